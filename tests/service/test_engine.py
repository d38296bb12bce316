"""The engine without HTTP (service.engine): the four tasks as async methods on real tiny
packages, the same answers as the HTTP routes give for the same inputs, and the errors the
routes map to statuses, raised as the service's error types."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import orjson
import pytest

from heads.rows import InvalidInput
from service.engine import Call, Engine
from service.errors import (
    DeadlineExceeded,
    InputError,
    ModelNotFound,
    NotReady,
    Overloaded,
    PayloadTooLarge,
)
from service.settings import Settings
from tests.service.conftest import serve

pytestmark = pytest.mark.anyio

TEXTS = ["the film was good", "john lives in paris and mary in rome", ""]
PAIRS = [("who lives in paris ?", "john lives in paris and mary in rome")] * 2


def as_json(answer: object) -> object:
    """What the HTTP route would send for `answer` (numpy included), read back."""
    return json.loads(orjson.dumps(answer, option=orjson.OPT_SERIALIZE_NUMPY))


async def test_every_task_answers_as_the_http_route(model_dir: Path) -> None:
    settings = Settings(model_dir=model_dir, intra_op_threads=1)
    async with Engine(settings) as engine:
        labels = await engine.classify([*TEXTS, ("a", "b")], top_k=None)
        entities = await engine.ner(TEXTS, aggregation_strategy="first")
        spans = await engine.qa(PAIRS, top_k=2)
        vectors = await engine.embed(TEXTS)
    async with serve(settings) as service:

        async def post(path: str, body: dict) -> object:
            r = await service.client.post(path, json=body)
            assert r.status_code == 200, r.text
            return r.json()

        assert as_json(labels) == await post(
            "/classify", {"inputs": [*TEXTS, ["a", "b"]], "top_k": None}
        )
        assert as_json(entities) == await post(
            "/ner", {"inputs": TEXTS, "aggregation_strategy": "first"}
        )
        assert as_json(spans) == await post(
            "/qa", {"inputs": [{"question": q, "context": c} for q, c in PAIRS], "top_k": 2}
        )
        assert isinstance(vectors, np.ndarray) and vectors.shape[0] == len(TEXTS)
        assert as_json(vectors) == await post("/embed", {"inputs": TEXTS})
    assert len(labels) == 4 and all(len(x) == 2 for x in labels)  # both labels, every input


async def test_errors_are_the_service_error_types(model_dir: Path) -> None:
    settings = Settings(model_dir=model_dir, intra_op_threads=1, max_client_batch_size=4)
    async with Engine(settings) as engine:
        with pytest.raises(ModelNotFound, match="no model named 'nope'"):
            await engine.classify(["a"], model="nope")
        with pytest.raises(InputError, match="this call needs a classification model"):
            await engine.classify(["a"], model="minilm")
        with pytest.raises(PayloadTooLarge, match="max_client_batch_size"):
            await engine.embed(["a"] * 5)
        with pytest.raises(InvalidInput, match="question is empty"):
            await engine.qa([("", "john lives in paris")])
        past = Call(deadline=asyncio.get_running_loop().time() - 1)
        with pytest.raises(DeadlineExceeded):
            await engine.embed(["a"], call=past)
        engine.registry.admission.limit = 0
        with pytest.raises(Overloaded):
            await engine.embed(["a"])
        engine.registry.admission.limit = 10
        assert engine.registry.admission.in_flight == 0  # every failure gave its slot back
    with pytest.raises(NotReady, match="shutting down"):  # stopped: draining
        await engine.embed(["a"])


async def test_a_call_records_the_model_and_job(model_dir: Path) -> None:
    async with Engine(Settings(model_dir=model_dir, intra_op_threads=1)) as engine:
        call = engine.call()
        await engine.embed(["a short text"], call=call)
        assert call.model is not None and call.model.name == "minilm"
        assert call.job is not None and call.job.tokens > 0
