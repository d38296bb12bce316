"""The floor under the service's own cost: a bare ASGI app on the same uvicorn (same event
loop and HTTP parser as `python -m service`) that reads the whole request body and answers a
fixed JSON document, whatever the path. What the service spends per request above this app is
FastAPI, validation, tokenization, batching, the thread hand-offs and the answer's JSON.

    python -m uvicorn benchmarks._bare:app --port 8099 --log-level warning
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks._server import REPO, Server, free_port, running

ANSWER = b'[{"label":"positive","score":0.9}]'
HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(ANSWER)).encode())]


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (message := await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    more = True
    while more:  # read the body as the service must
        message = await receive()
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": ANSWER})


@contextmanager
def serve_bare() -> Iterator[Server]:
    """This app under uvicorn in a subprocess on 127.0.0.1, with the service's log level."""
    with tempfile.TemporaryDirectory(prefix="bench-bare-") as tmp:
        port = free_port()
        args = [
            sys.executable, "-m", "uvicorn", "benchmarks._bare:app",
            "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
        ]  # fmt: skip
        with running(args, REPO, None, port, Path(tmp) / "bare.log") as server:
            yield server
