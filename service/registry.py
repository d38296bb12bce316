"""The models this process serves: load every package under model_dir, pick one per request,
and say whether the whole is ready.

Readiness policy (GET /ready):
- 503 `loading` until every package has been tried (read, session created, warmed up), by
  every worker process with --workers (at start: a worker replaced later does not hold /ready
  back while the others serve, and gets no connection until it has loaded);
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
import dataclasses
import gc
import hashlib
import json
import logging
import time
from dataclasses import dataclass, field
from multiprocessing.sharedctypes import Synchronized, SynchronizedArray
from pathlib import Path
from typing import Any, Literal

import numpy as np
from tokenizers import Tokenizer

from heads.adapters import ADAPTER_INPUT, ENCODER, Adapter, check_fits, read_adapter
from heads.contract import MANIFEST, OUTPUT_NAMES, TOKENIZER, answering_tasks
from heads.package import ModelPackage, read_package
from heads.rows import encode, forget, load_package_tokenizer, pad_id, row, template
from service.adapters import AdapterDoor
from service.batcher import Batcher, pad
from service.errors import InputError, ModelNotFound, NotReady
from service.job_queue import Admission
from service.malloc import give_back_free_memory
from service.metrics import Metrics
from service.runtime import ON_REQUEST, Backend, EncoderBackend, open_backend, warm_up
from service.selection import check_named, choose, none_loaded, package_folders, unfit
from service.settings import EngineSettings

log = logging.getLogger(__name__)

# The output names each head's post-processing reads; checked at load, not at the first request.
REQUIRED_OUTPUTS = {task: set(names) for task, names in OUTPUT_NAMES.items()}


@dataclass
class LoadedModel:
    """An opened package: its session, warmed up, and (once served) the batcher that runs it."""

    package: ModelPackage  # its name: the folder's, the name it is served under
    tokenizer: Tokenizer
    backend: Backend
    variant: str
    warmup_seconds: float
    package_name: str  # what package.json calls it, shown by /models where it differs
    version: str  # the start of package.json's sha256 (which holds every file's)
    loaded_at: float  # time.time()
    # set by Registry._serve, on the event loop; an adapter's door into its encoder's batcher
    batcher: Batcher | AdapterDoor = field(init=False)
    adapter: Adapter | None = None  # an adapter package's weights (heads.adapters)
    base: LoadedModel | None = None  # the encoder an adapter runs over

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
    error: str | None = None  # why it does not serve
    model: LoadedModel | None = None
    reload_error: str | None = None  # why a newer version did not load (this one serves)
    attempted: str | None = None  # model control: the folder's fingerprint last tried

    @property
    def task(self) -> str | None:
        """The task of the model it serves; None while none does."""
        return self.model.task if self.model is not None else None


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


def is_encoder(folder: Path) -> bool:
    """Whether the package in `folder` is an encoder (adapters run over it): they load first."""
    try:
        return json.loads((folder / MANIFEST).read_text()).get("task") == ENCODER
    except (OSError, ValueError, AttributeError):
        return False


def fingerprint(folder: Path) -> str | None:
    """What model control compares to see a package folder change: package.json's bytes (it
    holds every file's sha256) and every file's path, size and modification time; None when
    it cannot be read."""
    h = hashlib.sha256()
    try:
        h.update((folder / MANIFEST).read_bytes())
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            st = path.stat()
            h.update(f"{path.relative_to(folder)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    except OSError:
        return None
    return h.hexdigest()[:16]


@dataclass
class LoadFlags:
    """Shared by the worker processes: one byte per worker, set once it has tried all its
    packages (the parent clears it when it replaces that worker), and `started`, set once
    every worker had (the service's first start is over)."""

    flags: SynchronizedArray[Any]
    index: int
    started: Synchronized[Any]

    def mark_loaded(self) -> None:
        self.flags[self.index] = 1
        if all(self.flags[:]):
            self.started.value = 1

    def all_loaded(self) -> bool:
        return bool(self.started.value) or all(self.flags[:])


class Registry:
    def __init__(self, settings: EngineSettings, metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.entries: list[Entry] = []
        self.admission = Admission(settings.max_concurrent_requests)
        self.draining = False
        self.loaded = asyncio.Event()  # every package tried
        # With --workers: one flag per worker process, so /ready waits for all of them
        self.load_flags: LoadFlags | None = None
        self._loader: asyncio.Task[None] | None = None
        self._control = asyncio.Lock()  # one load or unload at a time
        self._retiring: set[asyncio.Task[None]] = set()  # old versions finishing their queue

    # -- lifecycle -------------------------------------------------------------------------

    def start_loading(self) -> None:
        """Load in the background, so /health answers and /ready says 503 meanwhile."""
        self._loader = asyncio.create_task(self.load_all(), name="load-packages")

    async def load_all(self) -> None:
        model_dir = self.settings.model_dir
        self.entries = [Entry(path=p, name=name) for p, name in self.packages()]
        if not self.entries:
            log.error("no model package under %s", model_dir.resolve())
        # encoders first: the adapters that run over them find them loaded
        for entry in sorted(self.entries, key=lambda e: not is_encoder(e.path)):
            entry.attempted = fingerprint(entry.path)
            try:
                opened = await asyncio.to_thread(self._open, entry.path, entry.name)
                self._serve(opened)
                entry.model = opened
            except Exception as exc:  # any failure stays with this package
                entry.state, entry.error = "failed", f"{type(exc).__name__}: {exc}"
                log.error("%s: not served: %s", entry.path, entry.error)
            else:
                entry.state = "ready"
        self.loaded.set()
        # What loading made (sessions, tokenizers, the app's routes and schemas) lives as long
        # as the process: out of the collector's generations, a full collection no longer walks
        # it while requests run.
        gc.freeze()
        if self.load_flags is not None:
            self.load_flags.mark_loaded()
        ready = sum(e.state == "ready" for e in self.entries)
        log.info("%d of %d packages ready", ready, len(self.entries))
        self.check_defaults()

    def packages(self) -> list[tuple[Path, str]]:
        """(folder, served name) of each package: model_dir's sub-folders under their names,
        or model_dir itself when it is one package (under model_name, else its name)."""
        return package_folders(self.settings.model_dir, self.settings.model_name)

    def _open(self, path: Path, name: str) -> LoadedModel:
        """Blocking part of loading (runs in a thread): read, verify, open, warm up."""
        start = time.perf_counter()
        package = read_package(path, verify=self.settings.verify_sha256)
        # Served under its folder's name, one rule for every package: a user who renames or
        # copies a folder (models/wnut from runs/wnut-bh/package) asks for the name they see.
        package_name, package = package.name, dataclasses.replace(package, name=name)
        if package.adapter is not None:
            return self._open_adapter(package, package_name, start)
        declared = {o["name"] for o in package.outputs}
        missing = REQUIRED_OUTPUTS[package.task] - declared
        if missing:
            raise ValueError(f"a {package.task} package needs outputs {sorted(missing)}")
        tokenizer = load_package_tokenizer(package.tokenizer_path)
        backend, variant = open_backend(package, self.settings)
        sample = row(template(tokenizer), encode(tokenizer, "warm up the model").ids)
        warm = time.perf_counter()
        outputs = warm_up(
            backend, pad([sample, sample], pad_id(package.pad_token_id, tokenizer))
        )  # 2 rows: the batch axis is dynamic
        seconds = time.perf_counter() - warm
        if missing := declared - set(outputs):
            raise ValueError(f"the graph does not produce outputs {sorted(missing)}")
        log.info("%s: loaded in %.2fs", package.name, time.perf_counter() - start)
        version = hashlib.sha256((path / MANIFEST).read_bytes()).hexdigest()[:12]
        return LoadedModel(
            package, tokenizer, backend, variant, seconds, package_name, version, time.time()
        )

    def _open_adapter(self, package: ModelPackage, package_name: str, start: float) -> LoadedModel:
        """An adapter package over the loaded encoder it names, warmed up through it."""
        assert package.adapter is not None
        wanted = package.adapter["base"]
        base = self.encoder_for(wanted)
        if base is None:
            raise ValueError(
                f"its encoder {wanted.get('name')!r} (weights {wanted['digest'][:12]}) is not "
                "loaded: put that encoder package in the model directory (or load it first)"
            )
        if package.sha256.get(TOKENIZER) != base.package.sha256.get(TOKENIZER):
            raise ValueError(f"its tokenizer.json is not its encoder {base.name}'s")
        adapter = read_adapter(package.path, package.name, package.adapter)
        assert base.package.encoder is not None
        if why := check_fits(adapter, base.package.encoder):
            raise ValueError(f"it cannot run over {base.name}: {why}")
        sample = row(template(base.tokenizer), encode(base.tokenizer, "warm up the model").ids)
        warm = time.perf_counter()
        feeds = pad([sample, sample], pad_id(base.package.pad_token_id, base.tokenizer))
        feeds[ADAPTER_INPUT] = np.array([adapter, adapter], dtype=object)
        states = base.backend.run(feeds, True, ON_REQUEST)
        n = len(sample)
        for name, value in adapter.head({k: v[0, :n] for k, v in states.items()}).items():
            if not np.all(np.isfinite(value)):
                raise RuntimeError(f"warm-up output {name} is not finite")
        seconds = time.perf_counter() - warm
        log.info("%s: adapter over %s loaded in %.2fs", package.name, base.name,
                 time.perf_counter() - start)  # fmt: skip
        version = hashlib.sha256((package.path / MANIFEST).read_bytes()).hexdigest()[:12]
        return LoadedModel(
            package, base.tokenizer, base.backend, base.variant, seconds, package_name, version,
            time.time(), adapter=adapter, base=base,
        )  # fmt: skip

    def encoder_for(self, wanted: dict[str, Any]) -> LoadedModel | None:
        """The loaded encoder an adapter's `base` block names: its weights' digest, by its
        name first where several hold the same weights."""
        fits = [
            e.model
            for e in self.entries
            if e.model is not None
            and e.model.package.encoder is not None
            and e.model.package.encoder["digest"] == wanted["digest"]
        ]
        return next((m for m in fits if m.name == wanted.get("name")), fits[0] if fits else None)

    def riders(self, encoder: LoadedModel) -> list[Entry]:
        """The entries of the adapters that run over `encoder`."""
        return [e for e in self.entries if e.model is not None and e.model.base is encoder]

    def _serve(self, opened: LoadedModel) -> None:
        """Give `opened` its batcher, started on this event loop (an adapter: its door into its
        encoder's)."""
        package = opened.package
        if opened.adapter is not None and opened.base is not None:
            assert isinstance(opened.base.backend, EncoderBackend)
            base_batcher = opened.base.batcher
            assert isinstance(base_batcher, Batcher)
            opened.batcher = AdapterDoor(base_batcher, opened.base.backend, opened.adapter)
            self.metrics.add_model(package.name, package.task)
            a = opened.adapter
            self.metrics.adapter_info.labels(
                package.name, opened.base.name, a.kind, str(a.rank), str(a.nbytes)
            ).set(1)
            provider = opened.backend.provider
            self.metrics.model_info.labels(
                package.name, package.task, opened.variant, provider
            ).set(1)
            return
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
            pad_token_id=pad_id(package.pad_token_id, opened.tokenizer),
            name=package.name,
        )
        batcher.start()
        provider = opened.backend.provider
        self.metrics.model_info.labels(package.name, package.task, opened.variant, provider).set(1)
        opened.batcher = batcher

    # -- model control: load, reload, unload while serving ------------------------------------

    def entry(self, name: str) -> Entry | None:
        return next((e for e in self.entries if e.name == name), None)

    async def load(self, path: Path, name: str, attempt: str | None = None) -> Entry:
        """Open the package at `path` and serve it under `name`: beside the version serving
        now, which keeps answering until the new one is warm; then new requests go to the new
        version, and the old one finishes what it has queued and is closed. A package that
        fails to load leaves the old version serving (entry.reload_error says why). One load
        or unload at a time. `attempt`: the folder fingerprint this load tries (poll mode)."""
        async with self._control:
            # A new package joins the entries once it serves (or has failed): /ready does not
            # drop while it loads.
            entry = self.entry(name) or Entry(path=path, name=name)
            entry.attempted = attempt
            try:
                opened = await asyncio.to_thread(self._open, path, name)
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
                self.metrics.load_failures.labels(name).inc()
                self._add(entry)
                if entry.model is not None:
                    entry.reload_error = error
                    log.error("%s: new version not served, the old one serves: %s", name, error)
                else:
                    entry.state, entry.error = "failed", error
                    log.error("%s: not served: %s", path, error)
                raise
            old = entry.model
            riders = self.riders(old) if old is not None else []
            if riders and (why := self._cannot_carry(opened, riders)):
                entry.reload_error = why
                raise ValueError(why)
            self._serve(opened)
            self._add(entry)
            entry.model, entry.path = opened, path
            entry.state, entry.error, entry.reload_error = "ready", None, None
            log.info("%s: version %s serving", name, opened.version)
            for rider in riders:  # its adapters now run over the new version
                assert rider.model is not None
                moved = dataclasses.replace(
                    rider.model, backend=opened.backend, tokenizer=opened.tokenizer, base=opened
                )
                self._serve(moved)
                self._retire(rider.model)
                rider.model = moved
            if old is not None:
                self._retire(old)
            self.check_defaults()
            return entry

    def _cannot_carry(self, opened: LoadedModel, riders: list[Entry]) -> str | None:
        """Why the adapters `riders` cannot move onto the encoder `opened` (None: they can)."""
        encoder = opened.package.encoder
        if encoder is None:
            return (
                f"adapters run over it ({', '.join(e.name for e in riders)}); it is no encoder now"
            )
        for rider in riders:
            assert rider.model is not None and rider.model.adapter is not None
            if why := check_fits(rider.model.adapter, encoder):
                return f"adapter {rider.name} cannot run over the new version: {why}"
        return None

    def _add(self, entry: Entry) -> None:
        if entry not in self.entries:
            self.entries = sorted([*self.entries, entry], key=lambda e: e.name)

    async def unload(self, name: str) -> None:
        """Stop serving `name`: new requests get 404, queued ones finish (within
        drain_timeout, then 503)."""
        async with self._control:
            entry = self.entry(name)
            if entry is None:
                raise ModelNotFound(f"no model named {name!r}; GET /models lists them")
            if entry.model is not None and (riders := self.riders(entry.model)):
                raise InputError(
                    f"adapters run over {name} ({', '.join(e.name for e in riders)}): unload "
                    "them first"
                )
            self.entries = [e for e in self.entries if e is not entry]
            if entry.model is not None:
                self._retire(entry.model)
            log.info("%s: unloaded", name)
            self.check_defaults()

    def _retire(self, model: LoadedModel) -> None:
        task = asyncio.create_task(self._drain_and_close(model), name=f"retire-{model.name}")
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _drain_and_close(self, model: LoadedModel) -> None:
        """Let `model`'s batcher answer what it holds, then stop it and let its session go."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.drain_timeout
        while not model.batcher.idle and loop.time() < deadline:
            await asyncio.sleep(0.01)
        await model.batcher.stop()  # anything still queued past the deadline: 503
        if model.adapter is None:  # an adapter's tokenizer is its encoder's, still serving
            forget(model.tokenizer)  # the row-layout caches would keep it alive
        del model
        # The first load froze what it made out of the collector's reach (load_all): thaw it
        # so that a retired version's cycles can go, then freeze what serves again.
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        give_back_free_memory()

    async def retired(self) -> None:
        """Wait until every retired version is closed (tests, shutdown)."""
        while self._retiring:
            await asyncio.gather(*self._retiring, return_exceptions=True)

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
        await self.retired()

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
        self, use: str | None, name: str | None, endpoint: str, allow_single_text: bool = False
    ) -> LoadedModel:
        """The model for a request of request task `use` (heads.contract.REQUEST_TASKS; None:
        any package, for what every package serves: /tokenize, /decode): `name` if given, else
        the one model that can answer, or the task's default (service.selection)."""
        tasks = answering_tasks(use) if use is not None else None
        if name is not None:
            entry = next((e for e in self.entries if e.name == name), None)
            if entry is None:
                raise ModelNotFound(f"no model named {name!r}; GET /models lists the loaded ones")
            if entry.state == "loading":
                raise NotReady(f"model {name!r} is still loading")
            if entry.state == "failed" or entry.model is None:
                raise ModelNotFound(f"model {name!r} failed to load: {entry.error}")
            if tasks is not None and entry.task not in tasks:
                raise InputError(
                    f"model {name!r} is for {entry.task}; {endpoint} needs a "
                    f"{' or '.join(tasks)} model"
                )
            if use is not None:
                check_named(entry.model.package, use, endpoint, allow_single_text)
            return entry.model
        ready = [e.model for e in self.entries if e.model is not None]
        if use is not None:
            chosen = choose(ready, use, self.settings.default_model.get(use))
        elif len(ready) > 1:
            names = ", ".join(m.name for m in ready)
            raise InputError(f"several models are loaded ({names}); name one in 'model'")
        else:
            chosen = ready[0] if ready else None
        if chosen is not None:
            return chosen
        if not self.loaded.is_set():
            raise NotReady("models are still loading")
        raise ModelNotFound(none_loaded(ready, use, endpoint))

    def check_defaults(self) -> None:
        """Warn of a configured default (--default-model) that does not answer its task now:
        failed to load, unloaded, or reloaded as another kind. Requests that name no model
        then get the next rule's choice (service.selection)."""
        ready = {e.name: e.model for e in self.entries if e.model is not None}
        for use, name in self.settings.default_model.items():
            model = ready.get(name)
            why = "it is not loaded" if model is None else unfit(model.package, use)
            if why:
                log.warning(
                    "default model %s for %s does not answer (%s): requests that name no "
                    "model get the next rule's choice",
                    name,
                    use,
                    why,
                )
