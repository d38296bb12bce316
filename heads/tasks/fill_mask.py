"""Fill-mask: texts with the model's mask token ([MASK], <mask>) -> the likeliest tokens for
each blank.

    rows = preprocess(tokenizer, ["Paris is the [MASK] of France."], 128, "[MASK]")
    # the batcher runs rows; each row's Outputs has `logits` (L, V)
    [answer] = postprocess(tokenizer, rows, [logits], "[MASK]", top_k=5)
    # [{"score": 0.41, "token": 2103, "token_str": "capital", "sequence": "paris is the ..."}, ...]

The service runs the same two steps as a `Job` (see heads.tasks), one per request. The package
(`training.export --task fill-mask`) names its mask token and how its tokenizer decodes.

Semantics follow transformers' fill-mask pipeline:

- each blank's scores are the softmax over the whole vocabulary of the logits at its
  position; the `top_k` best (default 5) come back best first as {score, token, token_str,
  sequence}: token the id, token_str the token decoded alone, sequence the text with the
  blank filled in, decoded without special tokens;
- a text with one blank answers a flat list; with several, one list per blank, in text order,
  each blank filled alone, its sequence decoded *with* special tokens (the pipeline keeps the
  other [MASK]s visible so, and [CLS] / [SEP] come along);
- `targets` restricts the scores to those words: each is looked up as a vocabulary entry,
  else tokenized and its *first token* scored, as the pipeline does (a multi-token word, say
  "airplane" -> "air ##plane", is scored as "air", and the answer's token / token_str show
  which token it was); a target that tokenizes to nothing is skipped; repeats count once; the
  probabilities stay those of the whole-vocabulary softmax (not renormalised), and top_k is
  capped at the number of targets.

Differences, on purpose: every input gets its own answer (the pipeline unwraps a one-text
list); a text longer than the model's window is refused with the limit, since truncating could
cut its blanks off (the pipeline does not truncate either, and fails inside the model); a text
without the mask token, or a package without one, is an InvalidInput.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Any

import numpy as np
from tokenizers import Encoding, Tokenizer

from heads.package import ModelPackage
from heads.rows import InvalidInput, ModelRow, Outputs, guess_pad_id, row, template
from heads.tasks import TaskOptions, one_by_one

__all__ = ["TOP_K", "Job", "clean_up", "postprocess", "preprocess", "target_ids"]

TOP_K = 5  # the pipeline's default


def preprocess(
    tokenizer: Tokenizer, texts: list[str], max_seq_length: int, mask_token: str
) -> list[ModelRow]:
    """One row `[CLS] text [SEP]` per text, each with at least one mask token; InvalidInput
    for a text without one or longer than `max_seq_length`."""
    _check_texts(texts)
    encodings = tokenizer.encode_batch(texts, add_special_tokens=False)
    return _rows(tokenizer, encodings, max_seq_length, _mask_id(tokenizer, mask_token))


def _check_texts(texts: list[str]) -> None:
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise InvalidInput(f"inputs[{i}]: expected a string")


def _mask_id(tokenizer: Tokenizer, mask_token: str) -> int:
    mask_id = tokenizer.token_to_id(mask_token)
    if mask_id is None:
        raise InvalidInput(f"the model's tokenizer has no mask token {mask_token!r}")
    return mask_id


def _rows(
    tokenizer: Tokenizer, encodings: list[Encoding], max_seq_length: int, mask_id: int
) -> list[ModelRow]:
    layout = template(tokenizer)
    n_special = layout.single.n_special
    mask_token = tokenizer.id_to_token(mask_id)
    rows = []
    for i, enc in enumerate(encodings):
        if mask_id not in enc.ids:
            raise InvalidInput(f"inputs[{i}] has no mask token {mask_token}: nothing to fill in")
        length = len(enc.ids) + n_special
        if length > max_seq_length:
            # cutting the text to the window could cut its blanks off: refuse instead
            raise InvalidInput(
                f"inputs[{i}] is {length} tokens long, more than the model's max_seq_length "
                f"{max_seq_length}; shorten it (fill-mask does not truncate)"
            )
        rows.append(row(layout, enc.ids))
    return rows


def target_ids(tokenizer: Tokenizer, targets: str | list[str]) -> np.ndarray:
    """The token ids `targets` score, as the pipeline picks them: a vocabulary entry as it
    is, another word by its first token; words with no token are skipped, repeats count once.
    InvalidInput when none is left."""
    words = [targets] if isinstance(targets, str) else list(targets)
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    ids: list[int] = []
    for word in words:
        found = vocab.get(word)
        if found is None:
            pieces = tokenizer.encode(word, add_special_tokens=False).ids
            if not pieces:
                continue  # the pipeline warns and ignores it
            found = pieces[0]  # a word of several tokens is scored by its first
        ids.append(found)
    if not ids:
        raise InvalidInput(f"targets {words}: none of them is or makes a token of the vocabulary")
    return np.fromiter(dict.fromkeys(ids), dtype=np.int64)


# transformers' clean_up_tokenization: no space before punctuation and English contractions
_CLEAN_UP = (
    (" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
    (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"),
)  # fmt: skip


def clean_up(text: str) -> str:
    """What transformers' decode does with clean_up_tokenization_spaces: " ." -> "." ..."""
    for before, after in _CLEAN_UP:
        text = text.replace(before, after)
    return text


def _softmax(logits: np.ndarray) -> np.ndarray:
    """(M, V) -> (M, V) probabilities, in float64."""
    x = logits.astype(np.float64)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def postprocess(
    tokenizer: Tokenizer,
    sequences: list[ModelRow],
    logits: Seq[np.ndarray],
    mask_token: str,
    top_k: int = TOP_K,
    targets: np.ndarray | None = None,
    clean_up_tokenization_spaces: bool = False,
    pad_id: int | None = None,
) -> list[list[Any]]:
    """Per row, its logits (L, V) -> the answer: the top_k {score, token, token_str,
    sequence} of its one blank, or one such list per blank. targets: `target_ids`' ids.
    pad_id: the package's (None: a guess by name, for packages that do not record it)."""
    mask_id = _mask_id(tokenizer, mask_token)
    pad_id = guess_pad_id(tokenizer) if pad_id is None else pad_id
    if targets is not None:
        top_k = min(top_k, len(targets))

    def decode(ids: Seq[int], skip_special_tokens: bool = False) -> str:
        text = tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)
        return clean_up(text) if clean_up_tokenization_spaces else text

    answers = []
    for seq, out in zip(sequences, logits, strict=True):
        ids = seq.input_ids
        blanks = np.flatnonzero(ids == mask_id)  # (M,) positions, in text order
        probs = _softmax(np.asarray(out)[blanks])  # (M, V)
        candidates = np.arange(probs.shape[1]) if targets is None else targets
        scores = probs[:, candidates]  # (M, K)
        # a stable sort on -score: ties keep vocabulary (or target) order
        best = np.argsort(-scores, axis=-1, kind="stable")[:, :top_k]
        single = len(blanks) == 1
        per_blank = []
        for m, position in enumerate(blanks.tolist()):
            filled = []
            for k in best[m].tolist():
                token = int(candidates[k])
                text = ids.copy()
                text[position] = token
                if pad_id is not None:  # the pipeline filters the padding token out
                    text = text[text != pad_id]
                filled.append(
                    {
                        "score": float(scores[m, k]),
                        "token": token,
                        "token_str": decode([token]),
                        "sequence": decode(text.tolist(), skip_special_tokens=single),
                    }
                )
            per_blank.append(filled)
        answers.append(per_blank[0] if single else per_blank)
    return answers


@dataclass(frozen=True, kw_only=True)
class Options(TaskOptions):
    """/fill-mask's options, the fill-mask pipeline's names: fillers per mask, and the words
    they are chosen from (None: the whole vocabulary)."""

    task = "fill-mask"

    top_k: int = TOP_K
    targets: str | list[str] | None = None

    def job(self, package: ModelPackage, inputs: list[Any]) -> Job:
        return Job(package, inputs, self)


class Job:
    """One fill-mask request for a model's batcher: texts -> one row each -> per text the
    top_k fillers of its blank (a list), or of each of its blanks (a list of lists)."""

    truncated = 0
    windowed = 0

    def __init__(
        self,
        package: ModelPackage,
        texts: list[str],
        options: Options = Options(),
    ) -> None:
        top_k, targets = options.top_k, options.targets
        # checked here, so a bad option is a 422 before any compute
        _check_texts(texts)
        if package.mask_token is None:
            raise InvalidInput(
                f"model {package.name!r} has no mask token: export it with "
                "`python -m training.export --task fill-mask` from a checkpoint whose tokenizer "
                "has one"
            )
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise InvalidInput(f"top_k must be an integer of at least 1, not {top_k!r}")
        if targets is not None and (
            not isinstance(targets, str | list)
            or not targets
            or not all(isinstance(t, str) for t in targets)
        ):
            raise InvalidInput("targets must be a word or a non-empty list of words")
        self.texts = texts
        self.mask_token = package.mask_token
        self.clean_up = package.clean_up_tokenization_spaces
        self.pad_id = package.pad_token_id
        self.max_seq_length = package.max_seq_length
        self.top_k, self.targets = top_k, targets
        self.tokenizer: Tokenizer | None = None
        self.target_ids: np.ndarray | None = None
        self.sequences: list[ModelRow] = []

    def rows(self, tokenizer: Tokenizer, encodings: list[Encoding]) -> list[ModelRow]:
        mask_id = _mask_id(tokenizer, self.mask_token)
        if self.targets is not None:
            self.target_ids = target_ids(tokenizer, self.targets)
        self.sequences = _rows(tokenizer, encodings, self.max_seq_length, mask_id)
        self.tokenizer = tokenizer  # the answer decodes with it
        return self.sequences

    def answer(self, outputs: list[Outputs]) -> list[list[Any]]:
        assert self.tokenizer is not None, "rows() first"
        return postprocess(
            self.tokenizer,
            self.sequences,
            [out["logits"] for out in outputs],
            self.mask_token,
            self.top_k,
            self.target_ids,
            self.clean_up,
            self.pad_id,
        )

    @staticmethod
    def answer_many(jobs: list[Job], outputs: list[list[Outputs]]) -> list[Any]:
        return one_by_one(jobs, outputs)  # nothing to share between jobs
