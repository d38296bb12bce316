"""The peer: what a user runs instead of this service, in-process on the same weights in
PyTorch: a transformers pipeline (sentence-transformers' `encode` for embeddings), called one
input at a time, then with a list at several batch sizes. Torch keeps its default thread count."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

PIPELINE_TASKS = {
    "classification": "text-classification",
    "token-classification": "token-classification",
    "question-answering": "question-answering",
}


def load(task: str, checkpoint: Path, max_seq_length: int) -> Callable[[list[Any], int], Any]:
    """`call(inputs, batch_size)`, running the peer on a list of inputs."""
    if task == "embedding":
        from sentence_transformers import SentenceTransformer

        st = SentenceTransformer(str(checkpoint), device="cpu")
        st.max_seq_length = max_seq_length

        def encode(inputs: list[Any], batch_size: int) -> Any:
            if batch_size == 1 and len(inputs) == 1:
                return st.encode(inputs[0])  # one text, as a user calls it
            return st.encode(inputs, batch_size=batch_size)

        return encode

    from transformers import pipeline

    kwargs: dict[str, Any] = {}
    if task == "token-classification":
        kwargs["aggregation_strategy"] = "simple"
    pipe = pipeline(PIPELINE_TASKS[task], model=str(checkpoint), device="cpu", **kwargs)
    call_kwargs: dict[str, Any] = {}
    if task == "classification":
        call_kwargs = {"truncation": True, "max_length": max_seq_length}
    elif task == "question-answering":
        call_kwargs = {"max_seq_len": min(384, max_seq_length), "doc_stride": 128}

    def run(inputs: list[Any], batch_size: int) -> Any:
        if batch_size == 1 and len(inputs) == 1:
            x = inputs[0]
            return pipe(**x, **call_kwargs) if isinstance(x, dict) else pipe(x, **call_kwargs)
        return list(pipe(inputs, batch_size=batch_size, **call_kwargs))

    return run


def measure(
    call: Callable[[list[Any], int], Any],
    inputs: list[Any],
    batch_sizes: list[int],
    budget: float,
    threads: list[int],
) -> list[dict[str, Any]]:
    """Inputs/s for each torch thread count (0 = torch's default) and batch size: batch 1 is
    one call per input (a user's loop); larger sizes hand the peer chunks of 4 x batch_size
    inputs at a time until `budget` seconds pass."""
    default = torch.get_num_threads()
    results = []
    with torch.inference_mode():
        for n in threads:
            torch.set_num_threads(n or default)
            call(inputs[:1], 1)  # load lazily-built pieces before timing
            for size in batch_sizes:
                chunk = 1 if size == 1 else 4 * size
                done = 0
                start = time.perf_counter()
                while time.perf_counter() - start < budget and done < len(inputs):
                    part = inputs[done : done + chunk]
                    call(part, size)
                    done += len(part)
                elapsed = time.perf_counter() - start
                results.append(
                    {
                        "torch_threads": n or default,
                        "batch_size": size,
                        "inputs": done,
                        "seconds": round(elapsed, 2),
                        "inputs_per_s": round(done / elapsed, 2),
                        "ms_per_input": round(1000 * elapsed / done, 3),
                    }
                )
    torch.set_num_threads(default)
    return results
