"""The output folder: numbered Parquet parts in input order, the bad rows, and what the run
was, so that a stopped run continues where it stopped and writes nothing twice.

    out/_batch.json           the run: task, options, columns, input file (size, mtime), models
    out/part-00000.parquet    rows 0 .. part_rows - 1: `row` (the input row) and the answer
    out/part-00001.parquet    ...
    out/_errors.jsonl         {"row", "error", "error_type"} per bad row, in row order
    out/_SUCCESS              written last: every row has its answer or its error (and the
                              last invocation's figures: rows, seconds, rows per second)

A part is written to a hidden file and renamed: a part file is whole or absent. Parts are
committed in order and each part's errors are appended before its rename, so on resume the
parts present are the longest run 0..k-1 and the error lines of later rows are dropped.
pyarrow.dataset and Spark skip names that start with "_" or ".", so the folder reads as one
table: `pq.read_table("out")`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

RUN = "_batch.json"
ERRORS = "_errors.jsonl"
SUCCESS = "_SUCCESS"


class OutputError(RuntimeError):
    """The folder holds another run's output."""


def part_name(index: int) -> str:
    return f"part-{index:05d}.parquet"


class Output:
    """The output folder of one run (`describe`: what makes two runs the same run). `done`:
    the parts already written; `complete`: the run had finished."""

    def __init__(self, folder: Path, describe: dict[str, Any], overwrite: bool = False) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        run = folder / RUN
        previous = json.loads(run.read_text()) if run.is_file() else None
        if overwrite:
            previous = None
        elif previous is not None and previous != describe:
            changed = sorted(k for k in describe if describe.get(k) != previous.get(k))
            raise OutputError(
                f"{folder} holds the output of another run ({', '.join(changed)} differ): "
                "choose another --output, or pass --overwrite to start again"
            )
        if previous is None:  # a new run (or one started again): no file of another stays
            self._clear()
            _write_atomic(run, json.dumps(describe, indent=2, sort_keys=True) + "\n")
        self.done = 0
        while (folder / part_name(self.done)).is_file():
            self.done += 1
        for stray in folder.glob("part-*.parquet"):  # after a gap: never committed
            if int(stray.stem.split("-")[1]) >= self.done:
                stray.unlink()
        self.complete = (folder / SUCCESS).is_file()
        self.rows_done = sum(
            pq.read_metadata(folder / part_name(i)).num_rows for i in range(self.done)
        )
        self._keep_errors_below(self.rows_done)

    def _clear(self) -> None:
        for path in self.folder.iterdir():
            if path.name in (RUN, ERRORS, SUCCESS) or path.name.startswith(("part-", ".part-")):
                path.unlink()

    def _keep_errors_below(self, rows: int) -> None:
        """Drop the error lines of rows not yet committed (a run stopped between them)."""
        path = self.folder / ERRORS
        if not path.is_file():
            return
        with path.open("rb") as f:
            lines = f.readlines()
        kept = [line for line in lines if line.strip() and json.loads(line)["row"] < rows]
        if len(kept) != len(lines):
            _write_atomic(path, b"".join(kept).decode())

    def errors(self) -> int:
        """Bad rows recorded so far."""
        path = self.folder / ERRORS
        return sum(1 for _ in path.open("rb")) if path.is_file() else 0

    def write(self, index: int, table: pa.Table, errors: list[dict[str, Any]]) -> None:
        """Commit part `index` (the next one): its errors first, then the part file."""
        assert index == self.done, f"part {index} written out of order (next is {self.done})"
        if errors:
            with (self.folder / ERRORS).open("ab") as f:
                f.write(b"".join(json.dumps(e).encode() + b"\n" for e in errors))
                f.flush()
                os.fsync(f.fileno())
        hidden = self.folder / f".{part_name(index)}"
        pq.write_table(table, hidden, use_dictionary=dictionary_columns(table.schema))
        with hidden.open("rb") as f:
            os.fsync(f.fileno())
        os.replace(hidden, self.folder / part_name(index))
        self.done += 1
        self.rows_done += table.num_rows

    def finish(self, figures: dict[str, Any]) -> None:
        """Mark the run complete; `figures` (rows, seconds...) go in the marker, as JSON."""
        _write_atomic(self.folder / SUCCESS, json.dumps(figures) + "\n")
        self.complete = True


def dictionary_columns(schema: pa.Schema) -> list[str]:
    """The Parquet leaf columns worth a dictionary: every one but floating point. A float's
    dictionary is as long as its values, and building it first cost a part of 10,000 MiniLM
    vectors ~40 MiB more while written (38 against 101 MiB over the table; the file 0.6 MiB
    larger): the peak of a batch run came from it. Labels, tokens and the like keep theirs."""
    leaves = [leaf for field in schema for leaf in _leaves(field.name, field.type)]
    return [path for path, floating in leaves if not floating]


def _leaves(path: str, kind: pa.DataType) -> list[tuple[str, bool]]:
    """(Parquet column path, is floating point) of each leaf under `kind`."""
    if pa.types.is_struct(kind):
        return [leaf for f in kind for leaf in _leaves(f"{path}.{f.name}", f.type)]
    if pa.types.is_map(kind):
        return _leaves(f"{path}.key_value.key", kind.key_type) + _leaves(
            f"{path}.key_value.value", kind.item_type
        )
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return _leaves(f"{path}.list.element", kind.value_type)
    return [(path, pa.types.is_floating(kind))]


def _write_atomic(path: Path, text: str) -> None:
    hidden = path.with_name(f".{path.name}.tmp")
    hidden.write_text(text)
    os.replace(hidden, path)
