"""Every inference answer says where its time went, in text-embeddings-inference's header
names: x-total-time, x-tokenization-time, x-queue-time, x-inference-time (milliseconds)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from service.settings import Settings
from tests.service.conftest import gate, metric, serve

pytestmark = pytest.mark.anyio
HEADERS = ("x-total-time", "x-tokenization-time", "x-queue-time", "x-inference-time")


def times(r: httpx.Response) -> dict[str, float]:
    return {
        name.removeprefix("x-").removesuffix("-time"): float(r.headers[name]) for name in HEADERS
    }


async def test_an_answer_carries_its_stage_times(model_dir: Path) -> None:
    async with serve(Settings(model_dir=model_dir)) as s:
        for path, body in (
            ("/classify", {"inputs": ["a good film", "a dull one"]}),
            ("/ner", {"inputs": "Anna flew to Lisbon"}),
            ("/embed", {"inputs": "a sentence"}),
            (  # the Open Inference Protocol's infer goes the same way
                "/v2/models/sst2/infer",
                {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["ok"]}]},
            ),
        ):
            r = await s.client.post(path, json=body)
            assert r.status_code == 200, r.text
            t = times(r)
            assert t["inference"] > 0 and t["tokenization"] > 0 and t["queue"] >= 0, (path, t)
            assert t["total"] >= t["inference"] + t["tokenization"] + t["queue"], (path, t)


async def test_the_queue_time_is_the_wait_behind_another_batch(model_dir: Path) -> None:
    """The second request waits while the first one's batch is held for 0.3 s: its queue time
    says so, and its inference time is its own batch's only."""
    async with serve(Settings(model_dir=model_dir, max_batch_size=1)) as s:
        backend = gate(s.app, hold=True)
        first = asyncio.create_task(s.client.post("/classify", json={"inputs": "first"}))
        await asyncio.to_thread(backend.entered.wait, 5)
        second = asyncio.create_task(s.client.post("/classify", json={"inputs": "second"}))
        labels = {"model": "sst2", "task": "classification"}
        while metric(await s.metrics(), "bert_heads_queue_depth", **labels) < 1:
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.3)
        backend.gate.set()
        a, b = (await first).raise_for_status(), (await second).raise_for_status()
        assert times(a)["inference"] >= 300  # the held batch
        assert times(b)["queue"] >= 300 > times(b)["inference"]


async def test_a_windowed_job_adds_the_inference_of_each_batch_it_ran_in(model_dir: Path) -> None:
    """One long NER text, several windows, batches of one: their inference times add up."""
    async with serve(Settings(model_dir=model_dir, max_batch_size=1)) as s:
        backend = gate(s.app, name="conll", delay=0.05)  # each batch takes at least 50 ms
        text = " ".join(["Anna Berg flew from Lisbon to Paris on Monday"] * 20)
        r = await s.client.post("/ner", json={"inputs": text})
        assert r.status_code == 200, r.text
        assert backend.calls >= 3  # one batch per window
        assert times(r)["inference"] >= backend.calls * 50


async def test_a_refused_request_has_the_headers_too(model_dir: Path) -> None:
    async with serve(Settings(model_dir=model_dir)) as s:
        r = await s.client.post("/classify", json={"inputs": []})
        assert r.status_code == 422
        t = times(r)
        assert t["total"] > 0 and t["inference"] == t["tokenization"] == t["queue"] == 0
