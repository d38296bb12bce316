"""What the rerankers share once each row has its score: a document scored by several windows
scores as its best one ("MaxP", Dai & Callan 2019), and the answer lists the documents best
first, at most `top_n`, naming a windowed document's best window by its characters. The
cross-encoder (heads.tasks.rerank) and late interaction (heads.tasks.late_interaction) both
answer so."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Window", "ranked"]


@dataclass(frozen=True, slots=True)
class Window:
    """Where a windowed document's best window lies, as its answer names it."""

    start: int  # character offsets of the window's tokens in the document
    end: int


def ranked(
    scores: Sequence[float] | np.ndarray,
    bounds: list[int],
    spans: list[Window | None],
    top_n: int | None,
) -> list[dict[str, Any]]:
    """Per-row scores, document i's rows [bounds[i], bounds[i + 1]), each row's window (None
    when its document was not windowed) -> `{index, score[, window]}` best first (ties keep
    the documents' order), at most top_n."""
    best: list[tuple[float, Window | None]] = []
    for first, end in zip(bounds, bounds[1:], strict=False):
        k = first + int(np.argmax(scores[first:end]))  # MaxP: the best window
        best.append((float(scores[k]), spans[k]))
    order = sorted(range(len(best)), key=lambda i: -best[i][0])  # stable: ties keep order
    answer = []
    for i in order[:top_n]:
        item: dict[str, Any] = {"index": i, "score": best[i][0]}
        if (span := best[i][1]) is not None:
            item["window"] = {"start": span.start, "end": span.end}
        answer.append(item)
    return answer
