"""Run a task's Job against an exported package the way the service's batcher does, without
the service: encode the job's texts in one call, ask it for rows, pad them into one batch, run
the package's fp32 graph in ONNX Runtime (CPU), cut each row's outputs back to its length, and
ask for the answer. The task tests use it to check the whole path, graph included."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from heads.package import ModelPackage, read_package
from heads.rows import Outputs, load_package_tokenizer, pad, pad_id

_sessions: dict[Path, Any] = {}


def session(package: ModelPackage) -> Any:
    """The package's fp32 CPU session, one per package for the test session."""
    import onnxruntime as ort

    path = package.variant_path("fp32")
    if path not in _sessions:
        _sessions[path] = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return _sessions[path]


def run_job(package: ModelPackage | Path, job: Any) -> Any:
    """The job's answer, its rows run as one padded batch through the package's graph."""
    package = package if isinstance(package, ModelPackage) else read_package(Path(package))
    tokenizer = load_package_tokenizer(package.tokenizer_path)
    encodings = tokenizer.encode_batch(job.texts, add_special_tokens=False)
    rows = job.rows(tokenizer, encodings)
    outputs = run_rows(package, rows) if rows else []  # no rows: the model does not run
    return type(job).answer_many([job], [outputs])[0]


def run_rows(package: ModelPackage, rows: list[Any]) -> list[Outputs]:
    """Each row's outputs, the rows run as one padded batch through the package's graph."""
    tokenizer = load_package_tokenizer(package.tokenizer_path)
    feeds = pad(rows, pad_id(package.pad_token_id, tokenizer))
    run = session(package)
    names = [o.name for o in run.get_outputs()]
    got = run.run(names, {i.name: feeds[i.name] for i in run.get_inputs()})
    # outputs whose axis 1 is the sequence (the package says which, as the service reads it)
    per_token = {
        o["name"]
        for o in package.outputs
        if len(o.get("shape", [])) > 1 and o["shape"][1] == "sequence"
    }
    outputs: list[Outputs] = []
    for r, seq in enumerate(rows):
        # per-token outputs lose their padding, as the batcher hands them back
        cut = {
            n: g[r, : len(seq)] if n in per_token else g[r] for n, g in zip(names, got, strict=True)
        }
        outputs.append({n: np.asarray(v) for n, v in cut.items()})
    return outputs
