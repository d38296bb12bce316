"""Input files read part by part: Parquet (a row group at a time), JSON Lines and CSV / TSV (a
line at a time), never the whole file. Each part is `part_rows` consecutive rows, numbered from
0 in file order (CSV: the header is not a row; JSON Lines: every line is a row). A record that
cannot be read (not JSON, a missing field, a CSV line with the wrong number of fields) is a bad
row of its part, with its reason; a column that is not in the file stops the run at once.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

FORMATS = {".parquet": "parquet", ".pq": "parquet", ".jsonl": "jsonl", ".ndjson": "jsonl",
           ".json": "jsonl", ".csv": "csv", ".tsv": "tsv"}  # fmt: skip


@dataclass
class Part:
    """Rows [first, first + len(values)) of the input: each row's values by role (None where
    the record could not be read, its reason in `errors` by position), and the kept columns."""

    index: int
    first: int
    values: list[dict[str, Any] | None]
    errors: dict[int, str] = field(default_factory=dict)
    keep: dict[str, pa.Array] = field(default_factory=dict)


class InputError(ValueError):
    """The input cannot be read as asked (no such column, unknown format): the run stops."""


def file_format(path: Path, given: str | None = None) -> str:
    if given:
        return given
    kind = FORMATS.get(path.suffix.lower())
    if kind is None:
        raise InputError(
            f"{path}: cannot tell the format from {path.suffix!r}; pass --format "
            f"({', '.join(sorted(set(FORMATS.values())))})"
        )
    return kind


class Reader:
    """`parts(part_rows, skip)`: the parts from part `skip` on. `total` rows when the file
    says (Parquet), and `fraction()` of the file read, for the progress line."""

    total: int | None = None

    def __init__(self, path: Path, columns: dict[str, str], keep: list[str]) -> None:
        self.path, self.columns, self.keep = path, columns, keep

    def parts(self, part_rows: int, skip: int = 0) -> Generator[Part, None, None]:
        raise NotImplementedError

    def fraction(self) -> float | None:
        return None


def open_input(
    path: Path, columns: dict[str, str], keep: list[str], fmt: str | None = None
) -> Reader:
    """A Reader of `path` that reads `columns` (role -> column name) and `keep`."""
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    kind = file_format(path, fmt)
    reader = {"parquet": ParquetReader, "jsonl": JsonLinesReader}.get(kind, CsvReader)
    if kind == "tsv":  # GLUE's TSV: tab-separated, quotes are text
        return CsvReader(path, columns, keep, delimiter="\t", quoting=csv.QUOTE_NONE)
    return reader(path, columns, keep)


class ParquetReader(Reader):
    def __init__(self, path: Path, columns: dict[str, str], keep: list[str]) -> None:
        super().__init__(path, columns, keep)
        self.file = pq.ParquetFile(path)
        schema = self.file.schema_arrow
        missing = [c for c in [*columns.values(), *keep] if c not in schema.names]
        if missing:
            raise InputError(f"{path}: no column {missing} (it has {schema.names})")
        for role, name in columns.items():
            kind = schema.field(name).type
            texts = pa.types.is_string(kind) or pa.types.is_large_string(kind)
            lists = (pa.types.is_list(kind) or pa.types.is_large_list(kind)) and (
                pa.types.is_string(kind.value_type) or pa.types.is_large_string(kind.value_type)
            )
            if not texts and not (role == "documents" and lists):
                raise InputError(f"{path}: column {name!r} holds {kind}, not text")
        self.total = self.file.metadata.num_rows

    def parts(self, part_rows: int, skip: int = 0) -> Generator[Part, None, None]:
        first = skip * part_rows
        groups, start = [], 0  # the row groups from the one holding `first` on
        for g in range(self.file.num_row_groups):
            n = self.file.metadata.row_group(g).num_rows
            if start + n > first:
                groups.append(g)
            elif not groups:
                start += n
        wanted = list(dict.fromkeys([*self.columns.values(), *self.keep]))
        # One row group at a time: iter_batches over them all read ahead by the file's size
        # (Arrow held 13.8 MiB of a 300k-row file's text and 33.8 of a 1M-row one's, SST-2
        # sentences in groups of 50k; 4.7 either way group by group), and the run's peak with it.
        batches = (
            batch
            for g in groups
            for batch in self.file.iter_batches(
                batch_size=min(part_rows, 65_536), row_groups=[g], columns=wanted
            )
        )
        held: list[pa.RecordBatch] = []
        offset, rows, index = first - start, 0, skip  # rows of the first group before `first`
        for batch in batches:
            if offset:
                cut = min(offset, batch.num_rows)
                batch, offset = batch.slice(cut), offset - cut
            held.append(batch)
            rows += batch.num_rows
            while rows >= part_rows:
                table = pa.Table.from_batches(held)
                yield self._part(index, table.slice(0, part_rows), part_rows)
                rest = table.slice(part_rows)
                held, rows, index = rest.to_batches(), rest.num_rows, index + 1
        if rows:
            yield self._part(index, pa.Table.from_batches(held), part_rows)

    def _part(self, index: int, table: pa.Table, part_rows: int) -> Part:
        by_role = {role: table.column(name).to_pylist() for role, name in self.columns.items()}
        values = [
            dict(zip(by_role, row, strict=True)) for row in zip(*by_role.values(), strict=True)
        ]
        keep = {name: table.column(name).combine_chunks() for name in self.keep}
        return Part(index, index * part_rows, list(values), keep=keep)


class _LineReader(Reader):
    """A text format read as bytes, so that the progress line knows how far it is."""

    raw: BinaryIO

    def fraction(self) -> float | None:
        size = self.path.stat().st_size
        return min(1.0, self.raw.tell() / size) if size and not self.raw.closed else None

    def records(self, skip: int) -> Iterator[tuple[dict[str, Any] | None, str | None]]:
        """(the record's values by column, None) or (None, why it cannot be read); the first
        `skip` records may come as (None, None), unread."""
        raise NotImplementedError

    def parts(self, part_rows: int, skip: int = 0) -> Generator[Part, None, None]:
        part = Part(skip, skip * part_rows, [])
        kept: dict[str, list[str | None]] = {name: [] for name in self.keep}
        for n, (record, problem) in enumerate(self.records(skip * part_rows)):
            if n < skip * part_rows:
                continue
            if record is not None:
                missing = [c for c in self.columns.values() if c not in record]
                if missing:
                    record, problem = None, f"no field {missing[0]!r}"
            if record is None:
                part.errors[len(part.values)] = problem or "unreadable"
                part.values.append(None)
            else:
                part.values.append({role: record[c] for role, c in self.columns.items()})
            for name in self.keep:
                value = None if record is None else record.get(name)
                kept[name].append(
                    value if value is None or isinstance(value, str) else json.dumps(value)
                )
            if len(part.values) == part_rows:
                part.keep = {name: pa.array(v, pa.string()) for name, v in kept.items()}
                yield part
                part = Part(part.index + 1, part.first + part_rows, [])
                kept = {name: [] for name in self.keep}
        if part.values:
            part.keep = {name: pa.array(v, pa.string()) for name, v in kept.items()}
            yield part


class JsonLinesReader(_LineReader):
    """One JSON object per line; kept fields that are not strings are kept as their JSON."""

    def records(self, skip: int) -> Iterator[tuple[dict[str, Any] | None, str | None]]:
        with self.path.open("rb") as self.raw:
            for n, line in enumerate(self.raw):
                if n < skip:
                    yield None, None  # done in an earlier run: not parsed again
                elif not line.strip():
                    yield None, "an empty line"
                else:
                    yield self._parse(line)

    @staticmethod
    def _parse(line: bytes) -> tuple[dict[str, Any] | None, str | None]:
        try:
            record = json.loads(line)
        except ValueError as e:  # not JSON, or not UTF-8
            return None, f"not JSON: {e}"
        if not isinstance(record, dict):
            return None, f"not a JSON object: {type(record).__name__}"
        return record, None


class CsvReader(_LineReader):
    """A header line, then one record per row (quoted fields may span lines). Bytes that are not
    UTF-8 come through as lone surrogates, which the row check refuses as the endpoint does."""

    def __init__(
        self,
        path: Path,
        columns: dict[str, str],
        keep: list[str],
        delimiter: str = ",",
        quoting: int = csv.QUOTE_MINIMAL,
    ) -> None:
        super().__init__(path, columns, keep)
        self.delimiter, self.quoting = delimiter, quoting
        header = next(self._csv(io.StringIO(self._first_line())), [])
        missing = [c for c in [*columns.values(), *keep] if c not in header]
        if missing:
            raise InputError(f"{path}: no column {missing} (the header has {header})")

    def _csv(self, lines: Iterator[str] | io.TextIOBase) -> Iterator[list[str]]:
        return csv.reader(lines, delimiter=self.delimiter, quoting=self.quoting)  # type: ignore[arg-type]

    def _first_line(self) -> str:
        with self.path.open(encoding="utf-8-sig", errors="surrogateescape", newline="") as f:
            return f.readline()

    def records(self, skip: int) -> Iterator[tuple[dict[str, Any] | None, str | None]]:
        with self.path.open("rb") as self.raw:
            text = io.TextIOWrapper(self.raw, "utf-8-sig", errors="surrogateescape", newline="")
            rows = self._csv(text)
            header = next(rows, [])
            while True:
                try:
                    fields = next(rows)
                except StopIteration:
                    return
                except csv.Error as e:
                    yield None, f"not CSV: {e}"
                    continue
                if len(fields) != len(header):
                    yield None, f"{len(fields)} fields where the header has {len(header)}"
                else:
                    yield dict(zip(header, fields, strict=True)), None
