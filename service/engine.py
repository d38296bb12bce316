"""The engine: the model packages and their batchers, with the tasks as async methods that take
plain Python inputs and return the answers the HTTP routes serialise. No HTTP in here:

    async with Engine(EngineSettings(model_dir=Path("models"))) as engine:  # loads, drains at exit
        [[best]] = await engine.answer(classify.Options(), ["I loved this film"])  # {"label", "score"}
        vectors = await engine.answer(embed.Options(), ["a sentence", "another"])  # (2, H) float32
        [span] = await engine.answer(qa.Options(), [("Who?", "Anna met Paul.")])  # best span or None

One entry point, `answer(options, inputs, model=..., call=...)`: the options are a task's
typed options (heads.tasks: each task module's `Options`), which also say which packages
answer them. Every call takes the same path: refused while draining (503), an admission slot (429
when max_concurrent_requests are in flight), the model (by name, or the only ready one of the
task, or its default: service.selection; 404 / 422), the size limits (413), the task's `Job` (heads.tasks) queued on the model's
batcher with the request's deadline (503 timeout), and its answer. Errors are the
service.errors types (a bad input: heads.rows.InvalidInput), whoever the caller is.

A caller passes a `Call` of its own (Engine.call makes one) to read back what its request used
and where its time went, or to give it up: a plain record the engine fills in, never calls back
into. The HTTP fronts (service.lifecycle) read it for their headers, metrics and spans, and
cancel it when the client disconnects (the job's rows still queued are then dropped).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

from heads.contract import MANIFEST
from heads.tasks import Job, TaskOptions
from heads.tasks.analyze import AnalyzeJob, HeadJob
from service.errors import ClientGone, InputError, ModelNotFound, PayloadTooLarge
from service.job_queue import Timing
from service.metrics import Metrics
from service.model_control import Poller
from service.registry import LoadedModel, Registry
from service.settings import EngineSettings


class Call:
    """One caller's request through the engine, as data: its deadline (event loop clock),
    whether its caller gave it up, and what the engine filled in: the model and the request
    task once chosen, the inputs' count, the job and its answer's future once queued, and where
    its time went (`timing`: queue, tokenization, inference seconds; `enqueued`: when the job was
    queued). The engine writes these as it goes and never calls back: its caller reads them
    once the answer (or the error) is back, or cancels the call while it waits."""

    model: LoadedModel | None = None
    task = ""  # the request task the metrics and spans name (the model's, once chosen)
    inputs = 0
    job: Job | None = None
    future: asyncio.Future[Any] | None = None  # the job's answer, once queued
    enqueued = 0.0  # perf_counter() when its job was queued; 0.0: never
    cancelled = False  # its caller gave it up (cancel)
    # Its rows share a batch with no other call's: its answers then depend on its own inputs
    # alone, run after run (the offline batch command's calls; a server's calls mix).
    alone = False

    def __init__(self, deadline: float, where: str = "this call") -> None:
        self.deadline = deadline
        self.where = where  # how errors name the caller: "/classify needs a ... model"
        self.timing = Timing()

    def cancel(self) -> None:
        """Give the answer up: the job's rows still queued are dropped, and the engine raises
        ClientGone to whoever awaits it."""
        self.cancelled = True
        if self.future is not None:
            self.future.cancel()


class Engine:
    """See the module docstring. `start()` (or `async with`) inside the event loop that will
    call it; `stop()` drains: new calls get 503, calls in flight finish (drain_timeout)."""

    def __init__(self, settings: EngineSettings, metrics: Metrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.registry = Registry(settings, self.metrics)
        self.poller = Poller(self.registry) if settings.model_control == "poll" else None

    async def start(self, wait: bool = True) -> None:
        """Open every package (in the background); with `wait`, until all have been tried.
        model_control poll: then follow model_dir."""
        self.registry.start_loading()
        if self.poller is not None:
            self.poller.start()
        if wait:
            await self.registry.loaded.wait()

    async def stop(self) -> None:
        if self.poller is not None:
            await self.poller.stop()
        await self.registry.shutdown(self.settings.drain_timeout)

    async def load(self, name: str) -> LoadedModel:
        """Load (or reload) model_dir/<name> beside what serves, then swap (model control)."""
        path = self.settings.model_dir / name
        if "/" in name or name.startswith(".") or not (path / MANIFEST).is_file():
            raise ModelNotFound(f"no package folder {name!r} in the model directory")
        entry = await self.registry.load(path, name)
        assert entry.model is not None
        return entry.model

    async def unload(self, name: str) -> None:
        """Stop serving `name`; what it has queued finishes first (model control)."""
        await self.registry.unload(name)

    async def __aenter__(self) -> Engine:
        await self.start()
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def call(self, where: str = "this call") -> Call:
        """A Call with the default deadline (request_timeout from now)."""
        loop = asyncio.get_running_loop()
        return Call(loop.time() + self.settings.request_timeout, where)

    # -- the one path ----------------------------------------------------------------------

    async def answer(
        self,
        options: TaskOptions,
        inputs: Sequence[Any],
        *,
        model: str | None = None,
        call: Call | None = None,
    ) -> Any:
        """The answer to `inputs` with the task `options` are of (heads.tasks: each task's
        `Options`), from the model `model` (None: the only ready one of the task, or its
        default); see the module docstring for the steps and their errors. `call` is filled in
        as it goes."""
        if call is None:
            call = self.call()
        items = list(inputs)  # one copy: the size checks and the job read the same list
        registry = self.registry
        registry.check_accepting()
        registry.admission.acquire()
        try:
            # rerank and zero-shot take a single-text classifier only when asked to
            single = getattr(options, "allow_single_text", False)
            chosen = registry.select(options.use or options.task, model, call.where, single)
            call.model, call.task, call.inputs = (
                chosen,
                options.task or chosen.package.task,
                len(items),
            )
            for field, sized in options.sized(items).items():
                self.check_sizes(sized, field)
            job = call.job = options.job(chosen.package, items)
            return await self._queued(call, chosen, job)
        finally:
            registry.admission.release()

    async def analyze(
        self,
        heads: Mapping[str, TaskOptions],
        inputs: Sequence[Any],
        *,
        call: Call | None = None,
    ) -> dict[str, Any]:
        """Several heads trained on one frozen encoder (adapter packages of kind "frozen",
        heads.adapters), each with its task's options, over `inputs` in one encoder pass
        (heads.tasks.analyze): head name -> the answer its own endpoint gives. The same path
        as `answer`; 422 for a head that is not a frozen-encoder adapter, or heads over
        different encoders."""
        if call is None:
            call = self.call()
        items = list(inputs)
        registry = self.registry
        registry.check_accepting()
        registry.admission.acquire()
        try:
            parts: dict[str, HeadJob] = {}
            base: LoadedModel | None = None
            for name, options in heads.items():
                chosen = registry.select(options.use or options.task, name, call.where)
                if chosen.adapter is None or chosen.adapter.kind != "frozen":
                    raise InputError(
                        f"model {name!r} is not a head trained on a frozen encoder: "
                        f"{call.where} runs one encoder pass for such heads only; ask "
                        f"{name} on its task's endpoint"
                    )
                if base is not None and chosen.base is not base:
                    raise InputError(
                        f"{call.where}: the heads run over different encoders "
                        f"({base.name}, {chosen.base.name if chosen.base else '?'})"
                    )
                base = chosen.base
                for field, sized in options.sized(items).items():
                    self.check_sizes(sized, field)
                parts[name] = HeadJob(options.job(chosen.package, items), chosen.adapter)
            if base is None:
                raise InputError(f"{call.where}: name at least one model in 'models'")
            call.model, call.task, call.inputs = base, "analyze", len(items)
            job = call.job = AnalyzeJob(parts)
            return await self._queued(call, base, job)  # type: ignore[no-any-return]
        finally:
            registry.admission.release()

    async def _queued(self, call: Call, model: LoadedModel, job: Job) -> Any:
        """Queue `job` on `model`'s batcher with the call's deadline, and its answer."""
        try:
            future = model.batcher.enqueue(job, call.deadline, call.timing, call.alone)
            call.future, call.enqueued = future, time.perf_counter()
            return await future
        except asyncio.CancelledError:
            if call.cancelled:  # its caller gave it up, not a cancelled task
                raise ClientGone("the caller gave the call up (client disconnected)") from None
            raise

    def check_sizes(self, inputs: list[Any], field: str = "inputs") -> None:
        """413 for more inputs than max_client_batch_size or an input over max_text_chars (a
        pair's texts together). field: what the request calls them."""
        s = self.settings
        if len(inputs) > s.max_client_batch_size:
            raise PayloadTooLarge(
                f"{field} has {len(inputs)} items, more than max_client_batch_size "
                f"({s.max_client_batch_size}); split the request"
            )
        for i, x in enumerate(inputs):
            n = (
                len(x)
                if isinstance(x, str)
                else sum(len(p) if isinstance(p, str) else 1 for p in x)
            )
            if n > s.max_text_chars:
                raise PayloadTooLarge(
                    f"{field}[{i}] has {n} characters, more than max_text_chars "
                    f"({s.max_text_chars}); split the text"
                )
