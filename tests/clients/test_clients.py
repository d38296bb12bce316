"""The client libraries people already use, unmodified, against a real server (`make
test-clients`): openai, langchain-openai, cohere (v1 and v2), huggingface_hub's InferenceClient
and tritonclient, each call as its README shows it, run by the pinned versions of
requirements/clients.txt in their own environment (BERT_HEADS_CLIENTS_PYTHON, which make
test-clients creates), with an API key set. Every answer is compared with the native route's."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from service.app import create_app
from service.settings import Settings
from tests.clients.models import DEFAULTS, build_model_dir
from tests.service.conftest import LiveServer

pytestmark = pytest.mark.clients
pytest.importorskip("torch")  # the exporter's

KEY = "client-key"
TEXTS = ["the film was good", "a dull match in the rain"]
QUERY = "who won the match"
DOCUMENTS = ["the team won the final", "paris is big", "the match was won at home"]
LABELS = ["sports", "politics", "cooking"]


def clients_python() -> str:
    python = os.environ.get("BERT_HEADS_CLIENTS_PYTHON")
    if not python:
        pytest.skip("BERT_HEADS_CLIENTS_PYTHON is not set: run `make test-clients`")
    assert Path(python).is_file(), f"BERT_HEADS_CLIENTS_PYTHON={python} does not exist"
    return python


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    models = build_model_dir(tmp_path_factory.mktemp("clients") / "models")
    settings = Settings(model_dir=models, default_model=DEFAULTS, api_key=KEY)
    live = LiveServer(create_app(settings)).start()
    try:
        yield live
    finally:
        live.stop()


def client(server: LiveServer, code: str) -> Any:
    """Run `code` in the clients' environment with URL, HOST and KEY defined; the JSON it
    prints last is the answer."""
    preamble = f"import json\nURL = {server.url!r}\nHOST = {server.url[7:]!r}\nKEY = {KEY!r}\n"
    # HF_HUB_OFFLINE (set where the hub is unreachable) refuses every URL, the server's too
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    done = subprocess.run(
        [clients_python(), "-c", preamble + textwrap.dedent(code)],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def native(server: LiveServer, path: str, body: dict[str, Any]) -> Any:
    headers = {"Authorization": f"Bearer {KEY}"}
    response = httpx.post(server.url + path, json=body, headers=headers, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def assert_vectors(got: Any, want: Any) -> None:
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-5, atol=1e-6)


# -- OpenAI ------------------------------------------------------------------------------------


def test_openai_embeddings_and_models(server: LiveServer):
    got = client(
        server,
        f"""
        from openai import OpenAI
        client = OpenAI(base_url=URL + "/v1", api_key=KEY)
        response = client.embeddings.create(model="embedder", input={TEXTS!r})
        floats = client.embeddings.create(model="embedder", input="{TEXTS[0]}",
                                          encoding_format="float")
        print(json.dumps({{
            "vectors": [d.embedding for d in response.data],
            "one": floats.data[0].embedding,
            "models": [m.id for m in client.models.list()],
            "retrieved": client.models.retrieve("embedder").id,
        }}))
    """,
    )
    want = native(server, "/embed", {"inputs": TEXTS, "model": "embedder"})
    assert_vectors(got["vectors"], want)
    assert_vectors(got["one"], want[0])
    assert got["models"] == ["embedder"] and got["retrieved"] == "embedder"


def test_langchain_openai_embeddings(server: LiveServer):
    got = client(
        server,
        f"""
        from langchain_openai import OpenAIEmbeddings
        embeddings = OpenAIEmbeddings(model="embedder", base_url=URL + "/v1", api_key=KEY,
                                      check_embedding_ctx_length=False)
        print(json.dumps({{"documents": embeddings.embed_documents({TEXTS!r}),
                          "query": embeddings.embed_query("{TEXTS[0]}")}}))
    """,
    )
    want = native(server, "/embed", {"inputs": TEXTS, "model": "embedder"})
    assert_vectors(got["documents"], want)
    assert_vectors(got["query"], want[0])


# -- Cohere ------------------------------------------------------------------------------------


def test_cohere_v2_and_v1_rerank(server: LiveServer):
    got = client(
        server,
        f"""
        import cohere
        co = cohere.ClientV2(api_key=KEY, base_url=URL)
        v2 = co.rerank(model="reranker", query="{QUERY}", documents={DOCUMENTS!r}, top_n=2,
                       max_tokens_per_doc=4096)
        co1 = cohere.Client(api_key=KEY, base_url=URL)
        v1 = co1.rerank(model="reranker", query="{QUERY}",
                        documents=[{{"text": d}} for d in {DOCUMENTS!r}], top_n=2,
                        return_documents=True)
        print(json.dumps({{
            "v2": [[r.index, r.relevance_score] for r in v2.results],
            "v1": [[r.index, r.relevance_score, r.document.text] for r in v1.results],
        }}))
    """,
    )
    want = native(server, "/rerank", {"query": QUERY, "texts": DOCUMENTS, "model": "reranker"})
    best = [[r["index"], r["score"]] for r in want[:2]]
    assert [i for i, _ in got["v2"]] == [i for i, _ in best]
    np.testing.assert_allclose([s for _, s in got["v2"]], [s for _, s in best], rtol=1e-6)
    assert [[i, s] for i, s, _ in got["v1"]] == got["v2"]
    assert [t for _, _, t in got["v1"]] == [DOCUMENTS[i] for i, _ in best]


# -- huggingface_hub ---------------------------------------------------------------------------


def test_huggingface_hub_inference_client(server: LiveServer):
    got = client(
        server,
        f"""
        from dataclasses import asdict
        from huggingface_hub import InferenceClient
        def route(path):
            return InferenceClient(model=URL + path, token=KEY)
        def plain(x):
            return [asdict(e) for e in x] if isinstance(x, list) else asdict(x)
        print(json.dumps({{
            "root": plain(InferenceClient(model=URL, token=KEY).text_classification(
                "{TEXTS[0]}")),
            "classify": plain(route("/classify").text_classification("{TEXTS[0]}", top_k=2)),
            "ner": plain(route("/ner").token_classification("{TEXTS[1]}")),
            "qa": plain(route("/qa").question_answering(question="what was good?",
                                                        context="{TEXTS[0]}")),
            "zero_shot": plain(route("/zero-shot").zero_shot_classification(
                "{TEXTS[1]}", candidate_labels={LABELS!r})),
            "fill_mask": plain(route("/fill-mask").fill_mask("the [MASK] was good", top_k=3)),
            "features": route("/embed").feature_extraction("{TEXTS[0]}").tolist(),
            "similarity": route("/similarity").sentence_similarity(
                "{TEXTS[0]}", other_sentences={TEXTS!r}),
        }}))
    """,
    )
    top1 = native(server, "/classify", {"inputs": TEXTS[0]})
    assert [(x["label"], x["score"]) for x in got["root"]] == [
        (x["label"], x["score"]) for x in top1
    ]
    top2 = native(server, "/classify", {"inputs": TEXTS[0], "top_k": 2})
    assert [x["label"] for x in got["classify"]] == [x["label"] for x in top2]
    entities = native(server, "/ner", {"inputs": TEXTS[1]})
    assert [(e["entity_group"], e["start"], e["end"]) for e in got["ner"]] == [
        (e["entity_group"], e["start"], e["end"]) for e in entities
    ]
    span = native(server, "/qa", {"question": "what was good?", "context": TEXTS[0]})
    assert (got["qa"]["answer"], got["qa"]["start"]) == (span["answer"], span["start"])
    zero = native(server, "/zero-shot", {"inputs": TEXTS[1], "candidate_labels": LABELS})
    assert [x["label"] for x in got["zero_shot"]] == zero["labels"]
    np.testing.assert_allclose([x["score"] for x in got["zero_shot"]], zero["scores"])
    fillers = native(server, "/fill-mask", {"inputs": "the [MASK] was good", "top_k": 3})
    assert [x["token_str"] for x in got["fill_mask"]] == [x["token_str"] for x in fillers]
    vectors = native(server, "/embed", {"inputs": TEXTS})
    assert_vectors(np.array(got["features"]).reshape(-1), vectors[0])
    assert_vectors(got["similarity"], np.array(vectors) @ np.array(vectors[0]))


# -- the Open Inference Protocol v2 (tritonclient) ---------------------------------------------


def test_tritonclient_health_and_infer(server: LiveServer):
    got = client(
        server,
        f"""
        import numpy as np
        import tritonclient.http as httpclient
        headers = {{"Authorization": "Bearer " + KEY}}
        client = httpclient.InferenceServerClient(url=HOST)
        text = httpclient.InferInput("text", [{len(TEXTS)}], "BYTES")
        text.set_data_from_numpy(np.array({TEXTS!r}, dtype=object), binary_data=False)
        result = client.infer("sentiment", [text], headers=headers)
        print(json.dumps({{
            "live": client.is_server_live(),
            "ready": client.is_model_ready("sentiment", headers=headers),
            "labels": [x.decode() if isinstance(x, bytes) else x
                       for x in result.as_numpy("label")],
        }}))
    """,
    )
    want = native(server, "/classify", {"inputs": TEXTS, "model": "sentiment"})
    assert got["live"] and got["ready"]
    assert got["labels"] == [a[0]["label"] for a in want]
