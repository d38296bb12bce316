"""Served sentence-transformers folders (issue 17, test 4): a folder built with
sentence-transformers' module classes (tests/training/test_st_folders.py) goes through
training.export into a real uvicorn server, and /embed answers what
`SentenceTransformer(folder).encode` does (cosine >= 0.99999): CLS, mean and max pooling, with
and without Dense and Normalize, for bert, and a few for roberta and distilbert (electra's
folders are compared with `encode` in tests/training/test_st_folders.py).
Prompts: /embed and /v1/embeddings `prompt_name` (and the folder's default_prompt_name) as
`encode(prompt_name=...)`, an unknown name or a model without prompts a 422.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from service.app import create_app
from service.settings import Settings
from tests.service.conftest import LiveServer
from tests.training import test_st_folders as folders  # skips without torch / sentence-transformers
from training import export

# slow: ~17 s of exports and a live server; the same folders against sentence-transformers
# without HTTP stay in the unit suite (tests/training/test_st_folders.py)
pytestmark = pytest.mark.slow

TEXTS = [*folders.TEXTS, "query: a text that already has a prefix", "x " * 40]
CASES = {  # package name -> family, pooling, Dense activations, Normalize
    **{f"{family}-{pooling}{'-dense-norm' * both}": (family, pooling, ("tanh",) * both, both)
       for family in ("bert",) for pooling in ("cls", "mean", "max")
       for both in (False, True)},
    "bert-sqrt-dense": ("bert", "mean_sqrt_len_tokens", ("tanh", "identity"), False),
    "roberta-cls-dense-norm": ("roberta", "cls", ("tanh",), True),
    "roberta-mean": ("roberta", "mean", (), False),
    "roberta-max-dense": ("roberta", "max", ("identity",), False),
    "distilbert-cls": ("distilbert", "cls", (), False),
    "distilbert-mean-norm": ("distilbert", "mean", (), True),
    "distilbert-max-dense-norm": ("distilbert", "max", ("tanh",), True),
    "mpnet-mean-norm": ("mpnet", "mean", (), True),  # all-mpnet-base-v2's modules
    "modernbert-mean-norm": ("modernbert", "mean", (), True),
    "modernbert-cls-dense": ("modernbert", "cls", ("tanh",), False),
    "deberta-v2-mean-norm": ("deberta-v2", "mean", (), True),
}  # fmt: skip
PROMPTS = {"query": "query: ", "passage": "passage: "}
NO_PROMPTS = "bert-cls"  # exported without config_sentence_transformers.json
MIN_COSINE = 0.99999


@pytest.fixture(scope="module")
def st_folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("st-folders")
    built = {name: folders.st_folder(root / name, *case) for name, case in CASES.items()}
    built["prompted"] = folders.st_folder(
        root / "prompted", "bert", "mean", ("identity",), True,
        prompts=PROMPTS, default_prompt_name="query",
    )  # fmt: skip
    (built[NO_PROMPTS] / "config_sentence_transformers.json").unlink()
    return built


@pytest.fixture(scope="module")
def server(
    st_folders: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[httpx.Client]:
    models = tmp_path_factory.mktemp("st-packages")
    for name, folder in st_folders.items():
        export.export_package(folder, "embedding", models / name, verbose=False)
    live = LiveServer(create_app(Settings(model_dir=models, intra_op_threads=1))).start()
    with httpx.Client(base_url=live.url, timeout=60) as client:
        yield client
    live.stop()


def encode(folder: Path, texts: list[str], **options: str) -> np.ndarray:
    st = folders.st.SentenceTransformer(str(folder), device="cpu")
    return st.encode(texts, batch_size=len(texts), **options)


def embed(client: httpx.Client, model: str, **body: object) -> np.ndarray:
    response = client.post("/embed", json={"inputs": TEXTS, "model": model, **body})
    assert response.status_code == 200, response.text
    return np.asarray(response.json())


def assert_same(ours: np.ndarray, theirs: np.ndarray) -> None:
    assert ours.shape == theirs.shape
    cosine = (ours * theirs).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(theirs, axis=1)
    assert cosine.min() >= MIN_COSINE, cosine
    assert np.abs(ours - theirs).max() <= 1e-4  # same scale too: Normalize applied or not alike


@pytest.mark.parametrize("name", CASES)
def test_embed_is_sentence_transformers_encode(
    server: httpx.Client, st_folders: dict[str, Path], name: str
) -> None:
    assert_same(embed(server, name), encode(st_folders[name], TEXTS))


def test_prompt_name_is_encodes(server: httpx.Client, st_folders: dict[str, Path]) -> None:
    folder = st_folders["prompted"]
    passage = encode(folder, TEXTS, prompt_name="passage")
    assert_same(embed(server, "prompted", prompt_name="passage"), passage)
    openai = server.post(
        "/v1/embeddings", json={"input": TEXTS, "model": "prompted", "prompt_name": "passage"}
    ).json()
    assert_same(np.asarray([d["embedding"] for d in openai["data"]]), passage)
    # the usage counts the prompt's tokens too: they were computed
    plain = server.post(
        "/v1/embeddings", json={"input": TEXTS, "model": "prompted", "prompt_name": "document"}
    ).json()
    assert openai["usage"]["prompt_tokens"] > plain["usage"]["prompt_tokens"]


def test_default_prompt_name_applies_when_none_is_named(
    server: httpx.Client, st_folders: dict[str, Path]
) -> None:
    folder = st_folders["prompted"]
    default = encode(folder, TEXTS)  # sentence-transformers applies default_prompt_name "query"
    assert_same(default, encode(folder, TEXTS, prompt_name="query"))
    assert_same(embed(server, "prompted"), default)
    without = embed(server, "prompted", prompt_name="document")  # saved as "": no prompt
    assert_same(without, encode(folder, TEXTS, prompt=""))
    assert np.abs(without - default).max() > 1e-3


@pytest.mark.parametrize(
    "model, path, message",
    [
        ("prompted", "/embed",
         "prompt_name 'search' is not one of model 'prompted''s prompts: document, passage, query"),
        ("prompted", "/v1/embeddings", "is not one of model 'prompted''s prompts"),
        (NO_PROMPTS, "/embed", f"prompt_name 'search': model '{NO_PROMPTS}' has no prompts"),
    ],
)  # fmt: skip
def test_an_unknown_prompt_name_is_a_422(
    server: httpx.Client, model: str, path: str, message: str
) -> None:
    key = "inputs" if path == "/embed" else "input"
    response = server.post(path, json={key: TEXTS, "model": model, "prompt_name": "search"})
    assert response.status_code == 422
    assert message in response.json()["error"]


def test_openapi_shows_prompt_name(server: httpx.Client) -> None:
    schemas = server.get("/openapi.json").json()["components"]["schemas"]
    for request in ("EmbedRequest", "OpenAIEmbeddingRequest"):
        assert "prompt_name" in schemas[request]["properties"]
        assert "default_prompt_name" in str(schemas[request]["properties"]["prompt_name"])


def test_models_lists_the_prompts(server: httpx.Client) -> None:
    models = {m["name"]: m for m in server.get("/models").json()["models"]}
    assert models["prompted"]["prompts"] == {**PROMPTS, "document": ""}
    assert models["prompted"]["default_prompt_name"] == "query"
    assert models[NO_PROMPTS]["prompts"] is None
