"""Token embeddings (POST /embed_all, TEI's): texts -> a vector per token.

    job = Options(return_tokens=True).job(package, ["a cat sits"])
    # the batcher runs job.rows(...); each row's Outputs has `token_embeddings` (L, D)
    [answer] = job.answer(outputs)   # {"embeddings": (L, D), "tokens": [{id, text, ...}]}

Two kinds of package answer it:

- a dense embedding package: the encoder's last hidden state at every token of the row,
  [CLS] and [SEP] included, as TEI's /embed_all answers; rows, truncation and prompts are
  /embed's (heads.tasks.embed.TextRows). Raw unless `normalize` (TEI has no such choice);
- a late-interaction (ColBERT) package: the vectors its MaxSim reads, unit length, a query's
  (`is_query`, PyLate's name) or a document's (heads.tasks.late_interaction); a text over
  the query or document length is cut to it, as PyLate and colbert-ai cut it.

`return_tokens`: each vector's token as /tokenize names it (id, text, special, and start /
stop character offsets into the input, null for special tokens).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from tokenizers import Encoding, Tokenizer

from heads.contract import TOKEN_EMBEDDINGS
from heads.package import ModelPackage
from heads.rows import InvalidInput, ModelRow, Outputs, template
from heads.tasks import TaskOptions, embed, late_interaction, one_by_one
from heads.tasks.late_interaction import normalize_tokens

__all__ = ["Job", "Options"]

Token = dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class Options(TaskOptions):
    """/embed_all's options: normalise each vector (None: as the package's task has it, raw
    for an embedding package, unit length for a ColBERT one), each vector's token
    (`return_tokens`), a ColBERT query rather than a document (`is_query`), and for an
    embedding package /embed's truncate, truncation_direction and prompt_name."""

    use = "token-embedding"

    normalize: bool | None = None
    return_tokens: bool = False
    is_query: bool = False
    truncate: bool = True
    truncation_direction: str = "right"
    prompt_name: str | None = None

    def job(self, package: ModelPackage, inputs: list[Any]) -> Job:
        return Job(package, inputs, self)


def _tokens(
    tokenizer: Tokenizer,
    text: str,
    model_row: ModelRow,
    encoding: Encoding,
    placed: tuple[int, int, int],
    prefix_chars: int,
) -> list[Token]:
    """Each position of `model_row` as a token. The text's n tokens are `encoding`'s from
    index `dropped` on, at row positions from `first` ((first, dropped, n) = placed): they
    carry character offsets into the input (less the prompt's `prefix_chars`; a prompt's own
    tokens have none). The template's tokens, a ColBERT marker and its query expansion are
    special."""
    out: list[Token] = []
    first, dropped, n_text = placed
    for k, token_id in enumerate(model_row.input_ids.tolist()):
        token: Token = {"id": token_id, "text": tokenizer.id_to_token(token_id)}
        i = k - first + dropped
        if first <= k < first + n_text and encoding.ids[i] == token_id:
            start, stop = encoding.offsets[i]
            token["text"] = text[start:stop]  # as /tokenize names it: the input's characters
            inside = start >= prefix_chars
            token |= {"special": False, "start": start - prefix_chars if inside else None,
                      "stop": stop - prefix_chars if inside else None}  # fmt: skip
        else:
            token |= {"special": True, "start": None, "stop": None}
        out.append(token)
    return out


class Job(embed.TextRows):
    """One /embed_all request: texts -> one row each -> per text its (n, D) float32 token
    vectors, or {"embeddings", "tokens"} with `return_tokens`."""

    wants = (TOKEN_EMBEDDINGS,)

    def __init__(
        self, package: ModelPackage, texts: list[str], options: Options = Options()
    ) -> None:
        self.spec: late_interaction.Spec | None = None
        if package.task == "late-interaction":
            self.spec = late_interaction.Spec.of(package)
            start = ""
        elif package.sparse:
            raise InvalidInput(
                f"model {package.name!r} is a sparse embedding model: its vectors are per "
                "vocabulary entry (POST /embed_sparse), not per token"
            )
        else:
            if not any(o["name"] == TOKEN_EMBEDDINGS for o in package.outputs):
                raise InvalidInput(
                    f"model {package.name!r} has no token_embeddings output (exported before "
                    "/embed_all existed): export it again with python -m training.export "
                    "--task embedding"
                )
            if options.is_query:
                raise InvalidInput(
                    f"is_query is for late-interaction (ColBERT) models; model {package.name!r} "
                    "is an embedding model, whose queries and documents are encoded alike "
                    "(a query prompt, if it has one, is a prompt_name)"
                )
            start = embed.prompt(package, options.prompt_name)
        super().__init__(package, texts, options.truncate, start, options.truncation_direction)
        self.prefix_chars = len(start)
        self.is_query = options.is_query
        self.normalize = (
            options.normalize if options.normalize is not None else self.spec is not None
        )
        self.with_tokens = options.return_tokens
        self.made: list[ModelRow] = []
        self.encodings: list[Encoding] = []
        self.tokenizer: Tokenizer | None = None

    def rows(self, tokenizer: Tokenizer, encodings: list[Encoding]) -> list[ModelRow]:
        if self.with_tokens:
            self.tokenizer, self.encodings = tokenizer, encodings
        if self.spec is None:
            self.made = super().rows(tokenizer, encodings)
            return self.made
        layout, spec = template(tokenizer), self.spec
        room = spec.room(layout, self.is_query)
        self.truncated = sum(len(e.ids) > room for e in encodings)
        build = late_interaction.query_row if self.is_query else late_interaction.document_row
        self.made = [build(spec, layout, e.ids[:room]) for e in encodings]
        self.tokens = sum(len(r) for r in self.made)
        return self.made

    def _placed(self, model_row: ModelRow, encoding: Encoding) -> tuple[int, int, int]:
        """(the row position of the text's first kept token, how many of the encoding's
        first tokens the row left out, how many it kept): after the template's prefix and a
        ColBERT marker; left truncation drops the first tokens, any other cut the last ones."""
        assert self.tokenizer is not None
        layout = template(self.tokenizer)
        spec = self.spec
        marker = (
            spec is not None
            and (spec.query_prefix_id if self.is_query else spec.document_prefix_id) is not None
        )
        first = len(layout.single.prefix) + marker
        n_text = len(model_row) - layout.single.n_special - marker
        if spec is not None and self.is_query:  # the expansion follows the text and [SEP]
            n_text = spec.room(layout, True)
        n_text = min(n_text, len(encoding.ids))
        dropped = len(encoding.ids) - n_text if self.direction == "left" and spec is None else 0
        return first, dropped, n_text

    def answer(self, outputs: list[Outputs]) -> list[Any]:
        answers: list[Any] = []
        for k, (model_row, out) in enumerate(zip(self.made, outputs, strict=True)):
            states = out[TOKEN_EMBEDDINGS]
            if self.spec is not None:
                keep = late_interaction.kept(self.spec, model_row, self.is_query)
                states = states[keep]
            else:
                keep = np.ones(len(model_row), dtype=bool)
            x = normalize_tokens(states) if self.normalize else states.astype(np.float32)
            if self.tokenizer is None:
                answers.append(np.ascontiguousarray(x))
                continue
            encoding = self.encodings[k]
            placed = self._placed(model_row, encoding)
            tokens = _tokens(
                self.tokenizer, self.texts[k], model_row, encoding, placed, self.prefix_chars
            )
            kept_tokens = [t for t, kept in zip(tokens, keep.tolist(), strict=True) if kept]
            answers.append({"embeddings": np.ascontiguousarray(x), "tokens": kept_tokens})
        return answers

    @staticmethod
    def answer_many(jobs: list[Job], outputs: list[list[Outputs]]) -> list[Any]:
        return one_by_one(jobs, outputs)
