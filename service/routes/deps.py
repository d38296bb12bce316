"""What routes depend on, as `Annotated` aliases: the registry, the API key check, and the
per-request `Inference` helper that holds an admission slot while the request runs."""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Annotated, TypeVar

from fastapi import Depends, Request

from service.errors import PayloadTooLarge, Unauthorized
from service.http import ClientGone
from service.registry import LoadedModel, Registry
from service.rows import Outputs
from service.rows import Sequence as Row
from service.settings import Settings

T = TypeVar("T")

# Below this many characters (tokenization) or tokens (post-processing) a stage stays on the
# event loop: a thread hop costs more than the work.
OFFLOAD_WORK = 2_000


# The dependencies are `async def` although they never await: FastAPI runs a plain `def`
# dependency in a worker thread, and three thread hops per request cost more than the work
# (tiny model, 2 cores: idle p50 1.10 -> 0.93 ms; at 32 clients, batches of 9 -> 15 rows).


async def get_registry(request: Request) -> Registry:
    registry: Registry = request.app.state.registry
    return registry


async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


RegistryDep = Annotated[Registry, Depends(get_registry)]
SettingsDep = Annotated[Settings, Depends(get_settings)]


def require_api_key(request: Request, settings: SettingsDep) -> None:
    """401 unless `Authorization: Bearer <api_key>` matches (when an api_key is set)."""
    if settings.api_key is None:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    expected = settings.api_key.get_secret_value().encode()
    # compare_digest: the time taken does not tell how much of the key was right
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), expected):
        raise Unauthorized(
            "missing or wrong API key: send 'Authorization: Bearer <key>'",
            headers={"WWW-Authenticate": "Bearer"},
        )


async def _check_api_key(request: Request, settings: SettingsDep) -> None:
    require_api_key(request, settings)


ApiKey = Depends(_check_api_key)


class Inference:
    """One request's path through a model: pick the model, check sizes, tokenize, run the rows
    through the batcher (giving up if the client leaves), post-process; each stage timed."""

    def __init__(self, request: Request, registry: Registry) -> None:
        self.request = request
        self.registry = registry
        self.settings = registry.settings
        self.deadline = asyncio.get_running_loop().time() + self.settings.request_timeout
        self._model: LoadedModel | None = None
        self.tokens = 0  # tokens in the rows of the last run()

    @property
    def model(self) -> LoadedModel:
        assert self._model is not None, "call use() first"
        return self._model

    def use(self, task: str, name: str | None) -> LoadedModel:
        self._model = self.registry.select(task, name, self.request.url.path)
        # for RequestMetrics: label this request with its model
        self.request.state.model, self.request.state.task = self._model.name, task
        return self._model

    def check_sizes(self, texts: Sequence[str | tuple[str, str]], field: str = "inputs") -> None:
        """413 for more inputs than max_client_batch_size or a text over max_text_chars."""
        s = self.settings
        if len(texts) > s.max_client_batch_size:
            raise PayloadTooLarge(
                f"{field} has {len(texts)} items, more than max_client_batch_size "
                f"({s.max_client_batch_size}); split the request"
            )
        for i, text in enumerate(texts):
            n = len(text) if isinstance(text, str) else len(text[0]) + len(text[1])
            if n > s.max_text_chars:
                raise PayloadTooLarge(
                    f"{field}[{i}] has {n} characters, more than max_text_chars "
                    f"({s.max_text_chars}); split the text"
                )

    async def tokenize(self, fn: Callable[[], T], chars: int) -> T:
        """Run the task's encode_pre, in a thread when the texts are long enough to stall
        the event loop (which meanwhile accepts requests and feeds the batcher)."""
        return await self._stage("tokenization", fn, chars)

    async def postprocess(self, fn: Callable[[], T]) -> T:
        """Run the task's encode_post, in a thread when the last `run` had many tokens."""
        return await self._stage("postprocess", fn, self.tokens)

    async def _stage(self, name: str, fn: Callable[[], T], work: int) -> T:
        start = time.perf_counter()
        result = await asyncio.to_thread(fn) if work > OFFLOAD_WORK else fn()
        m = self.registry.metrics
        m.stage.labels(self.model.name, self.model.task, name).observe(time.perf_counter() - start)
        return result

    def count(self, *, truncated: int = 0, windowed: int = 0) -> None:
        m, labels = self.registry.metrics, (self.model.name, self.model.task)
        if truncated:
            m.truncated.labels(*labels).inc(truncated)
        if windowed:
            m.windowed.labels(*labels).inc(windowed)

    async def run(self, rows: list[Row]) -> list[Outputs]:
        """The rows' outputs, in order. Raises ClientGone when the client disconnects first:
        the rows still queued are then dropped before they cost compute."""
        self.tokens = sum(len(row) for row in rows)
        submit = asyncio.ensure_future(self.model.batcher.submit(rows, self.deadline))
        gone = asyncio.ensure_future(self._client_gone())
        try:
            done, _ = await asyncio.wait({submit, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not submit.done():
                submit.cancel()  # the batcher counts the drop
        if submit not in done:
            raise ClientGone("client disconnected")
        return submit.result()

    async def _client_gone(self) -> None:
        # The body is read by now, so the next message the server has is the disconnect.
        while (await self.request.receive())["type"] != "http.disconnect":
            await asyncio.sleep(0.01)  # a server that keeps answering: do not spin


async def _inference(
    request: Request, registry: RegistryDep, _: Annotated[None, ApiKey]
) -> AsyncIterator[Inference]:
    registry.check_accepting()
    registry.admission.acquire()
    try:
        yield Inference(request, registry)
    finally:
        registry.admission.release()


InferenceDep = Annotated[Inference, Depends(_inference)]
