"""Evaluation metrics, as plain functions over labels, tags, strings and numbers.

Each follows the reference implementation people compare against, rewritten here:

- classification: accuracy, and F1 of the positive class (id 1) for binary tasks (GLUE);
- token classification: entity-level precision / recall / F1 over strict IOB2 spans, as
  `seqeval.metrics.classification_report(mode="strict", scheme=IOB2)` counts them;
- question answering: the SQuAD v1.1 / v2.0 evaluation script's exact match and token F1;
- embedding: Spearman rank correlation (ties get their average rank, as scipy's).

    >>> entity_spans(["B-PER", "I-PER", "O", "I-LOC"])
    [('PER', 0, 2)]
    >>> squad_f1("the Eiffel tower", "Eiffel Tower in Paris")
    0.6666666666666666
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np

# --- classification ---------------------------------------------------------------------


def classification_scores(
    preds: Sequence[int] | np.ndarray, golds: Sequence[int] | np.ndarray, num_labels: int
) -> dict:
    """accuracy; for two labels also precision / recall / F1 of label id 1 (GLUE's F1)."""
    p, g = np.asarray(preds), np.asarray(golds)
    if len(p) != len(g) or len(g) == 0:
        raise ValueError(f"need as many predictions as gold labels (> 0), got {len(p)}, {len(g)}")
    scores = {"accuracy": float((p == g).mean())}
    if num_labels == 2:
        tp = int(((p == 1) & (g == 1)).sum())
        precision = tp / max(int((p == 1).sum()), 1)
        recall = tp / max(int((g == 1).sum()), 1)
        scores |= {"precision": precision, "recall": recall, "f1": _f1(precision, recall)}
    return scores


def _f1(precision: float, recall: float) -> float:
    return 2 * precision * recall / (precision + recall) if precision + recall else 0.0


# --- token classification ---------------------------------------------------------------


def to_iob2(tags: Sequence[str]) -> list[str]:
    """IOB1 (or IOB2) -> IOB2. In IOB1 an entity starts with I- and B- only separates two
    adjacent entities of one type; IOB2 starts every entity with B-. Valid IOB2 comes back
    unchanged, so the conversion is applied to every file without guessing its scheme."""
    out: list[str] = []
    prev = "O"
    for tag in tags:
        if tag.startswith("I-") and (prev == "O" or prev[2:] != tag[2:]):
            tag = "B-" + tag[2:]
        out.append(tag)
        prev = tag
    return out


def entity_spans(tags: Sequence[str], strict: bool = True) -> list[tuple[str, int, int]]:
    """IOB2 tags -> entities (type, start, end), end exclusive.

    strict (seqeval's mode="strict"): an entity starts at B-X and runs over the I-X that
    follow; an I-X with no B-X / I-X of the same type before it belongs to no entity.
    strict=False is conlleval's reading: such an I-X starts an entity.
    """
    spans: list[tuple[str, int, int]] = []
    kind: str | None = None
    start = 0
    for i, tag in enumerate([*tags, "O"]):
        prefix, _, typ = tag.partition("-")
        if kind is not None and not (prefix == "I" and typ == kind):
            spans.append((kind, start, i))
            kind = None
        if prefix == "B" or (prefix == "I" and kind is None and not strict):
            kind, start = typ, i
    return spans


def ner_scores(
    golds: Iterable[Sequence[str]], preds: Iterable[Sequence[str]], strict: bool = True
) -> dict:
    """Micro-averaged entity precision / recall / F1 over sentences, and F1 per entity type.
    An entity counts as found only when its type, start and end all match."""
    gold_set: set[tuple[int, str, int, int]] = set()
    pred_set: set[tuple[int, str, int, int]] = set()
    for n, (gold, pred) in enumerate(zip(golds, preds, strict=True)):
        if len(gold) != len(pred):
            raise ValueError(f"sentence {n}: {len(gold)} gold tags but {len(pred)} predicted")
        gold_set |= {(n, *span) for span in entity_spans(gold, strict)}
        pred_set |= {(n, *span) for span in entity_spans(pred, strict)}
    scores = _prf(gold_set, pred_set)
    for typ in sorted({s[1] for s in gold_set | pred_set}):
        of_type = _prf({s for s in gold_set if s[1] == typ}, {s for s in pred_set if s[1] == typ})
        scores[f"f1_{typ}"] = of_type["f1"]
    return scores


def _prf(gold: set, pred: set) -> dict:
    tp = len(gold & pred)
    precision = tp / len(pred) if pred else 0.0
    recall = tp / len(gold) if gold else 0.0
    return {"precision": precision, "recall": recall, "f1": _f1(precision, recall)}


# --- question answering -----------------------------------------------------------------

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """The SQuAD script's normalisation: lower case, drop punctuation, drop the articles
    a / an / the, collapse white space."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def squad_exact(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def squad_f1(prediction: str, gold: str) -> float:
    """Token-level F1 of the normalised strings. An empty side (SQuAD 2.0's no-answer) scores
    1 only when both are empty."""
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    if not pred_tokens or not gold_tokens:
        return float(pred_tokens == gold_tokens)
    same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if same == 0:
        return 0.0
    return _f1(same / len(pred_tokens), same / len(gold_tokens))


def squad_scores(predictions: Sequence[str], golds: Sequence[Sequence[str]]) -> dict:
    """exact_match and f1 in percent, each the maximum over a question's gold answers, averaged
    over questions. A question with no gold answer (SQuAD 2.0) is scored against ""."""
    if len(predictions) != len(golds) or not golds:
        raise ValueError(f"need one prediction per question (> 0), got {len(predictions)}")
    em = f1 = 0.0
    for pred, answers in zip(predictions, golds, strict=True):
        answers = list(answers) or [""]
        em += max(squad_exact(pred, a) for a in answers)
        f1 += max(squad_f1(pred, a) for a in answers)
    return {"exact_match": 100 * em / len(golds), "f1": 100 * f1 / len(golds)}


# --- embedding --------------------------------------------------------------------------


def rankdata(x: Sequence[float]) -> np.ndarray:
    """1-based ranks; tied values share the average of the ranks they span."""
    values = np.asarray(x, dtype=np.float64)
    order = np.argsort(values, kind="stable")
    _, first, counts = np.unique(values[order], return_index=True, return_counts=True)
    ranks = np.empty(len(values))
    ranks[order] = np.repeat(first + (counts + 1) / 2, counts)
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rho: Pearson correlation of the ranks. NaN when either side is constant."""
    if len(x) != len(y) or len(x) < 2:
        raise ValueError(f"need two equal-length sequences of >= 2 values, got {len(x)}, {len(y)}")
    rx, ry = rankdata(x), rankdata(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    denominator = np.sqrt((rx**2).sum() * (ry**2).sum())
    return float((rx * ry).sum() / denominator) if denominator else float("nan")
