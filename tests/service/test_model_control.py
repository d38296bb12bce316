"""Models loaded, reloaded and unloaded while the service serves (Triton's model-control
modes): explicit (POST with the admin key) and poll (following model_dir). Versions are told
apart by their labels."""

from __future__ import annotations

import asyncio
import gc
import shutil
import weakref
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from heads import rows
from service.settings import Settings
from tests.service.conftest import gate, metric, serve

pytestmark = pytest.mark.anyio
ADMIN = {"Authorization": "Bearer admin-key"}


def version(make_package: Callable[..., Path], folder: Path, name: str, v: str) -> Path:
    """A classification package at folder/name whose labels say version `v`."""
    return make_package(folder, "classification", name, labels=[f"neg-{v}", f"pos-{v}"])


def explicit(model_dir: Path, **more: Any) -> Settings:
    return Settings(
        model_dir=model_dir,
        model_control="explicit",
        admin_key="admin-key",
        api_key="user-key",
        **more,
    )


async def labels_of(s: Any, model: str = "sent") -> set[str]:
    r = await s.client.post(
        "/classify",
        json={"inputs": "good", "model": model, "top_k": None},
        headers={"Authorization": "Bearer user-key"},
    )
    assert r.status_code == 200, r.text
    return {item["label"] for item in r.json()}


async def test_explicit_load_reload_and_unload_with_the_admin_key(
    tmp_path: Path, make_package: Callable[..., Path]
) -> None:
    models = tmp_path / "models"
    version(make_package, models, "sent", "v1")
    async with serve(explicit(models)) as s:
        post = s.client.post
        assert await labels_of(s) == {"neg-v1", "pos-v1"}
        before = (
            await s.client.get("/models", headers={"Authorization": "Bearer user-key"})
        ).json()
        # keys: the inference key is not the admin key, and the other way round
        user = {"Authorization": "Bearer user-key"}
        assert (await post("/models/sent/load", headers=user)).status_code == 401
        r = await post("/classify", json={"inputs": "a"}, headers=ADMIN)
        assert r.status_code == 401

        version(make_package, models, "sent", "v2")  # the new version, in place
        r = await post("/models/sent/load", headers=ADMIN)
        assert r.status_code == 200, r.text
        info = r.json()
        assert info["state"] == "ready" and info["labels"] == ["neg-v2", "pos-v2"]
        assert info["version"] != before["models"][0]["version"] and info["loaded_at"] > 0
        assert await labels_of(s) == {"neg-v2", "pos-v2"}

        version(make_package, tmp_path / "staging", "other", "o1")  # a new name
        shutil.copytree(tmp_path / "staging" / "other", models / "other")
        assert (await post("/models/other/load", headers=ADMIN)).status_code == 200
        assert await labels_of(s, "other") == {"neg-o1", "pos-o1"}

        assert (await post("/models/other/unload", headers=ADMIN)).json()["state"] == "unloaded"
        r = await post("/classify", json={"inputs": "a", "model": "other"}, headers=user)
        assert r.status_code == 404
        assert (await post("/models/nope/load", headers=ADMIN)).status_code == 404
        assert (await post("/models/nope/unload", headers=ADMIN)).status_code == 404


async def test_a_broken_version_leaves_the_old_one_serving_and_says_why(
    tmp_path: Path, make_package: Callable[..., Path]
) -> None:
    models = tmp_path / "models"
    package = version(make_package, models, "sent", "v1")
    async with serve(explicit(models)) as s:
        (package / "model.onnx").write_bytes(b"not a model")  # its sha256 no longer matches
        r = await s.client.post("/models/sent/load", headers=ADMIN)
        assert r.status_code == 422 and "did not load" in r.json()["error"], r.text
        assert await labels_of(s) == {"neg-v1", "pos-v1"}  # the old version serves on
        (m,) = (await s.client.get("/models", headers={"Authorization": "Bearer user-key"})).json()[
            "models"
        ]
        assert m["state"] == "ready" and "sha256" in m["reload_error"]
        ready = await s.client.get("/ready")
        assert ready.status_code == 200 and "a new version failed" in ready.json()["models"]["sent"]
        assert metric(await s.metrics(), "bert_heads_model_load_failures_total", model="sent") == 1


async def test_model_control_off_refuses_load_and_settings_refuse_unsafe_modes(
    model_dir: Path, tmp_path: Path
) -> None:
    async with serve(Settings(model_dir=model_dir, admin_key="admin-key")) as s:
        r = await s.client.post("/models/sst2/load", headers=ADMIN)
        assert r.status_code == 403 and "MODEL_CONTROL=explicit" in r.json()["error"]
    with pytest.raises(ValidationError, match="needs an admin_key"):
        Settings(model_dir=tmp_path, model_control="explicit")
    with pytest.raises(ValidationError, match="needs verify_sha256"):
        Settings(model_dir=tmp_path, model_control="poll", verify_sha256=False)
    with pytest.raises(ValidationError, match="must not also be an inference key"):
        Settings(model_dir=tmp_path, admin_key="k", api_key="a,k")


async def test_reload_under_load_drops_nothing_and_frees_the_old_version(
    tmp_path: Path, make_package: Callable[..., Path]
) -> None:
    """8 clients send requests for 3 s while the package is replaced 6 times (one of them
    broken): every answer is 200 and from one of the versions; each old session is let go."""
    models = tmp_path / "models"
    version(make_package, models, "sent", "v0")
    async with serve(explicit(models)) as s:
        seen: Counter[str] = Counter()
        statuses: Counter[int] = Counter()
        stop = asyncio.Event()

        async def client() -> None:
            while not stop.is_set():
                r = await s.client.post(
                    "/classify",
                    json={"inputs": "good film", "model": "sent"},
                    headers={"Authorization": "Bearer user-key"},
                )
                statuses[r.status_code] += 1
                if r.status_code == 200:
                    seen[r.json()[0]["label"].split("-")[1]] += 1

        clients = [asyncio.create_task(client()) for _ in range(8)]
        freed, tokenizers = [], []
        for n in range(1, 7):
            await asyncio.sleep(0.4)
            old = s.registry.entry("sent").model.backend
            freed.append(weakref.ref(old))
            del old
            tokenizers.append(s.registry.entry("sent").model.tokenizer)
            if n == 4:  # a broken copy dropped in: refused, the version serving stays
                (models / "sent" / "model.onnx").write_bytes(b"broken")
                assert (await s.client.post("/models/sent/load", headers=ADMIN)).status_code == 422
                shutil.rmtree(models / "sent")
            version(make_package, models, "sent", f"v{n}")
            assert (await s.client.post("/models/sent/load", headers=ADMIN)).status_code == 200
        await asyncio.sleep(0.3)
        stop.set()
        await asyncio.gather(*clients)
        await s.registry.retired()
    gc.collect()
    assert set(statuses) == {200}, statuses
    assert set(seen) <= {f"v{n}" for n in range(7)} and len(seen) >= 5, seen
    # the broken attempt (n == 4) replaced nothing: that version's backend stayed in use
    assert sum(ref() is not None for ref in freed) <= 1, [ref() for ref in freed]
    # nor do the tokenizer caches keep retired versions' tokenizers (6 MB each for BERT's vocab)
    cached = {id(held[0]) for cache in (rows._TEMPLATES, rows._SUBWORD) for held in cache.values()}
    assert not any(id(t) in cached for t in tokenizers)


async def test_unload_lets_queued_requests_finish(
    tmp_path: Path, make_package: Callable[..., Path]
) -> None:
    models = tmp_path / "models"
    version(make_package, models, "sent", "v1")
    async with serve(explicit(models)) as s:
        backend = gate(s.app, name="sent", hold=True)
        user = {"Authorization": "Bearer user-key"}
        body = {"inputs": "good", "model": "sent"}
        held = [
            asyncio.create_task(s.client.post("/classify", json=body, headers=user))
            for _ in range(3)
        ]
        await asyncio.to_thread(backend.entered.wait, 5)
        assert (await s.client.post("/models/sent/unload", headers=ADMIN)).status_code == 200
        assert (await s.client.post("/classify", json=body, headers=user)).status_code == 404
        backend.gate.set()
        assert [r.status_code for r in await asyncio.gather(*held)] == [200, 200, 200]
        await s.registry.retired()


async def test_poll_follows_the_folder_and_waits_for_a_copy_to_settle(
    tmp_path: Path, make_package: Callable[..., Path]
) -> None:
    models = tmp_path / "models"
    version(make_package, models, "sent", "v1")
    staging = version(make_package, tmp_path / "staging", "new", "n1")
    settings = Settings(model_dir=models, model_control="poll", poll_interval=0.1)
    async with serve(settings) as s:

        async def names() -> set[str]:
            return {m["name"] for m in (await s.client.get("/models")).json()["models"]}

        # a slow copy: package.json first, then the graph in pieces over 0.6 s
        target = models / "new"
        target.mkdir()
        for f in sorted(staging.iterdir(), key=lambda p: p.name != "package.json"):
            if f.is_dir():
                shutil.copytree(f, target / f.name)
                continue
            data = f.read_bytes()
            with open(target / f.name, "wb") as out:
                for i in range(0, len(data), max(1, len(data) // 3)):
                    out.write(data[i : i + max(1, len(data) // 3)])
                    out.flush()
                    await asyncio.sleep(0.1)
                    assert "new" not in await names() or f.name != "model.onnx"
        for _ in range(50):  # settled: loaded within a few intervals
            if "new" in await names():
                break
            await asyncio.sleep(0.1)
        assert await labels_of_open(s, "new") == {"neg-n1", "pos-n1"}
        assert s.registry.entry("new").reload_error is None

        version(make_package, models, "sent", "v2")  # changed in place: reloaded
        for _ in range(50):
            if await labels_of_open(s, "sent") == {"neg-v2", "pos-v2"}:
                break
            await asyncio.sleep(0.1)
        assert await labels_of_open(s, "sent") == {"neg-v2", "pos-v2"}

        shutil.rmtree(target)  # removed: unloaded
        for _ in range(50):
            if "new" not in await names():
                break
            await asyncio.sleep(0.1)
        assert await names() == {"sent"}


async def labels_of_open(s: Any, model: str) -> set[str]:
    r = await s.client.post("/classify", json={"inputs": "good", "model": model, "top_k": None})
    return {item["label"] for item in r.json()} if r.status_code == 200 else set()
