"""Offline batch NER (issue 53), side by side in one run: CoNLL-2003 sentences through
`python -m service.batch ner` (fp32 and int8) against transformers' token-classification
pipeline on the same checkpoint and the same torch threads (what users would write), and
ONNX Runtime alone on the same rows (the ceiling). The entities of the command and of the
pipeline are compared on a sample: the speed is of the same answers.

    python -m benchmarks.packages --only minilm-ner      # models/bench/minilm-ner + its checkpoint
    python -m benchmarks.batch_ner --rows 20000

The package is MiniLM's real encoder with a random 9-label CoNLL head (benchmarks.packages):
its entities are random, their cost is a real one. Figures as in benchmarks.batch: rows/s and
CPU ms per row (all processes doing the work), the command's steady rate after its first
part. Results: benchmarks/results/batch_ner.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks._data import shared_data
from benchmarks._machine import cpu_name
from benchmarks._paths import REPO, shown, write_results
from benchmarks.batch import batch_args, batch_figure, best_layout, command, per_row
from benchmarks.serve import CpuMeter, log
from heads.package import read_package
from heads.rows import load_package_tokenizer
from heads.tasks import ner
from training.data.token_classification import read_tagged

BATCH_SIZE = 32  # the pipeline's batch_size, and the ceiling's batches


def sentences(data: Path, n: int) -> list[str]:
    """CoNLL-2003's dev sentences (eng.testa), words joined by spaces, repeated to `n`."""
    found = [" ".join(s.words) for s in read_tagged(data / "conll2003" / "iob2" / "eng.testa")]
    return [found[i % len(found)] for i in range(n)]


def pipeline_ner(checkpoint: Path, texts: list[str], threads: int) -> tuple[dict, list]:
    """The token-classification pipeline as a user runs it over a list (batch_size 32,
    aggregation "simple", the endpoint's default), torch on `threads` threads."""
    import torch
    from transformers import pipeline

    torch.set_num_threads(threads)
    pipe = pipeline(
        "token-classification", model=str(checkpoint), aggregation_strategy="simple", device="cpu"
    )
    pipe(texts[:BATCH_SIZE], batch_size=BATCH_SIZE)  # warm up
    meter, cpu0, start = CpuMeter(), time.process_time(), time.perf_counter()
    answers = pipe(texts, batch_size=BATCH_SIZE)
    wall = time.perf_counter() - start
    figure = {"rows_per_s": round(len(texts) / wall, 1),
              "cpu_ms_per_row": per_row(time.process_time() - cpu0, len(texts)),
              "others_cpu_cores": meter.read()["others_cpu_cores"], "rows": len(texts)}  # fmt: skip
    return figure, answers


def ceiling(package: Path, variant: str, threads: int, texts: list[str], budget: float) -> dict:
    """ONNX Runtime alone on the sentences' NER rows (the command's windows), batches of 32
    (benchmarks.batch.best_layout)."""
    pkg = read_package(package)
    tokenizer = load_package_tokenizer(pkg.tokenizer_path)
    stride = ner.default_stride(pkg.max_seq_length)
    rows = [
        r for t in texts for r in ner.preprocess(tokenizer, t, pkg.max_seq_length, stride).sequences
    ]
    return best_layout(package, variant, threads, rows, budget, sizes=(BATCH_SIZE,))


def same_entities(ours: list[Any], theirs: list[Any]) -> dict[str, Any]:
    """How many sentences got the same entities (group, start, end; scores within 1e-3)."""
    same = 0
    for o, t in zip(ours, theirs, strict=True):
        key = [(e["entity_group"], e["start"], e["end"]) for e in o]
        if key == [(e["entity_group"], e["start"], e["end"]) for e in t] and all(
            abs(a["score"] - float(b["score"])) <= 1e-3 for a, b in zip(o, t, strict=True)
        ):
            same += 1
    return {"sentences": len(ours), "same": same}


def markdown(result: dict[str, Any]) -> str:
    pipe = result["pipeline"]
    lines = [
        "# Offline batch NER: MiniLM + a CoNLL head (issue 53)",
        "",
        f"`{result['command']}` on {result['cpu']} ({result['cores']} cores), {result['threads']} "
        f"ONNX Runtime / torch threads, spinning off; {result['rows']:,} CoNLL-2003 dev sentences "
        f"(repeated; the pipeline on the first {pipe['rows']:,}). Entities of the command (fp32) "
        f"equal the pipeline's on {result['agreement']['same']:,} of "
        f"{result['agreement']['sentences']:,} sentences (group, start, end; score within 1e-3).",
        "",
        "| door | variant | rows/s | x pipeline | CPU ms / row | x less CPU than the pipeline |",
        "|---|---|---|---|---|---|",
    ]
    doors = [("transformers pipeline (batch_size 32)", "fp32", pipe)]
    for variant, d in result["variants"].items():
        doors.append(
            (f"ONNX Runtime alone (ceiling, {d['ceiling']['layout']})", variant, d["ceiling"])
        )
        doors.append(("python -m service.batch ner", variant, d["batch"]))
    for name, variant, f in doors:
        lines.append(
            f"| {name} | {variant} | {f['rows_per_s']:,.0f} | {f['rows_per_s'] / pipe['rows_per_s']:.2f} "
            f"| {f['cpu_ms_per_row']:.2f} | {pipe['cpu_ms_per_row'] / f['cpu_ms_per_row']:.2f} |"
        )  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.batch_ner", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--package", type=Path, default=Path("models/bench/minilm-ner"))
    p.add_argument("--rows", type=int, default=20_000, help="sentences of the command's figures")
    p.add_argument("--pipeline-rows", type=int, default=2_000, help="sentences the pipeline tags")
    p.add_argument("--variants", default="fp32,int8")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--ceiling-seconds", type=float, default=15.0)
    p.add_argument("--data", type=Path, default=None)
    p.add_argument("--results", type=Path, default=REPO / "benchmarks" / "results")
    a = p.parse_args(argv)
    data, package = shared_data(a.data), a.package.resolve()
    checkpoint = package.parent / "checkpoints" / package.name  # benchmarks.packages writes it
    texts = sentences(data, a.rows)
    result: dict[str, Any] = {
        "command": "python -m benchmarks.batch_ner " + " ".join(argv if argv is not None else sys.argv[1:]),
        "cpu": cpu_name(), "cores": os.cpu_count(), "threads": a.threads, "rows": a.rows,
        "variants": {}, "loadavg_at_start": os.getloadavg(),
    }  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-batch-ner-") as tmp:
        work = Path(tmp)
        source = work / "sentences.parquet"
        pq.write_table(pa.table({"sentence": texts}), source)
        for variant in a.variants.split(","):
            log(f"{variant}: ceiling")
            top = ceiling(package, variant, a.threads, texts[:5_000], a.ceiling_seconds)
            log(f"{variant}: python -m service.batch ner on {a.rows:,} rows")
            out = work / f"out-{variant}"
            run = command(batch_args(package, variant, a.threads, source, out, task="ner"))
            result["variants"][variant] = {"ceiling": top, "batch": batch_figure(run, a.rows)}
            log(json.dumps(result["variants"][variant]))
        log(f"the pipeline on {a.pipeline_rows:,} rows")
        result["pipeline"], theirs = pipeline_ner(checkpoint, texts[: a.pipeline_rows], a.threads)
        parts = sorted((work / "out-fp32").glob("part-*.parquet"))  # in input order
        answers = pa.concat_tables(pq.read_table(p) for p in parts).column("entities").to_pylist()
        result["agreement"] = same_entities(answers[: a.pipeline_rows], theirs)
    result["loadavg_at_end"] = os.getloadavg()
    path = write_results(a.results, "batch_ner", result, shown(markdown(result)))
    log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
