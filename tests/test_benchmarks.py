"""The server-cost benchmark's parts (benchmarks.server_cost, _cpu, _bare) on a tiny package:
its request bodies are what the API takes, and a short run accounts the server's CPU to its
threads. Nothing here asserts speed: the figures are the benchmark's to report."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest

from benchmarks import server_cost
from benchmarks._cpu import CLASSES
from benchmarks.tiny import build_tiny_package
from service import schemas

SCHEMAS = {
    "/classify": schemas.ClassifyRequest,
    "/embed": schemas.EmbedRequest,
    "/v1/embeddings": schemas.OpenAIEmbeddingRequest,
    "/ner": schemas.NerRequest,
    "/qa": schemas.QaRequest,
}
TEXTS = ["a good film", "the worst movie of the year", "paris is the capital of france"]
SHORT = argparse.Namespace(clients=4, warmup=0.3, duration=1.0)


@pytest.mark.parametrize("endpoint", list(SCHEMAS))
@pytest.mark.parametrize("shape", [1, 3])
def test_bodies_are_requests_the_api_accepts(endpoint: str, shape: int) -> None:
    inputs = [(t, t + " and more") for t in TEXTS] if endpoint == "/qa" else TEXTS
    sent = server_cost.bodies(endpoint, inputs * 4, shape)
    assert len(sent) == 12 // shape
    for body in sent:
        SCHEMAS[endpoint].model_validate(body)
    many = sent[0].get("inputs", sent[0].get("input"))
    assert isinstance(many, list) == (shape > 1)


def _check_split(x: dict) -> None:
    cpu = x["server_cpu_us"]
    assert set(cpu) == {*CLASSES, "total"}
    assert cpu["total"] == pytest.approx(sum(cpu[c] for c in CLASSES), abs=1.0)
    assert cpu["event_loop"] > 0


@pytest.mark.slow  # the unit suite stays under 10 minutes; CI's slow stage runs it
def test_a_short_run_splits_the_server_cpu_by_thread(tmp_path: Path) -> None:
    build_tiny_package(tmp_path / "cls", "classification")
    sent = server_cost.bodies("/classify", TEXTS, 1) + server_cost.bodies("/classify", TEXTS, 3)
    with server_cost.start_service(tmp_path / "cls", "fp32", 2, server_cost._server.REPO) as s:
        threads = s.threads[0]
        classes = threads.classes()
        assert classes[threads.pid] == "event_loop"
        assert "ort_pool" in classes.values()  # 2 intra-op threads: the caller + one of ORT's
        served = server_cost.measure(s, "/classify", sent, 1, SHORT)
    assert served["requests_per_s"] > 0 and not served["errors"]
    _check_split(served)
    assert served["server_cpu_us"]["executor"] > 0  # every batch is handed to session.run there

    with server_cost.start_bare() as bare:
        floor = server_cost.measure(bare, "/", sent, 1, SHORT)
    assert floor["requests_per_s"] > 0 and not floor["errors"]
    _check_split(floor)
    assert floor["server_cpu_us"]["executor"] == floor["server_cpu_us"]["ort_pool"] == 0


@pytest.mark.parametrize("task", ["classification", "token-classification", "question-answering",
                                  "embedding"])  # fmt: skip
def test_the_null_backend_answers_in_the_graphs_shapes_without_running_it(
    tmp_path: Path, task: str
) -> None:
    """--backend null: the same outputs, names, shapes and dtypes as session.run, at any batch
    size and length, and session.run is never called."""
    import numpy as np

    import service.runtime as runtime

    build_tiny_package(tmp_path / "p", task)
    model = str(tmp_path / "p" / "model.onnx")
    real = runtime.OrtBackend(model, ["CPUExecutionProvider"], 1, False)
    scope: dict = {}
    patched = (runtime.OrtBackend.__init__, runtime.OrtBackend.run)
    try:
        exec("import os as _os\n" + server_cost.NULL_BACKEND, scope)
        null = runtime.OrtBackend(model, ["CPUExecutionProvider"], 1, False)
    finally:
        runtime.OrtBackend.__init__, runtime.OrtBackend.run = patched
    null.session.run = None  # it must not be called
    for size, length in [(1, 5), (7, 31), (64, 128)]:
        feeds = {
            "input_ids": np.ones((size, length), np.int64),
            "attention_mask": np.ones((size, length), np.int64),
            "token_type_ids": np.zeros((size, length), np.int64),
        }
        want = real.run(feeds)
        got = scope["_null_run"](null, feeds)
        assert list(got) == list(want)
        for name in want:
            assert got[name].shape == want[name].shape and got[name].dtype == want[name].dtype
            assert np.isfinite(got[name]).all() and len(np.unique(got[name])) > 1  # random


def test_the_window_ceiling_batches_as_the_batcher_would_with_that_many_rows_in_flight() -> None:
    """benchmarks.serve's "window" order: each window of `size` arrival-order rows is sorted
    and cut by grow_batch with the CPU pad limit; every row runs once, in its own window."""
    import numpy as np

    from benchmarks._engine import _batches
    from heads.rows import ModelRow
    from service.stages.infer import CPU_PAD_LIMIT

    rng = np.random.default_rng(0)
    lengths = rng.integers(3, 60, size=100)
    rows = [ModelRow(np.full(n, k), np.zeros(n, np.int64)) for k, n in enumerate(lengths)]
    batches = _batches(rows, 32, "window")
    assert sorted(int(r.input_ids[0]) for b in batches for r in b) == list(range(100))
    windows = [{int(r.input_ids[0]) // 32 for r in b} for b in batches]
    assert all(len(w) == 1 for w in windows)  # no batch mixes two windows
    for b in batches:
        n = [len(r) for r in b]
        # each row that joined added at most CPU_PAD_LIMIT padded positions
        assert n == sorted(n) and sum(max(n) - x for x in n) <= CPU_PAD_LIMIT * (len(n) - 1)
    assert 4 < len(batches) < 100  # it batches, and it does not pad whole windows


@pytest.mark.slow  # the unit suite stays under 10 minutes; CI's slow stage runs it
def test_the_family_speed_benchmark_times_every_family_beside_bert(tmp_path):
    """benchmarks.families on the tiny shape, one short round: a row per family and batch,
    BERT's own ratio 1, and the own-encoder families unfused where ORT fuses BERT."""
    import json

    from benchmarks import families

    assert families.main(["--shapes", "tiny", "--rounds", "1", "--seconds", "0.01",
                          "--out", str(tmp_path)]) == 0  # fmt: skip
    results = json.loads((tmp_path / "families.json").read_text())["results"]
    assert len(results) == len(families.FAMILIES) * len(families.BATCHES)
    assert all(r["vs_bert"] == 1 for r in results if r["family"] == "bert")
    assert all(r["ms"] > 0 for r in results)
    fused = {r["family"]: r["fused"] for r in results}
    assert fused["bert"].get("Attention") == 2
    assert all("Attention" not in fused[f] for f in ("deberta-v2", "modernbert", "mpnet"))


@pytest.mark.slow  # ~35 s: two training loops
def test_ours_and_trainers_loops_run_side_by_side_on_the_same_rows(
    tmp_path, shared_data, minilm_path
):
    """benchmarks.finetune_vs_trainer, a few CoNLL steps of each loop in its own process (the real
    all-MiniLM-L6-v2: minilm_path skips without its package): a
    row with both rates, their ratio and each final loss, in the JSON and the Markdown."""
    import json

    pytest.importorskip("accelerate")  # transformers' Trainer needs it
    from benchmarks import finetune_vs_trainer

    assert finetune_vs_trainer.main(["--tasks", "conll", "--precisions", "fp32", "--steps", "4",
                                     "--skip", "1", "--rounds", "1", "--examples", "64",
                                     "--data", str(shared_data), "--results", str(tmp_path)]) == 0  # fmt: skip
    report = json.loads((tmp_path / "finetune_vs_trainer.json").read_text())
    [row] = report["results"]
    assert row["task"] == "conll" and row["precision"] == "fp32" and row["ratios"]
    assert row["ours_steps_per_s"] > 0 and row["trainer_steps_per_s"] > 0
    assert 0 < row["ours_final_loss"][0] < 10 and 0 < row["trainer_final_loss"][0] < 10
    assert report["threads"] >= 1 and report["cpu"]
    assert "| conll | fp32 |" in (tmp_path / "finetune_vs_trainer.md").read_text()


def test_the_pretraining_step_probe_times_each_mode_on_a_small_corpus(tmp_path, capsys):
    """benchmarks.pretrain_step on CPU, BERT-tiny, a corpus and vocabulary written here: the
    loader alone, the step on a resident batch, inline and as trained (Prefetched), each timed."""
    from benchmarks import pretrain_step

    words = [
        "the",
        "cat",
        "sat",
        "on",
        "a",
        "mat",
        "while",
        "dogs",
        "ran",
        "far",
        "away",
        "from",
        "home",
    ]
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    (tmp_path / "vocab.txt").write_text("\n".join(specials + words) + "\n")
    blocks = [" ".join(words[i:] + words[:i]) + " ." for i in range(len(words))]
    (tmp_path / "book.txt").write_text("\n\n".join("\n".join(blocks[i:i + 4]) for i in range(9)))  # fmt: skip
    assert pretrain_step.main(["--config", "tiny", "--batch-size", "4", "--steps", "2", "--warmup", "1",
                               "--corpus", str(tmp_path / "book.txt"), "--tokenizer",
                               str(tmp_path / "vocab.txt"), "--cache-dir", str(tmp_path / "cache")]) == 0  # fmt: skip
    out = capsys.readouterr().out
    modes = ["loader alone", "batch on device", "inline loader", "as trained (Prefetched)"]
    for mode in modes:
        [line] = [x for x in out.splitlines() if x.startswith(f"mode {mode} ")]
        assert float(line.split("ms_per_step ")[1].split()[0]) > 0
    assert "-bound territory" in out


@pytest.mark.slow  # the unit suite stays under 10 minutes; CI's slow stage runs it
def test_versus_serves_every_level_and_writes_the_ratios(tmp_path, shared_data):
    """benchmarks.versus without infinity on a tiny embedding package: the raw ceiling, our
    server at one-text and many-text levels through /v1/embeddings, the report's ratios."""
    import json

    from benchmarks import versus

    package = build_tiny_package(tmp_path / "tiny-embed", "embedding").path
    assert versus.main(["--package", str(package), "--no-infinity", "--variants", "fp32",
                        "--levels", "1", "2x4", "--rounds", "1", "--duration", "0.3",
                        "--warmup", "0.2", "--raw-budget", "0.05", "--data", str(shared_data),
                        "--out", str(tmp_path)]) == 0  # fmt: skip
    report = json.loads((tmp_path / f"versus-{package.name}.json").read_text())
    served = report["best"]["bert-heads fp32"]
    assert set(served) == {"1", "2x4"} and all(v["sequences_per_s"] > 0 for v in served.values())
    assert served["2x4"]["sequences_per_s"] >= served["2x4"]["requests_per_s"] * 4 * 0.99
    assert report["raw"]["fp32"]["sequences_per_s"] > 0
    assert "served / raw at 32 clients" not in (tmp_path / f"versus-{package.name}.md").read_text()


def test_the_lanes_probe_times_one_lane_two_at_once_and_one_wide_session(tmp_path, capsys):
    from benchmarks import lanes

    package = build_tiny_package(tmp_path / "tiny-embed", "embedding").path
    assert lanes.main(["--model", str(package / "model.onnx"), "--batch-sizes", "1", "2",
                       "--runs", "3", "--length", "8"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    for batch in (1, 2):
        [line] = [x for x in out.splitlines() if x.startswith(f"batch {batch}:")]
        figures = [float(x) for x in re.findall(r"(\d+\.\d+)", line)]
        assert len(figures) == 4 and all(f > 0 for f in figures), line


def test_the_int8_gate_table_compares_before_and_after_on_a_checkpoint(tmp_path):
    from benchmarks import int8_gate

    build_tiny_package(tmp_path / "unused", "classification", checkpoint_dir=tmp_path / "ckpt")
    argv = ["--packages", "--checkpoint", f"tiny=classification:{tmp_path / 'ckpt'}",
            "--rounds", "1", "--work", str(tmp_path / "work"), "--results", str(tmp_path)]  # fmt: skip
    assert int8_gate.main(argv) == 0
    row = json.loads((tmp_path / "int8_gate.json").read_text())["packages"]["tiny"]
    assert row["gate"] == {"top1_agreement": 0.99} and row["sample"]["inputs"] > 200
    assert set(row["agreement"]) == {"before", "after"}
    assert set(row["speed"]) == {"fp32", "before", "after"}
    assert "| tiny | top1_agreement >= 0.99 |" in (tmp_path / "int8_gate.md").read_text()
