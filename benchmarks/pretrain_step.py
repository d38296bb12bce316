"""Where a pretraining step's time goes: the loader alone (the host's bound), the step on a
batch already on the device (the device's bound), the loader inline in the launching thread,
and as training.pretrain runs it on a GPU (a Prefetched thread ahead, pinned memory).

    python -m benchmarks.pretrain_step --config base --batch-size 128          # on a GPU
    python -m benchmarks.pretrain_step --config base --compile --documents files --head fixed
    python -m benchmarks.pretrain_step --config tiny --batch-size 16 --steps 5  # smoke, CPU

If the step as trained runs at about the loader's rate while the device-bound step is faster,
the host is the bound and MFU is lost there, not in the kernels. The corpus is
../shared/data/corpus's books (or --corpus), bert-base-uncased's vocabulary, sequence 128,
MLM + NSP, bf16 autocast on a GPU; AdamW as the trainer builds it (fused). --head chosen runs
the MLM head on the chosen positions (a host sync a step, CPU training's way), fixed on a
fixed slice of max_predictions a row (the GPU's way).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from training.data.corpus import corpus_files
from training.model import BertForPreTraining, BertSelfAttention, set_dropout
from training.optim import adamw
from training.pretrain import (
    H100_BF16_TFLOPS,
    flops_per_token,
    get_config,
    get_tokenizer,
    make_streams,
    parse_args,
    pretraining_loss,
)
from training.trainer import Dist, Prefetched, autocast, resolve_precision

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
BOOKS = ["gutenberg_nltk", "misc_pd_books", "tinyshakespeare"]
MODES = ["loader", "device", "inline", "trained"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--config", default="base", help="model preset (tiny, mini, small, base)")
    p.add_argument("--batch-size", type=int, default=128, help="sequences a step")
    p.add_argument("--steps", type=int, default=30, help="timed steps per mode")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps before each mode")
    p.add_argument("--corpus", nargs="+", default=[str(DATA / "corpus" / c) for c in BOOKS])
    p.add_argument("--tokenizer", default=str(DATA / "vocab" / "bert-base-uncased" / "vocab.txt"))
    p.add_argument("--cache-dir", help="tokenized corpus cache (default: training.pretrain's)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model too")
    p.add_argument("--compile-mode", help="torch.compile mode (reduce-overhead: CUDA graphs)")
    p.add_argument("--documents", default="blocks", help="corpus units: blocks or files")
    p.add_argument("--head", choices=["fixed", "chosen"], default="fixed",
                   help="MLM head on a fixed slice a row (GPU training) or the chosen positions")  # fmt: skip
    p.add_argument("--modes", nargs="+", default=MODES, choices=MODES, help="what to time")
    p.add_argument(
        "--three-qkv",
        action="store_true",
        help="Q, K and V as three GEMMs (BertSelfAttention.fuse_qkv off: before 2026-11-26)",
    )
    p.add_argument(
        "--sdpa",
        choices=["auto", "cudnn", "flash", "efficient", "math"],
        default="auto",
        help="the attention kernel SDPA may take (auto: its own choice)",
    )
    p.add_argument(
        "--no-padding-mask",
        action="store_true",
        help="diagnostic: drop the attention mask (pads attended), so SDPA may take flash",
    )
    p.add_argument(
        "--dropout",
        type=float,
        help="diagnostic: every dropout at this rate (BERT 0.1; Cramming pretrains at 0)",
    )
    p.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="then profile N steps on the resident batch: the top kernels by GPU time",
    )
    cli = p.parse_args(argv)
    args = parse_args(
        ["--corpus", *cli.corpus, "--tokenizer", cli.tokenizer, "--config", cli.config,
         "--batch-size", str(cli.batch_size), "--steps", "1", "--out", "/nonexistent",
         "--documents", cli.documents]
        + (["--compile"] if cli.compile else [])
        + (["--cache-dir", cli.cache_dir] if cli.cache_dir else [])
    )  # fmt: skip
    d = Dist()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    precision = resolve_precision("auto", device)
    tokenizer = get_tokenizer(args, d, corpus_files(args.corpus))
    stream, _ = make_streams(args, d, tokenizer, corpus_files(args.corpus))
    config = get_config(args, tokenizer)
    torch.manual_seed(0)
    BertSelfAttention.fuse_qkv = not cli.three_qkv
    model = BertForPreTraining(config).to(device).train()
    if cli.dropout is not None:
        set_dropout(model, cli.dropout)
    run_model = torch.compile(model, mode=cli.compile_mode) if cli.compile else model
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")
    optimizer = adamw(model, 1e-4, 0.01)
    loss_fn = pretraining_loss("mlm+nsp", stream.max_predictions if cli.head == "fixed" else None)
    params = [q for q in model.parameters() if q.requires_grad]
    per_token = flops_per_token(config, args.max_seq_length, args.mlm_probability)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    kernels = {
        "cudnn": "CUDNN_ATTENTION",
        "flash": "FLASH_ATTENTION",
        "efficient": "EFFICIENT_ATTENTION",
        "math": "MATH",
    }

    def step(batch: dict) -> None:
        if cli.no_padding_mask:
            batch = {k: v for k, v in batch.items() if k != "attention_mask"}
        with autocast(device, precision), contextlib.ExitStack() as stack:
            if cli.sdpa != "auto":
                stack.enter_context(sdpa_kernel(getattr(SDPBackend, kernels[cli.sdpa])))
            loss = loss_fn(run_model, batch)["loss"]
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def timed(name: str, one: Callable[[], int]) -> dict:
        for _ in range(cli.warmup):
            one()
        sync()
        t0, tokens = time.perf_counter(), 0
        for _ in range(cli.steps):
            tokens += one()
        sync()
        s = time.perf_counter() - t0
        row = {"mode": name, "ms_per_step": 1e3 * s / cli.steps,
               "seq_per_s": cli.steps * cli.batch_size / s}  # fmt: skip
        if device.type == "cuda" and name != "loader alone":
            row["mfu"] = tokens * per_token / s / (H100_BF16_TFLOPS * 1e12)
        print("  ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()), flush=True)  # fmt: skip
        return row

    fixed = {k: v.to(device) for k, v in stream.next_batch().items()}
    fixed_tokens = int(fixed["attention_mask"].sum())

    def on_device() -> int:
        step(fixed)
        return fixed_tokens

    def inline() -> int:
        batch = stream.next_batch()
        step({k: v.to(device, non_blocking=True) for k, v in batch.items()})
        return int(batch["attention_mask"].sum())

    ahead = Prefetched(stream, pin=device.type == "cuda")

    def trained() -> int:
        batch = ahead.next_batch()
        step({k: v.to(device, non_blocking=True) for k, v in batch.items()})
        return int(batch["attention_mask"].sum())

    def loader() -> int:
        stream.next_batch()
        return 0

    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    mode = f", compiled{' ' + cli.compile_mode if cli.compile_mode else ''}" if cli.compile else ""
    print(f"{name}, torch {torch.__version__}, {cli.config} batch {cli.batch_size} x "
          f"{args.max_seq_length}, {precision}{mode}, documents {cli.documents}, "
          f"MLM head {cli.head}")  # fmt: skip
    runs = {"loader": ("loader alone", loader), "device": ("batch on device", on_device),
            "inline": ("inline loader", inline), "trained": ("as trained (Prefetched)", trained)}  # fmt: skip
    rows = {m: timed(*runs[m]) for m in cli.modes}
    if "trained" in cli.modes:
        ahead.close()
    if cli.profile:
        profile(lambda: step(fixed), cli.profile, sync)
    if "loader" in rows and "device" in rows:
        gpu, host = rows["device"]["ms_per_step"], rows["loader"]["ms_per_step"]
        print(f"device step {gpu:.1f} ms, loader {host:.1f} ms a batch: "
              f"{'host' if host > 0.5 * gpu else 'device'}-bound territory")  # fmt: skip
    return 0


def profile(one: Callable[[], None], steps: int, sync: Callable[[], None]) -> None:
    """The kernels that took the device's time over `steps` steps, the top 25, and how much
    of the wall time the device spent idle between them."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    sync()
    t0 = time.perf_counter()
    with torch_profile(activities=activities) as prof:
        for _ in range(steps):
            one()
        sync()
    wall = time.perf_counter() - t0
    kernels = [
        e for e in prof.key_averages() if e.device_time_total > 0 and e.device_type.name == "CUDA"
    ]
    busy = sum(e.device_time_total for e in kernels) / 1e6
    print(
        f"profile: {steps} steps, {1e3 * wall / steps:.1f} ms a step under the profiler, "
        f"kernels {1e3 * busy / steps:.1f} ms a step ({100 * busy / wall:.0f}% busy)"
    )
    sort = "cuda_time_total" if torch.cuda.is_available() else "cpu_time_total"
    print(prof.key_averages().table(sort_by=sort, row_limit=25, max_name_column_width=90))


if __name__ == "__main__":
    sys.exit(main())
