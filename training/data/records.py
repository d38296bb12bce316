"""Rows of a tabular or JSON-lines file, each with the line it came from, for the readers of
the fine-tuning tasks. The format follows the file name:

    .tsv / .txt    tab-separated with a header line, no quote processing (GLUE: SST-2 and
                   STS-B sentences contain unbalanced `"`, as the GLUE loaders read them)
    .csv           comma-separated with a header line, RFC 4180 quoting
    .jsonl / .ndjson / .json   one JSON object per line

    >>> for where, row in read_records("sst2/dev.tsv"):
    ...     where, row        # ('sst2/dev.tsv:2', {'sentence': "it 's a charming ...", 'label': '1'})
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class DataError(ValueError):
    """A dataset that cannot be read as the task expects. The message names the file and, for
    a bad row, its line, and says what was expected."""


TSV = (".tsv", ".txt")
CSV = (".csv",)
JSONL = (".jsonl", ".ndjson", ".json")

Record = dict[str, Any]


def existing(path: str | Path) -> Path:
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    return path


def read_records(path: str | Path, expected: str) -> Iterator[tuple[str, Record]]:
    """Yield ("file:line", row) for every non-blank row. `expected` describes the columns or
    keys the caller needs; it goes into every error message."""
    path = existing(path)
    suffix = path.suffix.lower()
    if suffix in JSONL:
        yield from _jsonl(path, expected)
    elif suffix in CSV:
        yield from _table(path, expected, csv.reader(_lines(path), strict=True), "comma")
    elif suffix in TSV:
        yield from _table(path, expected, (line.split("\t") for line in _lines(path)), "tab")
    else:
        raise DataError(
            f"{path}: unknown format {suffix or '(no extension)'!r}: expected .tsv, .csv or "
            f".jsonl with {expected}"
        )


def _lines(path: Path) -> Iterator[str]:
    with path.open(encoding="utf-8-sig", newline="") as f:
        for line in f:
            yield line.rstrip("\r\n")


def _table(path: Path, expected: str, rows: Iterator[list[str]], sep: str) -> Iterator:
    try:
        header = [h.strip() for h in next(rows)]
    except StopIteration:
        raise DataError(
            f"{path}: the file is empty: expected a header line and {expected}"
        ) from None
    except csv.Error as e:
        raise DataError(f"{path}:1: {e}") from None
    line = 1
    while True:
        try:
            fields = next(rows)
        except StopIteration:
            return
        except csv.Error as e:
            raise DataError(f"{path}:{line + 1}: {e}") from None
        line += 1
        if not any(f.strip() for f in fields):
            continue
        if len(fields) != len(header):
            raise DataError(
                f"{path}:{line}: {len(fields)} {sep}-separated fields, expected {len(header)} "
                f"as in the header {header}"
            )
        yield f"{path}:{line}", dict(zip(header, fields, strict=True))


def _jsonl(path: Path, expected: str) -> Iterator[tuple[str, Record]]:
    for line, text in enumerate(_lines(path), start=1):
        if not text.strip():
            continue
        try:
            row = json.loads(text)
        except json.JSONDecodeError as e:
            hint = ""
            if (
                line == 1
                and text.lstrip().startswith(("{", "["))
                and text.rstrip()[-1:] not in "}]"
            ):
                hint = " (one JSON document over many lines? this task reads one object per line)"
            raise DataError(
                f"{path}:{line}: not valid JSON ({e.msg}){hint}; expected {expected}"
            ) from None
        if not isinstance(row, dict):
            raise DataError(f"{path}:{line}: expected a JSON object with {expected}")
        yield f"{path}:{line}", row


def field(row: Record, where: str, *names: str, kind: type = str) -> Any:
    """The first of `names` present in the row (alternative spellings of one column)."""
    for name in names:
        if name in row and row[name] is not None:
            value = row[name]
            if kind is str and isinstance(value, int | float) and not isinstance(value, bool):
                value = str(value)  # labels written as ids
            if not isinstance(value, kind):
                raise DataError(
                    f"{where}: {name!r} is {type(value).__name__}, expected {kind.__name__}"
                )
            return value
    found = ", ".join(map(repr, row)) or "nothing"
    raise DataError(f"{where}: missing {' or '.join(map(repr, names))}; found {found}")


def require_rows(rows: list, path: str | Path, expected: str) -> list:
    if not rows:
        raise DataError(f"{path}: no examples: expected {expected}")
    return rows
