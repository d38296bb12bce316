"""Inference speed of the families with encoders of their own (DeBERTa-v3, ModernBERT, MPNet)
against BERT of the same size, as the service runs them (issue 29).

    python -m benchmarks.families                          # tiny and base shapes
    python -m benchmarks.families --shapes base --rounds 5
    python -m benchmarks.families --long 2048              # ModernBERT: one long row vs windows

For each shape, one random classification model per family is exported by `training.export`
(the fp32 package the service serves: ORT's optimizer fuses what it recognises) and opened with
the service's own session options (`service.runtime.open_backend`, default Settings). Each
(family, batch) is then timed in `--rounds` interleaved rounds (every family once per round,
so drift on a noisy machine hits them alike): median milliseconds of one forward pass on rows
of random ids, every token real. Shapes ("same size" = the same layers, hidden size, heads and
feed-forward parameters):

    tiny  2 layers, hidden 128, 2 heads, FFN 512 (BERT-tiny)
    base  12 layers, hidden 768, 12 heads, FFN 3072 (BERT-base); ModernBERT's GeGLU gets an
          intermediate of 2048 (its Wi is 768 x 4096: the same parameters as BERT's two FFN
          matrices). DeBERTa with v3-base's options (256 log buckets over 512 positions, p2c +
          c2p, shared keys), ModernBERT with base's (a window of 128, every third layer
          global), MPNet with 32 relative buckets.

`--long T`: ModernBERT (base shape, a window of 128) on one row of T tokens against the same
tokens as rows of 512, in one run: what one long window costs next to the service's windows
(the exported graph computes local layers as masked full attention, O(T^2)).

Writes benchmarks/results/families.{json,md} (with --long: families-long.{json,md}).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer, normalizers, pre_tokenizers
from tokenizers.models import WordPiece
from tokenizers.processors import TemplateProcessing

from benchmarks.tiny import tiny_tokenizer, tiny_vocabulary
from heads.package import read_package
from service.runtime import open_backend
from service.settings import Settings
from training.config import BertConfig
from training.export import export_package
from training.model import HEADS

RESULTS = Path(__file__).parent / "results"
SHAPES = {  # layers, hidden, heads, FFN
    "tiny": (2, 128, 2, 512),
    "base": (12, 768, 12, 3072),
}
FAMILIES = ("bert", "deberta-v2", "modernbert", "mpnet")
BATCHES = ((1, 128), (32, 128), (1, 512), (8, 512))  # (rows, tokens per row)
MAX_LENGTH = 512


def mpnet_tokenizer() -> Tokenizer:
    """tiny_vocabulary() under MPNet's specials and template: <s> a </s>, <pad> = 1."""
    specials = ["<s>", "<pad>", "</s>", "[UNK]", "<mask>"]
    words = [t for t in tiny_vocabulary() if not (t.startswith("[") and t.endswith("]"))]
    vocab = {t: i for i, t in enumerate(dict.fromkeys([*specials, *words]))}
    tok = Tokenizer(WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = TemplateProcessing(
        single="<s> $A </s>",
        pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", 0), ("</s>", 2)],
    )
    return tok


def config(family: str, shape: str, vocab_size: int) -> BertConfig:
    layers, hidden, heads, ffn = SHAPES[shape]
    base = dict(
        vocab_size=vocab_size,
        num_hidden_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        intermediate_size=ffn,
        max_position_embeddings=MAX_LENGTH,
        id2label={0: "negative", 1: "positive"},
    )
    if family == "bert":
        return BertConfig(**base)
    if family == "deberta-v2":
        v3 = dict(relative_attention=True, position_buckets=256, max_relative_positions=512,
                  pos_att_type=["p2c", "c2p"], share_att_key=True, norm_rel_ebd="layer_norm",
                  position_biased_input=False)  # fmt: skip
        return BertConfig(
            **base, model_type=family, type_vocab_size=0, layer_norm_eps=1e-7, extra=v3
        )
    if family == "modernbert":
        # GeGLU: Wi is H x 2I, Wo I x H; I = 2/3 FFN gives BERT's FFN parameter count
        return BertConfig(
            **(base | {"intermediate_size": 2 * ffn // 3, "pad_token_id": 0}),
            model_type=family,
            type_vocab_size=0,
            layer_norm_eps=1e-5,
            hidden_dropout_prob=0.0,
            extra={"local_attention": 128, "global_attn_every_n_layers": 3},
        )
    return BertConfig(
        **(base | {"max_position_embeddings": MAX_LENGTH + 2}),
        model_type=family,
        pad_token_id=1,
        type_vocab_size=0,
        extra={"relative_attention_num_buckets": 32},
    )


def build(family: str, shape: str, out: Path) -> Path:
    tok = mpnet_tokenizer() if family == "mpnet" else tiny_tokenizer()
    torch.manual_seed(0)
    model = HEADS["classification"](config(family, shape, tok.get_vocab_size())).eval()
    path = out / f"{family}-{shape}"
    export_package(model, "classification", path, tokenizer=tok, max_seq_length=MAX_LENGTH,
                   verbose=False)  # fmt: skip
    return path


def feeds(rows: int, length: int, names: list[str], vocab: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    ids = rng.integers(5, vocab, (rows, length), dtype=np.int64)
    ids[:, 0], ids[:, -1] = 2, 3  # a start and an end token, as rows have
    batch = {
        "input_ids": ids,
        "attention_mask": np.ones_like(ids),
        "token_type_ids": np.zeros_like(ids),
    }
    return {n: batch[n] for n in names}


def time_once(backend: Any, batch: dict[str, np.ndarray], repeats: int) -> float:
    """Median milliseconds of one forward pass over `repeats` passes."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        backend.run(batch)
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def long_rows(length: int, rounds: int, out: Path, settings: Settings) -> int:
    """ModernBERT base: 1 x `length` tokens against length / 512 rows of 512."""
    tok = tiny_tokenizer()
    cfg = config("modernbert", "base", tok.get_vocab_size()).replace(max_position_embeddings=length)
    torch.manual_seed(0)
    model = HEADS["classification"](cfg).eval()
    with tempfile.TemporaryDirectory() as tmp:
        export_package(model, "classification", Path(tmp) / "p", tokenizer=tok,
                       max_seq_length=length, verbose=False)  # fmt: skip
        package = read_package(Path(tmp) / "p")
        backend, _ = open_backend(package, settings)
        names = [i["name"] for i in package.inputs]
        shapes = [(1, length), (length // 512, 512)]
        samples: dict[tuple[int, int], list[float]] = {s: [] for s in shapes}
        for _ in range(rounds):
            for rows, tokens in shapes:
                batch = feeds(rows, tokens, names, 200)
                time_once(backend, batch, 1)
                samples[rows, tokens].append(time_once(backend, batch, 3))
    ms = {s: statistics.median(v) for s, v in samples.items()}
    lines = [
        f"# ModernBERT base: one row of {length} tokens vs rows of 512 "
        f"(median of {rounds} interleaved rounds)",
        "",
        "| batch | ms |",
        "|---|---|",
        *(f"| {r} x {t} | {m:.0f} |" for (r, t), m in ms.items()),
    ]
    out.mkdir(parents=True, exist_ok=True)
    (out / "families-long.md").write_text("\n".join(lines) + "\n")
    (out / "families-long.json").write_text(json.dumps({f"{r}x{t}": m for (r, t), m in ms.items()}))
    print("\n".join(lines))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.families", description=__doc__.split("\n\n")[0])  # fmt: skip
    ap.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    ap.add_argument(
        "--seconds", type=float, default=2.0, help="timed per (family, batch) per round"
    )
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--long", type=int, help="time ModernBERT on one row of this many tokens")
    args = ap.parse_args(argv)
    settings = Settings()
    if args.long:
        return long_rows(args.long, args.rounds, args.out, settings)
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for shape in args.shapes:
            backends = {}
            for family in FAMILIES:
                t0 = time.perf_counter()
                package = read_package(build(family, shape, Path(tmp)))
                backend, _ = open_backend(package, settings)
                fused = package.source.get("fusion", {}).get("ops", {})
                backends[family] = (backend, package, {k: v for k, v in fused.items() if v})
                print(f"{shape} {family}: exported in {time.perf_counter() - t0:.0f}s, "
                      f"fused {backends[family][2]}", flush=True)  # fmt: skip
            for rows, length in BATCHES:
                samples: dict[str, list[float]] = {f: [] for f in FAMILIES}
                for _ in range(args.rounds):
                    for family, (backend, package, _fused) in backends.items():
                        names = [i["name"] for i in package.inputs]
                        batch = feeds(rows, length, names, 200)
                        first = time_once(backend, batch, 1)  # warm: also sizes the repeats
                        repeats = max(3, min(50, int(args.seconds * 1000 / max(first, 1e-3))))
                        samples[family].append(time_once(backend, batch, repeats))
                bert = statistics.median(samples["bert"])
                for family in FAMILIES:
                    ms = statistics.median(samples[family])
                    results.append(dict(shape=shape, family=family, rows=rows, tokens=length,
                                        ms=ms, seq_per_s=rows * 1000 / ms, vs_bert=ms / bert,
                                        fused=backends[family][2]))  # fmt: skip
                    print(f"{shape} {family} {rows}x{length}: {ms:.1f} ms "
                          f"({ms / bert:.2f}x BERT)", flush=True)  # fmt: skip
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")), platform.processor())  # fmt: skip
    meta = dict(cpu=cpu, cores=torch.get_num_threads(), rounds=args.rounds,
                intra_op_threads=settings.intra_op_threads)  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "families.json").write_text(json.dumps(dict(meta=meta, results=results), indent=1))
    lines = [
        f"# Family speed: ONNX Runtime sessions as the service opens them ({cpu}, "
        f"{meta['cores']} cores, median of {args.rounds} interleaved rounds)",
        "",
        "| shape | family | batch (rows x tokens) | ms per batch | sequences/s | x BERT time |",
        "|---|---|---|---|---|---|",
        *(
            f"| {r['shape']} | {r['family']} | {r['rows']} x {r['tokens']} | {r['ms']:.1f} | "
            f"{r['seq_per_s']:.1f} | {r['vs_bert']:.2f} |"
            for r in results
        ),  # fmt: skip
        "",
        "Fused operators (ORT's BERT optimizer, per graph): "
        + "; ".join(
            f"{r['shape']} {r['family']}: {r['fused']}"
            for r in results
            if r["rows"] == 1 and r["tokens"] == 128
        ),
    ]
    (args.out / "families.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out / 'families.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
