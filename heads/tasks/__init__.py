"""One module per head, each in the same two steps around the model: `preprocess` (text ->
model rows) and `postprocess` (the rows' outputs -> answer), as transformers' pipelines name
them. Both are plain functions over `tokenizers` encodings and numpy arrays (rows and their
outputs are `heads.rows` types), so `training.evaluate` scores exactly what the service
answers.

The service runs them as a `Job`, one per request, built by the route from the request's
options and the package: the batch worker encodes the texts of every job that arrived since its
last look in one `encode_batch` call (Rust, off the GIL), asks each job for its rows, and, once a
job's last row has run, for its answer. No tokenization or post-processing runs on the event
loop.
"""

from __future__ import annotations

from typing import Any, Protocol

from tokenizers import Encoding, Tokenizer

from heads.rows import Outputs, Sequence


class Job(Protocol):
    """One request's work for a model's batcher."""

    texts: list[str]  # what to encode (without special tokens), in the order rows() reads them
    truncated: int  # inputs cut to the window, known after rows()
    windowed: int  # inputs split into several windows, known after rows()

    def rows(self, tokenizer: Tokenizer, encodings: list[Encoding]) -> list[Sequence]:
        """The model rows for `encodings` (one per text); InvalidInput when they cannot be."""
        ...

    def answer(self, outputs: list[Outputs]) -> Any:
        """The answer from each row's outputs, in rows() order."""
        ...
