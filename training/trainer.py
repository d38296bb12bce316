"""The one training loop: `training.pretrain`, `training.finetune` and `training.distill` are
recipes on it.

    trainer = Trainer(dist, model, batches, loss, LoopConfig(lr=5e-5, steps=1000, warmup=100),
                      out=Path("runs/x"), checkpoint=Path("runs/x/last"), write_model=save)
    trainer.start(Trainer.load_state(trainer.checkpoint))   # None: a fresh run
    finished = trainer.fit()

A recipe brings the model, its batches (`Batches`: CPU tensors, resumable), a loss
`(model, batch) -> {"loss": scalar, other parts to log}`, and optionally `evaluate() -> metrics`
(run on rank 0) and `extra_state() -> dict` (saved with the loop's state). The loop owns the
rest: the process group (`Dist`), the learning rate (`get_lr`), autocast and fp16 loss scaling,
gradient accumulation and clipping, every rank's data position and RNG for an exact resume,
atomic checkpoints, the JSON-lines log and its curves, the progress bar, and a clean stop on
Ctrl-C or SIGTERM (finish the step, checkpoint, return).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import queue
import random
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol, TypeVar, cast

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn
from tqdm.auto import tqdm

from training.optim import adamw, describe
from training.plots import plot_curves, read_log, write_log_row

STATE_FILE = "trainer_state.pt"
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}  # autocast's, by name
PLOT_EVERY_S = 60  # a PNG costs ~1 s on a busy CPU: redraw at most once a minute, and at the end


# --- who this process is ----------------------------------------------------------------


T = TypeVar("T")


@dataclass
class Dist:
    """This process in the run: rank, world size, device. One process without torchrun."""

    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")
    owns_group: bool = False  # this process started the group and must end it

    @classmethod
    def start(cls, device: str | None = None) -> Dist:
        """torchrun sets WORLD_SIZE / RANK / LOCAL_RANK: join the group (NCCL on GPUs, gloo on
        CPU). device None or "auto": cuda:LOCAL_RANK when a GPU is visible, else the CPU."""
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        if device in (None, "auto"):
            device = "cuda" if torch.cuda.is_available() else "cpu"
        dev = torch.device(f"cuda:{local_rank}" if device == "cuda" else device)
        if dev.type == "cuda":
            if not torch.cuda.is_available():
                raise ValueError(f"--device {device} but no CUDA device is visible")
            torch.cuda.set_device(dev)
        world = int(os.environ.get("WORLD_SIZE", 1))
        if world == 1:
            return cls(device=dev)
        owns = not dist.is_initialized()
        if owns:  # rank 0 evaluates while the others wait at a barrier: allow a long one
            dist.init_process_group(
                "nccl" if dev.type == "cuda" else "gloo", timeout=timedelta(hours=2)
            )
        return cls(dist.get_rank(), dist.get_world_size(), dev, owns)

    @property
    def main(self) -> bool:
        return self.rank == 0

    def log(self, message: str) -> None:
        if self.main:
            tqdm.write(message, file=sys.stderr)

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    def max_over_ranks(self, value: float) -> float:
        """The largest of every rank's value (the value itself on one process)."""
        if self.world == 1:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order."""
        if self.world == 1:
            return [obj]
        gathered: list[Any] = [None] * self.world
        dist.all_gather_object(gathered, obj)
        return gathered

    def first_then_others(self, make: Callable[[], Any]) -> Any:
        """Rank 0 makes a file-backed thing (a cache, a tokenizer); the others then reuse it."""
        result = make() if self.main else None
        self.barrier()
        return result if self.main else make()

    def run(self, work: Callable[[], T]) -> T:
        """work(), then a barrier, so that no rank tears the group down while another still
        talks to it (rank 1 aborted with "terminate called without an active exception" in 2
        of ~15 full-suite runs of the torchrun test, once rank 0 had left); the group ends
        either way."""
        try:
            result = work()
            self.barrier()
            return result
        finally:
            self.close()

    def close(self) -> None:
        if self.owns_group:
            dist.destroy_process_group()


# --- the schedule -----------------------------------------------------------------------


def get_lr(
    step: int, max_lr: float, warmup: int, now: float, end: float, decay_from: float = 0.0
) -> float:
    """Learning rate of optimizer step `step` (0-based): linear warm-up to max_lr over `warmup`
    steps, then linear decay reaching 0 when `now` reaches `end` (steps, or seconds of a time
    budget). decay_from: where the decay line starts. 0 is BERT's optimization.py (the decay
    runs from step 0, so the end of warm-up is at max_lr x (1 - warmup / end)): pretraining.
    `warmup` is transformers' get_linear_schedule_with_warmup (max_lr right after warm-up):
    fine-tuning, as it has always been here."""
    if step < warmup:
        return max_lr * (step + 1) / warmup
    if now >= end:
        return 0.0
    return max_lr * max(0.0, 1.0 - (now - decay_from) / (end - decay_from))


@dataclass
class LoopConfig:
    """What the loop does and when. steps or time_budget (seconds of training) ends it."""

    lr: float
    steps: int | None = None
    time_budget: float | None = None
    warmup: int = 0
    decay_from_warmup: bool = False  # see get_lr: fine-tuning True, pretraining False
    weight_decay: float = 0.01
    adam_beta2: float = 0.999
    max_grad_norm: float = 1.0
    grad_accum: int = 1  # micro-batches per optimizer step
    precision: str = "fp32"  # PRECISIONS; auto: bf16 on a GPU, fp32 on a CPU
    compile: bool = False
    log_every: int = 10
    eval_every: int = 0  # 0: not by step count
    eval_at_start: bool = False
    eval_each_epoch: bool = False
    save_every: int = 0  # 0: not by step count
    save_after_eval: bool = False
    stop_at: int | None = None  # checkpoint and return at this step, schedule unchanged
    progress: bool = True
    desc: str | None = None
    peak_tflops: float | None = None  # the accelerator's peak: MFU on GPUs

    @classmethod
    def from_args(cls, args: Any, **overrides: Any) -> LoopConfig:
        """The fields a recipe's arguments name alike (lr, steps, grad_accum, ...), then
        `overrides`."""
        names = {f.name for f in dataclasses.fields(cls)} - set(overrides)
        return cls(**{n: getattr(args, n) for n in names if hasattr(args, n)}, **overrides)


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """Mixed precision for `precision` bf16 / fp16 (fp32 master weights); fp32 runs as is."""
    if DTYPES[precision] is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=DTYPES[precision])


def threads(device: torch.device) -> str:
    """On CPU, the thread counts each process computes with (OMP_NUM_THREADS or one per core;
    transformers' Trainer leaves them as they are too), for the log's first line."""
    if device.type != "cpu":
        return ""
    return f" ({torch.get_num_threads()} threads, {torch.get_num_interop_threads()} inter-op)"


def resolve_precision(precision: str, device: torch.device) -> str:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    if precision == "auto":
        return "bf16" if device.type == "cuda" else "fp32"
    if precision == "fp16" and device.type != "cuda":
        raise ValueError("--precision fp16 needs a CUDA device (use bf16 or fp32 on CPU)")
    return precision


# --- what a recipe brings ---------------------------------------------------------------


class Batches(Protocol):
    """This process's endless, resumable stream of CPU batches."""

    # Passes over the data so far (logged; an integer step marks an epoch's end). Read-only:
    # a property (EpochBatches) or an int attribute (PretrainingStream) both serve.
    @property
    def epoch(self) -> float: ...

    def next_batch(self) -> dict[str, Tensor]: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class Prefetched:
    """Batches read `depth` ahead by a thread, pinned for an asynchronous copy to a GPU.

    Building a batch in the thread that launches the kernels cost BERT-base's step 17%
    (eager) to 28% (compiled) on an H200 (benchmarks/results/pretrain_step_gpu.md).
    state_dict() and epoch are those after the last batch handed out, not the thread's: a
    checkpoint resumes where training was. An error in the thread is raised by next_batch."""

    def __init__(self, data: Batches, depth: int = 4, pin: bool = False) -> None:
        self.data, self.depth, self.pin = data, depth, pin
        self.epoch: float = data.epoch
        self._state = data.state_dict()
        self._thread: threading.Thread | None = None

    def _start(self) -> None:
        self._queue: queue.Queue = queue.Queue(self.depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._fill, name="batches", daemon=True)
        self._thread.start()

    def _fill(self) -> None:
        item: Any
        while not self._stop.is_set():
            try:
                batch = self.data.next_batch()
                if self.pin:
                    batch = {k: v.pin_memory() for k, v in batch.items()}
                item = (batch, self.data.state_dict(), self.data.epoch)
            except BaseException as e:  # handed to the training thread, which raises it
                item = e
            while not self._stop.is_set():
                try:
                    self._queue.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if isinstance(item, BaseException):
                return

    def next_batch(self) -> dict[str, Tensor]:
        if self._thread is None:
            self._start()
        item = self._queue.get()
        if isinstance(item, BaseException):
            self.close()
            raise item
        batch, self._state, self.epoch = item
        return batch

    def state_dict(self) -> dict[str, Any]:
        return self._state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.close()
        self.data.load_state_dict(state)
        self.epoch, self._state = self.data.epoch, self.data.state_dict()

    def close(self) -> None:
        """Stop the thread and rewind the stream to just after the last batch handed out
        (next_batch starts a thread from there)."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self.data.load_state_dict(self._state)


# (model, batch on the device) -> {"loss": the scalar to minimise, other parts: logged means}
LossFn = Callable[[nn.Module, dict[str, Tensor]], dict[str, Tensor]]


# --- RNG and files ----------------------------------------------------------------------


def rng_state(device: torch.device) -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state()}
    state["torch"] = torch.get_rng_state()
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    if "python" in state:  # pretraining states saved before these were kept lack them
        random.setstate(state["python"])
        np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def replace_files(directory: Path, write: Callable[[Path], None]) -> None:
    """write(tmp) fills a temporary folder whose files then replace those in `directory`,
    STATE_FILE last and the old one removed first: a crash mid-save can leave no resumable
    state, but never a state beside weights of another step."""
    tmp = directory / ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    write(tmp)
    (directory / STATE_FILE).unlink(missing_ok=True)
    for f in sorted(tmp.iterdir(), key=lambda f: f.name == STATE_FILE):
        if f.is_dir():  # e.g. a sentence-transformers 1_Pooling/
            shutil.rmtree(directory / f.name, ignore_errors=True)
        os.replace(f, directory / f.name)
    tmp.rmdir()


class StopRequest:
    """Ctrl-C or SIGTERM (a scheduler's preemption) finishes the current step, checkpoints and
    stops; a second Ctrl-C stops at once."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        self.requested = True
        signal.signal(signum, self._previous.get(signum, signal.SIG_DFL))

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


class Meter:
    """Loss parts and throughput since the last log row. Losses are summed on the device, so a
    step costs no host-device synchronisation until the row is written."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.reset()

    def reset(self) -> None:
        self.sums: Tensor | None = None
        self.names: list[str] = []
        self.micro_batches = self.steps = 0
        self.counts = [0.0, 0.0, 0.0]  # sequences, real tokens, model FLOPs
        self.seconds = 0.0

    def add(self, parts: dict[str, Tensor], batch: dict[str, Tensor], flops: float) -> None:
        values = torch.stack([v.detach().float() for v in parts.values()])
        if self.sums is None:
            self.names, self.sums = list(parts), torch.zeros_like(values)
        self.sums += values
        self.micro_batches += 1
        tokens = float(batch["attention_mask"].sum()) if "attention_mask" in batch else 0.0
        for i, n in enumerate((len(batch["input_ids"]), tokens, tokens * flops)):
            self.counts[i] += n

    def row(self, d: Dist, peak_tflops: float | None) -> dict[str, float]:
        """Mean loss parts over the window; steps, sequences and tokens per second of training
        over all processes; on GPU the model FLOPs utilisation against peak_tflops."""
        assert self.sums is not None
        row = dict(zip(self.names, (self.sums / self.micro_batches).tolist(), strict=True))
        counts = torch.tensor(self.counts, dtype=torch.float64, device=d.device)
        if d.world > 1:
            dist.all_reduce(counts)
        seqs, tokens, flops = counts.tolist()
        seconds = max(self.seconds, 1e-9)
        row |= {"steps_per_s": self.steps / seconds, "seq_per_s": seqs / seconds}
        if tokens:
            row["tokens_per_s"] = tokens / seconds
        if d.device.type == "cuda" and flops and peak_tflops:
            row["mfu"] = flops / seconds / (peak_tflops * 1e12 * d.world)
        self.reset()
        return row


# --- the loop ---------------------------------------------------------------------------


class Trainer:
    """One model, its batches and loss, trained as `loop` says. Only rank 0 writes files."""

    def __init__(
        self,
        d: Dist,
        model: nn.Module,
        data: Batches,
        loss: LossFn,
        loop: LoopConfig,
        *,
        out: Path,
        checkpoint: Path,
        write_model: Callable[[Path], object],
        evaluate: Callable[[], dict[str, float] | None] | None = None,
        extra_state: Callable[[], dict[str, Any]] = dict,
        flops_per_token: Callable[[int], float] | None = None,
        reshard: Callable[[dict[str, Any], int, int], dict[str, Any]] | None = None,
        plot: str = "curves.png",
        title: str | None = None,
    ) -> None:
        """out: log.jsonl and the plot; checkpoint: the folder save() fills (model files and
        STATE_FILE). reshard(data_state, saved_world, world) adapts rank 0's data position
        when a run resumes on another number of processes."""
        if d.device.type == "cuda":
            data = Prefetched(data, pin=True)
        self.d, self.model, self.data, self.loss, self.loop = d, model, data, loss, loop
        self.out, self.checkpoint, self.write_model = out, checkpoint, write_model
        self.evaluate_fn, self.extra_state = evaluate, extra_state
        self.flops_per_token, self.reshard = flops_per_token, reshard
        self.log_path, self.plot_path, self.title = out / "log.jsonl", out / plot, title
        self.precision = resolve_precision(loop.precision, d.device)
        cuda = d.device.type == "cuda"
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = adamw(model, loop.lr, loop.weight_decay, beta2=loop.adam_beta2)
        self.scaler = torch.amp.GradScaler(d.device.type, enabled=self.precision == "fp16")
        self.ddp: nn.parallel.DistributedDataParallel | None = None
        self.train_model: nn.Module = model
        if d.world > 1:
            ids = [d.device.index] if cuda else None
            self.train_model = self.ddp = nn.parallel.DistributedDataParallel(model, ids)
        if loop.compile:
            # an OptimizedModule; the stubs type compile()'s result as any callable
            self.train_model = cast(nn.Module, torch.compile(self.train_model))
        if cuda:
            torch.set_float32_matmul_precision("high")  # TF32 for what autocast leaves in fp32
        self.step, self.elapsed, self.eval_seconds = 0, 0.0, 0.0
        self.lr, self.grad_norm = 0.0, torch.zeros(())
        self.meter = Meter(d.device)
        self.last_train: dict[str, Any] = {}
        self.last_eval: dict[str, Any] = {}
        self._evaluated_at: int | None = None
        self._saved_at: int | None = None
        self._plotted = time.perf_counter()
        kind = {"fp32": "fp32", "bf16": "bf16 autocast", "fp16": "fp16 autocast, loss scaling"}
        d.log(
            f"training on {d.device} x{d.world}{threads(d.device)}: {kind[self.precision]}; "
            f"{describe(self.optimizer)}"
            + (f"; {loop.grad_accum} micro-batches a step" if loop.grad_accum > 1 else "")
            + ("; compiled" if loop.compile else "")
        )

    # --- state ---

    @staticmethod
    def load_state(directory: Path) -> dict[str, Any] | None:
        path = directory / STATE_FILE
        if not path.is_file():
            return None
        # Our own file, holding numpy RNG state and Python objects: not a weights-only pickle.
        return torch.load(path, map_location="cpu", weights_only=False)

    def start(self, state: dict[str, Any] | None) -> None:
        """Continue from a saved state exactly (same processes: same data and RNG), or begin
        a fresh log."""
        if state is None:
            if self.d.main:
                self.log_path.unlink(missing_ok=True)
            return
        self.optimizer.load_state_dict(state["optimizer"])
        if "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])
        self.step, self.elapsed = int(state["step"]), float(state["elapsed"])
        saved_world = state["world_size"]
        if saved_world == self.d.world:
            mine = state["ranks"][self.d.rank]
            self.data.load_state_dict(mine["data"])
            set_rng_state(mine["rng"], self.d.device)
        else:  # same place in the data, new per-rank order: no longer bit-for-bit reproducible
            self.d.log(f"warning: resuming {saved_world} processes' run on {self.d.world}")
            data = state["ranks"][0]["data"]
            if self.reshard is not None:
                data = self.reshard(data, saved_world, self.d.world)
            self.data.load_state_dict(data)
        # Rows logged after the checkpoint belong to the steps about to be redone.
        if self.d.main and self.log_path.is_file():
            rows = [r for r in read_log(self.log_path) if r.get("step", 0) <= self.step]
            self.log_path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        self.d.log(f"resumed at step {self.step} ({self.elapsed:.0f} s trained)")

    def save(self) -> None:
        """Checkpoint: every rank's data position and RNG go to rank 0, which writes."""
        ranks = self.d.gather({"data": self.data.state_dict(), "rng": rng_state(self.d.device)})
        if self.d.main:
            state = {
                "step": self.step,
                "elapsed": self.elapsed,
                "world_size": self.d.world,
                "ranks": ranks,
                "optimizer": self.optimizer.state_dict(),
                "scaler": self.scaler.state_dict(),
                **self.extra_state(),
            }

            def write(tmp: Path) -> None:
                self.write_model(tmp)
                torch.save(state, tmp / STATE_FILE)

            replace_files(self.checkpoint, write)
            self.plot()
        self._saved_at = self.step
        self.d.barrier()

    # --- the loop ---

    def done(self) -> bool:
        loop = self.loop
        return (loop.steps is not None and self.step >= loop.steps) or (
            loop.time_budget is not None and self.elapsed >= loop.time_budget
        )

    def fit(self) -> bool:
        """Train until the schedule ends (True) or a stop is asked for (False); then log,
        evaluate and checkpoint whatever the last step left undone."""
        loop, d = self.loop, self.d
        if self.step == 0 and loop.eval_at_start:
            self.evaluate()
        self.model.train()
        bar = tqdm(
            total=loop.steps,
            initial=self.step,
            desc=loop.desc,
            unit="step",
            dynamic_ncols=True,
            file=sys.stderr,
            # None: only when stderr is a terminal, so that service and CI logs stay plain
            disable=None if d.main and loop.progress else True,
        )
        with StopRequest() as stop:
            while True:
                if loop.time_budget is not None:  # every rank must see the budget end together
                    self.elapsed = d.max_over_ranks(self.elapsed)
                if self.done() or (loop.stop_at is not None and self.step >= loop.stop_at):
                    break
                # With DDP every rank must agree to stop; asking costs a sync, so not every step.
                if (d.world == 1 or self.step % loop.log_every == 0) and d.max_over_ranks(
                    float(stop.requested)
                ):
                    d.log(f"stopping at step {self.step} on request")
                    break
                epoch = self.data.epoch
                self.train_step()
                bar.update(1)
                finished = self.done()
                if self.step % loop.log_every == 0 or finished:
                    self.log_train(bar)
                if (
                    (loop.eval_every and self.step % loop.eval_every == 0)
                    or (loop.eval_each_epoch and int(self.data.epoch) > int(epoch))
                    or finished
                ):
                    self.evaluate()
                if (
                    (loop.save_every and self.step % loop.save_every == 0)
                    or (loop.save_after_eval and self._evaluated_at == self.step)
                    or finished
                ):
                    self.save()
        bar.close()
        if isinstance(self.data, Prefetched):
            self.data.close()
        if self.meter.steps:
            self.log_train(bar)
        if self.done() and self._evaluated_at != self.step:
            self.evaluate()
        if self._saved_at != self.step:
            self.save()
        self.plot(force=True)
        return self.done()

    def train_step(self) -> None:
        """One optimizer step over loop.grad_accum micro-batches."""
        loop, d = self.loop, self.d
        t0 = time.perf_counter()
        decay_from = loop.warmup if loop.decay_from_warmup else 0
        now, end = (self.elapsed, loop.time_budget) if loop.time_budget else (self.step, loop.steps)
        # steps is set when time_budget is not: one of the two ends the loop
        self.lr = get_lr(self.step, loop.lr, loop.warmup, now, cast(float, end), decay_from)
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr
        for micro in range(loop.grad_accum):
            batch = self.data.next_batch()
            flops = self.flops_per_token(batch["input_ids"].shape[1]) if self.flops_per_token else 0
            on_device = {k: v.to(d.device, non_blocking=True) for k, v in batch.items()}
            # DDP all-reduces gradients in backward: only on a step's last micro-batch.
            accumulate = self.ddp is not None and micro < loop.grad_accum - 1
            with self.ddp.no_sync() if accumulate else contextlib.nullcontext():  # type: ignore[union-attr]
                with autocast(d.device, self.precision):
                    parts = self.loss(self.train_model, on_device)
                self.scaler.scale(parts["loss"] / loop.grad_accum).backward()
            self.meter.add(parts, batch, flops)
        self.scaler.unscale_(self.optimizer)  # clip the true gradients, not fp16-scaled ones
        self.grad_norm = torch.nn.utils.clip_grad_norm_(self.params, loop.max_grad_norm)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self.meter.steps += 1
        if d.device.type == "cuda" and self.step % loop.log_every == 0:
            torch.cuda.synchronize()  # so that the window's time is the GPU's time
        dt = time.perf_counter() - t0
        self.elapsed += dt
        self.meter.seconds += dt

    def log_train(self, bar: Any) -> None:
        row = {"split": "train", "step": self.step, "epoch": round(self.data.epoch, 3)}
        row |= self.meter.row(self.d, self.loop.peak_tflops)
        row |= {"lr": self.lr, "grad_norm": float(self.grad_norm), "elapsed_s": self.elapsed}
        self.last_train = row
        if self.d.main:
            write_log_row(self.log_path, row)
        bar.set_postfix(loss=f"{row['loss']:.4f}", lr=f"{self.lr:.2e}")

    def evaluate(self) -> None:
        """Rank 0 runs the recipe's evaluation and logs it; the others wait."""
        if self.d.main and self.evaluate_fn is not None:
            t0 = time.perf_counter()
            metrics = self.evaluate_fn()
            self.eval_seconds += time.perf_counter() - t0
            self.model.train()
            if metrics is not None:
                row = {"split": "eval", "step": self.step, "epoch": round(self.data.epoch, 3)}
                row |= metrics
                self.last_eval = row
                write_log_row(self.log_path, row)
                shown = ", ".join(f"{k} {v:.4g}" for k, v in metrics.items())
                self.d.log(f"eval step {self.step}: {shown}")
                self.plot()
        self._evaluated_at = self.step
        self.d.barrier()

    def plot(self, force: bool = False) -> None:
        """The log's curves, at most once a PLOT_EVERY_S unless forced."""
        recent = time.perf_counter() - self._plotted < PLOT_EVERY_S
        if not self.d.main or not self.log_path.is_file() or (recent and not force):
            return
        plot_curves(self.log_path, self.plot_path, title=self.title)
        self._plotted = time.perf_counter()
