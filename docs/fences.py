"""The fenced code blocks of a Markdown text, read as CommonMark reads them, and refused where a
reader would be misled.

A fence that never closes turns the rest of the page into code, and a closing fence with text
after it (```` ``` `k8s/kserve` holds ...````) does not close anything: CommonMark takes it as
a line of code, so on a forge the block runs on to the next bare fence. README.md once showed
~200 lines as code so. `code_blocks` raises on both; tests/test_readme.py reads every example
through it, and docs/hooks.py fails `make docs` on it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})(?P<rest>.*)$")


class FenceError(ValueError):
    pass


@dataclass
class Block:
    info: str  # the fence's language word ("bash", "python", ...; "" when none)
    code: str  # the lines between the fences, the fence's indentation taken off
    line: int  # where the opening fence is (1-based)


def code_blocks(text: str, where: str = "text") -> list[Block]:
    """Every fenced block of `text`, in order. Raises FenceError for a fence left open and for
    text after a closing fence, naming the line (`where`: the file, for the message)."""
    blocks: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        i += 1
        if opening is None:
            continue
        fence, indent = opening["fence"], len(opening["indent"])
        info = opening["rest"].strip()
        if fence[0] == "`" and "`" in info:
            continue  # not a fence: an inline code span that starts a line (CommonMark 4.5)
        start, body = i, []
        while True:
            if i == len(lines):
                raise FenceError(
                    f"{where}:{start}: the {fence} fence opened here is never closed: "
                    "the rest of the page would show as code"
                )
            line = lines[i]
            i += 1
            closing = FENCE.match(line)
            if closing and closing["fence"][0] == fence[0] and len(closing["fence"]) >= len(fence):
                if not closing["rest"].strip():
                    break
                raise FenceError(
                    f"{where}:{i}: text after a closing fence ({line.strip()[:40]!r}): "
                    f"it does not close the block opened at line {start}; put the text on "
                    "its own line"
                )
            body.append(line[indent:] if not line[:indent].strip() else line.lstrip())
        word = info.split()[0] if info else ""
        blocks.append(Block(word, "\n".join(body) + "\n" if body else "", start))
    return blocks
