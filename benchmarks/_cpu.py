"""Where a server process spends its CPU, thread by thread, from /proc/<pid>/task/*.

Python 3.11 does not name its threads for the kernel, and ONNX Runtime's and tokenizers'
native threads are unnamed too (all show as `python`), so the server is started with a
`PRELUDE` that writes down, to the file in $BENCH_THREAD_LOG, the native id of every Python
thread it starts and of every thread ONNX Runtime starts while it opens a session. With that:

- event_loop: the main thread: HTTP, validation, routing, tokenization called on the loop,
  padding, post-processing, JSON;
- tokenization: native threads born after /ready that are not ORT's: the `tokenizers` Rust
  pool that `encode_batch` starts (one text runs on the caller, so single inputs stay on the
  loop);
- executor: the event loop's default executor (`asyncio_N`; `uvloop_N` under uvloop): the
  batcher's hand-off to `session.run`, and the tokenization / post-processing the service
  offloads for large requests;
- ort_pool: ORT's intra-op pool (intra_op_threads - 1 threads per session);
- other: the rest: BLAS and libuv pools, other Python threads, threads that have ended.

The issue's "runtime threads" are executor + ort_pool.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
CLASSES = ("event_loop", "tokenization", "executor", "ort_pool", "other")
# thread names of an event loop's default executor (asyncio.to_thread): asyncio, uvloop
EXECUTOR_PREFIXES = ("python:asyncio_", "python:uvloop_")

# Run in the server process before the service (python -c): cheap, once per thread started.
PRELUDE = """
import os as _os, threading as _threading
def _note(kind, tids):
    with open(_os.environ["BENCH_THREAD_LOG"], "a") as f:
        f.write("".join(f"{t} {kind}\\n" for t in tids))
_run = _threading.Thread.run
def _run_noted(self):
    _note("python:" + self.name, [_threading.get_native_id()])
    _run(self)
_threading.Thread.run = _run_noted
import onnxruntime as _ort
_init = _ort.InferenceSession.__init__
def _init_noted(self, *args, **kwargs):
    before = set(_os.listdir("/proc/self/task"))
    _init(self, *args, **kwargs)
    _note("ort", sorted(set(_os.listdir("/proc/self/task")) - before))
_ort.InferenceSession.__init__ = _init_noted
"""


def thread_times(pid: int) -> dict[int, float]:
    """CPU seconds of each live thread of `pid`: time on a CPU from schedstat, in ns (stat's
    utime + stime count 10 ms ticks, too coarse for a few seconds of a small thread)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            ns = Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0]
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread ended between listdir and read
        out[int(tid)] = int(ns) / 1e9
    return out


def stat_seconds(path: str) -> float:
    """User + system CPU seconds from a /proc/.../stat file (a process's or a thread's)."""
    fields = Path(path).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime


def ended_time(pid: int) -> float:
    """CPU seconds of `pid`'s threads that have ended (whole process minus live threads)."""
    live = 0.0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            live += stat_seconds(f"/proc/{pid}/task/{tid}/stat")
        except (FileNotFoundError, ProcessLookupError):
            continue
    return max(0.0, stat_seconds(f"/proc/{pid}/stat") - live)


@dataclass
class ThreadMap:
    """Which class each thread of a server belongs to (see the module docstring)."""

    pid: int
    log: Path  # the prelude's notes: "<tid> python:<name>" or "<tid> ort"
    at_ready: frozenset[int]  # threads alive when the server became ready

    @classmethod
    def at_start(cls, pid: int, log: Path) -> ThreadMap:
        return cls(pid, log, frozenset(thread_times(pid)))

    def classes(self) -> dict[int, str]:
        notes = {}
        if self.log.is_file():
            for line in self.log.read_text().splitlines():
                tid, kind = line.split(" ", 1)
                notes[int(tid)] = kind
        out = {}
        for tid in thread_times(self.pid):
            kind = notes.get(tid, "")
            if tid == self.pid:
                out[tid] = "event_loop"
            elif kind == "ort":
                out[tid] = "ort_pool"
            elif kind.startswith(EXECUTOR_PREFIXES):
                out[tid] = "executor"
            elif kind or tid in self.at_ready:
                out[tid] = "other"  # another Python thread, or a native pool from start-up
            else:
                out[tid] = "tokenization"
        return out


class CpuSplit:
    """CPU seconds per class between construction and `read()`."""

    def __init__(self, threads: ThreadMap) -> None:
        self.threads = threads
        self.ended0 = ended_time(threads.pid)
        self.per_thread0 = thread_times(threads.pid)

    def read(self) -> dict[str, float]:
        """{class: CPU seconds} for CLASSES plus 'total'; threads that ended count as other."""
        now = thread_times(self.threads.pid)
        classes = self.threads.classes()
        out = dict.fromkeys(CLASSES, 0.0)
        for tid, seconds in now.items():
            out[classes.get(tid, "other")] += seconds - self.per_thread0.get(tid, 0.0)
        if set(self.per_thread0) - set(now):  # a thread ended: its share from the process's
            # 10 ms ticks (only then: their rounding would otherwise show as noise)
            out["other"] += max(0.0, ended_time(self.threads.pid) - self.ended0)
        out["total"] = sum(out.values())
        return out
