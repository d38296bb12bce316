"""Every endpoint's happy path, single and batched, and the shape rule: a single input gets
its answer, a list gets a list (/embed always a list of vectors)."""

from __future__ import annotations

import base64
import json
import logging
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks.tiny import DEFAULT_LABELS, WORDS
from service.settings import Settings
from tests.service.conftest import Service, metric, serve

NER_LABELS = DEFAULT_LABELS["token-classification"]

pytestmark = pytest.mark.anyio

TEXT = "john lives in paris, france"
QUESTION, CONTEXT = "where does john live?", "john lives in paris. mary works in new york city."


def assert_labels(result: list[dict], k: int) -> None:
    assert len(result) == k
    assert {r["label"] for r in result} <= {"negative", "positive"}
    scores = [r["score"] for r in result]
    assert scores == sorted(scores, reverse=True)


async def test_classify_single_and_batch(shared: Service) -> None:
    single = (await shared.client.post("/classify", json={"inputs": TEXT})).json()
    assert_labels(single, 1)
    batch = (
        await shared.client.post("/classify", json={"inputs": [TEXT, "a bad film"], "top_k": None})
    ).json()
    assert len(batch) == 2
    assert_labels(batch[0], 2)
    assert pytest.approx(sum(r["score"] for r in batch[0])) == 1.0  # softmax over both labels
    assert batch[0][0] == pytest.approx(single[0])


async def test_classify_pairs_and_sigmoid(shared: Service) -> None:
    pair = [["a cat sat", "a dog sat"]]

    async def scores(function: str) -> dict[str, float]:
        body = {"inputs": pair, "function_to_apply": function, "top_k": 2}
        r = await shared.client.post("/classify", json=body)
        assert r.status_code == 200, r.text
        [result] = r.json()
        assert_labels(result, 2)
        return {x["label"]: x["score"] for x in result}

    logits = await scores("none")
    sigmoid = await scores("sigmoid")
    # each label's own sigmoid of its logit, not a softmax over both (whose scores add to 1)
    assert sigmoid == pytest.approx({k: 1 / (1 + np.exp(-v)) for k, v in logits.items()}, abs=1e-9)
    assert sum(sigmoid.values()) != pytest.approx(1.0, abs=1e-3)
    softmax = await scores("softmax")
    assert softmax["positive"] == pytest.approx(
        1 / (1 + np.exp(logits["negative"] - logits["positive"])), abs=1e-9
    )
    # and the pair is read as a pair: its answer is neither text's alone
    alone = (await shared.client.post("/classify", json={"inputs": "a cat sat"})).json()
    assert alone[0]["score"] != pytest.approx(max(softmax.values()), abs=1e-4)


async def test_ner_single_and_batch(shared: Service) -> None:
    r = await shared.client.post(
        "/ner", json={"inputs": TEXT, "aggregation_strategy": "none", "ignore_labels": []}
    )
    assert r.status_code == 200, r.text
    tokens = r.json()
    assert tokens, "strategy none with no ignored labels returns every token"
    for t in tokens:
        assert t["entity"] in NER_LABELS
        assert TEXT[t["start"] : t["end"]] == t["word"]
    # ignore_labels=[]: "O" groups count too, so the random model's answer cannot be empty
    body = {"inputs": [TEXT, "mary works"], "ignore_labels": []}
    batch = (await shared.client.post("/ner", json=body)).json()
    assert len(batch) == 2 and all(isinstance(x, list) for x in batch)
    assert batch[0], "every token of the text belongs to some group"
    assert batch[0][0]["start"] == 0 and batch[0][-1]["end"] == len(TEXT)
    for entity in batch[0]:
        assert set(entity) == {"entity_group", "score", "word", "start", "end"}
        assert TEXT[entity["start"] : entity["end"]] == entity["word"]


async def test_ner_long_text_is_windowed_not_cut(service: Service) -> None:
    text = " ".join(["john lives in paris"] * 60)  # ~240 tokens, the window is 64
    r = await service.client.post(
        "/ner", json={"inputs": text, "aggregation_strategy": "none", "ignore_labels": []}
    )
    assert r.status_code == 200, r.text
    assert r.json()[-1]["end"] == len(text)
    assert (
        'inputs_windowed_total{model="conll",task="token-classification"} 1.0'
        in await service.metrics()
    )


async def test_qa_single_batch_and_top_k(shared: Service) -> None:
    single = (
        await shared.client.post("/qa", json={"question": QUESTION, "context": CONTEXT})
    ).json()
    assert set(single) == {"answer", "score", "start", "end"}
    assert CONTEXT[single["start"] : single["end"]] == single["answer"]
    items = [
        {"question": QUESTION, "context": CONTEXT},
        {"question": "who works?", "context": CONTEXT},
    ]
    batch = (await shared.client.post("/qa", json={"inputs": items})).json()
    assert len(batch) == 2 and batch[0] == single
    hf_form = {"inputs": {"question": QUESTION, "context": CONTEXT}}  # the HF Inference API's
    assert (await shared.client.post("/qa", json=hf_form)).json() == single
    top = (
        await shared.client.post("/qa", json={"question": QUESTION, "context": CONTEXT, "top_k": 3})
    ).json()
    assert len(top) == 3 and top[0] == single


async def test_qa_long_context_is_windowed(service: Service, standin_checkpoint: Any) -> None:
    """A context of ~10 windows: the answers are the question-answering pipeline's on the same
    model, over the same windows (the package's 64 tokens, the default stride of 32)."""
    from transformers import pipeline

    rng = random.Random(5)
    context = " ".join(rng.choices(WORDS, k=300))
    body = {"question": QUESTION, "context": context, "max_seq_len": 999, "top_k": 3}
    r = await service.client.post("/qa", json=body)
    assert r.status_code == 200, r.text
    assert (
        'inputs_windowed_total{model="squad",task="question-answering"} 1.0'
        in await service.metrics()
    )
    pipe = pipeline("question-answering", model=str(standin_checkpoint("question-answering")))
    theirs = pipe(question=QUESTION, context=context, top_k=3, max_seq_len=64, doc_stride=32)
    ours = r.json()
    assert [(a["start"], a["end"], a["answer"]) for a in ours] == [
        (a["start"], a["end"], a["answer"]) for a in theirs
    ]
    assert [a["score"] for a in ours] == pytest.approx([a["score"] for a in theirs], abs=1e-5)
    assert max(a["start"] for a in ours) > len(context) // 4  # not all from the first window


async def test_embed_single_and_batch(shared: Service) -> None:
    single = (await shared.client.post("/embed", json={"inputs": TEXT})).json()
    assert len(single) == 1 and len(single[0]) == 32  # always a list of vectors, as TEI
    assert np.linalg.norm(single[0]) == pytest.approx(1.0, abs=1e-5)
    batch = (
        await shared.client.post("/embed", json={"inputs": [TEXT, "a cat"], "normalize": False})
    ).json()
    assert len(batch) == 2
    assert np.asarray(batch[0]) / np.linalg.norm(batch[0]) == pytest.approx(
        np.asarray(single[0]), abs=1e-5
    )


async def test_openai_embeddings(shared: Service) -> None:
    r = await shared.client.post(
        "/v1/embeddings", json={"input": [TEXT, "a cat"], "model": "minilm"}
    )
    body = r.json()
    assert body["object"] == "list" and body["model"] == "minilm"
    assert [d["index"] for d in body["data"]] == [0, 1]
    assert all(d["object"] == "embedding" and len(d["embedding"]) == 32 for d in body["data"])
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 4
    b64 = (
        await shared.client.post(
            "/v1/embeddings", json={"input": TEXT, "encoding_format": "base64"}
        )
    ).json()
    decoded = np.frombuffer(base64.b64decode(b64["data"][0]["embedding"]), dtype="<f4")
    assert decoded == pytest.approx(np.asarray(body["data"][0]["embedding"]), abs=1e-6)


async def test_models_lists_every_package(shared: Service) -> None:
    body = (await shared.client.get("/models")).json()
    by_name = {m["name"]: m for m in body["models"]}
    assert set(by_name) == {"sst2", "conll", "squad", "minilm"}
    sst2 = by_name["sst2"]
    assert sst2["state"] == "ready" and sst2["provider"] == "cpu" and sst2["variant"] == "fp32"
    assert sst2["labels"] == ["negative", "positive"] and sst2["max_seq_length"] == 64
    assert body["limits"]["max_client_batch_size"] == 64


async def test_health_ready_and_docs(shared: Service) -> None:
    assert (await shared.client.get("/health")).json() == {"status": "alive"}
    ready = await shared.client.get("/ready")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"
    assert (await shared.client.get("/docs")).status_code == 200
    assert "/v1/embeddings" in (await shared.client.get("/openapi.json")).json()["paths"]


async def test_model_selects_among_packages_of_a_task(tmp_path: Path, make_package) -> None:
    make_package(tmp_path, "classification", "first")
    make_package(tmp_path, "classification", "second")
    async with serve(Settings(model_dir=tmp_path)) as s:
        r = await s.client.post("/classify", json={"inputs": TEXT})
        assert r.status_code == 422 and "first, second" in r.json()["error"]
        assert (
            await s.client.post("/classify", json={"inputs": TEXT, "model": "second"})
        ).status_code == 200


async def test_models_shows_each_lossy_variants_agreement_with_fp32(
    tmp_path: Path, make_package, caplog
) -> None:
    folder = make_package(tmp_path, "classification", "sst2")
    recorded = json.loads((folder / "package.json").read_text())["parity"]["int8"]["agreement"]
    with caplog.at_level(logging.WARNING, logger="service.runtime"):
        async with serve(Settings(model_dir=tmp_path, variant="int8")) as s:
            [info] = (await s.client.get("/models")).json()["models"]
    assert info["variant"] == "int8" and set(info["agreement"]) == {"int8"}
    shown = info["agreement"]["int8"]
    assert shown["metrics"] == recorded["metrics"] and shown["gate"] == recorded["gate"]
    assert shown["passed"] and shown["written"] and shown["sample"] == recorded["sample"]["inputs"]
    assert shown["choice"] == recorded["choice"]["name"]
    # the stand-in was exported under a lenient gate (conftest.standin_int8_gate); the server
    # holds it to the real one and says so
    top1 = recorded["metrics"]["top1_agreement"]
    assert (
        f"sst2: serving int8, but int8 agrees with fp32 below its gate (top1_agreement {top1:.4g} < 0.99)"
        in caplog.text
    )


async def test_variant_setting_overrides_the_package_preference(
    tmp_path: Path, make_package
) -> None:
    make_package(tmp_path, "classification", "sst2", prefer={"cpu": "int8", "gpu": "fp32"})
    async with serve(Settings(model_dir=tmp_path)) as s:
        assert (await s.client.get("/models")).json()["models"][0]["variant"] == "int8"
        assert (await s.client.post("/classify", json={"inputs": TEXT})).status_code == 200
    async with serve(Settings(model_dir=tmp_path, variant="fp32")) as s:
        assert (await s.client.get("/models")).json()["models"][0]["variant"] == "fp32"


async def test_the_inference_posts_take_one_path_with_cors_on_or_off(model_dir: Path) -> None:
    # InferencePath serves the inference POSTs whether CORS wraps it or not: the same answers,
    # errors and request metrics; with CORS the answers also carry its headers.
    seen = []
    for origins in ([], [ORIGIN]):
        async with serve(Settings(model_dir=model_dir, cors_origins=origins)) as s:
            answers = []
            for path, body in ROUTER_CASES:
                r = await s.client.post(path, json=body, headers={"origin": ORIGIN})
                answers.append((r.status_code, r.json()))
                assert (r.headers.get("access-control-allow-origin") == ORIGIN) == bool(origins)
            text = await s.metrics()
            counts = [
                metric(text, "bert_heads_requests_total", endpoint="/classify", model="sst2",
                       status="200", task="classification"),
                metric(text, "bert_heads_requests_total", endpoint="/classify", model="",
                       status="422", task=""),
            ]  # fmt: skip
            seen.append((answers, counts))
    assert seen[0] == seen[1]
    assert seen[0][0][-1][1]["error_type"] == "validation" and seen[0][1] == [1.0, 1.0]


ORIGIN = "https://app.example"
ROUTER_CASES = [
    ("/classify", {"inputs": TEXT, "top_k": None}),
    ("/ner", {"inputs": TEXT, "aggregation_strategy": "none", "ignore_labels": []}),
    ("/qa", {"question": QUESTION, "context": CONTEXT}),
    ("/embed", {"inputs": TEXT}),
    ("/classify", {"inputs": []}),
]


async def test_openapi_describes_the_request_bodies(shared: Service) -> None:
    # the inference routes read raw bytes, yet /docs shows each body model and its errors
    spec = (await shared.client.get("/openapi.json")).json()
    for path, model in [
        ("/classify", "ClassifyRequest"),
        ("/ner", "NerRequest"),
        ("/qa", "QaRequest"),
        ("/embed", "EmbedRequest"),
        ("/v1/embeddings", "OpenAIEmbeddingRequest"),
    ]:
        post = spec["paths"][path]["post"]
        schema = post["requestBody"]["content"]["application/json"]["schema"]
        assert schema == {"$ref": f"#/components/schemas/{model}"}, path
        assert post["requestBody"]["required"] is True
        assert {"200", "413", "422", "429"} <= set(post["responses"]), path
        assert "parameters" not in post, path  # nothing of the request object leaks in
    assert "inputs" in spec["components"]["schemas"]["ClassifyRequest"]["properties"]
