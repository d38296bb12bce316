"""service.batch.read: every format is read part by part (never more than a part of rows at a
time), rows numbered from 0 in file order, a part from any index on (a resumed run), bad records
named with their reason, a missing column refused before anything runs."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from service.batch.read import InputError, open_input

TEXTS = [f"sentence number {i}" for i in range(23)]


def write(tmp_path: Path, kind: str) -> Path:
    if kind == "parquet":
        path = tmp_path / "in.parquet"
        table = pa.table({"id": list(range(23)), "text": TEXTS})
        pq.write_table(table, path, row_group_size=4)  # parts cut across row groups
    elif kind == "jsonl":
        path = tmp_path / "in.jsonl"
        path.write_text(
            "".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(TEXTS))
        )
    else:
        path = tmp_path / f"in.{kind}"
        sep = "\t" if kind == "tsv" else ","
        path.write_text(f"id{sep}text\n" + "".join(f"{i}{sep}{t}\n" for i, t in enumerate(TEXTS)))
    return path


@pytest.mark.parametrize("kind", ["parquet", "jsonl", "csv", "tsv"])
@pytest.mark.parametrize("skip", [0, 2, 4])
def test_parts_of_every_format(tmp_path: Path, kind: str, skip: int) -> None:
    reader = open_input(write(tmp_path, kind), {"text": "text"}, ["id"])
    parts = list(reader.parts(5, skip))
    assert [p.index for p in parts] == list(range(skip, 5))
    assert [len(p.values) for p in parts] == [5] * (4 - skip) + [3]  # never more than a part
    assert [p.first for p in parts] == [5 * i for i in range(skip, 5)]
    rows = [v["text"] for p in parts for v in p.values]  # type: ignore[index]
    assert rows == TEXTS[5 * skip :]
    ids = [str(x) for p in parts for x in p.keep["id"].to_pylist()]
    assert ids == [str(i) for i in range(5 * skip, 23)]
    assert reader.total == (23 if kind == "parquet" else None)


def test_bad_json_lines_are_bad_rows(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    lines = [b'{"text": "fine"}', b"{not json", b"", b"[1, 2]", b'{"other": 1}',
             b'{"text": "caf\xc3"}', b'{"text": 3}', b'{"text": null}']  # fmt: skip
    path.write_bytes(b"\n".join(lines) + b"\n")
    [part] = open_input(path, {"text": "text"}, []).parts(100)
    assert [v is None for v in part.values] == [False, True, True, True, True, True, False, False]
    assert part.errors[1].startswith("not JSON")
    assert part.errors[2] == "an empty line"
    assert part.errors[3] == "not a JSON object: list"
    assert part.errors[4] == "no field 'text'"
    assert part.errors[5].startswith("not JSON")  # not UTF-8
    assert part.values[6] == {"text": 3} and part.values[7] == {"text": None}  # checked later


def test_csv_bad_records_and_quoted_newlines(tmp_path: Path) -> None:
    path = tmp_path / "in.csv"
    path.write_bytes(b'id,text\n1,"two\nlines"\n2\n3,caf\xe9\n4,"a, b"\n')
    [part] = open_input(path, {"text": "text"}, []).parts(100)
    assert part.values[0] == {"text": "two\nlines"}
    assert part.values[1] is None and part.errors[1] == "1 fields where the header has 2"
    assert part.values[2] == {"text": "caf\udce9"}  # not UTF-8: a lone surrogate, refused later
    assert part.values[3] == {"text": "a, b"}


@pytest.mark.parametrize("kind", ["parquet", "jsonl", "csv"])
def test_a_missing_column_stops_before_anything_runs(tmp_path: Path, kind: str) -> None:
    path = write(tmp_path, kind)
    if kind == "jsonl":  # JSON Lines has no header: a record without the field is a bad row
        [part, *_] = open_input(path, {"text": "sentence"}, []).parts(5)
        assert part.errors[0] == "no field 'sentence'"
        return
    with pytest.raises(InputError, match="sentence"):
        open_input(path, {"text": "sentence"}, [])


def test_a_parquet_column_that_is_not_text_stops(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not text"):
        open_input(write(tmp_path, "parquet"), {"text": "id"}, [])


def test_an_unknown_format_names_the_flag(tmp_path: Path) -> None:
    path = tmp_path / "in.txt"
    path.write_text("x")
    with pytest.raises(InputError, match="--format"):
        open_input(path, {"text": "text"}, [])
