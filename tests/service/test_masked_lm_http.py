"""POST /fill-mask and /embed_sparse over HTTP: answers equal transformers' fill-mask pipeline and
the SPLADE formula on the same tiny masked-LM folders (BERT, RoBERTa), through the engine and the
batcher like every task; /models names the endpoints; the bad input is a clear 422."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

from service.settings import Settings
from tests.families import family_checkpoint, family_package
from tests.service.conftest import Service, serve

pytestmark = pytest.mark.anyio
transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

SEED = 5
FAMILIES = ("bert", "roberta")
MASK = {"bert": "[MASK]", "roberta": "<mask>"}


def names() -> dict[str, Any]:
    return {
        (family, kind): family_package(
            family, *(("fill-mask",) if kind == "fill" else ("embedding",)), seed=SEED,
            pooling="splade" if kind == "sparse" else None,
        )
        for family in FAMILIES
        for kind in ("fill", "sparse")
    }  # fmt: skip


@pytest.fixture(scope="module")
async def served(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Service]:
    root = tmp_path_factory.mktemp("masked-lm")
    for package in names().values():
        (root / package.name).symlink_to(package)
    for other in (dense(), classifier()):
        (root / other.name).symlink_to(other)
    async with serve(Settings(model_dir=root, intra_op_threads=1)) as s:
        yield s


def dense() -> Any:
    return family_package("bert", "embedding", seed=SEED)


def classifier() -> Any:
    return family_package("bert", "classification", seed=SEED)


def model(family: str, kind: str) -> str:
    return names()[family, kind].name


async def post(served: Service, path: str, body: dict[str, Any], status: int = 200) -> Any:
    response = await served.client.post(path, json=body)
    assert response.status_code == status, response.text
    return response.json()


def same_fillers(ours: list[dict], theirs: list[dict]) -> None:
    assert [(f["token"], f["token_str"], f["sequence"]) for f in ours] == [
        (f["token"], f["token_str"], f["sequence"]) for f in theirs
    ]
    assert max(abs(a["score"] - b["score"]) for a, b in zip(ours, theirs, strict=True)) <= 1e-5


@pytest.mark.parametrize("family", FAMILIES)
async def test_fill_mask_equals_the_pipeline(served: Service, family: str):
    m = MASK[family]
    texts = [f"Paris is the {m} of France.", f"A {m} sat on the {m}.", f"{m} 🙂 café"]
    pipe = transformers.pipeline(
        "fill-mask", model=str(family_checkpoint(family, "masked-lm", seed=SEED))
    )
    body = {"inputs": texts, "model": model(family, "fill"), "top_k": 3}
    ours = await post(served, "/fill-mask", body)
    for text, answer in zip(texts, ours, strict=True):
        theirs = pipe(text, top_k=3)
        if text.count(m) == 1:
            same_fillers(answer, theirs)
        else:  # one list per mask
            for a, b in zip(answer, theirs, strict=True):
                same_fillers(a, b)
    one = await post(served, "/fill-mask", {"inputs": texts[0], "model": model(family, "fill"),
                                            "targets": ["capital", "city"]})  # fmt: skip
    same_fillers(one, pipe(texts[0], targets=["capital", "city"]))


@pytest.mark.parametrize("family", FAMILIES)
async def test_sparse_embeddings_equal_the_formula(served: Service, family: str):
    texts = ["A cat sat on the mat.", "Paris is the capital of France 🙂"]
    body = {"inputs": texts, "model": model(family, "sparse"), "return_tokens": True}
    ours = await post(served, "/embed_sparse", body)
    folder = family_checkpoint(family, "masked-lm", seed=SEED)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    lm = transformers.AutoModelForMaskedLM.from_pretrained(folder).eval()
    for text, entries in zip(texts, ours, strict=True):
        with torch.inference_mode():
            logits = lm(**tokenizer(text, return_tensors="pt")).logits[0]
        want = torch.log1p(torch.relu(logits)).max(dim=0).values.numpy()
        assert [e["index"] for e in entries] == np.flatnonzero(want).tolist()
        values = np.array([e["value"] for e in entries])
        assert np.abs(values - want[want != 0]).max() <= 1e-4
        assert [e["token"] for e in entries] == tokenizer.convert_ids_to_tokens(
            [e["index"] for e in entries]
        )


async def test_models_names_each_packages_endpoints(served: Service):
    listed = {
        m["name"]: m["endpoints"] for m in (await served.client.get("/models")).json()["models"]
    }
    assert listed[model("bert", "fill")][0] == "/fill-mask"
    assert listed[model("bert", "sparse")][0] == "/embed_sparse"
    assert listed[dense().name][:2] == ["/embed", "/v1/embeddings"]


@pytest.mark.parametrize(
    "path, body, word",
    [
        ("/fill-mask", {"inputs": "no blank here", "model": "fill"}, "mask"),
        ("/fill-mask", {"inputs": "a [MASK] " + "word " * 400, "model": "fill"}, "max_seq_length"),
        ("/fill-mask", {"inputs": "a [MASK]", "model": "classifier"}, "needs a fill-mask"),
        ("/fill-mask", {"inputs": "a [MASK]", "model": "fill", "top_k": 0}, "top_k"),
        ("/embed_sparse", {"inputs": "a", "model": "dense"}, "not sparse"),
        ("/embed", {"inputs": "a", "model": "sparse"}, "/embed_sparse"),
        ("/embed_sparse", {"inputs": []}, "inputs"),
    ],
)
async def test_bad_input_is_a_clear_422(served: Service, path: str, body: dict, word: str):
    names = {"fill": model("bert", "fill"), "sparse": model("bert", "sparse"),
             "dense": dense().name, "classifier": classifier().name}  # fmt: skip
    body = {**body, "model": names.get(body.get("model"), body.get("model"))}
    response = await served.client.post(path, json=body)
    assert response.status_code == 422, response.text
    assert word in response.json()["error"], response.text


async def test_without_a_name_each_endpoint_picks_its_kind(served: Service, tmp_path):
    """/embed with one dense and several sparse packages loaded: the dense one serves it."""
    answer = await post(served, "/embed", {"inputs": "a cat"})
    assert len(answer) == 1


async def test_the_v2_protocol_answers_as_fill_mask_and_embed_sparse(served: Service):
    """Open Inference Protocol: each text's native answer as JSON in a BYTES element."""
    texts = {"bert": ["Paris is the [MASK] of France.", "a [MASK] sat"]}
    for kind, path, output, native_body in (
        ("fill", "/fill-mask", "predictions", {"top_k": 3}),
        ("sparse", "/embed_sparse", "sparse", {}),
    ):
        name = model("bert", kind)
        body = {
            "inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "data": texts["bert"]}],
            "parameters": native_body,
        }
        answer = await post(served, f"/v2/models/{name}/infer", body)
        (out,) = answer["outputs"]
        assert (out["name"], out["datatype"], out["shape"]) == (output, "BYTES", [2])
        native = await post(served, path, {"inputs": texts["bert"], "model": name, **native_body})
        assert [json.loads(x) for x in out["data"]] == native
