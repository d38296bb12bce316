"""Behaviour under load and through the lifecycle: dynamic batching, admission control, a
failing backend, readiness while loading and draining, metrics, disconnects and shutdown.

What only a real server shows (disconnects, a body on a socket, shutdown) runs against uvicorn
on a loopback port; the rest goes through the ASGI app with its lifespan running.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from service import registry as registry_module
from service.app import create_app
from service.runtime import Backend
from service.settings import Settings
from tests.service.conftest import TASKS, Service, gate, metric, serve
from tests.service.test_routing import assert_same_answer, assert_told_apart, sentences

pytestmark = pytest.mark.anyio


# 64 different sentences of 3 to 40 words: the stand-in model scores each differently
SENTENCES = sentences(64, seed=0, shortest=3, longest=40)


async def test_concurrent_requests_are_batched_and_answer_as_sequential_ones(
    service: Service,
) -> None:
    client = service.client
    sequential = [
        (await client.post("/classify", json={"inputs": s, "top_k": None})).json()
        for s in SENTENCES
    ]
    before = await service.metrics()
    labels = {"model": "sst2", "task": "classification"}
    passes_before = metric(before, "bert_heads_batch_size_count", **labels)

    responses = await asyncio.gather(
        *(client.post("/classify", json={"inputs": s, "top_k": None}) for s in SENTENCES)
    )
    after = await service.metrics()
    passes = metric(after, "bert_heads_batch_size_count", **labels) - passes_before
    rows = metric(after, "bert_heads_batch_size_sum", **labels) - metric(
        before, "bert_heads_batch_size_sum", **labels
    )
    assert rows == 64
    assert passes < 64, "64 concurrent requests took 64 forward passes: nothing was batched"
    assert metric(after, "bert_heads_batch_size_bucket", le="1.0", **labels) < metric(
        after, "bert_heads_batch_size_count", **labels
    )
    # each answer is its own request's: labels in the same order, scores equal but for the
    # last bits, while different sentences' scores are far apart
    assert_told_apart([next(x["score"] for x in a if x["label"] == "positive") for a in sequential])
    for i, (response, alone) in enumerate(zip(responses, sequential, strict=True)):
        assert_same_answer(response.json(), alone, f"request {i}")


async def test_batched_embeddings_equal_single_ones(service: Service) -> None:
    texts = SENTENCES[:16]
    alone = [(await service.client.post("/embed", json={"inputs": t})).json()[0] for t in texts]
    together = (await service.client.post("/embed", json={"inputs": texts})).json()
    assert np.abs(np.asarray(together) - np.asarray(alone)).max() <= 1e-6
    # while different texts' vectors are far apart: a swap would show
    distances = np.linalg.norm(np.asarray(alone)[:, None] - np.asarray(alone)[None], axis=-1)
    assert distances[np.triu_indices(len(texts), 1)].min() > 1e-2


async def test_admission_control_answers_429_with_retry_after(model_dir: Path) -> None:
    async with serve(Settings(model_dir=model_dir, max_concurrent_requests=2)) as s:
        backend = gate(s.app, hold=True)
        held = [
            asyncio.create_task(s.client.post("/classify", json={"inputs": t})) for t in ("a", "b")
        ]
        while s.registry.admission.in_flight < 2:
            await asyncio.sleep(0.005)
        refused = await s.client.post("/classify", json={"inputs": "c"})
        assert refused.status_code == 429
        assert refused.json()["error_type"] == "overloaded"
        assert int(refused.headers["retry-after"]) >= 1
        backend.gate.set()
        assert [r.status_code for r in await asyncio.gather(*held)] == [200, 200]
        assert (await s.client.post("/classify", json={"inputs": "c"})).status_code == 200
        assert (
            metric(
                await s.metrics(),
                "bert_heads_request_failures_total",
                model="",
                task="",
                reason="overloaded",
            )
            == 1
        )


async def test_request_timeout_answers_503_timeout(model_dir: Path) -> None:
    async with serve(Settings(model_dir=model_dir, request_timeout=0.2)) as s:
        backend = gate(s.app, hold=True)
        first = asyncio.create_task(s.client.post("/classify", json={"inputs": "a"}))
        await asyncio.to_thread(backend.entered.wait, 5)
        late = await s.client.post("/classify", json={"inputs": "b"})
        assert late.status_code == 503 and late.json()["error_type"] == "timeout"
        backend.gate.set()
        await first
        text = await s.metrics()
        assert (
            metric(
                text,
                "bert_heads_dropped_requests_total",
                model="sst2",
                task="classification",
                reason="deadline",
            )
            >= 1
        )
        assert backend.calls == 1, "the timed-out request never reached the model"


async def test_ready_is_503_until_warm_up_ends(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()
    real_warm_up = registry_module.warm_up

    def slow_warm_up(backend: Backend, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        release.wait(20)
        return real_warm_up(backend, feeds)

    monkeypatch.setattr(registry_module, "warm_up", slow_warm_up)
    async with serve(Settings(model_dir=model_dir), wait=False) as s:
        r = await s.client.get("/ready")
        assert r.status_code == 503 and r.json()["status"] == "loading"
        assert (await s.client.get("/health")).status_code == 200
        not_yet = await s.client.post("/classify", json={"inputs": "a"})
        assert not_yet.status_code == 503 and not_yet.json()["error_type"] == "not_ready"
        release.set()
        await asyncio.wait_for(s.registry.loaded.wait(), 20)
        r = await s.client.get("/ready")
        assert r.status_code == 200 and set(r.json()["models"].values()) == {"ready"}


async def test_an_empty_model_dir_is_never_ready(tmp_path: Path) -> None:
    async with serve(Settings(model_dir=tmp_path / "nothing")) as s:
        r = await s.client.get("/ready")
        assert r.status_code == 503 and r.json()["status"] == "empty"
        r = await s.client.post("/embed", json={"inputs": "a"})
        assert r.status_code == 404


async def test_metrics_exist_at_zero_and_count_requests_stages_and_batches(
    service: Service,
) -> None:
    text = await service.metrics()
    for task, model in zip(TASKS, ("sst2", "conll", "squad", "minilm"), strict=True):
        labels = {"model": model, "task": task}
        assert metric(text, "bert_heads_queue_depth", **labels) == 0
        assert metric(text, "bert_heads_batch_size_count", **labels) == 0
        assert (
            metric(text, "bert_heads_dropped_requests_total", reason="client_gone", **labels) == 0
        )
        assert metric(text, "bert_heads_request_failures_total", reason="backend", **labels) == 0
        for stage in ("tokenization", "queue_wait", "inference", "postprocess"):
            assert (
                metric(text, "bert_heads_stage_duration_seconds_count", stage=stage, **labels) == 0
            )
    assert (
        metric(
            text,
            "bert_heads_requests_total",
            endpoint="/v1/embeddings",
            status="200",
            model="minilm",
            task="embedding",
        )
        == 0
    )

    await service.client.post("/classify", json={"inputs": ["a", "b " * 200]})
    text = await service.metrics()
    labels = {"model": "sst2", "task": "classification"}
    assert (
        metric(text, "bert_heads_requests_total", endpoint="/classify", status="200", **labels) == 1
    )
    assert (
        metric(text, "bert_heads_request_duration_seconds_count", endpoint="/classify", **labels)
        == 1
    )
    for stage in ("tokenization", "queue_wait", "postprocess"):
        assert metric(text, "bert_heads_stage_duration_seconds_count", stage=stage, **labels) == 1
    assert metric(text, "bert_heads_stage_duration_seconds_count", stage="inference", **labels) >= 1
    # [CLS] a [SEP] and the long text cut to 64: on CPU "a" is not padded to 64 (CPU_PAD_LIMIT)
    assert metric(text, "bert_heads_batch_tokens_sum", **labels) >= 3 + 64
    assert metric(text, "bert_heads_inputs_truncated_total", **labels) == 1
    assert metric(text, "bert_heads_model_info", variant="fp32", provider="cpu", **labels) == 1


async def test_shutdown_drains_in_flight_requests_and_refuses_new_ones(model_dir: Path) -> None:
    app = create_app(Settings(model_dir=model_dir, drain_timeout=10))
    lifespan = app.router.lifespan_context(app)
    await lifespan.__aenter__()
    await app.state.registry.loaded.wait()
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://test"
    ) as client:
        backend = gate(app, hold=True)
        in_flight = asyncio.create_task(client.post("/classify", json={"inputs": "a"}))
        await asyncio.to_thread(backend.entered.wait, 5)
        shutdown = asyncio.create_task(lifespan.__aexit__(None, None, None))
        await asyncio.sleep(0.05)
        ready = await client.get("/ready")
        assert ready.status_code == 503 and ready.json()["status"] == "draining"
        refused = await client.post("/classify", json={"inputs": "b"})
        assert refused.status_code == 503 and refused.json()["error_type"] == "not_ready"
        assert not shutdown.done(), "shutdown waits for the request in flight"
        backend.gate.set()
        assert (await in_flight).status_code == 200
        await asyncio.wait_for(shutdown, 10)


# -- a real server -------------------------------------------------------------------------------


def test_uvicorn_shutdown_lets_the_request_in_flight_finish(live: Any) -> None:
    server = live(drain_timeout=10)
    backend = gate(server.app, hold=True)
    result: dict[str, int] = {}

    def call() -> None:
        result["status"] = httpx.post(
            server.url + "/classify", json={"inputs": "a"}, timeout=20
        ).status_code

    caller = threading.Thread(target=call)
    caller.start()
    assert backend.entered.wait(5)
    stopper = threading.Thread(target=server.stop)
    stopper.start()
    time.sleep(0.2)
    with pytest.raises(httpx.ConnectError):  # the listening socket is closed at once
        httpx.get(server.url + "/health", timeout=1)
    backend.gate.set()
    caller.join(10)
    stopper.join(10)
    assert result == {"status": 200}
