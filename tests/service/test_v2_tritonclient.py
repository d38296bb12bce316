"""Triton's own HTTP client (tritonclient[http]) talks to the service unchanged: health,
readiness, metadata and infer through the Open Inference Protocol v2, on a real server. Its
answers equal the native routes' for the same texts."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from service.app import create_app
from service.settings import Settings
from tests.service.conftest import LiveServer

httpclient = pytest.importorskip("tritonclient.http")
utils = pytest.importorskip("tritonclient.utils")

TEXTS = ["a good film", "a dull one"]


@pytest.fixture(scope="module")
def server(
    make_package: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    models = tmp_path_factory.mktemp("triton") / "models"
    models.mkdir()
    for task in ("classification", "embedding"):
        make_package(models, task)
    live = LiveServer(create_app(Settings(model_dir=models))).start()
    try:
        yield live
    finally:
        live.stop()


@pytest.fixture(scope="module")
def client(server: LiveServer) -> Iterator[object]:
    c = httpclient.InferenceServerClient(url=server.url.removeprefix("http://"))
    try:
        yield c
    finally:
        c.close()


def texts(name: str = "text") -> object:
    tensor = httpclient.InferInput(name, [len(TEXTS)], "BYTES")
    tensor.set_data_from_numpy(np.array(TEXTS, dtype=object), binary_data=False)
    return tensor


def test_health_readiness_and_metadata(client) -> None:
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("sst2")
    meta = client.get_model_metadata("sst2")
    assert meta["name"] == "sst2"
    assert {"name": "text", "datatype": "BYTES", "shape": [-1]} in meta["inputs"]
    assert {o["name"] for o in meta["outputs"]} >= {"label", "score"}


def test_classify_through_the_client_equals_the_native_route(client, server) -> None:
    wanted = [httpclient.InferRequestedOutput(n, binary_data=False) for n in ("label", "score")]
    result = client.infer("sst2", [texts()], outputs=wanted)
    labels = [x.decode() if isinstance(x, bytes) else x for x in result.as_numpy("label")]
    scores = result.as_numpy("score")
    native = httpx.post(server.url + "/classify", json={"inputs": TEXTS, "model": "sst2"}).json()
    assert labels == [a[0]["label"] for a in native]
    np.testing.assert_allclose(scores, [a[0]["score"] for a in native], rtol=1e-6)


def test_embed_through_the_client_equals_the_native_route(client, server) -> None:
    wanted = [httpclient.InferRequestedOutput("embedding", binary_data=False)]
    models = httpx.get(server.url + "/models").json()["models"]
    name = next(m["name"] for m in models if m["task"] == "embedding")
    vectors = client.infer(name, [texts()], outputs=wanted).as_numpy("embedding")
    native = httpx.post(server.url + "/embed", json={"inputs": TEXTS, "model": name}).json()
    np.testing.assert_allclose(vectors, np.array(native, dtype=np.float32), rtol=1e-5, atol=1e-6)


def test_errors_reach_the_client_as_its_exception(client) -> None:
    with pytest.raises(utils.InferenceServerException, match="no model named"):
        client.infer("nope", [texts()])
    binary = httpclient.InferInput("text", [len(TEXTS)], "BYTES")
    binary.set_data_from_numpy(np.array(TEXTS, dtype=object))  # the client's default: binary
    with pytest.raises(utils.InferenceServerException, match="binary tensor data"):
        client.infer("sst2", [binary])


def test_outputs_asked_in_binary_come_back_as_json_the_client_reads(client) -> None:
    # The client's defaults ask for binary outputs (per output, or binary_data_output when it
    # names none); the answer is JSON, which it reads alike.
    named = client.infer("sst2", [texts()], outputs=[httpclient.InferRequestedOutput("label")])
    unnamed = client.infer("sst2", [texts()])
    assert list(named.as_numpy("label")) == list(unnamed.as_numpy("label"))
    assert len(unnamed.as_numpy("label")) == len(TEXTS) and unnamed.as_numpy("score") is not None
