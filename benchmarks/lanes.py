"""ONNX Runtime alone, the way the service's lanes run it: does a second single-thread
session running at the same time slow the first (memory bandwidth, caches), and how do two
lanes compare with one session on two threads? Fixed-length rows of random ids.

    python -m benchmarks.lanes --model models/bench/minilm-embed/model.onnx
    python -m benchmarks.lanes --model models/bench/minilm-embed/model.int8.onnx --batch-sizes 1 2 4 8

If two lanes at once run as fast each as one alone, a served lane that runs slower than
this is losing its core to the server's own work, not to the other lane (issue 31).
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from benchmarks._engine import open_session
from service.runtime import OrtBackend


def per_row_ms(backend: OrtBackend, feeds: dict[str, np.ndarray], runs: int) -> float:
    backend.run(feeds)
    start = time.perf_counter()
    for _ in range(runs):
        backend.run(feeds)
    return (time.perf_counter() - start) / runs / len(next(iter(feeds.values()))) * 1e3


def feeds_of(backend: OrtBackend, values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`values` under the session's own input names and integer types."""
    return {
        i.name: values[i.name].astype(np.int32 if i.type == "tensor(int32)" else np.int64)
        for i in backend.session.get_inputs()
    }


def at_once(backends: list[OrtBackend], values: dict[str, np.ndarray], runs: int) -> list[float]:
    """per_row_ms of each backend, all running at the same time, one thread each."""
    out: list[float | BaseException] = [0.0] * len(backends)

    def lane(i: int) -> None:
        try:
            out[i] = per_row_ms(backends[i], feeds_of(backends[i], values), runs)
        except BaseException as e:  # raised in the caller's thread below
            out[i] = e

    threads = [threading.Thread(target=lane, args=(i,)) for i in range(len(backends))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for x in out:
        if isinstance(x, BaseException):
            raise x
    return out  # type: ignore[return-value]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", type=Path, required=True, help="an .onnx file of a package")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 4], help="rows a run")
    p.add_argument("--length", type=int, default=26, help="tokens a row (SST-2's p50 is ~24)")
    p.add_argument("--runs", type=int, default=200, help="timed runs per figure")
    cli = p.parse_args(argv)
    rng = np.random.default_rng(0)
    tokenizer = cli.model.parent / "tokenizer.json"  # a package's: ids inside its vocabulary
    vocab = Tokenizer.from_file(str(tokenizer)).get_vocab_size() if tokenizer.is_file() else 1000
    print(f"{cli.model}, {cli.length} tokens a row; ms a row (rows/s)")
    for batch in cli.batch_sizes:
        shape = (batch, cli.length)
        values = {"input_ids": rng.integers(vocab // 2, vocab, shape), "attention_mask": np.ones(shape),
                  "token_type_ids": np.zeros(shape)}  # fmt: skip
        [one] = at_once([open_session(cli.model, 1, spinning=True)], values, cli.runs)
        lanes = at_once(
            [open_session(cli.model, 1, spinning=True) for _ in range(2)], values, cli.runs
        )
        [two] = at_once([open_session(cli.model, 2, spinning=True)], values, cli.runs)
        print(f"batch {batch}: one lane alone {one:.2f} ({1e3 / one:.0f}/s); two lanes at once "
              f"{lanes[0]:.2f} and {lanes[1]:.2f} ({sum(1e3 / x for x in lanes):.0f}/s together); "
              f"one session on 2 threads {two:.2f} ({1e3 / two:.0f}/s)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
