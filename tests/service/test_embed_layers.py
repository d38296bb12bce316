"""/embed `layers`, `pooling` and `combine` (Devlin et al. 2018 §5.3, feature-based use): a
package exported with --hidden-states answers every layer's pooled states, equal to what
PyTorch computes from the same tiny model; a package without them answers a clear 422."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from service.settings import Settings
from tests.service.conftest import MAX_SEQ_LENGTH, Service, serve

torch = pytest.importorskip("torch")  # the reference is the PyTorch model: dev installs only
from benchmarks import tiny as packages  # noqa: E402 (ours, imported plainly: an error fails)

pytestmark = pytest.mark.anyio

TEXTS = ["john lives in paris", "a wonderful film , with brilliant music and a dull ending"]
LAYERS = 3  # the tiny model: embeddings output + 2 layers


@pytest.fixture(scope="module")
async def layered(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Service]:
    """Two embedding packages of the same model: with hidden states, and without."""
    models = tmp_path_factory.mktemp("layers") / "models"
    for name, hidden in (("layers", True), ("plain", False)):
        packages.build_tiny_package(
            models / name, "embedding", max_seq_length=MAX_SEQ_LENGTH, hidden_states=hidden
        )
    async with serve(Settings(model_dir=models)) as s:
        yield s


def pytorch_states(texts: list[str]) -> tuple[list[np.ndarray], np.ndarray]:
    """Every hidden state (N, T, H) of the packages' model, and the attention mask (N, T)."""
    tok = packages.tiny_tokenizer()
    model = packages.tiny_model(
        "embedding", None, 0, MAX_SEQ_LENGTH, vocab_size=tok.get_vocab_size()
    )
    ids = [tok.encode(t).ids for t in texts]
    T = max(map(len, ids))
    mask = np.array([[1] * len(i) + [0] * (T - len(i)) for i in ids])
    padded = np.array([i + [0] * (T - len(i)) for i in ids])
    with torch.no_grad():
        out = model.bert(torch.from_numpy(padded), torch.from_numpy(mask))
    return [h.numpy() for h in out.hidden_states], mask


def pooled(state: np.ndarray, mask: np.ndarray, pooling: str) -> np.ndarray:
    if pooling == "cls":
        return state[:, 0]
    return (state * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)


async def embed(s: Service, **body) -> tuple[int, object]:
    r = await s.client.post("/embed", json={"inputs": TEXTS, "normalize": False, **body})
    return r.status_code, r.json()


@pytest.mark.parametrize(
    "layers, pooling, combine",
    [
        ([-1, -2, -3], "mean", "concat"),
        ([-1, -2], "cls", "sum"),
        ([0, 2], "mean", "mean"),
        ([-2], "cls", "concat"),
    ],
)
async def test_layers_are_pytorchs_hidden_states(
    layered: Service, layers: list[int], pooling: str, combine: str
) -> None:
    status, body = await embed(
        layered, model="layers", layers=layers, pooling=pooling, combine=combine
    )
    assert status == 200, body
    states, mask = pytorch_states(TEXTS)
    chosen = np.stack([pooled(states[i], mask, pooling) for i in layers], axis=1)  # (N, k, H)
    want = {
        "concat": chosen.reshape(len(TEXTS), -1),
        "sum": chosen.sum(1),
        "mean": chosen.mean(1),
    }[combine]
    got = np.asarray(body)
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= 1e-5


async def test_the_last_layer_with_the_packages_pooling_is_its_embedding(layered: Service) -> None:
    _, default = await embed(layered, model="layers")
    _, last = await embed(layered, model="layers", layers=[-1], pooling="mean")
    _, plain = await embed(layered, model="plain")
    assert np.abs(np.asarray(default) - np.asarray(last)).max() <= 1e-6
    assert np.abs(np.asarray(default) - np.asarray(plain)).max() <= 1e-6
    status, normalised = await embed(layered, model="layers", layers=[-1, -2], normalize=True)
    assert status == 200 and np.linalg.norm(normalised, axis=1) == pytest.approx([1, 1], abs=1e-5)


async def test_models_says_how_many_hidden_states(layered: Service) -> None:
    by_name = {m["name"]: m for m in (await layered.client.get("/models")).json()["models"]}
    assert by_name["layers"]["hidden_states"] == LAYERS
    assert by_name["plain"]["hidden_states"] is None


@pytest.mark.parametrize(
    "body, message",
    [
        ({"model": "plain", "layers": [-1]}, "has no hidden-state outputs"),
        ({"model": "plain", "pooling": "cls"}, "export it with"),
        ({"model": "layers", "layers": [3]}, r"layers \[3\] out of range: this model has 3"),
        ({"model": "layers", "layers": [-4, 0]}, r"layers \[-4\] out of range"),
    ],
)
async def test_what_the_package_cannot_answer_is_a_422(
    layered: Service, body: dict, message: str
) -> None:
    status, answer = await embed(layered, **body)
    assert status == 422 and answer["error_type"] == "validation"
    assert re.search(message, answer["error"]), answer["error"]


@pytest.mark.parametrize(
    "body", [{"layers": []}, {"layers": ["-1"]}, {"pooling": "max"}, {"combine": "max"}]
)
async def test_malformed_options_are_a_422(layered: Service, body: dict) -> None:
    status, answer = await embed(layered, model="layers", **body)
    assert status == 422, answer


def test_the_package_lists_the_hidden_state_outputs(tmp_path: Path) -> None:
    pkg = packages.build_tiny_package(tmp_path / "p", "embedding", hidden_states=True)
    assert [o["name"] for o in pkg.outputs] == [
        "embeddings",
        "token_embeddings",  # every token's last hidden state (/embed_all)
        "hidden_states_cls",
        "hidden_states_mean",
    ]
    assert pkg.outputs[1]["shape"] == ["batch", "sequence", 32]
    assert pkg.outputs[2]["shape"] == ["batch", LAYERS, 32]
