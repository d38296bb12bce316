"""Fixtures for the service tests: real tiny model packages, an app with its lifespan running
behind an httpx client, and a real uvicorn server on a free loopback port.

Packages come from `make_package` alone, which wraps benchmarks.tiny: a tiny random-weight
encoder exported by the real training.export with a toy vocabulary, so these tests need neither
../shared nor a download. Its weights are drawn wide (benchmarks.tiny.STANDIN_RANGE), so that
different inputs get clearly different answers. Each task is exported once per session and
copied per test.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import uvicorn
from fastapi import FastAPI

from heads.package import write_package
from service.app import create_app
from service.runtime import Backend
from service.settings import Settings

TASKS = ("classification", "token-classification", "question-answering", "embedding")
NAMES = {
    "classification": "sst2",
    "token-classification": "conll",
    "question-answering": "squad",
    "embedding": "minilm",
}
MAX_SEQ_LENGTH = 64  # small, so that windowing is easy to reach


@pytest.fixture(scope="session")
def make_package(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """make_package(tmp_dir, task, name=None, **manifest) -> the package folder tmp_dir/name.

    `manifest` overrides package.json fields (sha256 is recomputed), e.g. prefer={...}.
    """
    pytest.importorskip("torch")  # the exporter's: dev installs only
    # Our own module, imported plainly: an error in it (or in training.export) fails the tests
    # that need it instead of skipping them.
    from benchmarks import tiny

    def make(tmp_dir: Path, task: str, name: str | None = None, **manifest: Any) -> Path:
        out = Path(tmp_dir) / (name or NAMES[task])
        # The same export for every name (benchmarks.tiny caches it): renaming only rewrites
        # package.json. The stand-in's weights are spread so that its answers differ by input
        # and a test that compares answers across requests can tell them apart.
        with standin_int8_gate():
            tiny.build_tiny_package(out, task, **standin(task))
        if name or manifest:
            m = json.loads((out / "package.json").read_text())
            m.update(manifest, name=name or m["name"])
            write_package(out, {k: v for k, v in m.items() if k not in ("sha256", "format")})
        return out

    return make


@contextmanager
def standin_int8_gate() -> Iterator[None]:
    """The int8 gate the stand-in classifier is exported under: its wide random weights put
    its logits near ties on many texts, and int8 flips 4.6% of its top labels on the export's
    sample (no choice does better than 2.9%), where the real gate (heads.quality) allows 1%.
    The service tests need its int8 file for variant choice, not for its answers."""
    from training import quantize

    gates = {**quantize.GATES, "classification": {"top1_agreement": 0.9}}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(quantize, "GATES", gates)
        yield


def standin(task: str) -> dict[str, Any]:
    """benchmarks.tiny.build_tiny_package's arguments for `task`'s stand-in package."""
    from benchmarks import tiny

    return {
        "name": NAMES[task],
        "max_seq_length": MAX_SEQ_LENGTH,
        "variants": ("fp32", "int8") if task == "classification" else ("fp32",),
        "initializer_range": tiny.STANDIN_RANGE,
    }


@pytest.fixture(scope="session")
def standin_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """standin_checkpoint(task) -> the Hugging Face checkpoint folder of the model in `task`'s
    package (model_dir's), for references computed by transformers."""
    pytest.importorskip("torch")
    from benchmarks import tiny

    def make(task: str) -> Path:
        root = tmp_path_factory.mktemp("standin")
        with standin_int8_gate():
            tiny.build_tiny_package(
                root / "package", task, checkpoint_dir=root / "ckpt", **standin(task)
            )
        return root / "ckpt"

    return make


def all_tasks(folder: Path, make_package: Callable[..., Path]) -> Path:
    folder.mkdir()
    for task in TASKS:
        make_package(folder, task)
    return folder


@pytest.fixture
def model_dir(tmp_path: Path, make_package: Callable[..., Path]) -> Path:
    """A model_dir with one package per task."""
    return all_tasks(tmp_path / "models", make_package)


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class Service:
    app: FastAPI
    client: httpx.AsyncClient

    @property
    def registry(self) -> Any:
        return self.app.state.registry

    async def metrics(self) -> str:
        """/metrics, with the first inference key when one is set (it guards /metrics unless
        metrics_public)."""
        key = self.app.state.settings.api_key
        first = key.get_secret_value().split(",")[0].strip() if key else ""
        headers = {"Authorization": f"Bearer {first}"} if first else {}
        return (await self.client.get("/metrics", headers=headers)).text


@asynccontextmanager
async def serve(settings: Settings, wait: bool = True) -> AsyncIterator[Service]:
    """The app with its lifespan running (packages loaded when `wait`), and a client to it."""
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        if wait:
            await asyncio.wait_for(app.state.registry.loaded.wait(), 60)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://test", timeout=30
        ) as client:
            yield Service(app, client)


@pytest.fixture
async def service(model_dir: Path) -> AsyncIterator[Service]:
    """A fresh service over one package per task: metrics start at zero."""
    async with serve(Settings(model_dir=model_dir)) as s:
        yield s


@pytest.fixture(scope="module")
async def shared(
    tmp_path_factory: pytest.TempPathFactory, make_package: Callable[..., Path]
) -> AsyncIterator[Service]:
    """One service for a whole module, for tests that only read answers (not metrics)."""
    models = all_tasks(tmp_path_factory.mktemp("shared") / "models", make_package)
    async with serve(Settings(model_dir=models)) as s:
        yield s


class LiveServer:
    """uvicorn in a thread on a free 127.0.0.1 port, for what only a real server shows:
    disconnects, shutdown, bodies on a socket."""

    def __init__(self, app: FastAPI, drain_timeout: float = 5) -> None:
        self.app = app
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        config = uvicorn.Config(
            app, log_level="warning", lifespan="on", timeout_graceful_shutdown=int(drain_timeout)
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    def start(self, ready: bool = True) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        while ready and time.monotonic() < deadline:
            if httpx.get(self.url + "/ready").status_code == 200:
                break
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()


@pytest.fixture
def live(model_dir: Path) -> Iterator[Callable[..., LiveServer]]:
    """live(**settings) -> a started LiveServer over model_dir; stopped after the test."""
    servers: list[LiveServer] = []

    def start(**settings: Any) -> LiveServer:
        server = LiveServer(
            create_app(Settings(model_dir=model_dir, **settings)), settings.get("drain_timeout", 5)
        )
        servers.append(server.start())
        return server

    yield start
    for server in servers:
        if server.thread.is_alive():
            server.stop()


# -- a model's backend under the test's control ------------------------------------------------


class Gated:
    """Wraps a model's backend: records every forward pass, can hold them until released, make
    them slower, or make ONNX Runtime fail on some."""

    def __init__(self, inner: Backend, hold: bool = False, delay: float = 0.0) -> None:
        self.inner = inner
        self.provider = inner.provider
        self.lanes = inner.lanes
        self.delay = delay  # seconds added to each forward pass: a heavier model
        self.calls = 0
        self.rows: list[int] = []  # rows per forward pass
        self.lengths: list[list[int]] = []  # per forward pass: each row's real length, sorted
        self.poison: set[int] = set()  # these passes (1-based) get ids outside the vocabulary,
        # so ONNX Runtime itself fails on them
        self.entered = threading.Event()
        self.gate = threading.Event()
        if not hold:
            self.gate.set()

    def run(
        self,
        feeds: Mapping[str, np.ndarray],
        alone: bool = True,
        wants: frozenset[str] = frozenset(),
    ) -> dict[str, np.ndarray]:
        self.calls += 1
        call = self.calls
        self.rows.append(len(feeds["input_ids"]))
        self.lengths.append(sorted(int(n) for n in feeds["attention_mask"].sum(axis=1)))
        self.entered.set()
        self.gate.wait(20)
        if self.delay:
            time.sleep(self.delay)
        if call in self.poison:
            feeds = {**feeds, "input_ids": np.full_like(feeds["input_ids"], 10**9)}
        return self.inner.run(feeds, alone, wants)


def gate(app: Any, name: str = "sst2", hold: bool = False, delay: float = 0.0) -> Gated:
    """Put a Gated around the backend of the loaded model `name` of `app`."""
    model = next(e.model for e in app.state.registry.entries if e.name == name)
    wrapped = Gated(model.backend, hold, delay)
    model.batcher.backend = wrapped
    return wrapped


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample of the Prometheus text `text`."""
    for line in text.splitlines():
        m = re.match(r"^(\w+)\{(.*)\} (\S+)$", line)
        if m and m.group(1) == name and dict(re.findall(r'(\w+)="([^"]*)"', m.group(2))) == labels:
            return float(m.group(3))
    raise KeyError(f"{name}{labels}")
