"""POST /embed_all on a dense embedding package, over HTTP in process with the real tiny
packages: each input's token vectors are the states its /embed vector pools (the stand-in
pools by mean), the tokens they name are /tokenize's, the model is chosen as /embed's is, and
what cannot be answered is a 422 that says why. And the backend hands the (B, T, H) output
back only to a batch that reads it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from heads.contract import TOKEN_EMBEDDINGS
from heads.rows import load_package_tokenizer, pad, row, template
from service.runtime import open_backend
from service.settings import Settings
from tests.service.conftest import Service, all_tasks, serve

pytestmark = pytest.mark.anyio
pytest.importorskip("torch")  # the exporter's

TEXTS = ["the film was good", "paris", "paris " * 40, ""]


@pytest.fixture(scope="module")
async def served(tmp_path_factory: pytest.TempPathFactory, make_package) -> AsyncIterator[Service]:
    models = all_tasks(tmp_path_factory.mktemp("embed-all") / "models", make_package)
    async with serve(Settings(model_dir=models)) as s:
        yield s


async def post(served: Service, path: str, body: dict, status: int = 200) -> object:
    response = await served.client.post(path, json=body)
    assert response.status_code == status, response.text
    return response.json()


async def test_the_token_vectors_are_what_embed_pools(served: Service):
    vectors = await post(served, "/embed_all", {"inputs": TEXTS})
    pooled = await post(served, "/embed", {"inputs": TEXTS, "normalize": False})
    assert isinstance(vectors, list) and isinstance(pooled, list)
    for tokens, sentence in zip(vectors, pooled, strict=True):
        x = np.asarray(tokens, dtype=np.float64)
        assert x.shape[1] == len(sentence) == 32
        assert np.abs(x.mean(axis=0) - np.asarray(sentence)).max() <= 1e-5


async def test_tokens_are_tokenizes_and_normalize_makes_unit_vectors(served: Service):
    answer = await post(served, "/embed_all",
                        {"inputs": TEXTS[:2], "return_tokens": True, "normalize": True})  # fmt: skip
    named = await post(served, "/tokenize", {"inputs": TEXTS[:2], "model": "minilm"})
    assert isinstance(answer, list) and isinstance(named, list)
    for item, tokens in zip(answer, named, strict=True):
        assert item["tokens"] == tokens
        norms = np.linalg.norm(np.asarray(item["embeddings"]), axis=1)
        assert np.allclose(norms, 1, atol=1e-5) and len(norms) == len(tokens)


async def test_a_single_string_is_answered_as_a_list_of_one(served: Service):
    one = await post(served, "/embed_all", {"inputs": "paris"})
    assert one == await post(served, "/embed_all", {"inputs": ["paris"]})


async def test_what_cannot_be_answered_says_why(served: Service):
    wrong = await post(served, "/embed_all", {"inputs": "a", "model": "sst2"}, 422)
    assert "embedding or late-interaction model" in wrong["error"]  # type: ignore[index]
    query = await post(served, "/embed_all", {"inputs": "a", "is_query": True}, 422)
    assert "is_query is for late-interaction" in query["error"]  # type: ignore[index]
    long = await post(served, "/embed_all", {"inputs": "paris " * 80, "truncate": False}, 422)
    assert "max_seq_length" in long["error"]  # type: ignore[index]


def test_the_token_output_is_handed_back_only_when_asked(tmp_path: Path, make_package):
    """/embed's batches never copy out (B, T, H): the session is asked for it only when a job
    of the batch reads it (service.runtime.ON_REQUEST)."""
    package_dir = make_package(tmp_path, "embedding")
    from heads.package import read_package

    package = read_package(package_dir)
    backend, _ = open_backend(package, Settings(device="cpu", intra_op_threads=1))
    tokenizer = load_package_tokenizer(package.tokenizer_path)
    feeds = pad([row(template(tokenizer), tokenizer.encode("paris", add_special_tokens=False).ids)])
    plain = backend.run(feeds)
    asked = backend.run(feeds, True, frozenset({TOKEN_EMBEDDINGS}))
    assert set(plain) == {"embeddings"}
    assert set(asked) == {"embeddings", TOKEN_EMBEDDINGS}
    assert asked[TOKEN_EMBEDDINGS].shape == (1, len(feeds["input_ids"][0]), 32)
    assert np.array_equal(plain["embeddings"], asked["embeddings"])
