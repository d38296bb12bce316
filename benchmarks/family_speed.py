"""MPNet, DeBERTa-v2 and ModernBERT against BERT of the same size, as the service runs them on
CPU, and what rewriting their attention into ONNX Runtime's contrib ops would buy (issue 46).

    python -m benchmarks.family_speed                          # all four, ~15 min on 2 cores
    python -m benchmarks.family_speed --rounds 20 --work runs/family-speed   # keep the exports
    python -m benchmarks.family_speed --graph my-model=runs/x/model.onnx  # time another graph
    python -m benchmarks.family_speed --before deberta-v2=old/model.onnx  # a change, side by side

Each family is a random checkpoint of BERT-base's shape (12 layers, hidden 768, 12 heads, FFN
3072; ModernBERT's GeGLU an intermediate of 2048, the same parameters) built with transformers'
own config and model classes and `save_pretrained`, a classification head, exported by
training.export (the fp32 graph the service loads). DeBERTa has v3-base's options (256 log
buckets over 512 positions, c2p + p2c, shared keys), ModernBERT base's (a window of 128, every
third layer global), MPNet 32 relative buckets.

Graphs timed, side by side:
    <family>          model.onnx as training.export wrote it (ORT's BERT fusion: BERT's attention
                      is one Attention node; the others' stays plain nodes)
    <family>+mha      that graph with its attention rewritten to MultiHeadAttention
                      (benchmarks.attention_rewrite)
    mpnet+attention   MPNet's rewritten to Attention, one QKV GEMM (int8 would lose its bias)
    NAME              each --graph NAME=PATH
    FAMILY@before     each --before FAMILY=PATH: the family's graph before a change (an older
                      training.export's, same checkpoint), its export's "x before" against it

Timing: sessions opened as the service opens them (benchmarks._engine.open_session: the
service's graph optimisation, --threads intra-op threads, no spinning); rows of random ids,
every token real, at batch 1 and 8 x 32 and 128 tokens. Every round runs every graph on every
shape in turn (order reversed every other round), so load from other processes falls on all of
them alike; each measurement records the process's CPU time and the wall time per batch.
Reported: medians over rounds, sequences/s by CPU time (what one core does when it is not
shared) and by wall time, and time relative to BERT (or to the graph before the rewrite) as the
median of the per-round ratios. The load average before and after is recorded.

Writes benchmarks/results/family_speed.{json,md}.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from benchmarks._engine import open_session
from benchmarks._machine import cpu_name
from benchmarks._paths import REPO, write_results
from benchmarks.attention_rewrite import rewrite
from benchmarks.families import mpnet_tokenizer
from benchmarks.tiny import tiny_tokenizer
from training.export import export_package

RESULTS = REPO / "benchmarks" / "results"
FAMILIES = ("bert", "mpnet", "deberta-v2", "modernbert")
SHAPES = ((1, 32), (1, 128), (8, 32), (8, 128))  # (rows, tokens)
SIZES = {"base": (12, 768, 12, 3072), "tiny": (2, 128, 2, 512)}  # layers, hidden, heads, FFN
MIN_SECONDS = 0.15  # a measurement repeats a batch until about this long
SHOWN_OPS = ("Attention", "MultiHeadAttention", "Softmax", "SkipLayerNormalization",
             "LayerNormalization", "BiasGelu", "Gelu", "EmbedLayerNormalization")  # fmt: skip


def checkpoint(family: str, folder: Path, size: str = "base") -> Path:
    """A random classification checkpoint of `family` and BERT-`size`'s shape, saved by
    transformers (model and fast tokenizer) into `folder`."""
    layers, hidden, heads, ffn = SIZES[size]
    import torch
    import transformers

    if family == "mpnet":  # <s> a </s></s> b </s>, <pad> = 1
        tok, specials = mpnet_tokenizer(), dict(bos_token="<s>", eos_token="</s>",
            unk_token="[UNK]", sep_token="</s>", pad_token="<pad>", cls_token="<s>",
            mask_token="<mask>")  # fmt: skip
    else:  # [CLS] a [SEP] b [SEP], [PAD] = 0
        tok, specials = tiny_tokenizer(), dict(unk_token="[UNK]", sep_token="[SEP]",
            pad_token="[PAD]", cls_token="[CLS]", mask_token="[MASK]")  # fmt: skip
    extra = {"model_input_names": ["input_ids", "attention_mask"]} if family != "bert" else {}
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, model_max_length=512, **specials, **extra
    )
    shape = dict(vocab_size=len(fast), hidden_size=hidden, num_hidden_layers=layers,
                 num_attention_heads=heads, intermediate_size=ffn,
                 id2label={0: "negative", 1: "positive"}, label2id={"negative": 0, "positive": 1})  # fmt: skip
    if family == "bert":
        config = transformers.BertConfig(max_position_embeddings=512, **shape)
    elif family == "mpnet":
        config = transformers.MPNetConfig(max_position_embeddings=514, pad_token_id=1, **shape)
    elif family == "deberta-v2":  # DeBERTa-v3-base's options
        config = transformers.DebertaV2Config(
            max_position_embeddings=512, relative_attention=True, position_buckets=256,
            max_relative_positions=512, pos_att_type=["p2c", "c2p"], share_att_key=True,
            norm_rel_ebd="layer_norm", position_biased_input=False, type_vocab_size=0,
            pad_token_id=0, layer_norm_eps=1e-7, **shape,
        )  # fmt: skip
    else:  # ModernBERT-base's options; GeGLU's Wi is H x 2I: I = 2/3 FFN, BERT's parameters
        ids = fast.convert_tokens_to_ids
        config = transformers.ModernBertConfig(
            **(shape | {"intermediate_size": 2 * ffn // 3}), max_position_embeddings=8192,
            local_attention=128, global_attn_every_n_layers=3, pad_token_id=ids("[PAD]"),
            cls_token_id=ids("[CLS]"), sep_token_id=ids("[SEP]"), bos_token_id=ids("[CLS]"),
            eos_token_id=ids("[SEP]"),
        )  # fmt: skip
    prefix = {
        "bert": "Bert",
        "mpnet": "MPNet",
        "deberta-v2": "DebertaV2",
        "modernbert": "ModernBert",
    }
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = getattr(transformers, f"{prefix[family]}ForSequenceClassification")(config)
    model.eval().save_pretrained(folder)
    fast.save_pretrained(folder)
    return folder


def build(family: str, work: Path, size: str = "base") -> dict[str, Path]:
    """`family`'s package in work/<size>/<family> (reused when there), and the rewritten
    graphs beside it: graph name -> ONNX file."""
    work = work / size / family
    package = work / "package"
    if not (package / "package.json").is_file():
        t0 = time.perf_counter()
        folder = checkpoint(family, work / "checkpoint", size)
        export_package(folder, "classification", package, max_seq_length=512, verbose=False)
        print(f"{family}: exported in {time.perf_counter() - t0:.0f} s", flush=True)
    graphs = {family: package / "model.onnx"}
    variants = {"mha": False, "attention": True} if family == "mpnet" else {"mha": False}
    for name, packed in variants.items() if family != "bert" else ():
        path = work / f"model.{name}.onnx"
        if not path.is_file():
            model = onnx.load(str(graphs[family]))
            written = rewrite(model, SIZES[size][2], packed=packed)
            if not any(written.values()):
                continue
            onnx.save(model, str(path))
        graphs[f"{family}+{name}"] = path
    return graphs


def feeds(rows: int, tokens: int, vocab: int, seed: int = 0) -> dict[str, np.ndarray]:
    ids = np.random.default_rng(seed).integers(5, vocab, (rows, tokens), dtype=np.int64)
    ids[:, 0] = 2  # a start token, as rows have
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": 0 * ids}


def measure(backend: Any, batch: dict[str, np.ndarray], repeats: int) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one forward pass, over `repeats` passes."""
    c0, t0 = time.process_time(), time.perf_counter()
    for _ in range(repeats):
        backend.run(batch)
    return (time.process_time() - c0) / repeats, (time.perf_counter() - t0) / repeats


def ops(path: Path) -> dict[str, int]:
    counted = Counter(n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node)
    return {op: counted[op] for op in SHOWN_OPS if counted[op]}


def run(graphs: dict[str, Path], rounds: int, threads: int) -> dict[str, Any]:
    sessions = {name: open_session(path, threads, spinning=False) for name, path in graphs.items()}
    batches = {s: feeds(*s, vocab=400) for s in SHAPES}
    repeats = {}
    for shape, batch in batches.items():
        for name, backend in sessions.items():
            backend.run(batch)  # a new shape's first run allocates
            repeats[name, shape] = max(1, round(MIN_SECONDS / measure(backend, batch, 1)[1]))
    samples: dict[tuple[str, tuple[int, int]], list[tuple[float, float]]] = {
        (n, s): [] for n in sessions for s in SHAPES
    }
    for r in range(rounds):
        order = list(sessions.items())[:: 1 if r % 2 == 0 else -1]
        for shape, batch in batches.items():
            for name, backend in order:
                samples[name, shape].append(measure(backend, batch, repeats[name, shape]))
        print(f"round {r + 1}/{rounds}", flush=True)
    return samples


def paired(samples: dict, name: str, to: str, shape: tuple[int, int]) -> float | None:
    """`name`'s CPU time over `to`'s on `shape`: the median of the per-round ratios."""
    base, runs = samples.get((to, shape)), samples[name, shape]
    if base is None or to == name:
        return None
    return round(statistics.median(a[0] / b[0] for a, b in zip(runs, base, strict=True)), 3)


def summarise(samples: dict, graphs: dict[str, Path]) -> list[dict[str, Any]]:
    """One row per (graph, shape). x_before: a rewritten graph (FAMILY+how) against the
    export it started from, a family's export against FAMILY@before (--before) if timed."""
    rows = []
    for (name, shape), runs in samples.items():
        family, plus, _ = name.partition("+")
        before = family if plus else f"{name}@before"
        cpu, wall = (statistics.median(x[k] for x in runs) for k in (0, 1))
        rows.append({"graph": name, "rows": shape[0], "tokens": shape[1],
                     "cpu_ms": round(1000 * cpu, 1), "wall_ms": round(1000 * wall, 1),
                     "seq_per_cpu_s": round(shape[0] / cpu, 2),
                     "seq_per_s": round(shape[0] / wall, 2),
                     "x_bert": paired(samples, name, "bert", shape),
                     "x_before": paired(samples, name, before, shape),
                     "ops": ops(graphs[name])})  # fmt: skip
    return rows


def markdown(result: dict[str, Any]) -> str:
    meta = result["meta"]
    lines = [
        f"# Families against BERT of the same size ({meta['size']}), CPU ({meta['cpu']}, "
        f"{meta['cores']} cores, "
        f"{meta['threads']} intra-op thread(s))",
        "",
        f"`{meta['command']}`; median of {meta['rounds']} interleaved rounds; load average "
        f"{meta['load_before']} before, {meta['load_after']} after. seq/s (CPU): sequences per "
        "second of CPU time, what one unshared core does; seq/s (wall): as measured on the "
        "shared machine. x BERT: time relative to BERT's, median of the per-round ratios "
        "(x before: to the graph the rewrite started from).",
        "",
        "| graph | batch | seq/s (CPU) | seq/s (wall) | x BERT | x before |",
        "|---|---|---|---|---|---|",
    ]
    for r in sorted(result["results"], key=lambda r: (r["rows"], r["tokens"])):
        x_bert, before = (f"{r[k]:.2f}" if r[k] is not None else "" for k in ("x_bert", "x_before"))
        lines.append(
            f"| {r['graph']} | {r['rows']} x {r['tokens']} | {r['seq_per_cpu_s']:.2f} | "
            f"{r['seq_per_s']:.2f} | {x_bert} | {before} |"
        )
    lines += ["", "Operators in each graph (counted from its nodes):", ""]
    seen = {}
    for r in result["results"]:
        seen.setdefault(r["graph"], r["ops"])
    lines += [f"- {g}: {', '.join(f'{k} {v}' for k, v in o.items())}" for g, o in seen.items()]
    return "\n".join(lines) + "\n"


def command(argv: list[str] | None) -> str:
    """The command line as run, a path given in it shown as PATH (results name no machine's
    paths)."""
    words = [w.split("=")[0] + "=PATH" if "=" in w and "/" in w else "PATH" if "/" in w else w
             for w in (sys.argv[1:] if argv is None else argv)]  # fmt: skip
    return " ".join(["python -m benchmarks.family_speed", *words])


def graph_option(text: str) -> tuple[str, Path]:
    name, sep, path = text.partition("=")
    if not sep or not name or not Path(path).is_file():
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=PATH of an ONNX file")
    return name, Path(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.family_speed",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--families", nargs="+", choices=FAMILIES, default=list(FAMILIES),
                    help="which families (default: all; bert is the reference)")  # fmt: skip
    ap.add_argument("--size", choices=SIZES, default="base",
                    help="base: BERT-base's shape (default); tiny: 2 x 128, a smoke test")  # fmt: skip
    ap.add_argument("--rounds", type=int, default=12, help="interleaved rounds (default 12)")
    ap.add_argument("--threads", type=int, default=1,
                    help="intra-op threads per session (default 1: one service lane)")  # fmt: skip
    ap.add_argument("--graph", type=graph_option, action="append", default=[],
                    help="NAME=PATH: also time this ONNX graph (repeatable)")  # fmt: skip
    ap.add_argument("--before", type=graph_option, action="append", default=[],
                    help="FAMILY=PATH: that family's graph before a change, timed beside as "
                         "FAMILY@before (its rows' x before)")  # fmt: skip
    ap.add_argument("--work", type=Path, default=None,
                    help="keep checkpoints and exports here and reuse them (default: a temp dir)")  # fmt: skip
    ap.add_argument("--out", type=Path, default=RESULTS,
                    help="results folder (default benchmarks/results)")  # fmt: skip
    args = ap.parse_args(argv)
    families = list(dict.fromkeys(["bert", *args.families]))
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        graphs = {name: path for f in families for name, path in build(f, work, args.size).items()}
        graphs |= dict(args.graph) | {f"{f}@before": p for f, p in args.before}
        load_before = os.getloadavg()
        samples = run(graphs, args.rounds, args.threads)
        load_after = os.getloadavg()
        result = {
            "meta": {
                "cpu": cpu_name(),
                "cores": len(os.sched_getaffinity(0)),
                "threads": args.threads,
                "size": args.size,
                "rounds": args.rounds,
                "command": command(argv),
                "load_before": [round(x, 2) for x in load_before],
                "load_after": [round(x, 2) for x in load_after],
                "extra_graphs": [name for name, _ in args.graph],
                "before_graphs": [f"{name}@before" for name, _ in args.before],
            },
            "results": summarise(samples, graphs),
        }
    path = write_results(args.out, "family_speed", result, markdown(result))
    print(path.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
