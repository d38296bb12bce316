"""Each request gets its own answer when many share batches: requests of every task, with
different inputs and options, sent at once, answer exactly what each answers alone.

The stand-in model (benchmarks.tiny.STANDIN_RANGE) answers different inputs differently (the
test checks that it does), so an answer handed to the wrong request, or answers put in the wrong
order, cannot pass. Runs without ../shared.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from pathlib import Path
from typing import Any

import pytest

from benchmarks.tiny import WORDS
from service.settings import Settings
from tests.service.conftest import Service, gate, serve

pytestmark = pytest.mark.anyio

# Batched and single forward passes may differ in the last bits of a float: this much, and no
# more. Different inputs' answers differ by far more (asserted below), so no swap fits in it.
TOLERANCE = 1e-6
SEPARATION = 1e-5


def sentences(n: int, seed: int, shortest: int = 3, longest: int = 30) -> list[str]:
    """n varied sentences over the stand-in's vocabulary (seeded)."""
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=rng.randint(shortest, longest))) for _ in range(n)]


def requests() -> list[tuple[str, dict]]:
    """Requests of every task: one or several inputs, different options, some windowed."""
    texts = sentences(40, seed=1)
    long_texts = sentences(4, seed=2, shortest=80, longest=120)  # NER windows (64 tokens)
    out: list[tuple[str, dict]] = []
    for i in range(12):
        inputs: Any = texts[i] if i % 3 == 0 else texts[i : i + 1 + i % 3]
        options = [{}, {"top_k": None}, {"function_to_apply": "sigmoid", "top_k": 2}][i % 3]
        out.append(("/classify", {"inputs": inputs, **options}))
    out.append(("/classify", {"inputs": [[texts[20], texts[21]], [texts[22], texts[23]]]}))
    for i, strategy in enumerate(["simple", "none", "first", "average", "max", "simple"]):
        inputs = [texts[24 + i], long_texts[i % 4]] if i % 2 else texts[24 + i]
        out.append(("/ner", {"inputs": inputs, "aggregation_strategy": strategy}))
    for i in range(6):
        context = " ".join(sentences(1, seed=10 + i, shortest=20, longest=90))
        body: dict = {"question": texts[30 + i], "context": context, "max_seq_len": 64}
        out.append(("/qa", {**body, "top_k": 1 + i % 3, "handle_impossible_answer": i == 4}))
    out.append(("/embed", {"inputs": texts[36]}))
    out.append(("/embed", {"inputs": texts[37:40], "normalize": False}))
    return out


def numbers(answer: Any) -> list[float]:
    """Every float of an answer, in order."""
    if isinstance(answer, float):
        return [answer]
    if isinstance(answer, dict):
        return [x for v in answer.values() for x in numbers(v)]
    if isinstance(answer, list):
        return [x for v in answer for x in numbers(v)]
    return []


def skeleton(answer: Any) -> Any:
    """The answer with every float replaced by None: labels, words, offsets, order."""
    if isinstance(answer, float):
        return None
    if isinstance(answer, dict):
        return {k: skeleton(v) for k, v in answer.items()}
    if isinstance(answer, list):
        return [skeleton(v) for v in answer]
    return answer


def assert_same_answer(got: Any, want: Any, where: str) -> None:
    """Labels, entities, spans and their order equal; every score within TOLERANCE."""
    assert skeleton(got) == skeleton(want), where
    a, b = numbers(got), numbers(want)
    assert max((abs(x - y) for x, y in zip(a, b, strict=True)), default=0.0) <= TOLERANCE, where


async def answers_alone(client: Any, calls: list[tuple[str, dict]]) -> list[Any]:
    out = []
    for path, body in calls:
        r = await client.post(path, json=body)
        assert r.status_code == 200, r.text
        out.append(r.json())
    return out


def assert_told_apart(scores: list[float]) -> None:
    """The stand-in gave these different inputs clearly different scores: a swap would show."""
    ordered = sorted(scores)
    assert min(b - a for a, b in itertools.pairwise(ordered)) > SEPARATION, ordered


async def test_requests_sent_together_answer_as_each_alone(service: Service) -> None:
    calls = requests()
    alone = await answers_alone(service.client, calls)
    # every request at once, twice over in another order: they share batches
    backend = gate(service.app, "sst2", hold=True)
    order = [*range(len(calls)), *reversed(range(len(calls)))]
    tasks = [asyncio.create_task(service.client.post(calls[i][0], json=calls[i][1])) for i in order]
    await asyncio.to_thread(backend.entered.wait, 10)
    await asyncio.sleep(0.2)  # the rest queue up behind the held batch
    backend.gate.set()
    responses = await asyncio.gather(*tasks)
    assert max(backend.rows) > 1, "the classify requests never shared a batch"
    for i, response in zip(order, responses, strict=True):
        assert response.status_code == 200, response.text
        assert_same_answer(response.json(), alone[i], f"{calls[i][0]} #{i}")


async def test_different_answers_per_text_within_one_request(service: Service) -> None:
    """A request's texts come back in its order, each with its own answer."""
    texts = sentences(16, seed=3)
    calls = [("/classify", {"inputs": t, "top_k": None}) for t in texts]
    alone = await answers_alone(service.client, calls)
    body = {"inputs": texts, "top_k": None}
    together = (await service.client.post("/classify", json=body)).json()
    for i, (got, want) in enumerate(zip(together, alone, strict=True)):
        assert_same_answer(got, want, f"text {i}")
    assert_told_apart([x["score"] for answer in alone for x in answer if x["label"] == "positive"])


async def test_a_batch_of_mixed_options_answers_each_with_its_own(model_dir: Path) -> None:
    """Jobs of one class answered together (`answer_many`) keep their own top_k and scoring
    function, and their own rows."""
    texts = sentences(12, seed=4, shortest=8, longest=8)  # one length: no padding splits them
    options = [{"top_k": None}, {"top_k": 1}, {"function_to_apply": "none", "top_k": None}]
    calls = [
        ("/classify", {"inputs": texts[2 * i : 2 * i + 2], **options[i % 3]}) for i in range(6)
    ]
    async with serve(Settings(model_dir=model_dir, max_wait_ms=200)) as s:
        alone = await answers_alone(s.client, calls)
        backend = gate(s.app, "sst2")
        together = await asyncio.gather(*(s.client.post(p, json=b) for p, b in calls))
        assert max(backend.rows) >= 6, backend.rows  # three requests or more in one pass
    for i, (response, want) in enumerate(zip(together, alone, strict=True)):
        assert_same_answer(response.json(), want, f"request {i}")
