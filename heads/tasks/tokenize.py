"""What the model would read: texts -> tokens, and token ids -> text (TEI's /tokenize and
/decode), with any package's own tokenizer and row template.

    job = TokenizeJob(["a cat sits"], add_special_tokens=True, prompt="")
    job.rows(tokenizer, tokenizer.encode_batch(job.texts, add_special_tokens=False))
    job.answer([])  # [[{"id": 101, "text": "[CLS]", "special": True, "start": None, ...}, ...]]
    texts = decode(tokenizer, [[101, 1037, 4937, 102]], skip_special_tokens=True)

A token's `text` is the slice of the input it covers (`input[start:stop]`, character offsets:
the span a client highlights), a special token's its own string, with no offsets. Nothing is
truncated: a client checks lengths before it sends. Both run as a `Job` through the model's
batcher like every task (the texts are encoded in its worker's one `encode_batch` call); the
job makes no rows, so the model does not run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenizers import Encoding, Tokenizer

from heads.package import ModelPackage
from heads.rows import InvalidInput, ModelRow, Outputs, template
from heads.tasks import TaskOptions, embed, one_by_one

__all__ = [
    "DecodeJob",
    "DecodeOptions",
    "TokenizeJob",
    "TokenizeOptions",
    "decode",
    "tokens_of",
]


@dataclass(frozen=True, kw_only=True)
class TokenizeOptions(TaskOptions):
    """/tokenize's options: with the special tokens, and an embedding package's prompt first
    (None: no prompt; any package answers)."""

    add_special_tokens: bool = True
    prompt_name: str | None = None

    def job(self, package: ModelPackage, inputs: list[Any]) -> TokenizeJob:
        name = self.prompt_name
        prompt = embed.prompt(package, name) if name is not None else ""
        return TokenizeJob(inputs, add_special_tokens=self.add_special_tokens, prompt=prompt)


@dataclass(frozen=True, kw_only=True)
class DecodeOptions(TaskOptions):
    """/decode's option: leave the special tokens out (any package answers)."""

    skip_special_tokens: bool = True

    def job(self, package: ModelPackage, inputs: list[Any]) -> DecodeJob:
        return DecodeJob(
            [list(ids) for ids in inputs], skip_special_tokens=self.skip_special_tokens
        )


def _token(tokenizer: Tokenizer, token_id: int) -> dict[str, Any]:
    text = tokenizer.id_to_token(token_id)
    return {"id": token_id, "text": text, "special": True, "start": None, "stop": None}


def tokens_of(
    tokenizer: Tokenizer, text: str, encoding: Encoding, add_special_tokens: bool
) -> list[dict[str, Any]]:
    """One text's tokens (its encoding made without special tokens), with the template's
    special tokens of a single-text row around them when asked."""
    body = [
        {"id": i, "text": text[start:stop], "special": False, "start": start, "stop": stop}
        for i, (start, stop) in zip(encoding.ids, encoding.offsets, strict=True)
    ]
    if not add_special_tokens:
        return body
    parts = template(tokenizer).single
    prefix = [_token(tokenizer, int(i)) for i in parts.prefix]
    return prefix + body + [_token(tokenizer, int(i)) for i in parts.suffix]


def decode(tokenizer: Tokenizer, ids: list[list[int]], skip_special_tokens: bool) -> list[str]:
    """Each id list back to text; an id outside the vocabulary is an InvalidInput naming it."""
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    for i, row in enumerate(ids):
        if bad := [j for j, x in enumerate(row) if not 0 <= x < size]:
            # one list is how /decode is mostly called: name the place in it alone
            where = f"ids[{bad[0]}]" if len(ids) == 1 else f"ids[{i}][{bad[0]}]"
            raise InvalidInput(
                f"{where} is {row[bad[0]]}, outside this model's vocabulary: token ids run "
                f"from 0 to {size - 1}"
            )
    return [tokenizer.decode(row, skip_special_tokens=skip_special_tokens) for row in ids]


class TokenizeJob:
    """One /tokenize request: per text its tokens (`tokens_of`); `prompt` goes first, as the
    embedding would read it."""

    truncated = windowed = 0

    def __init__(self, texts: list[str], *, add_special_tokens: bool, prompt: str) -> None:
        self.texts = [prompt + t for t in texts] if prompt else list(texts)
        self.add_special_tokens = add_special_tokens
        self.result: list[list[dict[str, Any]]] = []

    def rows(self, tokenizer: Tokenizer, encodings: list[Encoding]) -> list[ModelRow]:
        self.result = [
            tokens_of(tokenizer, t, e, self.add_special_tokens)
            for t, e in zip(self.texts, encodings, strict=True)
        ]
        return []  # nothing for the model to run

    def answer(self, outputs: list[Outputs]) -> list[list[dict[str, Any]]]:
        return self.result

    @staticmethod
    def answer_many(jobs: list[TokenizeJob], outputs: list[list[Outputs]]) -> list[Any]:
        return one_by_one(jobs, outputs)


class DecodeJob:
    """One /decode request: per id list its text (`decode`), in the tokenizer's thread."""

    texts: list[str] = []  # nothing to encode
    truncated = windowed = 0

    def __init__(self, ids: list[list[int]], *, skip_special_tokens: bool) -> None:
        self.ids, self.skip_special_tokens = ids, skip_special_tokens
        self.result: list[str] = []

    def rows(self, tokenizer: Tokenizer, encodings: list[Encoding]) -> list[ModelRow]:
        self.result = decode(tokenizer, self.ids, self.skip_special_tokens)
        return []

    def answer(self, outputs: list[Outputs]) -> list[str]:
        return self.result

    @staticmethod
    def answer_many(jobs: list[DecodeJob], outputs: list[list[Outputs]]) -> list[Any]:
        return one_by_one(jobs, outputs)
