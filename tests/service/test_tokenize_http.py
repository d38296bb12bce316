"""POST /tokenize and /decode over HTTP equal to transformers' fast tokenizer of the same folder,
for families with different tokenizers and templates (WordPiece `[CLS] a [SEP]`, byte-level BPE
`<s> a </s>`, DeBERTa-v3's Unigram), through the engine like any task; and the bad input."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from service.settings import Settings
from tests.families import family_checkpoint, family_package
from tests.service.conftest import Service, serve

pytestmark = pytest.mark.anyio
transformers = pytest.importorskip("transformers")

FAMILIES = ("bert", "roberta", "deberta-v2")
TEXTS = ["Hello  world, café naïve!", "São Paulo 🙂 and\ttabs", "", "New-York's mayor: 3.5%"]


@pytest.fixture(scope="module")
async def served(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Service]:
    root = tmp_path_factory.mktemp("tokenize")
    for family in FAMILIES:
        package = family_package(family, "classification")
        (root / package.name).symlink_to(package)
    async with serve(Settings(model_dir=root, intra_op_threads=1)) as s:
        yield s


def name(family: str) -> str:
    """The model name requests use: the package's (its folder's) name."""
    return family_package(family, "classification").name


def reference(family: str) -> Any:
    return transformers.AutoTokenizer.from_pretrained(family_checkpoint(family, "classification"))


async def post(served: Service, path: str, body: dict[str, Any], status: int = 200) -> Any:
    response = await served.client.post(path, json=body)
    assert response.status_code == status, response.text
    return response.json()


@pytest.mark.parametrize("special", [True, False])
@pytest.mark.parametrize("family", FAMILIES)
async def test_tokens_equal_the_fast_tokenizer(served: Service, family: str, special: bool):
    body = {"inputs": TEXTS, "model": name(family), "add_special_tokens": special}
    answer = await post(served, "/tokenize", body)
    hf = reference(family)
    assert len(answer) == len(TEXTS)
    for text, tokens in zip(TEXTS, answer, strict=True):
        want = hf(text, add_special_tokens=special, return_offsets_mapping=True,
                  return_special_tokens_mask=True)  # fmt: skip
        assert [t["id"] for t in tokens] == want["input_ids"], text
        assert [t["special"] for t in tokens] == [bool(m) for m in want["special_tokens_mask"]]
        for token, (start, stop) in zip(tokens, want["offset_mapping"], strict=True):
            if token["special"]:
                assert token["start"] is None and token["stop"] is None
                assert token["text"] == hf.convert_ids_to_tokens(token["id"])
            else:
                assert (token["start"], token["stop"]) == (start, stop)
                assert token["text"] == text[start:stop]


async def test_a_single_string_gets_a_list_of_lists(served: Service):
    answer = await post(served, "/tokenize", {"inputs": "a cat", "model": name("bert")})
    assert isinstance(answer, list) and len(answer) == 1 and answer[0][0]["special"]


@pytest.mark.parametrize("skip", [True, False])
@pytest.mark.parametrize("family", FAMILIES)
async def test_decode_equals_the_fast_tokenizer(served: Service, family: str, skip: bool):
    hf = reference(family)
    ids = [hf(text)["input_ids"] for text in TEXTS]
    body = {"ids": ids, "model": name(family), "skip_special_tokens": skip}
    assert await post(served, "/decode", body) == [
        hf.decode(row, skip_special_tokens=skip) for row in ids
    ]
    one = await post(served, "/decode", {"ids": ids[0], "model": name(family)})
    assert one == [hf.decode(ids[0], skip_special_tokens=True)]


@pytest.mark.parametrize(
    "path, body, word",
    [
        (
            "/decode",
            {"ids": [[1, 10**9]], "model": name("bert")},
            "outside this model's vocabulary",
        ),
        ("/decode", {"ids": [-1], "model": name("bert")}, "ids"),
        ("/decode", {"ids": "1 2", "model": name("bert")}, "ids"),
        ("/tokenize", {"inputs": [], "model": name("bert")}, "inputs"),
        ("/tokenize", {"inputs": "a"}, "several models are loaded"),
        ("/tokenize", {"inputs": "a", "model": name("bert"), "prompt_name": "query"}, "no prompts"),
    ],
)
async def test_bad_input_is_a_clear_422(served: Service, path: str, body: dict, word: str):
    error = await post(served, path, body, status=422)
    assert word in error["error"], error


async def test_models_lists_each_packages_endpoints(served: Service):
    response = await served.client.get("/models")
    endpoints = {m["name"]: m["endpoints"] for m in response.json()["models"]}
    assert endpoints[name("bert")] == [
        "/classify",
        "/zero-shot",
        "/rerank",
        "/v1/rerank",
        "/v2/rerank",
        "/tokenize",
        "/decode",
    ]


def test_schema_lists_the_endpoints(tmp_path: Path):
    from service.app import create_app

    paths = create_app(Settings(model_dir=tmp_path)).openapi()["paths"]
    assert {"/tokenize", "/decode"} <= set(paths)
