"""Many heads on one encoder (issue 52) through a real server: adapter packages answer as the
full models they stand for, alone, mixed in one batch and through POST /analyze; /models and
/metrics show them; model control keeps the encoder while adapters ride on it.

Two model dirs from one tiny wide encoder (tests/training/test_adapters_export.wide_init):
models/ holds the encoder package `enc`, two LoRA adapters (sentiment at rank 4, topics at
rank 2: different data, labels, seeds and ranks) and two heads trained on the frozen encoder
(a sentiment classifier and a tagger reading the sum of both layers); full/ holds, under the
same names, the full packages of the same fine-tunings (--merge for LoRA, the frozen run's own
checkpoint otherwise), exported by training.export.export_package. Asserted: labels, entity
spans and words exact, scores within 1e-4. Each package is built once for the module, about
25 s on 2 cores.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from heads.adapters import ADAPTER_INPUT
from service.app import create_app
from service.settings import Settings
from tests.service.conftest import Gated, LiveServer, metric
from tests.training.test_adapters_export import finetune, one_torch_thread, wide_init
from tests.training.tiny import tiny_tokenizer
from training.adapters import export_adapter, export_encoder
from training.export import export_package

pytestmark = pytest.mark.anyio

TOLERANCE = 1e-4
SENTIMENT = "sentiment/train.tsv"
TOPICS = "topics/train.csv"
NER = "ner/train.conll"
# name -> (task, training data, options): LoRA runs are trained again with --merge for full/
ADAPTERS = {
    "sst-lora": ("classification", SENTIMENT, ["--lora-rank", "4", "--seed", "1"]),
    "topics-lora": ("classification", TOPICS, ["--lora-rank", "2", "--seed", "2"]),
    "sst-frozen": ("classification", SENTIMENT, ["--freeze-encoder", "--seed", "3"]),
    "ner-frozen": ("token-classification", NER, ["--freeze-encoder", "--features", "all-sum"]),
}
LORA = ("sst-lora", "topics-lora")
FROZEN = ("sst-frozen", "ner-frozen")
TEXTS = [
    "a warm , funny film that never drags",
    "the striker scored twice in the second half",
    "ok",
    "Anna flew from Paris to Lisbon with the Red Cross on Monday",
]
ADMIN = {"Authorization": "Bearer admin-key"}


@dataclass
class Dirs:
    models: Path  # the encoder and its adapters
    full: Path  # the same fine-tunings as full packages, under the same names


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> Dirs:
    root = tmp_path_factory.mktemp("adapters-http")
    models, full = root / "models", root / "full"
    init = wide_init(root / "init", tiny_tokenizer())
    with one_torch_thread():
        export_encoder(init, models / "enc", verbose=False)
        for name, (task, train, more) in ADAPTERS.items():
            best = finetune(init, task, train, root / "runs" / name, *more)
            export_adapter(best, models / "enc", models / name, verbose=False)
            if name in LORA:  # the same run (seed, steps) again, its merged weights saved
                merged = root / "runs" / f"{name}-merged"
                best = finetune(init, task, train, merged, *more, "--merge")
            export_package(best, task, full / name, verbose=False)
    return Dirs(models, full)


@pytest.fixture(scope="module")
def servers(dirs: Dirs) -> Iterator[dict[str, LiveServer]]:
    """Live servers: "adapters" over models/, "full" over full/."""
    started = {
        key: LiveServer(create_app(Settings(model_dir=folder, intra_op_threads=1))).start()
        for key, folder in (("adapters", dirs.models), ("full", dirs.full))
    }
    yield started
    for server in started.values():
        server.stop()


@pytest.fixture(scope="module")
def expected(servers: dict[str, LiveServer]) -> dict[str, Any]:
    """Each model's answer to TEXTS from its full package: name -> answer."""
    answers = {}
    with httpx.Client(base_url=servers["full"].url, timeout=30) as c:
        for name in ADAPTERS:
            path, body = request(name, TEXTS)
            r = c.post(path, json=body)
            assert r.status_code == 200, r.text
            answers[name] = r.json()
    return answers


def request(name: str, texts: list[str]) -> tuple[str, dict[str, Any]]:
    """`name`'s task's endpoint and body: every label's score for a classifier."""
    if ADAPTERS[name][0] == "token-classification":
        return "/ner", {"inputs": texts, "model": name}
    return "/classify", {"inputs": texts, "model": name, "top_k": None}


def same(got: Any, want: Any, where: str = "answer") -> None:
    """Equal, floats within TOLERANCE: labels, words and spans exact, scores close."""
    if isinstance(want, Mapping):
        assert isinstance(got, Mapping) and set(got) == set(want), f"{where}: {got} != {want}"
        for key in want:
            same(got[key], want[key], f"{where}.{key}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), f"{where}: {got} != {want}"
        for k, (a, b) in enumerate(zip(got, want, strict=True)):
            same(a, b, f"{where}[{k}]")
    elif isinstance(want, float):
        assert abs(got - want) <= TOLERANCE, f"{where}: {got} != {want}"
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"


async def answer(client: httpx.AsyncClient, name: str, texts: list[str] = TEXTS) -> Any:
    path, body = request(name, texts)
    r = await client.post(path, json=body)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture
async def client(servers: dict[str, LiveServer]) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=servers["adapters"].url, timeout=30) as c:
        yield c


# --- answers ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [*LORA, *FROZEN])
async def test_an_adapter_answers_as_its_full_model(
    client: httpx.AsyncClient, expected: dict[str, Any], name: str
) -> None:
    same(await answer(client, name), expected[name], name)


class Recording(Gated):
    """Gated, also recording which adapters' rows each forward pass of the encoder held."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.mixes: list[set[str]] = []

    def run(
        self,
        feeds: Mapping[str, np.ndarray],
        alone: bool = True,
        wants: frozenset[str] = frozenset(),
    ) -> dict[str, np.ndarray]:
        rows = feeds.get(ADAPTER_INPUT, ())
        self.mixes.append({a.name for a in rows if a is not None})
        return super().run(feeds, alone, wants)


async def test_mixed_batches_gather_each_rows_lora(
    servers: dict[str, LiveServer], client: httpx.AsyncClient, expected: dict[str, Any]
) -> None:
    """20 concurrent requests alternating between the two LoRA adapters; the encoder's first
    forward pass is held so that the others queue and run in batches of both."""
    registry = servers["adapters"].app.state.registry
    encoder = next(e.model for e in registry.entries if e.name == "enc")
    recording = Recording(encoder.batcher.backend, hold=True)
    encoder.batcher.backend = recording
    try:
        names = [LORA[k % 2] for k in range(20)]
        calls = [asyncio.create_task(answer(client, name)) for name in names]
        assert await asyncio.to_thread(recording.entered.wait, 10)
        await asyncio.sleep(0.3)  # the other requests arrive and queue behind the held pass
        recording.gate.set()
        answers = await asyncio.gather(*calls)
    finally:
        encoder.batcher.backend = recording.inner
    for name, got in zip(names, answers, strict=True):
        same(got, expected[name], name)
    assert {"sst-lora", "topics-lora"} in recording.mixes, recording.mixes


# --- POST /analyze ------------------------------------------------------------------------


async def test_analyze_answers_as_the_separate_calls(
    client: httpx.AsyncClient, expected: dict[str, Any]
) -> None:
    r = await client.post("/analyze", json={"inputs": TEXTS, "models": list(FROZEN)})
    assert r.status_code == 200, r.text
    got = r.json()
    assert set(got) == set(FROZEN)
    ner = await client.post("/ner", json={"inputs": TEXTS, "model": "ner-frozen"})
    sst = await client.post("/classify", json={"inputs": TEXTS, "model": "sst-frozen"})
    same(got["ner-frozen"], ner.json(), "ner-frozen")
    same(got["ner-frozen"], expected["ner-frozen"], "ner-frozen")
    same(got["sst-frozen"], sst.json(), "sst-frozen")


async def test_analyze_takes_each_heads_options_as_its_endpoint_does(
    client: httpx.AsyncClient, expected: dict[str, Any]
) -> None:
    options = {"sst-frozen": {"top_k": None}, "ner-frozen": {"aggregation_strategy": "first"}}
    r = await client.post("/analyze", json={"inputs": TEXTS, "models": options})
    assert r.status_code == 200, r.text
    got = r.json()
    same(got["sst-frozen"], expected["sst-frozen"], "sst-frozen")
    ner = await client.post(
        "/ner", json={"inputs": TEXTS, "model": "ner-frozen", "aggregation_strategy": "first"}
    )
    same(got["ner-frozen"], ner.json(), "ner-frozen")


@pytest.mark.parametrize(
    ("models", "status", "message"),
    [
        (["sst-frozen", "sst-lora"], 422, "'sst-lora' is not a head trained on a frozen encoder"),
        (["sst-frozen", "nope"], 404, "'nope'"),
        (["enc"], 422, "model 'enc' is for encoder; /analyze runs heads of"),
        ({"sst-frozen": {"top_k": "x"}}, 422, "models.sst-frozen: top_k"),
        ({"sst-frozen": {"model": "ner-frozen"}}, 422, "models.sst-frozen: 'inputs' and 'model'"),
    ],
    ids=["lora-adapter", "unknown", "encoder", "wrong-option", "model-inside"],
)
async def test_analyze_refusals_say_which_model_and_why(
    client: httpx.AsyncClient, models: Any, status: int, message: str
) -> None:
    r = await client.post("/analyze", json={"inputs": TEXTS, "models": models})
    assert r.status_code == status, r.text
    assert message in r.json()["error"], r.json()


# --- what the service shows ---------------------------------------------------------------


async def test_models_lists_each_adapter_with_its_encoder(client: httpx.AsyncClient) -> None:
    models = {m["name"]: m for m in (await client.get("/models")).json()["models"]}
    assert set(models) == {"enc", *ADAPTERS}
    assert models["enc"]["task"] == "encoder" and models["enc"]["state"] == "ready"
    assert sorted(models["enc"]["adapters"]) == sorted(ADAPTERS)
    shapes = {
        "sst-lora": ("lora", 4, ["query", "value"]),
        "topics-lora": ("lora", 2, ["query", "value"]),
        "sst-frozen": ("frozen", 0, []),
        "ner-frozen": ("frozen", 0, []),
    }
    for name, (kind, rank, targets) in shapes.items():
        info = models[name]
        assert info["state"] == "ready" and info["task"] == ADAPTERS[name][0]
        assert info["base"] == "enc" and info.get("adapters") is None
        adapter = info["adapter"]
        assert (adapter["kind"], adapter["rank"], adapter["targets"]) == (kind, rank, targets)
        assert adapter["bytes"] > 0
    assert models["topics-lora"]["labels"] != models["sst-lora"]["labels"]
    assert models["sst-lora"]["adapter"]["bytes"] > models["sst-frozen"]["adapter"]["bytes"]


async def test_metrics_has_each_adapters_info(client: httpx.AsyncClient) -> None:
    models = {m["name"]: m for m in (await client.get("/models")).json()["models"]}
    text = (await client.get("/metrics")).text
    for name in ADAPTERS:
        a = models[name]["adapter"]
        labels = {"kind": a["kind"], "rank": str(a["rank"]), "bytes": str(a["bytes"])}
        assert metric(text, "bert_heads_adapter_info", model=name, base="enc", **labels) == 1


# --- model control ------------------------------------------------------------------------


@pytest.fixture
def controlled(dirs: Dirs, tmp_path: Path) -> Iterator[LiveServer]:
    """A server over a copy of models/ whose packages load and unload by admin request."""
    models = shutil.copytree(dirs.models, tmp_path / "models")
    settings = Settings(
        model_dir=models, model_control="explicit", admin_key="admin-key", intra_op_threads=1
    )
    server = LiveServer(create_app(settings)).start()
    yield server
    server.stop()


@pytest.mark.slow  # model control: the unit suite's 10 minutes are spent
async def test_the_encoder_stays_while_adapters_ride_on_it(
    controlled: LiveServer, expected: dict[str, Any]
) -> None:
    async with httpx.AsyncClient(base_url=controlled.url, timeout=30) as c:

        async def control(name: str, action: str, status: int = 200) -> Any:
            r = await c.post(f"/models/{name}/{action}", headers=ADMIN)
            assert r.status_code == status, r.text
            return r.json()

        refused = await control("enc", "unload", 422)
        riders = ", ".join(sorted(ADAPTERS))
        assert f"adapters run over enc ({riders}): unload them first" in refused["error"]
        for name in ADAPTERS:
            same(await answer(c, name), expected[name], name)

        # reloading the encoder carries its adapters over to the new version
        assert sorted((await control("enc", "load"))["adapters"]) == sorted(ADAPTERS)
        for name in LORA:
            same(await answer(c, name), expected[name], name)

        # one adapter unloaded: it is gone, the other keeps its own LoRA
        await control("topics-lora", "unload")
        r = await c.post("/classify", json={"inputs": TEXTS, "model": "topics-lora"})
        assert r.status_code == 404, r.text
        same(await answer(c, "sst-lora"), expected["sst-lora"], "sst-lora")
        info = await control("topics-lora", "load")
        assert info["base"] == "enc" and info["state"] == "ready"
        for name in LORA:
            same(await answer(c, name), expected[name], name)

        # with every adapter unloaded the encoder goes; an adapter then cannot load
        for name in ADAPTERS:
            await control(name, "unload")
        await control("enc", "unload")
        refused = await control("sst-lora", "load", 422)
        assert "its encoder 'enc'" in refused["error"] and "is not loaded" in refused["error"]
        await control("enc", "load")
        await control("sst-lora", "load")
        same(await answer(c, "sst-lora"), expected["sst-lora"], "sst-lora")


@pytest.mark.slow  # model control: the unit suite's 10 minutes are spent
async def test_an_adapter_without_its_encoder_fails_alone_and_says_which(
    dirs: Dirs, tmp_path: Path, expected: dict[str, Any]
) -> None:
    """At start: a model dir with an adapter and no encoder serves the rest; /ready says what
    failed."""
    models = tmp_path / "models"
    shutil.copytree(dirs.models / "topics-lora", models / "topics-lora")
    shutil.copytree(dirs.full / "sst-lora", models / "sst-lora")
    app = create_app(Settings(model_dir=models, intra_op_threads=1))
    server = LiveServer(app).start(ready=False)
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
            for _ in range(600):
                listed = {m["name"]: m for m in (await c.get("/models")).json()["models"]}
                if "loading" not in {m["state"] for m in listed.values()}:
                    break
                await asyncio.sleep(0.05)
            failed = listed["topics-lora"]
            assert failed["state"] == "failed", failed
            assert "its encoder 'enc'" in failed["error"] and "is not loaded" in failed["error"]
            ready = await c.get("/ready")
            assert ready.status_code == 503 and "its encoder 'enc'" in ready.text
            same(await answer(c, "sst-lora"), expected["sst-lora"], "sst-lora")
    finally:
        server.stop()


@pytest.mark.slow  # model control: the unit suite's 10 minutes are spent
async def test_poll_mode_loads_an_encoder_before_its_adapters_and_unloads_it_after(
    dirs: Dirs, tmp_path: Path
) -> None:
    """Poll mode, the encoder and two adapters, one named to sort before it and one after,
    dropped in together, then removed together: both adapters serve (the encoder was loaded
    first), and all go (the adapters first: an encoder with adapters cannot be unloaded)."""
    from heads.tasks import classify
    from service.engine import Engine
    from service.settings import EngineSettings

    models = tmp_path / "models"
    models.mkdir()
    settings = EngineSettings(model_dir=models, model_control="poll", poll_interval=0.05)
    async with Engine(settings) as engine:
        shutil.copytree(dirs.models / "sst-lora", models / "a-sst")  # sorts before "enc"
        shutil.copytree(dirs.models / "enc", models / "enc")
        shutil.copytree(dirs.models / "sst-lora", models / "z-sst")  # and after
        for _ in range(100):
            if all(engine.registry.entry(n) for n in ("a-sst", "enc", "z-sst")):
                break
            await asyncio.sleep(0.05)
        for name in ("a-sst", "z-sst"):
            assert engine.registry.entry(name).state == "ready"  # type: ignore[union-attr]
            [[best]] = await engine.answer(classify.Options(), ["a fine film"], model=name)
            assert best["label"]
        for name in ("a-sst", "enc", "z-sst"):
            shutil.rmtree(models / name)
        for _ in range(100):
            if not engine.registry.entries:
                break
            await asyncio.sleep(0.05)
        assert engine.registry.entries == []
