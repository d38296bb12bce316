"""The engine without HTTP (service.engine): the four tasks as async methods on real tiny
packages, the same answers as the tasks give without it and as the HTTP routes give for the same
inputs, and the errors the routes map to statuses, raised as the service's error types."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import orjson
import pytest

from heads.package import read_package
from heads.rows import InvalidInput, load_package_tokenizer
from heads.tasks import classify, embed, ner, qa
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
from tests.heads.tasks.served import run_rows
from tests.service.conftest import serve
from tests.service.test_routing import assert_same_answer

pytestmark = pytest.mark.anyio

# the second text's words are cut into pieces ("johnsons" is john ##s ##o ##n ##s): the NER
# strategies differ on it
TEXTS = [
    "the film was good",
    "johnsons parisians lived brilliantly in kyoto with maryanne",
    "john lives in paris and mary in rome",
    "",
]
PAIRS = [
    ("who lives in paris ?", "john lives in paris and mary in rome"),
    ("where does mary live ?", "mary lives in rome and works for the bank in london"),
]


def as_json(answer: object) -> object:
    """What the HTTP route would send for `answer` (numpy included), read back."""
    return json.loads(orjson.dumps(answer, option=orjson.OPT_SERIALIZE_NUMPY))


async def test_every_task_answers_as_the_http_route(model_dir: Path) -> None:
    settings = Settings(model_dir=model_dir, intra_op_threads=1)
    async with Engine(settings) as engine:
        labels = await engine.answer(classify.Options(top_k=None), [*TEXTS, ("a", "b")])
        entities = await engine.answer(ner.Options(aggregation_strategy="first"), TEXTS)
        spans = await engine.answer(qa.Options(top_k=2), PAIRS)
        vectors = await engine.answer(embed.Options(), TEXTS)
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
    assert len(labels) == len(TEXTS) + 1 and all(len(x) == 2 for x in labels)  # every input
    # and they are the tasks' pre- and post-processing applied input by input, with no engine
    # and no Job: the rows run in ONNX Runtime (tests/heads/tasks/served.py)
    sst2, conll, squad = (read_package(model_dir / n) for n in ("sst2", "conll", "squad"))
    tokenizer = load_package_tokenizer(conll.tokenizer_path)  # the four packages share it
    encoded = classify.preprocess(tokenizer, [*TEXTS, ("a", "b")], sst2.max_seq_length)
    logits = np.stack([o["logits"] for o in run_rows(sst2, encoded.sequences)])
    want = classify.postprocess(logits, sst2.labels or [], "single_label", top_k=None)
    assert_same_answer(as_json(labels), as_json(want), "classify")
    stride = ner.default_stride(conll.max_seq_length)
    for i, text in enumerate(TEXTS):
        prepared = ner.preprocess(tokenizer, text, conll.max_seq_length, stride)
        outputs = run_rows(conll, prepared.sequences)
        want = ner.postprocess(prepared, outputs, conll.labels or [], "first")
        assert_same_answer(as_json(entities[i]), as_json(want), f"ner {i}")
    length = min(384, squad.max_seq_length)
    for i, (question, context) in enumerate(PAIRS):
        prepared = qa.preprocess(tokenizer, question, context, length, qa.default_stride(length))
        want = qa.postprocess(prepared, run_rows(squad, prepared.sequences), top_k=2)
        assert_same_answer(as_json(spans[i]), as_json(want), f"qa {i}")
    assert as_json(spans[0]) != as_json(spans[1])  # two questions, two answers


async def test_a_calls_inputs_answer_as_each_alone(model_dir: Path) -> None:
    """Several inputs in one call (long ones in several windows) get, in order, what each gets
    alone: no answer handed to another input of the same call."""
    long_text = " ".join(["john lives in paris and mary works for the bank in rome"] * 12)
    texts = [TEXTS[1], long_text, TEXTS[2], "mary works in rome", long_text[::-1]]
    pairs = [*PAIRS, ("who works for the bank ?", long_text)]
    async with Engine(Settings(model_dir=model_dir, intra_op_threads=1)) as engine:
        for strategy in ("none", "simple", "first", "average", "max"):
            options = ner.Options(aggregation_strategy=strategy)
            together = await engine.answer(options, texts)
            alone = [(await engine.answer(options, [t]))[0] for t in texts]
            for i, (got, want) in enumerate(zip(together, alone, strict=True)):
                assert_same_answer(as_json(got), as_json(want), f"ner {strategy} text {i}")
            assert len({json.dumps(as_json(x)) for x in together}) == len(texts)
        for top_k in (1, 3):
            spans = qa.Options(top_k=top_k, max_seq_len=32)
            together = await engine.answer(spans, pairs)
            alone = [(await engine.answer(spans, [p]))[0] for p in pairs]
            for i, (got, want) in enumerate(zip(together, alone, strict=True)):
                assert_same_answer(as_json(got), as_json(want), f"qa top_k {top_k} pair {i}")
            assert len({json.dumps(as_json(x)) for x in together}) == len(pairs)
        inputs = [*texts, ("a cat sat", "a dog sat")]
        every = classify.Options(top_k=None)
        together = await engine.answer(every, inputs)
        alone = [(await engine.answer(every, [x]))[0] for x in inputs]
        for i, (got, want) in enumerate(zip(together, alone, strict=True)):
            assert_same_answer(as_json(got), as_json(want), f"classify input {i}")
        vectors = await engine.answer(embed.Options(), texts)
        for i, text in enumerate(texts):
            alone = (await engine.answer(embed.Options(), [text]))[0]
            assert np.abs(vectors[i] - alone).max() <= 1e-6, i


async def test_errors_are_the_service_error_types(model_dir: Path) -> None:
    settings = Settings(model_dir=model_dir, intra_op_threads=1, max_client_batch_size=4)
    async with Engine(settings) as engine:
        with pytest.raises(ModelNotFound, match="no model named 'nope'"):
            await engine.answer(classify.Options(), ["a"], model="nope")
        with pytest.raises(InputError, match="this call needs a classification model"):
            await engine.answer(classify.Options(), ["a"], model="minilm")
        with pytest.raises(PayloadTooLarge, match="max_client_batch_size"):
            await engine.answer(embed.Options(), ["a"] * 5)
        with pytest.raises(InvalidInput, match="question is empty"):
            await engine.answer(qa.Options(), [("", "john lives in paris")])
        past = Call(deadline=asyncio.get_running_loop().time() - 1)
        with pytest.raises(DeadlineExceeded):
            await engine.answer(embed.Options(), ["a"], call=past)
        engine.registry.admission.limit = 0
        with pytest.raises(Overloaded):
            await engine.answer(embed.Options(), ["a"])
        engine.registry.admission.limit = 10
        assert engine.registry.admission.in_flight == 0  # every failure gave its slot back
    with pytest.raises(NotReady, match="shutting down"):  # stopped: draining
        await engine.answer(embed.Options(), ["a"])


async def test_a_call_records_the_model_and_job(model_dir: Path) -> None:
    async with Engine(Settings(model_dir=model_dir, intra_op_threads=1)) as engine:
        call = engine.call()
        await engine.answer(embed.Options(), ["a short text"], call=call)
        assert call.model is not None and call.model.name == "minilm"
        assert call.job is not None and call.job.tokens > 0
