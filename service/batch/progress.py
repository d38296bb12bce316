"""The progress line on stderr: rows done, rows per second, time left, bad rows.

    12,800 / 100,000 rows  13%  1,843 rows/s  47s left  2 bad

Redrawn in place on a terminal (at most 4 times a second); elsewhere (a log, CI) a line every
`every` seconds. Time left comes from the rows when the total is known (Parquet), else from
how far through the file the reader is (JSON Lines, CSV).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class Progress:
    def __init__(
        self,
        total: int | None,
        done: int = 0,
        fraction: Callable[[], float | None] | None = None,
        stream: TextIO | None = None,
        every: float = 10.0,
        enabled: bool = True,
    ) -> None:
        self.total, self.start_rows, self.rows = total, done, done
        self.fraction = fraction or (lambda: None)
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty()
        self.every = 0.25 if self.live else every
        self.enabled = enabled
        self.started = self.shown = time.monotonic()
        self.bad = 0
        self.first: float | None = None  # how far through the file the first part ended

    def add(self, rows: int, bad: int = 0) -> None:
        if self.first is None:  # a resumed run: where the rows skipped end, about
            self.first = (self.fraction() or 0.0) if self.start_rows else 0.0
        self.rows += rows
        self.bad += bad
        if self.enabled and time.monotonic() - self.shown >= self.every:
            self.show()

    def line(self) -> str:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        rate = (self.rows - self.start_rows) / elapsed
        shown = f"{self.rows:,}" + (f" / {self.total:,} rows" if self.total else " rows")
        done = self.rows / self.total if self.total else self.fraction()
        if done is not None:
            shown += f"  {100 * done:.0f}%"
        shown += f"  {rate:,.0f} rows/s"
        if done and rate and done < 1:
            left = (
                (self.total - self.rows) / rate
                if self.total
                else elapsed * (1 - done) / max(done - (self.first or 0.0), 1e-9)
            )
            shown += f"  {_duration(left)} left"
        return shown + (f"  {self.bad:,} bad" if self.bad else "")

    def show(self, end: str = "") -> None:
        self.shown = time.monotonic()
        text = self.line()
        if self.live:
            self.stream.write(f"\r{text}\x1b[K{end}")
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.show("\n" if self.live else "")
