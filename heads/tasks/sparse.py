"""Sparse embeddings (SPLADE): texts -> vocabulary-wide weights, answered as their non-zero
entries.

    encoded = embed.preprocess(tokenizer, ["a cat sits"], 256)  # the rows are embed's
    # the batcher runs encoded.sequences; stack each row's `embeddings` (V,) into (N, V)
    [entries] = postprocess(vectors)      # [{"index": 1037, "value": 0.82}, ...], by index

The service runs the same two steps as a `Job` (see heads.tasks), one per request, for a
package whose pooling is sparse (`package.sparse`: `training.export --task embedding
--pooling splade` of a masked LM). The graph already pooled the masked-LM logits into one
weight per vocabulary entry, max over the text's tokens of log(1 + relu(logit)), so most are
exactly zero; here only the others are kept, sorted by index, as TEI's /embed_sparse answers
(`{"index", "value"}`), with the entry's token (`tokenizer.id_to_token`, as
sentence-transformers' SparseEncoder.decode names it) when asked. Rows, truncation and prompts
are the dense embeddings' (heads.tasks.embed); the vectors are not normalised (SPLADE scores
are dot products).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from tokenizers import Encoding, Tokenizer

from heads.package import ModelPackage
from heads.rows import InvalidInput, ModelRow, Outputs
from heads.tasks import TaskOptions, embed

__all__ = ["Job", "postprocess"]

Entry = dict[str, int | float | str]


def postprocess(vectors: np.ndarray, tokenizer: Tokenizer | None = None) -> list[list[Entry]]:
    """(N, V) sparse embeddings -> per row its non-zero entries, {"index", "value"} sorted by
    index; with `tokenizer`, each entry's "token" too."""
    x = np.asarray(vectors, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"sparse embeddings must be (N, V), got {x.shape}")
    rows, columns = np.nonzero(x)  # row-major: each row's indices ascending
    values = x[rows, columns].tolist()  # Python floats in one call
    indices = columns.tolist()
    tokens = [tokenizer.id_to_token(i) for i in indices] if tokenizer is not None else None
    bounds = np.searchsorted(rows, np.arange(len(x) + 1)).tolist()  # row r: bounds[r]:bounds[r + 1]
    answers = []
    for start, stop in zip(bounds[:-1], bounds[1:], strict=True):
        entries: list[Entry] = [
            {"index": i, "value": v}
            for i, v in zip(indices[start:stop], values[start:stop], strict=True)
        ]
        if tokens is not None:
            for entry, token in zip(entries, tokens[start:stop], strict=True):
                entry["token"] = token
        answers.append(entries)
    return answers


@dataclass(frozen=True, kw_only=True)
class Options(TaskOptions):
    """/embed_sparse's options: truncate or refuse an input over the window (cut from
    `truncation_direction`), each entry's token string (`return_tokens`), and the prompt
    (None: the package's default one)."""

    task = "embedding"
    use = "sparse-embedding"

    truncate: bool = True
    return_tokens: bool = False
    prompt_name: str | None = None
    truncation_direction: str = "right"

    def job(self, package: ModelPackage, inputs: list[Any]) -> Job:
        return Job(package, inputs, self)


class Job(embed.TextRows):
    """One sparse-embedding request for a model's batcher: texts -> one row each (embed's
    rows) -> per text its non-zero {"index", "value"} (and "token" with `return_tokens`)."""

    def __init__(
        self, package: ModelPackage, texts: list[str], options: Options = Options()
    ) -> None:
        start = embed.prompt(package, options.prompt_name)
        if not package.sparse:
            raise InvalidInput(
                f"model {package.name!r} answers dense embeddings (pooling {package.pooling}), "
                "not sparse ones"
            )
        super().__init__(package, texts, options.truncate, start, options.truncation_direction)
        self.with_tokens = options.return_tokens
        self.tokenizer: Tokenizer | None = None  # set by rows() when the tokens are asked for

    def rows(self, tokenizer: Tokenizer, encodings: list[Encoding]) -> list[ModelRow]:
        self.tokenizer = tokenizer if self.with_tokens else None
        return super().rows(tokenizer, encodings)

    def answer(self, outputs: list[Outputs]) -> list[list[Entry]]:
        return postprocess(np.stack([out["embeddings"] for out in outputs]), self.tokenizer)

    @staticmethod
    def answer_many(jobs: list[Job], outputs: list[list[Outputs]]) -> list[list[list[Entry]]]:
        """The answers of several jobs of one model: one np.nonzero over all their rows (the
        per-call overhead dominates single-text requests), token strings per job."""
        vectors = np.stack([out["embeddings"] for outs in outputs for out in outs])  # (N, V)
        entries = postprocess(vectors)
        answers, at = [], 0
        for job, outs in zip(jobs, outputs, strict=True):
            mine = entries[at : at + len(outs)]
            at += len(outs)
            if job.tokenizer is not None:
                for row in mine:
                    for entry in row:
                        entry["token"] = job.tokenizer.id_to_token(int(entry["index"]))
            answers.append(mine)
        return answers
