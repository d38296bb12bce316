"""The training log every long run writes (JSON lines) and the PNG of its curves.

One row per line, each with a `step` and a `split` ("train", "eval", ...), and any numbers:

    >>> write_log_row("runs/x/log.jsonl", {"split": "train", "step": 10, "loss": 2.3, "lr": 1e-4})
    >>> write_log_row("runs/x/log.jsonl", {"split": "eval", "step": 10, "accuracy": 0.81})
    >>> plot_curves("runs/x/log.jsonl", "runs/x/curves.png")

The plot has a panel for every key with "loss" in its name, one for the other metrics and
one for the learning rate, each line labelled "split key".
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

# Keys that are bookkeeping, not curves: throughput and gradient norms stay in the log (thousands
# of tokens/s on the metrics panel's axis would flatten the accuracy curves beside them).
NOT_PLOTTED = {
    "step", "split", "epoch", "lr", "time", "elapsed_s", "tokens", "examples",
    "grad_norm", "steps_per_s", "seq_per_s", "tokens_per_s", "examples_per_s", "mfu",
}  # fmt: skip


def write_log_row(path: str | Path, row: dict[str, Any]) -> None:
    """Append one row; numpy scalars and paths are written as plain numbers and strings."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(row, default=_plain) + "\n")


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy / torch scalars
        return value.item()
    return str(value)


def read_log(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a log; a half-written last line (the run was killed mid-write) is skipped."""
    rows = []
    for line in Path(path).read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def _series(rows: list[dict[str, Any]]) -> dict[str, tuple[list[float], list[float]]]:
    """ "split key" -> (steps, values) for every finite number in the rows."""
    series: dict[str, tuple[list[float], list[float]]] = {}
    for row in rows:
        step = row.get("step")
        if not isinstance(step, int | float):
            continue
        for key, value in row.items():
            if key in NOT_PLOTTED or not isinstance(value, int | float) or isinstance(value, bool):
                continue
            if not math.isfinite(value):
                continue
            xs, ys = series.setdefault(f"{row.get('split', 'train')} {key}", ([], []))
            xs.append(step)
            ys.append(value)
    return series


def plot_curves(log_path: str | Path, png_path: str | Path, title: str | None = None) -> Path:
    """Draw the log's curves into a PNG (matplotlib, no display needed); returns its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_log(log_path)
    series = _series(rows)
    lr_rows = [r for r in rows if isinstance(r.get("lr"), float) and "step" in r]
    panels = {
        "loss": {k: v for k, v in series.items() if "loss" in k},
        "metrics": {k: v for k, v in series.items() if "loss" not in k},
        "learning rate": {"lr": ([r["step"] for r in lr_rows], [r["lr"] for r in lr_rows])},
    }
    panels = {name: lines for name, lines in panels.items() if any(xs for xs, _ in lines.values())}

    fig, axes = plt.subplots(1, max(len(panels), 1), figsize=(5 * max(len(panels), 1), 3.6))
    axes = [axes] if not hasattr(axes, "__len__") else list(axes)
    for ax, (name, lines) in zip(axes, panels.items(), strict=False):
        for label, (xs, ys) in lines.items():
            ax.plot(xs, ys, label=label, marker="o" if len(xs) < 20 else None, markersize=3)
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    png_path = Path(png_path)
    png_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png_path, dpi=100)
    plt.close(fig)
    return png_path
