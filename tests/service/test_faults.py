"""Faults stay where they happen: a corrupt or tampered package is refused at start-up with a
reason an operator can act on while the other packages serve (/models and /ready say so, per the
readiness policy in service.registry); an ONNX Runtime error fails the requests of its batch
only, with 503 `backend`, and the worker goes on."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from benchmarks._traffic import assert_same
from service.settings import Settings
from tests.service.conftest import gate, metric, serve

pytestmark = pytest.mark.anyio


def _edit_manifest(package: Path, **changes: Any) -> None:
    """Change package.json by hand, as a tamperer would (the sha256 entries stay as they were)."""
    manifest = json.loads((package / "package.json").read_text())
    manifest.update(changes)
    (package / "package.json").write_text(json.dumps(manifest))


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


# name -> (how the squad package is broken, extra settings, words the refusal must contain)
FAULTS: dict[str, tuple[Callable[[Path], Any], dict[str, Any], list[str]]] = {
    "a byte of the graph changed": (
        lambda p: _flip_a_byte(p / "model.onnx"),
        {},
        ["model.onnx", "sha256 mismatch"],
    ),
    "tokenizer truncated": (
        lambda p: (p / "tokenizer.json").write_text("{"),
        {},
        ["tokenizer.json", "sha256 mismatch"],
    ),
    "a listed file missing": (
        lambda p: (p / "tokenizer.json").unlink(),
        {},
        ["tokenizer.json", "missing"],
    ),
    "manifest not JSON": (
        lambda p: (p / "package.json").write_text("{'task': "),
        {},
        ["package.json", "not valid JSON"],
    ),
    "unknown task": (
        lambda p: _edit_manifest(p, task="summarization"),
        {},
        ["package.json", "summarization"],
    ),
    "a hashed path outside the package": (
        lambda p: _edit_manifest(
            p, sha256={**json.loads((p / "package.json").read_text())["sha256"], "../x": "0"}
        ),
        {},
        ["outside the package"],
    ),
    "a graph ONNX Runtime cannot read (verify_sha256 off)": (
        lambda p: (p / "model.onnx").write_bytes(b"\x08\x07not a model"),
        {"verify_sha256": False},
        ["InvalidProtobuf"],
    ),
    "a graph without the head's outputs": (
        lambda p: _edit_manifest(p, outputs=[{"name": "logits", "shape": ["batch", "labels"]}]),
        {},
        ["needs outputs", "start_logits"],
    ),
}


@pytest.mark.parametrize("fault", FAULTS, ids=list(FAULTS))
async def test_a_broken_package_is_refused_with_its_reason_and_the_others_serve(
    tmp_path: Path, make_package: Callable[..., Path], fault: str
) -> None:
    break_it, settings, reason = FAULTS[fault]
    make_package(tmp_path, "classification")
    break_it(make_package(tmp_path, "question-answering"))
    async with serve(Settings(model_dir=tmp_path, **settings)) as s:
        ready = await s.client.get("/ready")
        assert ready.status_code == 503 and ready.json()["status"] == "degraded"
        assert ready.json()["models"]["sst2"] == "ready"
        refusal = ready.json()["models"]["squad"]
        assert refusal.startswith("failed: ") and all(word in refusal for word in reason)
        models = {m["name"]: m for m in (await s.client.get("/models")).json()["models"]}
        assert models["squad"]["state"] == "failed" and models["squad"]["error"] in refusal
        assert models["sst2"]["state"] == "ready"

        assert (await s.client.post("/classify", json={"inputs": "a"})).status_code == 200
        qa = await s.client.post("/qa", json={"question": "who?", "context": "john"})
        assert qa.status_code == 404 and qa.json()["error_type"] == "model_not_found"
        named = await s.client.post(
            "/qa", json={"question": "who?", "context": "john", "model": "squad"}
        )
        assert named.status_code == 404 and "failed to load" in named.json()["error"]
        assert (await s.client.get("/health")).status_code == 200  # alive: no restart helps


async def test_allow_partial_reports_ready_while_one_package_is_refused(
    tmp_path: Path, make_package: Callable[..., Path]
) -> None:
    make_package(tmp_path, "classification")
    _flip_a_byte(make_package(tmp_path, "embedding") / "model.onnx")
    async with serve(Settings(model_dir=tmp_path, allow_partial=True)) as s:
        ready = await s.client.get("/ready")
        assert ready.status_code == 200 and ready.json()["status"] == "degraded"
        assert ready.json()["models"]["minilm"].startswith("failed: ")


async def test_a_package_is_served_under_its_folders_name(
    tmp_path: Path, make_package: Callable[..., Path]
) -> None:
    """Two folders whose package.json give one name: both served, each under its folder's name,
    and /models shows the package's own name where it differs."""
    make_package(tmp_path, "classification")
    make_package(tmp_path, "classification", "sst2-copy")
    _edit_manifest(tmp_path / "sst2-copy", name="sst2")  # package.json is not hashed
    async with serve(Settings(model_dir=tmp_path)) as s:
        models = {m["name"]: m for m in (await s.client.get("/models")).json()["models"]}
        assert models["sst2"]["state"] == models["sst2-copy"]["state"] == "ready"
        assert models["sst2-copy"]["package_name"] == "sst2"
        assert models["sst2"]["package_name"] is None  # the same name: shown once
        r = await s.client.post("/classify", json={"inputs": "good", "model": "sst2-copy"})
        assert r.status_code == 200, r.text


TEXTS = ["good", "good film", "a good film", "a good old film", "a very good old film"]


async def test_an_onnx_runtime_error_fails_its_batch_only_and_the_worker_goes_on(
    model_dir: Path,
) -> None:
    """The model is held on a first request while five others queue; they run in batches of at
    most two (which rows share one depends on when a lane's next batch is formed: while the
    batch before it runs), and ONNX Runtime fails the second forward pass (ids outside the
    vocabulary: a real ORT error)."""
    async with serve(Settings(model_dir=model_dir, max_batch_size=2)) as s:
        post = s.client.post
        reference = [(await post("/classify", json={"inputs": t})).json() for t in TEXTS]
        backend = gate(s.app, hold=True)
        backend.poison = {2}
        first = asyncio.create_task(post("/classify", json={"inputs": "a"}))
        await asyncio.to_thread(backend.entered.wait, 5)
        queued = [asyncio.create_task(post("/classify", json={"inputs": t})) for t in TEXTS]
        labels = {"model": "sst2", "task": "classification"}
        while metric(await s.metrics(), "bert_heads_queue_depth", **labels) < len(TEXTS):
            await asyncio.sleep(0.005)  # until all five wait in the queue
        backend.gate.set()
        assert (await first).status_code == 200
        answers = await asyncio.gather(*queued)

        failed = [i for i, r in enumerate(answers) if r.status_code != 200]
        assert failed
        assert [len(TEXTS[i].split()) + 2 for i in failed] == backend.lengths[1]  # its batch
        for i in failed:
            assert answers[i].status_code == 503
            assert answers[i].json()["error_type"] == "backend"
            assert "InvalidArgument" in answers[i].json()["error"]  # what ONNX Runtime raised
        for i, r in enumerate(answers):
            if i not in failed:
                assert_same(r.json(), reference[i])
        assert backend.rows[0] == 1 and sum(backend.rows[1:]) == len(TEXTS)
        assert max(backend.rows) <= 2

        assert (await s.client.get("/health")).status_code == 200  # the worker is alive
        assert_same((await post("/classify", json={"inputs": TEXTS[0]})).json(), reference[0])
        text = await s.metrics()
        failures = metric(text, "bert_heads_request_failures_total", reason="backend", **labels)
        assert failures == len(failed) == backend.rows[1]
        assert metric(text, "bert_heads_queue_depth", **labels) == 0
