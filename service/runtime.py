"""ONNX Runtime behind a small contract: one session per package, provider and variant choice,
warm-up by a real forward pass.

The batcher only sees `Backend`; tests swap in a slow or failing one without touching ORT.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np
import onnxruntime as ort

from heads.adapters import ADAPTER_INPUT, ALL_HIDDEN_STATES, ENCODER, Adapter, stack_lora
from heads.contract import INPUT_NAMES, TOKEN_EMBEDDINGS
from heads.quality import agreement_problem

if TYPE_CHECKING:
    from heads.package import ModelPackage
    from service.settings import EngineSettings

log = logging.getLogger(__name__)

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"
# The attention kernels a CUDA session may pick: the provider's `sdpa_kernel` bit mask (ORT's
# AttentionBackend: flash 1, memory-efficient 2, TRT fused 4, unfused 16, TRT flash / cross /
# causal 32 / 64 / 128), i.e. all but cuDNN's flash attention (8). Why: onnxruntime-gpu 1.31
# picks cuDNN's for fp16 on Hopper, and cuDNN builds a graph for each new (batch, length) it
# sees: 39 ms on the first call of a shape against 1.3 ms on the second (BERT-base fp16, H200,
# `gpu_ceiling --new-shapes`), and the batcher makes new shapes all the time. Without it the
# first call costs 4.9 ms and served fp16 at 128 clients went 1,237 -> 6,960 requests/s. At a
# fixed shape cuDNN's is faster (15,277 against 12,289 sequences/s at batch 32): static shapes
# would earn it, the batcher's do not. ORT_ENABLE_CUDNN_FLASH_ATTENTION, when set, decides.
CUDA_ATTENTION_KERNELS = 1 | 2 | 4 | 16 | 32 | 64 | 128
CUDNN_ATTENTION_ENV = "ORT_ENABLE_CUDNN_FLASH_ATTENTION"
# ORT's session-level fusions a CPU session goes without. SkipLayerNormFusion would put back
# the SkipLayerNormalization that training.export splits for the CPU (its CPU kernel ran 4-5x
# slower than Add + LayerNormalization: `split_skip_layer_norm`). Today it leaves exported
# graphs alone (their dynamic shapes defeat its checks), but it fuses fixed-shape ones.
CPU_DISABLED_OPTIMIZERS = ("SkipLayerNormFusion",)
Provider = str | tuple[str, dict[str, str]]  # a name, or a name and its options
# Outputs a session hands back only when a batch's jobs ask for them (`wants`): an embedding
# package's token vectors are (B, T, H) where its pooled vector is (B, H), and only /embed_all
# reads them. A graph with no other output (a ColBERT package) always hands them back. An
# encoder's every layer's states (B, T, L + 1, H) go only to a head that reads other layers.
ON_REQUEST = frozenset({TOKEN_EMBEDDINGS, ALL_HIDDEN_STATES})
NONE: frozenset[str] = frozenset()
_NUMPY_DTYPES = {"tensor(int64)": np.int64, "tensor(int32)": np.int32}


class Backend(Protocol):
    """What the batcher needs from an inference engine."""

    @property
    def provider(self) -> str:
        """'cuda' or 'cpu': where the session really runs."""
        ...

    @property
    def lanes(self) -> int:
        """How many run() calls may go at once, each in its own thread (1: one at a time)."""
        ...

    def run(
        self, feeds: Mapping[str, np.ndarray], alone: bool = True, wants: frozenset[str] = NONE
    ) -> dict[str, np.ndarray]:
        """feeds: name -> (B, T) integer array; returns output name -> (B, ...) float32.
        alone: no other run() is in flight, so a backend with lanes may give it every core.
        wants: outputs fetched only when asked (ON_REQUEST), which this batch's jobs read."""
        ...


class OrtBackend:
    """An `onnxruntime.InferenceSession`, or two on CPU with lanes. Safe to call from threads.

    With `lanes` > 1 (CPU only) it holds a second session of the same model with
    `lane_threads` intra-op threads, which up to `lanes` batches run on at once, each on the
    thread that calls run(); a batch that runs alone takes the first session, with every
    thread. Why: on 2 cores MiniLM ran 1.2-1.7x the sequences/s as two one-thread runs side by
    side than as one two-thread run at batch 1 to 2, and as much at length-sorted batch 8
    (int8: 672 against 392 at batch 1; fp32: 282 against 239); while one run at a time on two
    threads answers a lone request fastest (batch 1: 1.7 against 3.0 ms int8, 4.1 against
    7.2 ms fp32). Two threads of one run also wait for each other at every operator, so the
    server's own work preempting either stalls both; a lane's preemption stalls only itself.
    Cost: the model's memory twice."""

    def __init__(
        self,
        model_path: Path,
        providers: list[Provider],
        intra_op_threads: int = 0,
        spinning: bool = False,
        lanes: int = 1,
        lane_threads: int = 1,
    ) -> None:
        self.session = _session(model_path, providers, intra_op_threads, spinning)
        self._lane_session = self.session
        self.lanes = 1
        if lanes > 1 and self.provider == "cpu":
            self._lane_session = _session(model_path, [CPU], lane_threads, spinning)
            self.lanes = lanes
        # The model may not take every feed the batcher builds (no token_type_ids, say), and
        # may want int32 ids: adapt here so the batcher stays model-agnostic.
        self._inputs = {
            i.name: _NUMPY_DTYPES.get(i.type, np.int64) for i in self.session.get_inputs()
        }
        every = [o.name for o in self.session.get_outputs()]
        self._outputs = [o for o in every if o not in ON_REQUEST] or every
        self._on_request = [o for o in every if o not in self._outputs]
        self.model_path = model_path

    @property
    def provider(self) -> str:
        # The session, not get_available_providers(), knows: the GPU wheel lists CUDA on
        # machines without a usable GPU and then silently runs on CPU.
        return "cuda" if self.session.get_providers()[0] == CUDA else "cpu"

    def run(
        self, feeds: Mapping[str, np.ndarray], alone: bool = True, wants: frozenset[str] = NONE
    ) -> dict[str, np.ndarray]:
        return self._run(self._feeds(feeds), alone, wants)

    def _feeds(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The session's inputs from the batcher's feeds, in the types the graph takes."""
        return {name: np.asarray(feeds[name], dtype=dtype) for name, dtype in self._inputs.items()}

    def _run(
        self, inputs: dict[str, np.ndarray], alone: bool, wants: frozenset[str]
    ) -> dict[str, np.ndarray]:
        session = self.session if alone else self._lane_session
        names = self._outputs + [o for o in self._on_request if o in wants]
        outputs = session.run(names, inputs)
        return {
            name: (out.astype(np.float32) if out.dtype == np.float16 else out)
            for name, out in zip(names, outputs, strict=True)
        }


class EncoderBackend(OrtBackend):
    """An encoder package's session (heads.adapters) and the LoRA matrices of the adapters
    attached to it, stacked once per attach or detach, not per batch. A batch's rows name
    their adapter (feeds[ADAPTER_INPUT]: an object array of Adapter or None, from the jobs);
    each row gathers its own slot in the graph, so one batch mixes any adapters. A row whose
    adapter was detached while it waited (unloaded) still runs: the batch gets a stack of its
    own with it."""

    def __init__(self, slots: list[dict[str, object]], *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.slots = slots
        self._lock = threading.Lock()
        self._stacked: tuple[tuple[Adapter, ...], dict[int, int], dict[str, np.ndarray]]
        self._restack(())

    def _restack(self, adapters: tuple[Adapter, ...]) -> None:
        slot = {id(a): n for n, a in enumerate(adapters, start=1)}
        self._stacked = (adapters, slot, stack_lora(self.slots, adapters))  # type: ignore[arg-type]

    @property
    def adapters(self) -> tuple[Adapter, ...]:
        return self._stacked[0]

    def attach(self, adapter: Adapter) -> None:
        with self._lock:
            if all(a is not adapter for a in self.adapters):
                self._restack((*self.adapters, adapter))

    def detach(self, adapter: Adapter) -> None:
        with self._lock:
            self._restack(tuple(a for a in self.adapters if a is not adapter))

    def _feeds(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        adapters, slot, stacked = self._stacked  # one consistent snapshot
        rows = feeds.get(ADAPTER_INPUT)
        if rows is None:
            index = np.zeros(len(feeds["input_ids"]), dtype=np.int64)
        else:
            if gone := [a for a in rows if a is not None and id(a) not in slot]:
                adapters = (*adapters, *dict.fromkeys(gone))
                slot = {id(a): n for n, a in enumerate(adapters, start=1)}
                stacked = stack_lora(self.slots, adapters)  # type: ignore[arg-type]
            index = np.array([0 if a is None else slot[id(a)] for a in rows], dtype=np.int64)
        inputs = {
            n: np.asarray(feeds[n], dtype=self._inputs[n]) for n in INPUT_NAMES if n in self._inputs
        }
        return {**inputs, ADAPTER_INPUT: index, **stacked}


def _session(
    model_path: Path, providers: list[Provider], intra_op_threads: int, spinning: bool
) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # No memory pattern: ORT keeps one per input shape it meets, and batches come in hundreds
    # of (rows, length) shapes, so the process grew with every new one and again on shapes
    # seen before (MiniLM int8, 352 shapes twice: 265 -> 291 MiB; off: 216 both times; a
    # 200k-row batch run grew ~10 MiB a part). Speed: the same (3.75 CPU ms a row either way).
    options.enable_mem_pattern = False
    if intra_op_threads:
        options.intra_op_num_threads = intra_op_threads
    # Spinning: ORT's pool threads busy-wait for the next parallel section instead of
    # sleeping on a futex. force_spinning_stop ends the spinning when a run returns, so
    # between batches they take nothing from the event loop (see Settings).
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    options.add_session_config_entry("session.force_spinning_stop", "1")
    return ort.InferenceSession(
        str(model_path),
        sess_options=options,
        providers=providers,
        disabled_optimizers=list(CPU_DISABLED_OPTIMIZERS) if providers == [CPU] else None,
    )


def usable_cores() -> int:
    """The cores this process may use: its CPU affinity, which a container's cpuset narrows."""
    return len(os.sched_getaffinity(0))


def cpu_lanes(settings: EngineSettings) -> tuple[int, int]:
    """(batches at once, intra-op threads each) on CPU: concurrent_batches, or one per core
    of the process's thread budget (intra_op_threads, else its usable cores), splitting that
    budget evenly so the lanes never ask for more threads than it has."""
    budget = settings.intra_op_threads or usable_cores()
    lanes = settings.concurrent_batches or budget
    return lanes, max(1, budget // lanes)


def choose_variant(package: ModelPackage, requested: str, kind: str) -> str:
    """The file to run: `requested` when the package has it, else its preference for `kind`
    ('cpu' or 'gpu'), else fp32."""
    available = package.variants
    if requested != "auto":
        if requested in available:
            return requested
        left_out = package.parity.get(requested)
        why = left_out.get("reason") if isinstance(left_out, dict) else None
        log.warning(
            "%s: variant %s not in package (has %s%s); using its preference",
            package.name,
            requested,
            ", ".join(available),
            f"; the export left it out: {why}" if why else "",
        )
    preferred = package.prefer.get(kind)
    if preferred in available:
        return preferred
    return "fp32" if "fp32" in available else next(iter(available))


def cuda_provider() -> tuple[str, dict[str, str]]:
    """The CUDA provider with the options the service opens it with (see CUDA_ATTENTION_KERNELS)."""
    if CUDNN_ATTENTION_ENV in os.environ:
        return CUDA, {}
    return CUDA, {"sdpa_kernel": str(CUDA_ATTENTION_KERNELS)}


@functools.cache
def preload_cuda_libraries() -> None:
    """Load CUDA and cuDNN from the nvidia-* wheels that onnxruntime-gpu[cuda,cudnn] installs,
    so that no CUDA base image (or LD_LIBRARY_PATH) is needed. Once per process; a failure is
    logged, and the CUDA session that follows then falls back to CPU (or fails with
    device=cuda)."""
    preload = getattr(ort, "preload_dlls", None)  # onnxruntime-gpu >= 1.21
    if preload is None:
        return
    try:
        preload()
    except Exception as err:  # any loader error means "no CUDA from wheels"
        log.warning("onnxruntime.preload_dlls() failed: %s", err)


def open_backend(package: ModelPackage, settings: EngineSettings) -> tuple[OrtBackend, str]:
    """Create the session for `package` on the device the settings ask for.

    Returns the backend and the variant it runs. Raises RuntimeError when device=cuda and
    CUDA cannot be used.
    """
    try_cuda = settings.device in ("auto", "cuda") and CUDA in ort.get_available_providers()
    if settings.device == "cuda" and not try_cuda:
        raise RuntimeError("device=cuda but this onnxruntime build has no CUDAExecutionProvider")
    if try_cuda:
        preload_cuda_libraries()
    providers: list[Provider] = [cuda_provider(), CPU] if try_cuda else [CPU]
    variant = choose_variant(package, settings.variant, "gpu" if try_cuda else "cpu")
    threads, spinning = settings.intra_op_threads, settings.intra_op_spinning
    lanes = cpu_lanes(settings)
    backend = _backend(package, package.variant_path(variant), providers, threads, spinning, lanes)
    if try_cuda and backend.provider != "cuda":
        if settings.device == "cuda":
            raise RuntimeError("device=cuda but the CUDA provider failed to start (see ORT log)")
        log.warning("%s: CUDA listed but unusable; running on CPU", package.name)
        cpu_variant = choose_variant(package, settings.variant, "cpu")
        if cpu_variant != variant:
            variant = cpu_variant
            path = package.variant_path(variant)
            backend = _backend(package, path, [CPU], threads, spinning, lanes)
    if backend.provider == "cpu" and variant == "fp16":
        log.warning("%s: fp16 on CPU is usually slower than fp32", package.name)
    if problem := agreement_problem(package.agreement(variant), variant):
        log.warning("%s: serving %s, but %s", package.name, variant, problem)
    log.info(
        "%s: %s variant on %s%s", package.name, variant, backend.provider,
        f", {backend.lanes} batches at once" if backend.lanes > 1 else "",
    )  # fmt: skip
    return backend, variant


def _backend(
    package: ModelPackage,
    path: Path,
    providers: list[Provider],
    threads: int,
    spinning: bool,
    lanes: tuple[int, int],
) -> OrtBackend:
    """An encoder package's EncoderBackend, any other's OrtBackend."""
    if package.task == ENCODER:
        assert package.encoder is not None
        return EncoderBackend(package.encoder["lora"], path, providers, threads, spinning, *lanes)
    return OrtBackend(path, providers, threads, spinning, *lanes)


def warm_up(backend: Backend, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One real forward pass (allocates arenas, picks kernels) before the first user request.

    Raises RuntimeError when an output is not finite: a broken model fails at start-up, not
    on the first user request.
    """
    outputs = backend.run(feeds, True, ON_REQUEST)  # every output, those fetched on request too
    for name, value in outputs.items():
        if not np.all(np.isfinite(value)):
            raise RuntimeError(f"warm-up output {name} is not finite")
    return outputs
