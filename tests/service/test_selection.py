"""Which model answers a request that names none (service.selection), over real HTTP: a user's
own models beside the default build leave the README's answers as they were; the
--default-model setting (flag or variable) beats a package's own `default_for`; a default the
packages cannot honour stops the start; model control keeps the defaults right; /rerank,
/v1/rerank and /zero-shot choose among the models that read pairs, and refuse a named model
that reads single texts unless the request says allow_single_text."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from heads.package import write_package
from service.__main__ import parse_settings
from service.app import create_app
from service.settings import Settings
from tests.service.conftest import LiveServer
from tests.test_readme import DEFAULT_PACKAGES, _stand_ins, curls, parse_curl, requested_model

REPO = Path(__file__).resolve().parents[2]
TEXT = "the film was good"
QUERY, DOCUMENTS = "who won the match", ["the team won the final", "paris is big"]
ADMIN = {"Authorization": "Bearer admin-key"}


@contextmanager
def running(model_dir: Path, **settings: Any) -> Iterator[httpx.Client]:
    """A real server (uvicorn on a loopback port) over model_dir, and a client to it."""
    server = LiveServer(create_app(Settings(model_dir=model_dir, **settings))).start()
    try:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            yield client
    finally:
        server.stop()


def declare(folder: Path, drop: tuple[str, ...] = (), **fields: Any) -> Path:
    """Rewrite the package's package.json with `fields`, without `drop` (hashes recomputed)."""
    m = json.loads((folder / "package.json").read_text())
    kept = {k: v for k, v in m.items() if k not in ("sha256", "format", *drop)}
    write_package(folder, kept | fields)
    return folder


def classifier(make_package: Callable[..., Path], folder: Path, name: str, **fields: Any) -> Path:
    """A classification package whose labels name it, so that an answer says who gave it."""
    return make_package(folder, "classification", name, labels=[f"neg-{name}", f"pos-{name}"],
                        **fields)  # fmt: skip


def answered_by(client: httpx.Client, **body: Any) -> str:
    r = client.post("/classify", json={"inputs": TEXT, "top_k": None, **body})
    assert r.status_code == 200, r.text
    return r.json()[0]["label"].split("-", 1)[1]


# -- a user's own models beside the default build -------------------------------------------------


def readme_requests_without_a_model() -> list[tuple[str, str]]:
    """(path, body) of each README curl that POSTs and names no model."""
    out = []
    for cmd in curls():
        req = parse_curl(cmd.line)
        if req.method == "POST" and req.body is not None and requested_model(req) is None:
            out.append((req.path, req.body))
    return out


def test_the_readme_sends_requests_without_a_model() -> None:
    paths = {path for path, _ in readme_requests_without_a_model()}
    assert {"/classify", "/ner", "/qa", "/embed"} <= paths


def test_the_readme_rerank_and_zero_shot_examples_name_a_pair_model() -> None:
    """None of them leans on demo-sentiment (which reads single texts): each names a task demo
    (or the ColBERT model of the late-interaction example)."""
    from demo.models import TASK_HEADS
    from tests.test_readme import COLBERT_STAND_INS

    for cmd in curls():
        req = parse_curl(cmd.line)
        if req.path in ("/rerank", "/v1/rerank", "/zero-shot"):
            assert requested_model(req) in (*TASK_HEADS, *COLBERT_STAND_INS), cmd.line


@pytest.mark.slow  # the unit suite stays under 10 minutes; CI's slow stage runs it
def test_a_users_own_models_leave_the_readme_answers_as_they_were(
    tmp_path: Path, make_package: Callable[..., Path]
) -> None:
    """The default build's packages declare themselves their task's default (demo.models
    DEFAULT_FOR), so that every README request that names no model gets the same answer with
    a second classifier (and NER, QA and embedding model) of the user's beside them."""
    from demo.models import DEFAULT_FOR

    build = _stand_ins(tmp_path / "build", {})
    for name in DEFAULT_PACKAGES:
        declare(build / name, default_for=DEFAULT_FOR[name])
    mine = tmp_path / "mine"
    shutil.copytree(build, mine)
    for task in DEFAULT_PACKAGES.values():
        make_package(mine, task, f"my-{task}")
    requests = readme_requests_without_a_model()
    answers = {}
    for folder in (build, mine):
        with running(folder) as client:
            answers[folder] = [client.post(path, content=body,
                                           headers={"content-type": "application/json"})
                               for path, body in requests]  # fmt: skip
            defaults = client.get("/models").json()["defaults"]
            assert {defaults[task] for task in DEFAULT_PACKAGES.values()} == set(DEFAULT_PACKAGES)
    for (path, body), alone, beside in zip(requests, answers[build], answers[mine], strict=True):
        assert alone.status_code == beside.status_code, f"{path} {body}\n-> {beside.text[:300]}"
        assert alone.json() == beside.json(), f"{path} {body}"
    served = {path for (path, _), r in zip(requests, answers[mine], strict=True) if r.is_success}
    assert {"/classify", "/ner", "/qa", "/embed"} <= served


def test_the_default_build_has_no_reranker_and_says_how_to_get_one(
    tmp_path: Path, make_package: Callable[..., Path]
) -> None:
    """demo-sentiment reads single texts: /rerank and /zero-shot no longer score pairs with it."""
    folder = tmp_path / "models"
    make_package(folder, "classification", "demo-sentiment", reads="single")
    make_package(folder, "embedding", "minilm-embedding")
    with running(folder) as client:
        single = "demo-sentiment: it reads single texts"
        for path, body, what, why in [
            ("/rerank", {"query": QUERY, "texts": DOCUMENTS}, "no reranker is loaded", single),
            ("/v1/rerank", {"query": QUERY, "documents": DOCUMENTS}, "no reranker is loaded",
             single),
            ("/zero-shot", {"inputs": TEXT, "candidate_labels": ["a"]}, "no NLI model is loaded",
             "demo-sentiment: its labels name no entailment"),
        ]:  # fmt: skip
            r = client.post(path, json=body)
            assert r.status_code == 404, r.text
            message = r.json()["error"]
            assert message.startswith(what), message
            assert why in message, message
            assert "make models-tasks" in message and "--reads pairs" in message
        assert "rerank" not in client.get("/models").json()["defaults"]


# -- the setting, the package's declaration, and neither -------------------------------------------


def test_the_setting_beats_the_packages_declaration(
    tmp_path: Path, make_package: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "models"
    classifier(make_package, folder, "a")
    classifier(make_package, folder, "b", default_for=["classification"])
    make_package(folder, "token-classification", "ner")
    with running(folder) as client:
        assert answered_by(client) == "b"  # its package.json declares it
        assert answered_by(client, model="a") == "a"  # a name still picks
        listed = client.get("/models").json()
        assert listed["defaults"]["classification"] == "b"
        by_name = {m["name"]: m for m in listed["models"]}
        assert by_name["b"]["default_for"] == ["classification"]
        assert by_name["a"]["default_for"] is None
        assert by_name["a"]["reads"] == "unknown"  # a plain export does not say
    with running(folder, default_model={"classification": "a"}) as client:
        assert answered_by(client) == "a"
        assert client.get("/models").json()["defaults"]["classification"] == "a"
    monkeypatch.setenv("BERT_HEADS_DEFAULT_MODEL", "classification=a, token-classification=ner")
    want = {"classification": "a", "token-classification": "ner"}
    assert Settings(model_dir=folder).default_model == want
    # the flag, repeated, wins over the variable
    flags = ["--model-dir", str(folder), "--default-model", "classification=b"]
    assert parse_settings(flags).default_model == {"classification": "b"}


def test_without_a_default_several_candidates_are_a_422_that_says_how_to_choose(
    tmp_path: Path, make_package: Callable[..., Path]
) -> None:
    folder = tmp_path / "models"
    classifier(make_package, folder, "a")
    classifier(make_package, folder, "b")
    with running(folder) as client:
        r = client.post("/classify", json={"inputs": TEXT})
        assert r.status_code == 422
        assert "several classification models are loaded (a, b)" in r.json()["error"]
        assert "--default-model classification=NAME" in r.json()["error"]
        assert "classification" not in client.get("/models").json()["defaults"]
    for name in ("a", "b"):
        declare(folder / name, default_for=["classification"])
    with running(folder) as client:
        r = client.post("/classify", json={"inputs": TEXT})
        assert r.status_code == 422
        assert "declare themselves the default (a, b)" in r.json()["error"]


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("classification=nope", "no package 'nope' in .* \\(the packages there: conll, sst2\\)"),
        ("classification=conll", "cannot answer classification requests: it is a token-class"),
        ("rerank=sst2", "cannot answer rerank requests: it reads single texts"),
        ("zero-shot=sst2", "its labels name no entailment"),
        ("sentiment=sst2", "'sentiment' is not one of classification, token-classification"),
        ("classification", "give TASK=NAME"),
    ],
)
def test_a_default_the_packages_cannot_honour_stops_the_start(
    tmp_path: Path,
    make_package: Callable[..., Path],
    capsys: pytest.CaptureFixture[str],
    flag: str,
    message: str,
) -> None:
    folder = tmp_path / "models"
    make_package(folder, "classification", reads="single")
    make_package(folder, "token-classification")
    with pytest.raises(SystemExit) as exited:
        parse_settings(["--model-dir", str(folder), "--default-model", flag])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--default-model: " in err
    assert re.search(message, err), err


def test_the_service_does_not_start_with_a_default_it_cannot_serve(
    tmp_path: Path, make_package: Callable[..., Path]
) -> None:
    """The real command: one line naming the setting and the reason, exit status 2."""
    folder = tmp_path / "models"
    make_package(folder, "classification")
    env = {**os.environ, "BERT_HEADS_DEFAULT_MODEL": "classification=gone"}
    done = subprocess.run(
        [sys.executable, "-m", "service", "--model-dir", str(folder), "--port", "0"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "--default-model: Value error, classification=gone: no package 'gone'" in done.stderr


def test_model_control_keeps_the_defaults_right(
    tmp_path: Path, make_package: Callable[..., Path]
) -> None:
    """Unloading the configured default falls back to the package's declaration; loading it
    again makes it the default again."""
    folder = tmp_path / "models"
    classifier(make_package, folder, "a")
    classifier(make_package, folder, "b")
    classifier(make_package, folder, "c", default_for=["classification"])
    settings = {"model_control": "explicit", "admin_key": "admin-key",
                "default_model": {"classification": "b"}}  # fmt: skip
    with running(folder, **settings) as client:
        assert answered_by(client) == "b"
        assert client.post("/models/b/unload", headers=ADMIN).status_code == 200
        assert answered_by(client) == "c"
        assert client.get("/models").json()["defaults"]["classification"] == "c"
        assert client.post("/models/b/load", headers=ADMIN).status_code == 200
        assert answered_by(client) == "b"
        assert client.post("/models/c/unload", headers=ADMIN).status_code == 200
        assert client.post("/models/b/unload", headers=ADMIN).status_code == 200
        assert answered_by(client) == "a"  # the only one left


# -- pairs: /rerank, /v1/rerank, /zero-shot ----------------------------------------------------------


@pytest.fixture(scope="module")
def pair_models(
    tmp_path_factory: pytest.TempPathFactory, make_package: Callable[..., Path]
) -> Path:
    """A classifier of single texts, a reranker and an NLI model that read pairs, a reranker
    from before packages said what they read, and an NLI model that reads single texts."""
    folder = tmp_path_factory.mktemp("pairs") / "models"
    make_package(folder, "classification", "sentiment", reads="single")
    make_package(folder, "classification", "reranker", labels=["irrelevant", "relevant"],
                 reads="pairs")  # fmt: skip
    make_package(folder, "classification", "nli", labels=["contradiction", "entailment"],
                 reads="pairs")  # fmt: skip
    old = make_package(folder, "classification", "old-reranker", labels=["no", "yes"])
    declare(old, drop=("reads",))  # exported before packages said what they read
    make_package(folder, "classification", "nli-single", labels=["contradiction", "entailment"],
                 reads="single")  # fmt: skip
    return folder


def rerank(client: httpx.Client, **more: Any) -> httpx.Response:
    return client.post("/rerank", json={"query": QUERY, "texts": DOCUMENTS, **more})


def open_rerank(client: httpx.Client, **more: Any) -> httpx.Response:
    return client.post("/v1/rerank", json={"query": QUERY, "documents": DOCUMENTS, **more})


def zero_shot(client: httpx.Client, **more: Any) -> httpx.Response:
    return client.post("/zero-shot", json={"inputs": TEXT, "candidate_labels": ["x", "y"], **more})


def test_pair_tasks_choose_among_the_models_that_read_pairs(pair_models: Path) -> None:
    with running(pair_models) as client:
        assert open_rerank(client).json()["model"] == "reranker"
        assert rerank(client).json() == rerank(client, model="reranker").json()
        assert zero_shot(client).json() == zero_shot(client, model="nli").json()
        listed = client.get("/models").json()
        assert {k: listed["defaults"].get(k) for k in ("rerank", "zero-shot")} == {
            "rerank": "reranker",
            "zero-shot": "nli",
        }
        reads = {m["name"]: m["reads"] for m in listed["models"]}
        assert reads["old-reranker"] == "unknown" and reads["reranker"] == "pairs"


def test_a_package_that_says_nothing_serves_when_none_says_pairs(
    tmp_path: Path, make_package: Callable[..., Path]
) -> None:
    """A package exported before `reads` existed serves /rerank as it did, unless a package
    that reads pairs is there."""
    folder = tmp_path / "models"
    make_package(folder, "classification", "sentiment", reads="single")
    old = make_package(folder, "classification", "old-reranker", labels=["no", "yes"])
    declare(old, drop=("reads",))
    with running(folder) as client:
        assert open_rerank(client).json()["model"] == "old-reranker"


def test_several_pair_models_take_the_declared_or_configured_default(
    tmp_path: Path, make_package: Callable[..., Path]
) -> None:
    folder = tmp_path / "models"
    for name in ("r1", "r2"):
        make_package(folder, "classification", name, labels=["no", "yes"], reads="pairs")
    with running(folder) as client:
        r = open_rerank(client)
        assert r.status_code == 422 and "several rerankers" in r.json()["error"]
        assert "--default-model rerank=NAME" in r.json()["error"]
    declare(folder / "r2", default_for=["rerank"])
    with running(folder) as client:
        assert open_rerank(client).json()["model"] == "r2"
    with running(folder, default_model={"rerank": "r1"}) as client:
        assert open_rerank(client).json()["model"] == "r1"
        assert client.get("/models").json()["defaults"]["rerank"] == "r1"


@pytest.mark.parametrize(
    ("send", "name"),
    [(rerank, "sentiment"), (open_rerank, "sentiment"), (zero_shot, "nli-single")],
    ids=["/rerank", "/v1/rerank", "/zero-shot"],
)
def test_a_named_single_text_model_is_refused_unless_the_request_allows_it(
    pair_models: Path, send: Callable[..., httpx.Response], name: str
) -> None:
    with running(pair_models) as client:
        r = send(client, model=name)
        assert r.status_code == 422, r.text
        message = r.json()["error"]
        assert f"model {name!r} reads single texts" in message
        assert "--reads pairs" in message and '"allow_single_text": true' in message
        assert send(client, model=name, allow_single_text=True).status_code == 200
        assert send(client, model="old-reranker" if send is not zero_shot else "nli").is_success


def test_a_named_model_that_cannot_do_the_task_gets_the_tasks_own_reason(
    pair_models: Path,
) -> None:
    """No entailment label: allow_single_text would not help, so it is not offered."""
    with running(pair_models) as client:
        for allow in (False, True):
            r = zero_shot(client, model="sentiment", allow_single_text=allow)
            assert r.status_code == 422 and "no entailment label" in r.json()["error"]
