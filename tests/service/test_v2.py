"""The Open Inference Protocol (KServe v2 REST), in the request shapes of its specification:
health, metadata, and infer for every task, answering what the native endpoints answer."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from service import registry as registry_module
from service.settings import Settings
from tests.service.conftest import metric, serve

pytestmark = pytest.mark.anyio


def text_tensor(name: str, texts: list[str]) -> dict[str, Any]:
    return {"name": name, "shape": [len(texts)], "datatype": "BYTES", "data": texts}


def output(answer: dict[str, Any], name: str) -> dict[str, Any]:
    return next(o for o in answer["outputs"] if o["name"] == name)


async def test_health_and_server_metadata(model_dir: Path) -> None:
    async with serve(Settings(model_dir=model_dir, api_key="k")) as s:
        # probes stay open, like /health and /ready
        assert (await s.client.get("/v2/health/live")).json() == {"live": True}
        assert (await s.client.get("/v2/health/ready")).json() == {"ready": True}
        meta = (await s.client.get("/v2")).json()
        assert meta["name"] == "bert-heads" and meta["extensions"] == []
        r = await s.client.get("/v2/models/sst2")
        assert r.status_code == 401  # model routes are behind the key
        ok = await s.client.get("/v2/models/sst2/ready", headers={"Authorization": "Bearer k"})
        assert ok.json() == {"name": "sst2", "ready": True}


async def test_model_metadata_names_each_tasks_tensors(model_dir: Path) -> None:
    async with serve(Settings(model_dir=model_dir)) as s:
        meta = {
            name: (await s.client.get(f"/v2/models/{name}")).json()
            for name in ("sst2", "conll", "squad", "minilm")
        }
    sst2 = meta["sst2"]
    assert sst2["inputs"] == [
        {"name": "text", "datatype": "BYTES", "shape": [-1]},
        {"name": "text_pair", "datatype": "BYTES", "shape": [-1]},
    ]
    labels = sst2["parameters"]["labels"]
    assert {o["name"]: (o["datatype"], o["shape"]) for o in sst2["outputs"]} == {
        "label": ("BYTES", [-1]),
        "score": ("FP32", [-1]),
        "scores": ("FP32", [-1, len(labels)]),
    }
    assert [i["name"] for i in meta["squad"]["inputs"]] == ["question", "context"]
    assert [o["name"] for o in meta["conll"]["outputs"]] == ["entities"]
    assert meta["minilm"]["outputs"] == [
        {"name": "embedding", "datatype": "FP32", "shape": [-1, -1]}
    ]
    for m in meta.values():
        assert len(m["versions"]) == 1 and m["platform"] == "onnxruntime_onnx"


async def test_infer_answers_what_the_native_endpoints_answer(model_dir: Path) -> None:
    texts = ["a good film", "Anna flew from Lisbon to Paris", "dull"]
    async with serve(Settings(model_dir=model_dir)) as s:
        post = s.client.post

        # classification: the top label and score, and every label's score in label order
        r = await post(
            "/v2/models/sst2/infer",
            json={"id": "req-1", "inputs": [text_tensor("text", texts)], "parameters": {}},
        )
        assert r.status_code == 200, r.text
        a = r.json()
        assert a["model_name"] == "sst2" and a["id"] == "req-1" and a["model_version"]
        native = (await post("/classify", json={"inputs": texts, "top_k": None})).json()
        assert output(a, "label")["data"] == [n[0]["label"] for n in native]
        np.testing.assert_allclose(
            output(a, "score")["data"], [n[0]["score"] for n in native], atol=1e-6
        )
        labels = (await s.client.get("/v2/models/sst2")).json()["parameters"]["labels"]
        scores = np.array(output(a, "scores")["data"]).reshape(output(a, "scores")["shape"])
        for row, n in zip(scores, native, strict=True):
            for item in n:
                assert abs(row[labels.index(item["label"])] - item["score"]) < 1e-6

        # NER: each element is the JSON of /ner's answer, parameters passed on
        body = {
            "inputs": [text_tensor("text", texts)],
            "parameters": {"aggregation_strategy": "first"},
        }
        a = (await post("/v2/models/conll/infer", json=body)).json()
        native = (
            await post("/ner", json={"inputs": texts, "aggregation_strategy": "first"})
        ).json()
        assert [json.loads(x) for x in output(a, "entities")["data"]] == native

        # QA: a nested [N, 1] data list is accepted too (row-major either way)
        body = {
            "inputs": [
                {"name": "question", "shape": [1], "datatype": "BYTES", "data": [["Who flew?"]]},
                text_tensor("context", ["Anna flew to Lisbon."]),
            ],
            "outputs": [{"name": "answer"}, {"name": "start"}],
        }
        a = (await post("/v2/models/squad/infer", json=body)).json()
        native = (
            await post("/qa", json={"question": "Who flew?", "context": "Anna flew to Lisbon."})
        ).json()
        assert [o["name"] for o in a["outputs"]] == ["answer", "start"]  # only those asked for
        assert output(a, "answer")["data"] == [native["answer"]]
        assert output(a, "start") == {
            "name": "start",
            "datatype": "INT64",
            "shape": [1],
            "data": [native["start"]],
        }

        # embedding: FP32 [N, D], flat row-major
        a = (
            await post("/v2/models/minilm/infer", json={"inputs": [text_tensor("text", texts)]})
        ).json()
        emb = output(a, "embedding")
        native = np.array((await post("/embed", json={"inputs": texts})).json())
        assert emb["shape"] == list(native.shape)
        np.testing.assert_allclose(np.array(emb["data"]).reshape(emb["shape"]), native, atol=1e-6)

        # counted with the other requests
        text = await s.metrics()
        labels_ = {
            "endpoint": "/v2/models/{name}/infer",
            "model": "minilm",
            "task": "embedding",
            "status": "200",
        }
        assert metric(text, "bert_heads_requests_total", **labels_) == 1


@pytest.mark.parametrize(
    ("path", "body", "status", "says"),
    [
        ("/v2/models/nope/infer", {"inputs": []}, 404, "no model named 'nope'"),
        ("/v2/models/sst2/versions/0/infer", {"inputs": []}, 404, "no version '0'"),
        ("/v2/models/sst2/infer", {"inputs": "x"}, 400, "inputs"),
        (
            "/v2/models/sst2/infer",
            {"inputs": [text_tensor("txt", ["a"])]},
            400,
            "unexpected input 'txt'",
        ),
        (
            "/v2/models/squad/infer",
            {"inputs": [text_tensor("question", ["a"])]},
            400,
            "missing input 'context'",
        ),
        (
            "/v2/models/sst2/infer",
            {"inputs": [{"name": "text", "shape": [1], "datatype": "FP32", "data": [1.0]}]},
            400,
            "must be BYTES",
        ),
        (
            "/v2/models/sst2/infer",
            {"inputs": [{"name": "text", "shape": [3], "datatype": "BYTES", "data": ["a"]}]},
            400,
            "shape [3] but 1 elements",
        ),
        (
            "/v2/models/sst2/infer",
            {"inputs": [text_tensor("text", ["a"])], "parameters": {"top_k": 2}},
            400,
            "parameter 'top_k' is not one",
        ),
        (
            "/v2/models/sst2/infer",
            {"inputs": [text_tensor("text", ["a"])], "parameters": {"truncate": "yes"}},
            400,
            "truncate",
        ),
        (
            "/v2/models/sst2/infer",
            {"inputs": [text_tensor("text", ["a"])], "outputs": [{"name": "logits"}]},
            400,
            "no output 'logits'",
        ),
        ("/v2/models/sst2/infer", {"inputs": [text_tensor("text", [])]}, 400, "the list is empty"),
        (
            "/v2/models/conll/infer",
            {"inputs": [text_tensor("text", ["x" * 200_000])]},
            413,
            "max_text_chars",
        ),
    ],
)
async def test_bad_requests_get_the_protocols_error_body(
    model_dir: Path, path: str, body: dict[str, Any], status: int, says: str
) -> None:
    async with serve(Settings(model_dir=model_dir)) as s:
        r = await s.client.post(path, json=body)
    assert r.status_code == status, r.text
    assert list(r.json()) == ["error"] and says in r.json()["error"], r.text


async def test_a_model_not_ready_says_503(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While the models warm up (held here), the server says 503 not ready, alive all along;
    once warm, 200 ready, and so does each model."""
    release = threading.Event()
    real_warm_up = registry_module.warm_up

    def held_warm_up(backend: Any, feeds: Any) -> Any:
        release.wait(20)
        return real_warm_up(backend, feeds)

    monkeypatch.setattr(registry_module, "warm_up", held_warm_up)
    async with serve(Settings(model_dir=model_dir), wait=False) as s:
        r = await s.client.get("/v2/health/ready")
        assert r.status_code == 503 and r.json()["ready"] is False, r.text
        assert (await s.client.get("/v2/health/live")).status_code == 200
        release.set()
        await asyncio.wait_for(s.registry.loaded.wait(), 20)
        r = await s.client.get("/v2/health/ready")
        assert r.status_code == 200 and r.json()["ready"] is True, r.text
        assert (await s.client.get("/v2/models/sst2/ready")).status_code == 200


async def test_a_kserve_model_folder_is_served_under_the_name_given(
    tmp_path: Path, make_package: Any
) -> None:
    """KServe puts one package at /mnt/models and passes the InferenceService's name."""
    package = make_package(tmp_path, "classification", "mnt-models")
    async with serve(Settings(model_dir=package, model_name="sentiment")) as s:
        r = await s.client.post(
            "/v2/models/sentiment/infer", json={"inputs": [text_tensor("text", ["good"])]}
        )
        assert r.status_code == 200, r.text
        (m,) = (await s.client.get("/models")).json()["models"]
        assert (m["name"], m["path"]) == ("sentiment", str(package))
    async with serve(Settings(model_dir=package)) as s:  # no name given: the folder's
        assert (await s.client.get("/v2/models/mnt-models/ready")).status_code == 200


async def test_infer_errors_are_counted_as_the_native_routes_count_theirs(model_dir: Path) -> None:
    """bert_heads_request_failures counts the v2 infer route's errors by reason (issue 48),
    labelled with the model when the path names a loaded one; a name that is not loaded is
    no label (as on the native routes), so a client cannot add series at will."""
    key = {"Authorization": "Bearer k"}
    text = [text_tensor("text", ["a"])]
    async with serve(Settings(model_dir=model_dir, api_key="k", max_text_chars=100)) as s:
        post = s.client.post
        assert (await post("/v2/models/sst2/infer", json={"inputs": text})).status_code == 401
        r = await post("/v2/models/nope/infer", json={"inputs": text}, headers=key)
        assert r.status_code == 404
        r = await post("/v2/models/sst2/infer", content=b'{"inputs": NaN}', headers=key)
        assert r.status_code == 400
        bad = {"inputs": [text_tensor("txt", ["a"])]}
        assert (await post("/v2/models/sst2/infer", json=bad, headers=key)).status_code == 400
        long = {"inputs": [text_tensor("text", ["x" * 101])]}
        assert (await post("/v2/models/conll/infer", json=long, headers=key)).status_code == 413
        assert (await post("/v2/models/sst2/infer", json={"inputs": text}, headers=key)).is_success
        metrics = (await s.client.get("/metrics", headers=key)).text
    failures = {
        ("", "", "unauthorized"): 1,
        ("", "", "model_not_found"): 1,
        ("sst2", "classification", "bad_request"): 2,
        ("conll", "token-classification", "payload_too_large"): 1,
        ("sst2", "classification", "validation"): 0,
    }
    for (model, task, reason), n in failures.items():
        got = metric(
            metrics, "bert_heads_request_failures_total", model=model, task=task, reason=reason
        )
        assert got == n, (model, task, reason)
    assert 'model="nope"' not in metrics
    route = {"endpoint": "/v2/models/{name}/infer", "model": "sst2", "task": "classification"}
    assert metric(metrics, "bert_heads_requests_total", **route, status="400") == 2
    assert metric(metrics, "bert_heads_requests_total", **route, status="200") == 1
