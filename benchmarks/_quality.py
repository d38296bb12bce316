"""What int8 costs in answers: every variant runs the same real inputs in-process (the
service's sessions and rows), and each is compared with fp32 and, where the data has gold
labels the package can be scored on, with the gold.

| task                 | agreement with fp32                       | task metric (per variant)         |
|----------------------|-------------------------------------------|-----------------------------------|
| classification       | same top label                            | SST-2 dev accuracy (SST-2 labels) |
| embedding            | cosine of the vectors (mean, min)         | STS-B dev Spearman (cosine)       |
| token-classification | same label per real token                 | -                                 |
| question-answering   | same answer span (service's postprocess)  | -                                 |

A package with random heads has no task metric worth the name: agreement is then what int8
changes, measured on real text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._data import SST2_LABELS, Item
from benchmarks._engine import feeds_for, open_session
from heads.package import ModelPackage
from heads.rows import ModelRow, Outputs, load_package_tokenizer, pad_id
from heads.tasks import embed, qa
from service.registry import sequence_outputs
from training.data.pairs import ScoredPair, read_pairs
from training.metrics import spearman

BATCH = 32


def row_outputs(
    package: ModelPackage, variant: str, rows: list[ModelRow], threads: int
) -> list[Outputs]:
    """Each row's outputs, as the batcher hands them over (padding cut off), in input order."""
    backend = open_session(package.variant_path(variant), threads, spinning=False)
    tok = load_package_tokenizer(package.tokenizer_path)
    per_token = sequence_outputs(package)
    names = [o.name for o in backend.session.get_outputs()]
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
    out: list[Outputs | None] = [None] * len(rows)
    for at in range(0, len(order), BATCH):
        idx = order[at : at + BATCH]
        feeds = feeds_for(backend, [rows[i] for i in idx], pad_id(package.pad_token_id, tok))
        values = backend.session.run(names, feeds)
        for k, i in enumerate(idx):
            n = len(rows[i])
            out[i] = {
                name: v[k, :n] if name in per_token else v[k]
                for name, v in zip(names, values, strict=True)
            }
    return out  # type: ignore[return-value]


def compare(
    package: ModelPackage, items: list[Item], variants: list[str], threads: int, data: Path
) -> dict[str, Any]:
    rows = [r for item in items for r in item.rows]
    outs = {v: row_outputs(package, v, rows, threads) for v in variants}
    result: dict[str, Any] = {"inputs": len(items), "sequences": len(rows), "variants": {}}
    ref = outs["fp32"]
    for v in variants:
        result["variants"][v] = _score(package, items, outs[v], ref, threads, v, data)
    return result


def _score(
    package: ModelPackage,
    items: list[Item],
    out: list[Outputs],
    ref: list[Outputs],
    threads: int,
    variant: str,
    data: Path,
) -> dict[str, Any]:
    task = package.task
    if task == "classification":
        pred = np.array([o["logits"].argmax() for o in out])
        gold_pred = np.array([o["logits"].argmax() for o in ref])
        scores: dict[str, Any] = {"label_agreement": round(float((pred == gold_pred).mean()), 4)}
        if package.labels == SST2_LABELS and all(i.label for i in items):
            gold = np.array([SST2_LABELS.index(i.label) for i in items])  # type: ignore[arg-type]
            scores["sst2_dev_accuracy"] = round(float((pred == gold).mean()), 4)
        return scores
    if task == "embedding":
        a = np.stack([o["embeddings"] for o in out])
        b = np.stack([o["embeddings"] for o in ref])
        a, b = embed.postprocess(a, True), embed.postprocess(b, True)
        cos = (a * b).sum(-1)
        return {
            "cosine_mean": round(float(cos.mean()), 5),
            "cosine_min": round(float(cos.min()), 5),
            "stsb_dev_spearman": round(_stsb(package, variant, threads, data), 4),
        }
    if task == "token-classification":
        same = [
            np.array_equal(o["logits"].argmax(-1), r["logits"].argmax(-1))
            for o, r in zip(out, ref, strict=True)
        ]
        tokens = [
            (o["logits"].argmax(-1) == r["logits"].argmax(-1))
            for o, r in zip(out, ref, strict=True)
        ]
        return {
            "token_label_agreement": round(float(np.concatenate(tokens).mean()), 4),
            "sentence_agreement": round(float(np.mean(same)), 4),
        }
    # question-answering: the service's own span decoding on each variant's logits
    agree, at = [], 0
    for item in items:
        n = len(item.rows)
        a = qa.postprocess(item.prepared, out[at : at + n])
        b = qa.postprocess(item.prepared, ref[at : at + n])
        agree.append(bool(a and b and (a[0]["start"], a[0]["end"]) == (b[0]["start"], b[0]["end"])))
        at += n
    return {"answer_agreement": round(float(np.mean(agree)), 4)}


def _stsb(package: ModelPackage, variant: str, threads: int, data: Path) -> float:
    """STS-B dev: Spearman of the cosine of the two sentences' embeddings with the gold."""
    pairs = [p for p in read_pairs(data / "stsb" / "dev.tsv") if isinstance(p, ScoredPair)]
    tok = load_package_tokenizer(package.tokenizer_path)
    texts = [t for p in pairs for t in (p.sentence1, p.sentence2)]
    rows = embed.preprocess(tok, texts, package.max_seq_length).sequences
    out = row_outputs(package, variant, rows, threads)
    vectors = embed.postprocess(np.stack([o["embeddings"] for o in out]), True)
    cos = (vectors[0::2] * vectors[1::2]).sum(-1)
    return spearman(cos.tolist(), [p.score for p in pairs])
