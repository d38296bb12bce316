"""The engine: the model packages and their batchers, with the tasks as async methods that take
plain Python inputs and return the answers the HTTP routes serialise. No HTTP in here:

    async with Engine(EngineSettings(model_dir=Path("models"))) as engine:  # loads, drains at exit
        [[best]] = await engine.classify(["I loved this film"])        # {"label", "score"}
        vectors = await engine.embed(["a sentence", "another"])        # (2, H) float32
        [span] = await engine.qa([("Who?", "Anna met Paul.")])           # best span or None

Every task call takes the same path: refused while draining (503), an admission slot (429
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
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import Any

import numpy as np

from heads.contract import MANIFEST
from heads.package import ModelPackage
from heads.rows import TextInput
from heads.tasks import (
    Job,
    classify,
    embed,
    fill_mask,
    ner,
    qa,
    rerank,
    sparse,
    tokenize,
    zero_shot,
)
from service.errors import ClientGone, ModelNotFound, PayloadTooLarge
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

    # -- the tasks -------------------------------------------------------------------------
    # Each returns `answer`'s coroutine rather than awaiting it in one of its own: one frame less
    # per request on the event loop.

    def classify(
        self,
        inputs: Sequence[TextInput],
        *,
        model: str | None = None,
        top_k: int | None = 1,
        function_to_apply: str | None = None,
        truncate: bool = True,
        truncation_direction: str = "right",
        call: Call | None = None,
    ) -> Awaitable[list[list[dict[str, Any]]]]:
        """Per input (a text or an (a, b) pair) its top_k `{label, score}`, best first."""
        items = list(inputs)  # one copy: the size check and the job read the same list
        return self.answer(
            "classification",
            model,
            items,
            lambda package: classify.Job(
                package,
                items,
                top_k=top_k,
                function_to_apply=function_to_apply,
                truncate=truncate,
                truncation_direction=truncation_direction,
            ),
            call,
        )

    def ner(
        self,
        texts: Sequence[str],
        *,
        model: str | None = None,
        aggregation_strategy: str = "simple",
        ignore_labels: list[str] | None = None,
        stride: int | None = None,
        call: Call | None = None,
    ) -> Awaitable[list[list[dict[str, Any]]]]:
        """Per text its entities `{entity_group, score, word, start, end}` (or one entry per
        token with aggregation_strategy "none")."""
        items = list(texts)
        return self.answer(
            "token-classification",
            model,
            items,
            lambda package: ner.Job(
                package,
                items,
                aggregation_strategy=aggregation_strategy,
                ignore_labels=ignore_labels,
                stride=stride,
            ),
            call,
        )

    def qa(
        self,
        pairs: Sequence[tuple[str, str]],
        *,
        model: str | None = None,
        top_k: int = 1,
        max_answer_len: int = 15,
        max_seq_len: int = 384,
        doc_stride: int | None = None,
        handle_impossible_answer: bool = False,
        call: Call | None = None,
    ) -> Awaitable[list[Any]]:
        """Per (question, context) its best span `{answer, score, start, end}` (None when the
        context has none), or with top_k > 1 a list of up to top_k, best first (the
        transformers pipeline's option names)."""
        items = list(pairs)
        return self.answer(
            "question-answering",
            model,
            items,
            lambda package: qa.Job(
                package,
                items,
                top_k=top_k,
                max_answer_len=max_answer_len,
                max_seq_length=max_seq_len,
                stride=doc_stride,
                handle_impossible_answer=handle_impossible_answer,
            ),
            call,
        )

    def embed(
        self,
        texts: Sequence[str],
        *,
        model: str | None = None,
        normalize: bool | None = None,
        truncate: bool = True,
        layers: list[int] | None = None,
        pooling: str | None = None,
        combine: str = "concat",
        prompt_name: str | None = None,
        truncation_direction: str = "right",
        dimensions: int | None = None,
        call: Call | None = None,
    ) -> Awaitable[np.ndarray]:
        """(N, H) float32: one vector per text (the package's pooling and normalisation unless
        `normalize` says otherwise; `layers` for a package exported with hidden states;
        `dimensions`: the first D values, normalised after the cut, as Matryoshka models are
        used)."""

        items = list(texts)

        def job(package: ModelPackage) -> embed.Job:
            return embed.Job(
                package,
                items,
                normalize=normalize,
                truncate=truncate,
                features=embed.features(package, layers, pooling, combine),
                prompt=embed.prompt(package, prompt_name),
                truncation_direction=truncation_direction,
                dimensions=dimensions,
            )

        return self.answer("embedding", model, items, job, call)

    def embed_sparse(
        self,
        texts: Sequence[str],
        *,
        model: str | None = None,
        truncate: bool = True,
        return_tokens: bool = False,
        prompt_name: str | None = None,
        truncation_direction: str = "right",
        call: Call | None = None,
    ) -> Awaitable[list[list[dict[str, Any]]]]:
        """Per text its non-zero vocabulary weights `{index, value}` (and `token`), by index,
        from a sparse (SPLADE) embedding package (heads.tasks.sparse)."""
        items = list(texts)

        def job(package: ModelPackage) -> sparse.Job:
            return sparse.Job(
                package,
                items,
                truncate=truncate,
                with_tokens=return_tokens,
                prompt=embed.prompt(package, prompt_name),
                truncation_direction=truncation_direction,
            )

        return self.answer("embedding", model, items, job, call, use="sparse-embedding")

    def fill_mask(
        self,
        texts: Sequence[str],
        *,
        model: str | None = None,
        top_k: int = fill_mask.TOP_K,
        targets: str | list[str] | None = None,
        call: Call | None = None,
    ) -> Awaitable[list[Any]]:
        """Per text the top_k fillers `{score, token, token_str, sequence}` of its mask token
        (one list per mask when it has several), as the fill-mask pipeline answers."""
        items = list(texts)
        return self.answer(
            "fill-mask",
            model,
            items,
            lambda package: fill_mask.Job(package, items, top_k=top_k, targets=targets),
            call,
        )

    def rerank(
        self,
        query: str,
        documents: Sequence[str],
        *,
        model: str | None = None,
        raw_scores: bool = False,
        truncate: bool = False,
        truncation_direction: str = "right",
        top_n: int | None = None,
        max_tokens_per_doc: int | None = None,
        allow_single_text: bool = False,
        call: Call | None = None,
    ) -> Awaitable[list[dict[str, Any]]]:
        """Per document `{index, score}` (and `window`, the best window's character span, when
        a long document was scored by windows), best first, at most top_n; the model is a
        classification package of a cross-encoder (heads.tasks.rerank), one that reads single
        texts only with `allow_single_text` (service.selection)."""
        items = list(documents)
        return self.answer(
            "classification",
            model,
            [(query, document) for document in items],  # a row each: counted, sized as pairs
            lambda package: rerank.Job(
                package,
                query,
                items,
                raw_scores=raw_scores,
                truncate=truncate,
                truncation_direction=truncation_direction,
                top_n=top_n,
                max_tokens_per_doc=max_tokens_per_doc,
            ),
            call,
            use="rerank",
            field="documents",
            allow_single_text=allow_single_text,
        )

    def zero_shot(
        self,
        sequences: Sequence[str],
        candidate_labels: Sequence[str],
        *,
        model: str | None = None,
        hypothesis_template: str = zero_shot.DEFAULT_TEMPLATE,
        multi_label: bool = False,
        allow_single_text: bool = False,
        call: Call | None = None,
    ) -> Awaitable[list[dict[str, Any]]]:
        """Per text `{sequence, labels, scores}`, best first, from an NLI classification
        package: every (text, label) pair of the request is one row (heads.tasks.zero_shot);
        one that reads single texts only with `allow_single_text` (service.selection)."""
        items, labels = list(sequences), list(candidate_labels)
        self.check_sizes(labels)
        return self.answer(
            "classification",
            model,
            items,
            lambda package: zero_shot.Job(
                package,
                items,
                labels,
                hypothesis_template=hypothesis_template,
                multi_label=multi_label,
            ),
            call,
            use="zero-shot",
            allow_single_text=allow_single_text,
        )

    def tokenize(
        self,
        texts: Sequence[str],
        *,
        model: str | None = None,
        add_special_tokens: bool = True,
        prompt_name: str | None = None,
        call: Call | None = None,
    ) -> Awaitable[list[list[dict[str, Any]]]]:
        """Per text its tokens `{id, text, special, start, stop}` with the model's tokenizer
        (any package; `prompt_name` for an embedding package's prompt)."""
        items = list(texts)

        def job(package: ModelPackage) -> tokenize.TokenizeJob:
            prompt = embed.prompt(package, prompt_name) if prompt_name is not None else ""
            return tokenize.TokenizeJob(items, add_special_tokens=add_special_tokens, prompt=prompt)

        return self.answer(None, model, items, job, call)

    def decode(
        self,
        ids: Sequence[Sequence[int]],
        *,
        model: str | None = None,
        skip_special_tokens: bool = True,
        call: Call | None = None,
    ) -> Awaitable[list[str]]:
        """Per list of token ids its text, with the model's tokenizer (any package)."""
        items = [list(row) for row in ids]
        return self.answer(
            None,
            model,
            items,
            lambda package: tokenize.DecodeJob(items, skip_special_tokens=skip_special_tokens),
            call,
        )

    # -- the one path ----------------------------------------------------------------------

    async def answer(
        self,
        task: str | None,
        name: str | None,
        inputs: list[Any],
        make_job: Callable[[ModelPackage], Job],
        call: Call | None = None,
        use: str | None = None,
        field: str = "inputs",
        allow_single_text: bool = False,
    ) -> Any:
        """The answer of the job `make_job` builds for the chosen model (see the module
        docstring for the steps and their errors), with `call` filled in as it goes. `use`: the
        request task when it is not `task` itself (heads.contract.REQUEST_TASKS: rerank,
        zero-shot, sparse-embedding)."""
        if call is None:
            call = self.call()
        registry = self.registry
        registry.check_accepting()
        registry.admission.acquire()
        try:
            model = registry.select(use or task, name, call.where, allow_single_text)
            call.model, call.task, call.inputs = model, task or model.package.task, len(inputs)
            self.check_sizes(inputs, field)
            job = call.job = make_job(model.package)
            future = model.batcher.enqueue(job, call.deadline, call.timing, call.alone)
            call.future, call.enqueued = future, time.perf_counter()
            return await future
        except asyncio.CancelledError:
            if call.cancelled:  # its caller gave it up, not a cancelled task
                raise ClientGone("the caller gave the call up (client disconnected)") from None
            raise
        finally:
            registry.admission.release()

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
