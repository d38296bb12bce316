"""benchmarks.family_speed on the tiny shape, one round: every graph on every batch, BERT the
reference, and each rewritten graph (benchmarks.attention_rewrite) one attention node a layer
and timed against the export it came from."""

from __future__ import annotations

import json

import pytest

from benchmarks import family_speed

pytest.importorskip("transformers")


@pytest.mark.slow
def test_every_graph_is_timed_beside_bert(tmp_path) -> None:
    argv = ["--size", "tiny", "--rounds", "1", "--work", str(tmp_path / "work"),
            "--out", str(tmp_path)]  # fmt: skip
    assert family_speed.main(argv) == 0
    result = json.loads((tmp_path / "family_speed.json").read_text())
    rows = {(r["graph"], r["rows"], r["tokens"]): r for r in result["results"]}
    graphs = {"bert", "mpnet", "mpnet+mha", "mpnet+attention", "deberta-v2", "deberta-v2+mha",
              "modernbert", "modernbert+mha"}  # fmt: skip
    assert {g for g, _, _ in rows} == graphs
    assert len(rows) == len(graphs) * len(family_speed.SHAPES)
    assert all(r["seq_per_cpu_s"] > 0 and r["seq_per_s"] > 0 for r in rows.values())
    for (graph, _, _), r in rows.items():
        assert (r["x_bert"] is None) == (graph == "bert")
        assert (r["x_before"] is None) == ("+" not in graph)
    assert rows["bert", 1, 32]["ops"]["Attention"] == 2  # ORT fuses BERT's itself
    assert "Attention" not in rows["mpnet", 1, 32]["ops"]
    assert rows["mpnet+mha", 1, 32]["ops"]["MultiHeadAttention"] == 2
    assert rows["mpnet+attention", 1, 32]["ops"]["Attention"] == 2
    assert rows["modernbert+mha", 1, 32]["ops"]["MultiHeadAttention"] == 2
    assert "PATH" in result["meta"]["command"] and str(tmp_path) not in result["meta"]["command"]
