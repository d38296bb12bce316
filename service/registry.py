"""The models this process serves: load every package under model_dir, pick one per request,
and say whether the whole is ready.

Readiness policy (GET /ready):
- 503 `loading` until every package has been tried (read, session created, warmed up), by
  every worker process with --workers;
- 503 `draining` from the moment shutdown starts;
- 503 `empty` when model_dir holds no package;
- 503 `degraded` when a package failed to load, unless `allow_partial` is set, then 200 as long
  as at least one package serves;
- 200 `ready` otherwise.
A package that fails never takes the others down: they serve (requests to them succeed even
while /ready says 503), and /models and /ready's body name the failure.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.sharedctypes import SynchronizedArray
from pathlib import Path
from typing import Any, Literal

from tokenizers import Tokenizer

from heads.contract import OUTPUT_NAMES
from heads.package import ModelPackage, find_packages, read_package
from heads.rows import encode, load_package_tokenizer, row, template
from service.batcher import Batcher, pad
from service.errors import InputError, ModelNotFound, NotReady
from service.job_queue import Admission
from service.metrics import Metrics
from service.runtime import Backend, open_backend, warm_up
from service.settings import Settings

log = logging.getLogger(__name__)

# The output names each head's post-processing reads; checked at load, not at the first request.
REQUIRED_OUTPUTS = {task: set(names) for task, names in OUTPUT_NAMES.items()}


@dataclass
class LoadedModel:
    """An opened package: its session, warmed up, and (once served) the batcher that runs it."""

    package: ModelPackage
    tokenizer: Tokenizer
    backend: Backend
    variant: str
    warmup_seconds: float
    batcher: Batcher = field(init=False)  # set by Registry._serve, on the event loop

    @property
    def name(self) -> str:
        return self.package.name

    @property
    def task(self) -> str:
        return self.package.task


@dataclass
class Entry:
    """One package folder and what became of it."""

    path: Path
    name: str  # the folder name until package.json is read
    state: Literal["loading", "ready", "failed"] = "loading"
    task: str | None = None
    error: str | None = None
    model: LoadedModel | None = None


# A fill-mask graph answers (B, T, V) float32 logits: a batch of max_batch_tokens 16,384 rows x
# tokens over a 30,522-word vocabulary would be 2 GB of output. Its batches are held to this many
# bytes of logits instead (256 MiB: 2,199 tokens over BERT's vocabulary).
FILL_MASK_OUTPUT_BYTES = 256 << 20


def batch_tokens(package: ModelPackage, max_batch_tokens: int) -> int:
    """The token budget of the package's batches: max_batch_tokens, or less for a graph whose
    output grows with the vocabulary at every position (fill-mask)."""
    if package.task != "fill-mask":
        return max_batch_tokens
    shape = next(o.get("shape", []) for o in package.outputs if o["name"] == "logits")
    vocab = shape[-1] if shape and isinstance(shape[-1], int) else 1
    return max(1, min(max_batch_tokens, FILL_MASK_OUTPUT_BYTES // (4 * vocab)))


def sequence_outputs(package: ModelPackage) -> frozenset[str]:
    """Outputs whose axis 1 is the sequence axis: the batcher cuts them to each row's length."""
    return frozenset(
        o["name"]
        for o in package.outputs
        if len(o.get("shape", [])) > 1 and o["shape"][1] == "sequence"
    )


@dataclass
class LoadFlags:
    """One byte per worker, shared: set once that worker has tried all its packages."""

    flags: SynchronizedArray[Any]
    index: int

    def mark_loaded(self) -> None:
        self.flags[self.index] = 1

    def all_loaded(self) -> bool:
        return all(self.flags[:])


class Registry:
    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.entries: list[Entry] = []
        self.admission = Admission(settings.max_concurrent_requests)
        self.draining = False
        self.loaded = asyncio.Event()  # every package tried
        # With --workers: one flag per worker process, so /ready waits for all of them
        self.load_flags: LoadFlags | None = None
        self._loader: asyncio.Task[None] | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def start_loading(self) -> None:
        """Load in the background, so /health answers and /ready says 503 meanwhile."""
        self._loader = asyncio.create_task(self.load_all(), name="load-packages")

    async def load_all(self) -> None:
        model_dir = self.settings.model_dir
        self.entries = [Entry(path=p, name=p.name) for p in find_packages(model_dir)]
        if not self.entries:
            log.error("no model package under %s", model_dir.resolve())
        for entry in self.entries:
            try:
                opened = await asyncio.to_thread(self._open, entry.path)
                if any(e.name == opened.package.name and e.state == "ready" for e in self.entries):
                    raise ValueError(f"another package is already named {opened.package.name!r}")
                self._serve(opened)
                entry.model = opened
            except Exception as exc:  # any failure stays with this package
                entry.state, entry.error = "failed", f"{type(exc).__name__}: {exc}"
                log.error("%s: not served: %s", entry.path, entry.error)
            else:
                entry.state, entry.name, entry.task = (
                    "ready",
                    opened.package.name,
                    opened.package.task,
                )
        self.loaded.set()
        # What loading made (sessions, tokenizers, the app's routes and schemas) lives as long
        # as the process: out of the collector's generations, a full collection no longer walks
        # it while requests run.
        gc.freeze()
        if self.load_flags is not None:
            self.load_flags.mark_loaded()
        ready = sum(e.state == "ready" for e in self.entries)
        log.info("%d of %d packages ready", ready, len(self.entries))

    def _open(self, path: Path) -> LoadedModel:
        """Blocking part of loading (runs in a thread): read, verify, open, warm up."""
        start = time.perf_counter()
        package = read_package(path, verify=self.settings.verify_sha256)
        declared = {o["name"] for o in package.outputs}
        missing = REQUIRED_OUTPUTS[package.task] - declared
        if missing:
            raise ValueError(f"a {package.task} package needs outputs {sorted(missing)}")
        tokenizer = load_package_tokenizer(package.tokenizer_path)
        backend, variant = open_backend(package, self.settings)
        sample = row(template(tokenizer), encode(tokenizer, "warm up the model").ids)
        warm = time.perf_counter()
        outputs = warm_up(
            backend, pad([sample, sample], template(tokenizer).pad_id)
        )  # 2 rows: the batch axis is dynamic
        seconds = time.perf_counter() - warm
        if missing := declared - set(outputs):
            raise ValueError(f"the graph does not produce outputs {sorted(missing)}")
        log.info("%s: loaded in %.2fs", package.name, time.perf_counter() - start)
        return LoadedModel(package, tokenizer, backend, variant, seconds)

    def _serve(self, opened: LoadedModel) -> None:
        """Give `opened` its batcher, started on this event loop."""
        package = opened.package
        s = self.settings
        if s.max_batch_tokens < package.max_seq_length:
            log.warning(
                "%s: max_batch_tokens %d < max_seq_length %d: long rows run alone",
                package.name,
                s.max_batch_tokens,
                package.max_seq_length,
            )
        batcher = Batcher(
            opened.backend,
            self.metrics.add_model(package.name, package.task),
            tokenizer=opened.tokenizer,
            sequence_outputs=sequence_outputs(package),
            max_batch_tokens=batch_tokens(package, s.max_batch_tokens),
            max_batch_size=s.max_batch_size,
            max_wait_ms=s.max_wait_ms,
            pad_token_id=template(opened.tokenizer).pad_id,
            name=package.name,
        )
        batcher.start()
        provider = opened.backend.provider
        self.metrics.model_info.labels(package.name, package.task, opened.variant, provider).set(1)
        opened.batcher = batcher

    async def shutdown(self, drain_timeout: float) -> None:
        """Refuse new requests (and /ready), let in-flight ones finish, stop the workers."""
        self.draining = True
        if self._loader is not None and not self._loader.done():
            self._loader.cancel()
            await asyncio.gather(self._loader, return_exceptions=True)
        if not await self.admission.wait_idle(drain_timeout):
            log.warning(
                "%d requests still in flight after %.0fs", self.admission.in_flight, drain_timeout
            )
        for entry in self.entries:
            if entry.model is not None:
                await entry.model.batcher.stop()

    # -- queries ---------------------------------------------------------------------------

    def readiness(self) -> tuple[bool, str]:
        """(ready, status): see the module docstring for the policy."""
        if self.draining:
            return False, "draining"
        if not self.loaded.is_set():
            return False, "loading"
        if self.load_flags is not None and not self.load_flags.all_loaded():
            return False, "loading"  # another worker process is still opening its sessions
        ready = [e for e in self.entries if e.state == "ready"]
        if not self.entries:
            return False, "empty"
        if len(ready) < len(self.entries):
            return (bool(ready) and self.settings.allow_partial), "degraded"
        return True, "ready"

    def check_accepting(self) -> None:
        if self.draining:
            raise NotReady(
                "the service is shutting down; retry on another replica",
                headers={"Retry-After": "1"},
            )

    def select(
        self,
        task: str | None,
        name: str | None,
        endpoint: str,
        accept: Callable[[ModelPackage], bool] | None = None,
    ) -> LoadedModel:
        """The model for a request: `name` if given, else the only ready model of `task`
        (None: of any task, for what every package serves: /tokenize, /decode) that `accept`
        takes (/embed and /embed_sparse: dense or sparse embedding packages)."""
        if name is not None:
            entry = next((e for e in self.entries if e.name == name), None)
            if entry is None:
                raise ModelNotFound(f"no model named {name!r}; GET /models lists the loaded ones")
            if entry.state == "loading":
                raise NotReady(f"model {name!r} is still loading")
            if entry.state == "failed" or entry.model is None:
                raise ModelNotFound(f"model {name!r} failed to load: {entry.error}")
            if task is not None and entry.task != task:
                raise InputError(
                    f"model {name!r} is for {entry.task}; {endpoint} needs a {task} model"
                )
            return entry.model
        candidates = [
            e.model
            for e in self.entries
            if task in (None, e.task)
            and e.model is not None
            and (accept is None or accept(e.model.package))
        ]
        kind = f"{task} models" if task else "models"
        if len(candidates) == 1:
            return candidates[0]
        if candidates:
            names = ", ".join(m.name for m in candidates)
            raise InputError(f"several {kind} are loaded ({names}); name one in 'model'")
        if not self.loaded.is_set():
            raise NotReady("models are still loading")
        raise ModelNotFound(f"no {task or ''} model is loaded; GET /models lists what is")
