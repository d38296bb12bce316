"""How far a lossy variant's answers may stray from fp32's: the gate `training.quantize`
applies before it writes an int8 file, and the service checks again when it loads one.

package.json records, per lossy variant, `parity.<variant>.agreement`: the metrics measured
against the fp32 graph on the export's sample of real text (examples/data), the gate they were
held to, and whether they passed. A variant with no record (a package exported before the gate)
or one below the gate is served with a warning.
"""

from __future__ import annotations

from typing import Any

# gate kind -> metric -> the least it may be, on the export's sample (training.quantize).
# Kinds are the package tasks, "sparse" for a sparse embedding (SPLADE) and "rank" for a
# classifier with one logit (a cross-encoder reranker, a regression), whose scores order inputs.
#
# Answers a user reads as a choice (a label, an entity, a span, a filled-in word) must be the
# same as fp32's on 99% of the sample (issue 46's bar): at 238 classification inputs that allows
# 2 flips, at 40 QA questions none. NER counts entity spans (label, start, end) pooled over the
# sample, both sides' spans in the denominator.
#
# Embeddings (dense and sparse alike: both are compared by dot products) are gated on their
# cosine to fp32's, mean >= 0.99 and worst >= 0.97: over every int8 file measured
# (benchmarks/int8_gate.py and the choices it tries), that bar passed only files whose STS-B dev
# Spearman stayed within 0.3 points of fp32's: all-mpnet-base-v2 with 12, 18, 24 or 36 of its
# 72 products in fp32 (cosine mean 0.990-0.998, worst 0.972-0.993: 0.04-0.26 points),
# all-MiniLM-L6-v2 quantised whole (0.992 / 0.977: 0.09), the SPLADE model (0.998 / 0.993:
# 0.05). It failed every file off by more: all-mpnet-base-v2 whole (0.880 / 0.772: 0.63
# points) or with 3 products in fp32 (0.931 / 0.867: 0.69), the SPLADE model with 8-bit
# weights (0.987 / 0.956: 0.42). It is conservative: mpnet with 6, 9 or 15 in fp32 (worst
# 0.918-0.968) fails it at 0.11-0.26 points.
# A sparse vector's support (which terms are non-zero) and its top-10 terms are recorded, not
# gated: the terms int8 adds or drops sit at the relu's edge, 0.4% of the weight (SPLADE model,
# mean over the sample), and no int8 choice keeps them: even one int8 product changed them.
GATES: dict[str, dict[str, float]] = {
    "classification": {"top1_agreement": 0.99},
    "token-classification": {"entity_agreement": 0.99},
    "question-answering": {"span_agreement": 0.99},
    "fill-mask": {"top1_agreement": 0.99},
    "embedding": {"cosine_mean": 0.99, "cosine_min": 0.97},
    "sparse": {"cosine_mean": 0.99, "cosine_min": 0.97},
    "rank": {"rank_agreement": 0.99},  # Spearman of int8's scores with fp32's
}
GATED_VARIANTS = ("int8",)  # lossy variants that must carry an agreement record


def gate_kind(task: str, sparse: bool = False, num_outputs: int | None = None) -> str:
    """The GATES key for a package's head."""
    if task == "embedding" and sparse:
        return "sparse"
    if task == "classification" and num_outputs == 1:
        return "rank"
    return task


def passes(metrics: dict[str, float], gate: dict[str, float]) -> bool:
    return all(metrics.get(name, float("-inf")) >= least for name, least in gate.items())


def shortfall(metrics: dict[str, float], gate: dict[str, float]) -> str:
    """The metrics below the gate, as a readable clause ("cosine_min 0.912 < 0.97")."""
    return ", ".join(
        f"{name} {metrics.get(name, float('nan')):.4g} < {least:g}"
        for name, least in gate.items()
        if not metrics.get(name, float("-inf")) >= least
    )


def effective_gate(record: dict[str, Any]) -> dict[str, float]:
    """The gate a recorded agreement is held to: per metric the stricter of the one recorded at
    export and the one this code sets for its kind (a gate raised since is not dodged)."""
    recorded = dict(record.get("gate") or {})
    for name, least in GATES.get(record.get("kind", ""), {}).items():
        recorded[name] = max(least, recorded.get(name, least))
    return recorded


def agreement_problem(record: dict[str, Any] | None, variant: str) -> str | None:
    """Why serving `variant` needs a warning (None: it does not): a gated variant with no
    recorded agreement (exported before the gate), or one below its gate."""
    if variant not in GATED_VARIANTS:
        return None
    if record is None or not isinstance(record.get("metrics"), dict):
        return (
            f"{variant} has no recorded agreement with fp32 (exported before the quality "
            "gate): its answers may differ from fp32's unmeasured; re-export to measure them"
        )
    gate = effective_gate(record)
    if not passes(record["metrics"], gate):
        return f"{variant} agrees with fp32 below its gate ({shortfall(record['metrics'], gate)})"
    return None
