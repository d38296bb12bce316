"""The engine's ceiling: the raw ONNX Runtime session in-process on already-tokenized rows,
opened exactly as the service opens it (`service.runtime.OrtBackend`: same graph optimisation
level, same intra-op threads and spinning, same provider), fed with the padding the service's
batcher builds (`service.batcher.pad`), in the dtypes the graph takes."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from heads.rows import ModelRow, pad
from service.job_queue import next_batch
from service.runtime import CPU, OrtBackend, cuda_provider, preload_cuda_libraries
from service.settings import Settings
from service.stages.infer import CPU_PAD_LIMIT, pad_limit


def open_session(model_path: Path, threads: int, spinning: bool, device: str = "cpu") -> OrtBackend:
    """The session on `device` ("cpu" or "cuda"), as `service.runtime.open_backend` opens it.
    A CUDA session that falls back to CPU is an error: its figures would be the CPU's."""
    if device == "cpu":
        return OrtBackend(model_path, [CPU], threads, spinning)
    preload_cuda_libraries()
    backend = OrtBackend(model_path, [cuda_provider(), CPU], threads, spinning)
    if backend.provider != "cuda":
        raise RuntimeError(f"{model_path}: the session runs on CPU, not CUDA")
    return backend


def feeds_for(
    backend: OrtBackend, rows: list[ModelRow], pad_token_id: int = 0
) -> dict[str, np.ndarray]:
    """Padded (B, T) feeds in the session's input names and dtypes (built before timing).
    pad_token_id: the package's (`ModelPackage.pad_token_id`) where answers matter; speed
    runs may pad with anything."""
    padded = pad(rows, pad_token_id)
    return {
        i.name: padded[i.name].astype(np.int32 if i.type == "tensor(int32)" else np.int64)
        for i in backend.session.get_inputs()
    }


def _batches(
    rows: list[ModelRow], size: int, order: str, limit: int | None = CPU_PAD_LIMIT
) -> list[list[ModelRow]]:
    """`size` rows a batch, in arrival order or sorted; or ("window") the service's own
    batcher's batches when `size` rows are in flight: each window of `size` arrival-order rows
    cut by `next_batch` as the batcher cuts its queue (default token and size limits; the
    padding `limit` of the provider, `service.stages.infer.pad_limit`)."""
    if order == "window":
        return [b for i in range(0, len(rows), size) for b in _policy(rows[i : i + size], limit)]
    if order == "sorted":  # what a batcher with unlimited choice could do: no padding to speak of
        rows = sorted(rows, key=len)
    return [rows[i : i + size] for i in range(0, len(rows), size)]


def _policy(window: list[ModelRow], limit: int | None) -> list[list[ModelRow]]:
    defaults = Settings.model_fields
    tokens, most = defaults["max_batch_tokens"].default, defaults["max_batch_size"].default
    out = []
    while window:
        picked = next_batch([len(r) for r in window], tokens, most, limit)
        out.append([window[k] for k in picked])
        chosen = set(picked)
        window = [r for k, r in enumerate(window) if k not in chosen]
    return out


MIN_BATCHES = 4  # a measurement runs at least this many batches, whatever the budget


def spread(n: int) -> list[int]:
    """0..n-1 in van der Corput order (0, n/2, n/4, 3n/4, ...): every prefix samples the
    whole range, so a time-bounded pass over length-sorted batches sees short and long ones."""

    def radical_inverse(i: int) -> float:
        x, f = 0.0, 0.5
        while i:
            x, i, f = x + f * (i & 1), i >> 1, f / 2
        return x

    return sorted(range(n), key=lambda i: radical_inverse(i))


def throughput(
    backend: OrtBackend, rows: list[ModelRow], size: int, order: str, budget: float
) -> dict[str, Any]:
    """Rows/s of back-to-back session.run calls over `rows` cut into batches of `size`
    (in arrival order, sorted by length, or as the batcher cuts windows of `size`), for about
    `budget` seconds and at least MIN_BATCHES batches. Sorted batches are visited in `spread`
    order, so that a short budget measures short and long rows alike."""
    batches = _batches(rows, size, order, pad_limit(backend.provider))
    if order == "sorted":
        batches = [batches[i] for i in spread(len(batches))]
    prepared = [feeds_for(backend, b) for b in batches]
    least = min(MIN_BATCHES, len(prepared))
    session = backend.session
    session.run(None, prepared[0])  # first run of a new shape allocates
    done_rows = done_tokens = padded_tokens = n = 0
    start = time.perf_counter()
    while True:
        feeds = prepared[n % len(prepared)]
        session.run(None, feeds)
        b, t = feeds["input_ids"].shape
        done_rows += b
        padded_tokens += b * t
        done_tokens += int(feeds["attention_mask"].sum())
        n += 1
        elapsed = time.perf_counter() - start
        if (elapsed >= budget and n >= least) or n >= 10 * len(prepared):
            break
    return {
        "batch_size": size,
        "order": order,
        "batches": n,
        "sequences_per_s": round(done_rows / elapsed, 2),
        "tokens_per_s": round(done_tokens / elapsed, 1),
        "sequences_per_batch": round(done_rows / n, 1),
        "padding_efficiency": round(done_tokens / padded_tokens, 3),
        "ms_per_batch": round(1000 * elapsed / n, 3),
    }


def request_latency(
    backend: OrtBackend, requests: list[list[ModelRow]], budget: float
) -> dict[str, float]:
    """Milliseconds of one session.run over one request's rows (batch 1 for a single text;
    a long QA context's windows together, as the idle service runs them), request after
    request, for about `budget` seconds."""
    from benchmarks._load import percentiles

    prepared = [feeds_for(backend, rows) for rows in requests]
    session = backend.session
    session.run(None, prepared[0])
    times = []
    start = time.perf_counter()
    for feeds in prepared:
        t0 = time.perf_counter()
        session.run(None, feeds)
        times.append((time.perf_counter() - t0) * 1000)
        if time.perf_counter() - start >= budget and len(times) >= 20:
            break
    return percentiles(times) | {"requests": len(times)}
