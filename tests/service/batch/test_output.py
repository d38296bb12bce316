"""The part files' encodings: no dictionary for floating-point leaves (a float's dictionary is
as long as its values and cost the run its peak memory), one for every other leaf."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from service.batch.output import Output, dictionary_columns

LABELED = pa.list_(pa.struct([("label", pa.string()), ("score", pa.float32())]))


def test_dictionary_columns_name_every_leaf_but_floats():
    schema = pa.schema([
        ("row", pa.int64()),
        ("labels", LABELED),
        ("embedding", pa.list_(pa.float32(), 4)),
        ("tokens", pa.list_(pa.list_(pa.float32(), 4))),
        ("sparse", pa.map_(pa.int32(), pa.float32())),
        ("answer", pa.struct([("text", pa.string()), ("score", pa.float64())])),
    ])  # fmt: skip
    assert dictionary_columns(schema) == [
        "row", "labels.list.element.label", "sparse.key_value.key", "answer.text"
    ]  # fmt: skip


def encodings(path: Path) -> dict[str, set[str]]:
    meta = pq.read_metadata(path)
    group = meta.row_group(0)
    return {
        group.column(i).path_in_schema: set(group.column(i).encodings)
        for i in range(meta.num_columns)
    }


def test_a_written_part_has_dictionaries_where_they_pay(tmp_path: Path):
    n = 64
    vectors = np.random.default_rng(0).random((n, 8), dtype=np.float32)
    table = pa.table({
        "row": pa.array(range(n), pa.int64()),
        "labels": pa.array([[{"label": "pos", "score": 0.5}]] * n, LABELED),
        "embedding": pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), 8),
    })  # fmt: skip
    output = Output(tmp_path / "out", {"run": 1})
    output.write(0, table, [])
    found = encodings(tmp_path / "out" / "part-00000.parquet")
    assert "RLE_DICTIONARY" in found["labels.list.element.label"]
    assert "RLE_DICTIONARY" in found["row"]
    for floats in ("labels.list.element.score", "embedding.list.element"):
        assert "RLE_DICTIONARY" not in found[floats] and "PLAIN" in found[floats], floats
    assert pq.read_table(tmp_path / "out" / "part-00000.parquet").equals(table)
