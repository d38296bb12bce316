"""Access and limits: the optional API key, the payload limit (decided before the body is read),
inputs per request and characters per text, model names that are names and never paths, CORS
off unless configured, and a container that runs as a non-root user on a read-only root."""

from __future__ import annotations

import contextlib
import hmac
import re
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from service import keys
from service.settings import Settings
from tests.service.conftest import serve

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parents[2]
KEY = "s3cret-key"
INFERENCE = [
    ("/classify", {"inputs": "a good film"}),
    ("/ner", {"inputs": "john lives in paris"}),
    ("/qa", {"question": "who?", "context": "john lives in paris"}),
    ("/embed", {"inputs": "a good film"}),
    ("/v1/embeddings", {"input": "a good film"}),
]
V2_INFER = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a"]}]}

# -- the API key ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("authorization", "status"),
    [
        (None, 401),
        ("", 401),
        ("Bearer", 401),
        ("Bearer ", 401),
        ("Bearer wrong", 401),
        (f"Bearer {KEY}x", 401),  # a longer key is not a match of its prefix
        (f"Bearer {KEY[:-1]}", 401),
        (f"Basic {KEY}", 401),
        (KEY, 401),
        (f"Bearer {KEY}", 200),
        (f"bearer {KEY}", 200),  # the scheme is case-insensitive (RFC 9110)
        (f"Bearer  {KEY} ", 200),
    ],
)
async def test_the_api_key_is_a_bearer_token(
    model_dir: Path, authorization: str | None, status: int
) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    async with serve(Settings(model_dir=model_dir, api_key=KEY)) as s:
        for path, body in INFERENCE:
            r = await s.client.post(path, json=body, headers=headers)
            assert r.status_code == status, (path, r.text)
            if status == 401:
                assert r.json()["error_type"] == "unauthorized"
                assert r.headers["www-authenticate"] == "Bearer"
        assert (await s.client.get("/models", headers=headers)).status_code == status


async def test_the_key_is_compared_in_constant_time_with_every_key(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    compared: list[tuple[bytes, bytes]] = []

    def spy(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return hmac.compare_digest(a, b)

    monkeypatch.setattr(keys, "hmac", type("hmac", (), {"compare_digest": staticmethod(spy)}))
    async with serve(Settings(model_dir=model_dir, api_key=f"{KEY},other")) as s:
        for token in ("guess", KEY):  # a right key: the other one is still compared
            headers = {"Authorization": f"Bearer {token}"}
            await s.client.post("/embed", json={"inputs": "a"}, headers=headers)
    assert sorted(compared) == sorted(
        (t.encode(), k) for t in ("guess", KEY) for k in (KEY.encode(), b"other")
    )


# What the API key protects, path by path: (method, path, body, who may call it without the
# key) where "probe" is anyone, "metrics" / "docs" anyone when metrics_public / docs_public,
# and "key" the key holders only.
PATHS: list[tuple[str, str, Any, str]] = [
    *[("POST", path, body, "key") for path, body in INFERENCE],
    ("POST", "/tokenize", {"inputs": "a", "model": "sst2"}, "key"),
    ("POST", "/decode", {"ids": [1, 2], "model": "sst2"}, "key"),
    ("GET", "/models", None, "key"),
    ("GET", "/v2/models/sst2", None, "key"),
    ("GET", "/v2/models/sst2/ready", None, "key"),
    ("POST", "/v2/models/sst2/infer", V2_INFER, "key"),
    ("GET", "/metrics", None, "metrics"),
    ("GET", "/openapi.json", None, "docs"),
    ("GET", "/docs", None, "docs"),
    ("GET", "/redoc", None, "docs"),
    ("GET", "/docs/assets/swagger-ui-bundle.js", None, "docs"),
    ("GET", "/health", None, "probe"),
    ("GET", "/ready", None, "probe"),
    ("GET", "/v2/health/live", None, "probe"),
    ("GET", "/v2/health/ready", None, "probe"),
    ("GET", "/v2", None, "probe"),  # the protocol's server metadata: name and version
]


@pytest.mark.parametrize(
    "public", [(), ("metrics",), ("docs",), ("metrics", "docs")], ids=lambda p: "+".join(p) or "-"
)
async def test_what_the_api_key_protects(model_dir: Path, public: tuple[str, ...]) -> None:
    """With a key set: the probes are open, inference, /models and v2 model routes need it,
    /metrics and the docs need it unless metrics_public / docs_public. Without a key set,
    every path is open (tested below)."""
    settings = Settings(
        model_dir=model_dir,
        api_key=KEY,
        metrics_public="metrics" in public,
        docs_public="docs" in public,
    )
    async with serve(settings) as s:
        for method, path, body, who in PATHS:
            open_to_all = who == "probe" or who in public
            for headers in ({}, {"Authorization": f"Bearer {KEY}"}):
                r = await s.client.request(method, path, json=body, headers=headers)
                want = 200 if headers or open_to_all else 401
                assert r.status_code == want, (path, headers, r.text[:300])
                if want == 401:
                    assert r.headers["www-authenticate"] == "Bearer", path


async def test_without_a_key_everything_is_open(model_dir: Path) -> None:
    async with serve(Settings(model_dir=model_dir)) as s:
        for method, path, body, _ in PATHS:
            r = await s.client.request(method, path, json=body)
            assert r.status_code == 200, (path, r.text[:300])


# -- limits --------------------------------------------------------------------------------------

TOO_MANY = 5  # max_client_batch_size is 4 below
TOO_LONG = "paris " * 10  # 60 characters, max_text_chars is 50 below
OVER_LIMITS = [
    ("/classify", {"inputs": ["a"] * TOO_MANY}, "max_client_batch_size"),
    ("/classify", {"inputs": [["a", "b"]] * TOO_MANY}, "max_client_batch_size"),
    ("/classify", {"inputs": TOO_LONG}, "max_text_chars"),
    ("/classify", {"inputs": [["paris " * 5, "paris " * 5]]}, "max_text_chars"),  # a + b
    ("/ner", {"inputs": ["a"] * TOO_MANY}, "max_client_batch_size"),
    ("/ner", {"inputs": TOO_LONG}, "max_text_chars"),
    ("/qa", {"inputs": [{"question": "who?", "context": "paris"}] * TOO_MANY}, "max_client"),
    ("/qa", {"question": "who?", "context": TOO_LONG}, "max_text_chars"),
    ("/embed", {"inputs": ["a"] * TOO_MANY}, "max_client_batch_size"),
    ("/embed", {"inputs": ["a", TOO_LONG]}, "inputs[1]"),
    ("/v1/embeddings", {"input": ["a"] * TOO_MANY}, "max_client_batch_size"),
    ("/v1/embeddings", {"input": TOO_LONG}, "max_text_chars"),
]


async def test_inputs_and_characters_over_the_limits_get_413(model_dir: Path) -> None:
    settings = Settings(model_dir=model_dir, max_client_batch_size=4, max_text_chars=50)
    async with serve(settings) as s:
        for path, body, word in OVER_LIMITS:
            r = await s.client.post(path, json=body)
            assert r.status_code == 413, (path, body, r.text)
            assert r.json()["error_type"] == "payload_too_large" and word in r.json()["error"]
        at_the_limit = {"inputs": ["paris " * 8] * 4}  # 4 inputs of 48 characters
        assert (await s.client.post("/embed", json=at_the_limit)).status_code == 200


def test_the_payload_limit_is_enforced_before_the_body_is_read(live: Any) -> None:
    """On a real socket: the 413 comes back while the client has sent only part of the body,
    whether it declared a Content-Length or streams chunks without one."""
    server = live(payload_limit=1000)
    host, port = server.url.removeprefix("http://").split(":")

    def exchange(head: bytes, body: bytes) -> bytes:
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(head + body)  # and never the rest
            data = b""
            with contextlib.suppress(ConnectionResetError, TimeoutError):
                while chunk := sock.recv(65536):
                    data += chunk
            return data

    head = b"POST /classify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    declared = exchange(head + b"Content-Length: 10000000\r\n\r\n", b'{"inputs": "' + b"a" * 100)
    assert declared.startswith(b"HTTP/1.1 413") and b"payload_too_large" in declared
    chunk = b"a" * 600
    streamed = exchange(
        head + b"Transfer-Encoding: chunked\r\n\r\n", (b"%x\r\n%s\r\n" % (len(chunk), chunk)) * 2
    )
    assert streamed.startswith(b"HTTP/1.1 413") and b"connection: close" in streamed.lower()
    assert httpx.post(server.url + "/classify", json={"inputs": "a"}).status_code == 200


# -- model names ---------------------------------------------------------------------------------

NOT_NAMES = [
    "../outside",
    "../outside/sst2",
    "../../etc/passwd",
    "/etc/passwd",
    "sst2/../minilm",
    "./sst2",
    "sst2/",
    "..",
    ".",
    "~",
    "SST2",
    "sst2\x00",
    "%2e%2e%2fetc",
    "",
]


async def test_model_names_are_looked_up_never_opened(
    tmp_path: Path, make_package: Callable[..., Path]
) -> None:
    """A model name only selects among the loaded packages: a path (even to a valid package
    outside model_dir) gets 404, and no file is opened or listed to find out."""
    model_dir = tmp_path / "models"
    model_dir.mkdir()
    make_package(model_dir, "classification")
    make_package(tmp_path / "outside", "classification")  # a valid package next door
    events: list[tuple[str, tuple[Any, ...]]] = []
    recording = False

    def audit(event: str, args: tuple[Any, ...]) -> None:
        if recording and event in ("open", "os.listdir", "os.scandir", "os.chdir"):
            events.append((event, args))

    sys.addaudithook(audit)  # cannot be removed; it records only while `recording`
    async with serve(Settings(model_dir=model_dir)) as s:
        await s.client.post("/classify", json={"inputs": "a", "model": "nope"})  # warm the path
        recording = True
        for name in NOT_NAMES:
            r = await s.client.post("/classify", json={"inputs": "a", "model": name})
            assert r.status_code == 404 and r.json()["error_type"] == "model_not_found", name
        recording = False
        assert (
            await s.client.post("/classify", json={"inputs": "a", "model": "sst2"})
        ).status_code == 200
    assert events == []


# -- CORS ----------------------------------------------------------------------------------------

ORIGIN = "https://app.example"
PREFLIGHT = {
    "Origin": ORIGIN,
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "authorization, content-type",
}


async def test_cors_is_off_unless_origins_are_configured(model_dir: Path) -> None:
    async with serve(Settings(model_dir=model_dir)) as s:
        preflight = await s.client.options("/classify", headers=PREFLIGHT)
        assert "access-control-allow-origin" not in preflight.headers
        r = await s.client.post("/classify", json={"inputs": "a"}, headers={"Origin": ORIGIN})
        assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


async def test_cors_allows_the_configured_origins_only(model_dir: Path) -> None:
    async with serve(Settings(model_dir=model_dir, cors_origins=ORIGIN)) as s:
        preflight = await s.client.options("/classify", headers=PREFLIGHT)
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == ORIGIN
        assert "POST" in preflight.headers["access-control-allow-methods"]
        assert "authorization" in preflight.headers["access-control-allow-headers"].lower()
        r = await s.client.post("/classify", json={"inputs": "a"}, headers={"Origin": ORIGIN})
        assert r.headers["access-control-allow-origin"] == ORIGIN
        error = await s.client.post("/classify", json={}, headers={"Origin": ORIGIN})
        assert error.status_code == 422 and error.headers["access-control-allow-origin"] == ORIGIN

        other = {**PREFLIGHT, "Origin": "https://evil.example"}
        refused = await s.client.options("/classify", headers=other)
        assert refused.status_code == 400 and "access-control-allow-origin" not in refused.headers
        r = await s.client.post(
            "/classify", json={"inputs": "a"}, headers={"Origin": "https://evil.example"}
        )
        assert "access-control-allow-origin" not in r.headers


# -- the container -------------------------------------------------------------------------------


def dockerfile_users() -> dict[str, str]:
    """Stage name -> the USER it runs as (inherited through FROM <stage>); 'root' if none."""
    users: dict[str, str] = {}
    stage = ""
    for line in (REPO / "Dockerfile").read_text().splitlines():
        if m := re.match(r"FROM\s+(\S+)(?:\s+AS\s+(\S+))?", line.strip(), re.IGNORECASE):
            stage = m.group(2) or m.group(1)
            users[stage] = users.get(m.group(1), "root")
        elif m := re.match(r"USER\s+(\S+)", line.strip(), re.IGNORECASE):
            users[stage] = m.group(1)
    return users


def test_the_images_run_as_a_non_root_user() -> None:
    users = dockerfile_users()
    for target in ("runtime", "gpu"):
        user = users[target].split(":")[0]
        assert user not in ("root", "0") and int(user) >= 1000, (target, user)
    deployment = yaml.safe_load((REPO / "k8s/base/deployment.yaml").read_text())
    pod = deployment["spec"]["template"]["spec"]["securityContext"]
    assert str(pod["runAsUser"]) == users["runtime"].split(":")[0]  # the same uid everywhere


def test_compose_runs_read_only_without_privileges() -> None:
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())  # resolves <<: merges
    for name in ("bert-heads", "bert-heads-gpu"):
        service = compose["services"][name]
        assert service["read_only"] is True, name
        assert service["cap_drop"] == ["ALL"], name
        assert "no-new-privileges:true" in service["security_opt"], name
        assert service["tmpfs"] == ["/tmp"], name  # the one writable place
        assert all(volume.endswith(":ro") for volume in service["volumes"]), name
        assert all(port.startswith("127.0.0.1:") for port in service["ports"]), name
