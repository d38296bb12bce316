"""The raw ONNX Runtime ceiling on a CUDA GPU at one fixed shape, for each variant of a
package: what the engine could do if the server cost nothing (issue 33).

    python -m benchmarks.gpu_ceiling --package models/bench/base-classify --variants fp32 fp16
    python -m benchmarks.gpu_ceiling --package models/bench/minilm-embed --seq 128 --tag minilm

Sequence length --seq (128: NVIDIA's TensorRT BERT-base anchor is about 7,900 sequences/s at
batch 128, fp16, A100, compute only), every batch size of --batch-sizes, three ways:
- run: session.run with numpy feeds and outputs, as the service calls it (host-to-device copy
  of the ids, device-to-host copy of the outputs, every call);
- iobinding: the ids copied to the GPU once, outputs left there (launches + compute);
- cudagraph: iobinding with the CUDA provider's graph capture (one session per shape: the
  graph replays fixed addresses). A graph whose nodes are not all on CUDA cannot be captured:
  the row then says why.
GPU memory is nvidia-smi's used memory after each session's runs (the process's whole use:
the CUDA context, ORT's arena, the weights).

--new-shapes N then asks what a shape the session has not seen costs, as the service meets
them (a batch's rows x padded length vary from batch to batch): N shapes drawn at random
(batch 1-64, length 8-64, seeded), each run twice in a row, then all N once more; the
milliseconds of the first call of each, the second, and the third pass, per variant. A first
call far above the second is a per-shape cost (kernel selection, arena growth) that a server
pays for every new shape, and bucketing lengths would bound. Measured: onnxruntime-gpu 1.31's
cuDNN flash attention (fp16, Hopper) builds a graph per shape, 39 ms a first call, which is why
the service leaves it out (`service.runtime.CUDA_ATTENTION_KERNELS`); sessions here are opened
as the service opens them, and ORT_ENABLE_CUDNN_FLASH_ATTENTION=1 puts cuDNN's back.

Results: benchmarks/results/gpu-ceiling-<package>[-tag].{json,md}.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from benchmarks._machine import gpu_memory_mib, gpu_name
from benchmarks._paths import write_results
from heads.package import read_package
from service.runtime import CUDA, cuda_provider, preload_cuda_libraries

WAYS = ("run", "iobinding", "cudagraph")


def feeds(session: ort.InferenceSession, batch: int, seq: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    out = {}
    for i in session.get_inputs():
        dtype = np.int32 if i.type == "tensor(int32)" else np.int64
        if "mask" in i.name:
            out[i.name] = np.ones((batch, seq), dtype)
        elif "type" in i.name:
            out[i.name] = np.zeros((batch, seq), dtype)
        else:
            out[i.name] = rng.integers(1000, 2000, (batch, seq)).astype(dtype)
    return out


def open_session(path: Path, graph: bool) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    name, provider_options = cuda_provider()  # as the service opens it
    if graph:
        provider_options = {**provider_options, "enable_cuda_graph": "1"}
    provider = (name, provider_options)
    session = ort.InferenceSession(str(path), options, providers=[provider])
    if session.get_providers()[0] != CUDA:
        raise RuntimeError(f"the session runs on {session.get_providers()}, not CUDA")
    return session


def timed(call, budget: float) -> tuple[float, int]:
    """Calls per second of `call` over about `budget` seconds, after three warm-ups."""
    for _ in range(3):
        call()
    n, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < budget or n < 5:
        call()
        n += 1
    return n / elapsed, n


def bound(session: ort.InferenceSession, inputs: dict[str, np.ndarray], fixed_outputs: bool):
    """An IO binding with the inputs on the GPU; outputs preallocated there when
    `fixed_outputs` (CUDA graphs replay fixed addresses), else allocated by ORT."""
    io = session.io_binding()
    keep = [ort.OrtValue.ortvalue_from_numpy(a, "cuda", 0) for a in inputs.values()]
    for name, value in zip(inputs, keep, strict=True):
        io.bind_ortvalue_input(name, value)
    if fixed_outputs:
        probe = session.io_binding()
        for name, value in zip(inputs, keep, strict=True):
            probe.bind_ortvalue_input(name, value)
        for o in session.get_outputs():
            probe.bind_output(o.name, "cuda")
        session.run_with_iobinding(probe)
        for o, value in zip(session.get_outputs(), probe.get_outputs(), strict=True):
            dtype = np.float16 if value.data_type() == "tensor(float16)" else np.float32
            out = ort.OrtValue.ortvalue_from_shape_and_type(value.shape(), dtype, "cuda", 0)
            keep.append(out)
            io.bind_ortvalue_output(o.name, out)
    else:
        for o in session.get_outputs():
            io.bind_output(o.name, "cuda")
    return io, keep


def measure(path: Path, batch: int, seq: int, budget: float) -> dict:
    row: dict = {"batch": batch}
    session = open_session(path, graph=False)
    inputs = feeds(session, batch, seq)
    rate, _ = timed(lambda: session.run(None, inputs), budget)
    row["run"] = round(rate * batch, 1)
    io, _keep = bound(session, inputs, fixed_outputs=False)
    rate, _ = timed(lambda: session.run_with_iobinding(io), budget)
    row["iobinding"] = round(rate * batch, 1)
    row["gpu_mib"] = gpu_memory_mib()
    try:
        graph = open_session(path, graph=True)
        io, _keep = bound(graph, inputs, fixed_outputs=True)
        rate, _ = timed(lambda: graph.run_with_iobinding(io), budget)
        row["cudagraph"] = round(rate * batch, 1)
    except Exception as err:  # capture refused: say why in the table, measure the rest
        row["cudagraph"] = None
        row["cudagraph_error"] = str(err).splitlines()[0][:200]
    return row


def new_shapes(path: Path, n: int) -> dict:
    """Milliseconds per call: first and second call of n unseen shapes, then a third pass."""
    rng = np.random.default_rng(0)
    shapes = [(int(rng.integers(1, 65)), int(rng.integers(8, 65))) for _ in range(n)]
    session = open_session(path, graph=False)
    session.run(None, feeds(session, 8, 32))  # the CUDA context and the first allocation
    passes: dict[str, list[float]] = {"first": [], "second": [], "third": []}

    def call(batch: int, seq: int) -> float:
        inputs = feeds(session, batch, seq)
        start = time.perf_counter()
        session.run(None, inputs)
        return 1e3 * (time.perf_counter() - start)

    for batch, seq in shapes:
        passes["first"].append(call(batch, seq))
        passes["second"].append(call(batch, seq))
    for batch, seq in shapes:
        passes["third"].append(call(batch, seq))
    return {
        name: {"p50": round(float(np.median(ms)), 2), "p90": round(float(np.quantile(ms, 0.9)), 2),
               "total_s": round(sum(ms) / 1e3, 2)}
        for name, ms in passes.items()
    }  # fmt: skip


def markdown(report: dict) -> str:
    lines = [
        f"# Raw ONNX Runtime ceiling on the GPU: {report['package']}",
        "",
        f"`{report['command']}` on {report['gpu']}, onnxruntime-gpu {report['onnxruntime']}.",
        f"Sequence length {report['seq']} (all tokens real), sequences/s; GPU MiB: nvidia-smi "
        "used memory after the session's runs.",
        "",
        "| variant | batch | run (numpy in/out) | iobinding | cudagraph | GPU MiB |",
        "|---|---|---|---|---|---|",
    ]
    for variant, rows in report["variants"].items():
        for r in rows:
            graph = r["cudagraph"] if r["cudagraph"] is not None else "refused"
            lines.append(
                f"| {variant} | {r['batch']} | {r['run']:,.0f} | {r['iobinding']:,.0f} | "
                f"{graph if isinstance(graph, str) else f'{graph:,.0f}'} | {r['gpu_mib']} |"
            )
    errors = {r.get("cudagraph_error") for rows in report["variants"].values() for r in rows}
    errors.discard(None)
    lines += ["", *(f"CUDA graph refused: {e}" for e in sorted(errors))] if errors else []
    if report.get("new_shapes"):
        lines += [
            "",
            f"## Unseen shapes ({report['new_shape_count']} drawn: batch 1-64, length 8-64)",
            "",
            "ms a call, session.run with numpy: p50 / p90 (total s over the shapes).",
            "",
            "| variant | first call of a shape | second call | all again |",
            "|---|---|---|---|",
        ]
        for variant, p in report["new_shapes"].items():
            cells = [
                f"{p[k]['p50']} / {p[k]['p90']} ({p[k]['total_s']} s)"
                for k in ("first", "second", "third")
            ]
            lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--package", type=Path, required=True, help="model package folder")
    parser.add_argument("--variants", nargs="+", default=["fp32", "fp16"])
    parser.add_argument("--seq", type=int, default=128, help="tokens per sequence")
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 8, 32, 128, 256])
    parser.add_argument("--budget", type=float, default=1.5, help="s per measurement")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--tag", default="", help="suffix of the result files")
    parser.add_argument("--new-shapes", type=int, default=0, metavar="N",
                        help="then N unseen (batch, length) shapes: first call vs second")  # fmt: skip
    cli = parser.parse_args(argv)
    if CUDA not in ort.get_available_providers():
        print(
            "error: this onnxruntime has no CUDA provider (pip install -e '.[gpu]')",
            file=sys.stderr,
        )
        return 2
    preload_cuda_libraries()
    package = read_package(cli.package)
    report = {
        "package": package.name,
        "gpu": gpu_name() or "no GPU",
        "onnxruntime": ort.__version__,
        "seq": cli.seq,
        "command": "python -m benchmarks.gpu_ceiling "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "variants": {},
    }
    for variant in cli.variants:
        if variant not in package.variants:
            print(f"{package.name}: no {variant} variant, skipped", file=sys.stderr)
            continue
        rows = report["variants"][variant] = []
        for batch in cli.batch_sizes:
            rows.append(measure(package.variant_path(variant), batch, cli.seq, cli.budget))
            print(variant, rows[-1], flush=True)
        if cli.new_shapes:
            report.setdefault("new_shapes", {})[variant] = new_shapes(
                package.variant_path(variant), cli.new_shapes
            )
            report["new_shape_count"] = cli.new_shapes
            print(variant, "new shapes", report["new_shapes"][variant], flush=True)
    stem = f"gpu-ceiling-{package.name}" + (f"-{cli.tag}" if cli.tag else "")
    print(write_results(cli.out, stem, report, markdown(report)).read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
