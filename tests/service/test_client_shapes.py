"""The client libraries' shapes, over HTTP in process (the libraries themselves run in
tests/clients/, `make test-clients`): Hugging Face's `{"inputs", "parameters"}` form on the task
routes and the answers InferenceClient parses, POST / by the model's task, /similarity,
Cohere's /v2/rerank, OpenAI's /v1/models, and token-id input on /v1/embeddings."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

from service.settings import Settings
from tests.clients.models import DEFAULTS, build_model_dir
from tests.service.conftest import Service, serve

pytestmark = pytest.mark.anyio
pytest.importorskip("torch")  # the exporter's

TEXT = "the film was good"
QUERY = "who won the match"
DOCUMENTS = ["the team won the final", "paris is big", "the match was won at home"]


@pytest.fixture(scope="module")
async def served(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Service]:
    models = build_model_dir(tmp_path_factory.mktemp("clients") / "models")
    async with serve(Settings(model_dir=models, default_model=DEFAULTS)) as s:
        yield s


async def post(served: Service, path: str, body: Any, status: int = 200) -> Any:
    response = await served.client.post(path, json=body)
    assert response.status_code == status, response.text
    return response.json()


# -- Hugging Face's form -----------------------------------------------------------------------


async def test_hf_text_classification_is_a_list_of_lists_for_one_text(served: Service):
    native = await post(served, "/classify", {"inputs": TEXT, "top_k": 2})
    hf = await post(served, "/classify", {"inputs": TEXT, "parameters": {"top_k": 2}})
    assert hf == [native]  # InferenceClient.text_classification reads answer[0]


async def test_parameters_are_the_routes_own_fields(served: Service):
    hf = await post(
        served, "/ner", {"inputs": TEXT, "parameters": {"aggregation_strategy": "none"}}
    )
    assert hf == await post(served, "/ner", {"inputs": TEXT, "aggregation_strategy": "none"})
    body = {"inputs": "the [MASK] was good", "parameters": {"top_k": 2}}
    assert await post(served, "/fill-mask", body) == await post(
        served, "/fill-mask", {"inputs": "the [MASK] was good", "top_k": 2}
    )
    qa = {"question": "what was good?", "context": TEXT}
    hf_qa = await post(served, "/qa", {"inputs": qa, "parameters": {"max_answer_len": 3}})
    assert hf_qa == await post(served, "/qa", {**qa, "max_answer_len": 3})


@pytest.mark.parametrize(
    ("parameters", "says"),
    [
        ({"temperature": 1}, "parameters.temperature: not a parameter of this route"),
        ({"inputs": "x"}, "parameters.inputs: not a parameter"),
        ({"top_k": 1}, "top_k is given twice"),
    ],
)
async def test_unknown_or_repeated_parameters_are_refused_by_name(
    served: Service, parameters: dict[str, Any], says: str
):
    body = {"inputs": TEXT, "top_k": 1, "parameters": parameters}
    error = await post(served, "/classify", body, 422)
    assert says in error["error"]


async def test_hf_zero_shot_is_label_score_pairs(served: Service):
    labels = ["sports", "politics", "cooking"]
    native = await post(served, "/zero-shot", {"inputs": TEXT, "candidate_labels": labels})
    hf = await post(
        served, "/zero-shot", {"inputs": TEXT, "parameters": {"candidate_labels": labels}}
    )
    pairs = zip(native["labels"], native["scores"], strict=True)
    assert hf == [{"label": label, "score": score} for label, score in pairs]


async def test_root_routes_by_the_default_task(served: Service, tmp_path: Any):
    # several models and two task defaults would be ambiguous; here DEFAULTS names one task
    assert await post(served, "/", {"inputs": TEXT}) == await post(
        served, "/classify", {"inputs": TEXT}
    )


async def test_root_with_several_tasks_and_no_default_says_how_to_choose(tmp_path: Any):
    models = build_model_dir(tmp_path / "models")
    async with serve(Settings(model_dir=models)) as s:
        error = await post(s, "/", {"inputs": TEXT}, 422)
    assert "post to the task's route instead" in error["error"]


async def test_similarity_is_the_cosine_of_the_embeddings(served: Service):
    body = {"inputs": {"source_sentence": TEXT, "sentences": DOCUMENTS}, "parameters": {}}
    scores = await post(served, "/similarity", body)
    vectors = np.array(await post(served, "/embed", {"inputs": [TEXT, *DOCUMENTS]}))
    assert np.allclose(scores, vectors[1:] @ vectors[0], atol=1e-5)


# -- Cohere v2 and OpenAI ----------------------------------------------------------------------


async def test_v2_rerank_answers_as_v1(served: Service):
    v1 = await post(served, "/v1/rerank", {"query": QUERY, "documents": DOCUMENTS, "top_n": 2})
    v2 = await post(served, "/v2/rerank", {"model": "reranker", "query": QUERY,
                                           "documents": DOCUMENTS, "top_n": 2})  # fmt: skip
    assert v2["results"] == [
        {"index": r["index"], "relevance_score": r["relevance_score"]} for r in v1["results"]
    ]
    assert v2["meta"]["api_version"] == {"version": "2"} and v2["id"]


async def first_tokens(served: Service, text: str, n: int) -> str:
    """The characters of the text's first n tokens, as the reranker reads them."""
    tokens = await post(served, "/tokenize",
                        {"inputs": text, "add_special_tokens": False, "model": "reranker"})  # fmt: skip
    return text[: tokens[0][n - 1]["stop"]]  # (a list per input)


@pytest.mark.parametrize("path", ["/v1/rerank", "/v2/rerank"])  # Jina's / infinity's, Cohere's
async def test_max_tokens_per_doc_reads_the_first_tokens(served: Service, path: str):
    long = "the match was won at home after a long and rainy evening " * 20
    head = await first_tokens(served, long, 6)
    cut = await post(served, path, {"query": QUERY, "documents": [long, "paris"],
                                    "max_tokens_per_doc": 6})  # fmt: skip
    want = await post(served, path, {"query": QUERY, "documents": [head, "paris"]})
    assert cut["results"] == want["results"]
    whole = await post(served, path, {"query": QUERY, "documents": [long, "paris"]})
    assert whole["results"] != cut["results"]


@pytest.mark.parametrize("path", ["/rerank", "/v1/rerank", "/v2/rerank"])
async def test_max_tokens_per_query_reads_the_querys_first_tokens(served: Service, path: str):
    """vLLM's split of the window: the query read up to N tokens, the document the rest."""
    query = "who won the match at home after the long and rainy evening"
    head = await first_tokens(served, query, 3)
    field = "texts" if path == "/rerank" else "documents"
    cut = await post(served, path, {"query": query, field: DOCUMENTS, "max_tokens_per_query": 3})
    want = await post(served, path, {"query": head, field: DOCUMENTS})
    whole = await post(served, path, {"query": query, field: DOCUMENTS})
    results = lambda a: a if path == "/rerank" else a["results"]  # noqa: E731
    assert results(cut) == results(want) and results(whole) != results(cut)


async def test_rerank_counts_documents_not_the_query(served: Service):
    limit = served.app.state.settings.max_client_batch_size
    body = {"query": QUERY, "documents": ["doc"] * limit}
    assert len((await post(served, "/v2/rerank", body))["results"]) == limit
    body["documents"].append("one more")
    assert "documents" in (await post(served, "/v2/rerank", body, 413))["error"]


async def test_openai_models_lists_what_v1_embeddings_serves(served: Service):
    listed = (await served.client.get("/v1/models")).json()
    assert listed["object"] == "list"
    assert [m["id"] for m in listed["data"]] == ["embedder"]
    one = (await served.client.get("/v1/models/embedder")).json()
    assert one == listed["data"][0] and one["object"] == "model" and one["owned_by"]
    response = await served.client.get("/v1/models/sentiment")  # loaded, but no embedder
    assert response.status_code == 404 and "/v1/models" in response.json()["error"]


@pytest.mark.parametrize("ids", [[1, 2, 3], [[1, 2], [3]]])
async def test_token_ids_are_refused_naming_langchains_setting(served: Service, ids: Any):
    error = await post(served, "/v1/embeddings", {"input": ids}, 422)
    assert "check_embedding_ctx_length=False" in error["error"]
