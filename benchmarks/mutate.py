"""Mutation testing as a measure of the suite: how many deliberate defects in the modules where
answers are made does the suite catch, run as a fresh clone runs it (no ../shared)?

    python -m benchmarks.mutate                       # every target (`make mutate`; ~1-2 h on 2 cores)
    python -m benchmarks.mutate --only ner qa         # some targets
    python -m benchmarks.mutate --only ner --tree /tmp/old --out /tmp/old-scores
                                                      # another tree (e.g. a `git worktree` of an
                                                      # older commit), to compare before / after
    python -m benchmarks.mutate --report --before /tmp/old-scores/mutation.json
                                                      # mutation.md again from mutation.json (after
                                                      # editing mutation_equivalents.json), with
                                                      # an older tree's scores beside

Each target is one module and the test files that exercise it. The tree is copied into
build/mutate/<target>/ (the working tree is never touched: mutmut writes its mutants there),
mutmut (https://github.com/boxed/mutmut) mutates that module alone and runs, per mutant, the
selected tests that reach the mutated function, with BERT_HEADS_TEST_DATA pointed at an empty
folder as `make test-fresh` does. A mutant is killed when a test fails (or the run times out),
survives when every test passes. The score is killed / (mutants that some test reached);
mutants that no selected test reaches count as survivors too, since the suite misses them.

Writes benchmarks/results/mutation.json and mutation.md: the score per module, and every
surviving mutant with its diff, so that a reader can tell a missing test from an equivalent
mutant (one that changes nothing observable, e.g. a default argument that every caller passes).
The equivalent ones, each with the reason no test can kill it, are listed in
benchmarks/mutation_equivalents.json by mutant name and diff (an entry whose diff no longer
matches, after the code changed, counts as a survivor again); the score is given raw and with
them left out.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks._machine import cpu_name
from benchmarks._paths import REPO

RESULTS = REPO / "benchmarks" / "results"
EQUIVALENTS = REPO / "benchmarks" / "mutation_equivalents.json"

# The tasks' own tests, and the engine's (each task's Job run as the service runs it). The
# HTTP tests reach the same code but cost ~10x more a mutant (0.34 mutants/s against 3.5 on 2
# cores): a measure that takes hours is not run.
TASK_TESTS = ("tests/heads", "tests/service/test_engine.py")
BATCHING_TESTS = (
    "tests/service/test_batcher.py",
    "tests/service/test_routing.py",
    "tests/service/test_engine.py",
)


@dataclass(frozen=True)
class Target:
    module: str  # the file mutated
    tests: tuple[str, ...]  # what pytest runs (files or folders)
    functions: tuple[str, ...] = ()  # only these functions' mutants (fnmatch on mutmut's names)


TARGETS = {
    "classify": Target("heads/tasks/classify.py", TASK_TESTS),
    "ner": Target("heads/tasks/ner.py", TASK_TESTS),
    "qa": Target("heads/tasks/qa.py", TASK_TESTS),
    "embed": Target("heads/tasks/embed.py", TASK_TESTS),
    "rerank": Target("heads/tasks/rerank.py", TASK_TESTS),
    "zero_shot": Target("heads/tasks/zero_shot.py", TASK_TESTS),
    "fill_mask": Target("heads/tasks/fill_mask.py", TASK_TESTS),
    "sparse": Target("heads/tasks/sparse.py", TASK_TESTS),
    "tokenize": Target("heads/tasks/tokenize.py", TASK_TESTS),
    "rows": Target("heads/rows.py", TASK_TESTS),
    "job_queue": Target("service/job_queue.py", BATCHING_TESTS),
    "batcher": Target("service/batcher.py", BATCHING_TESTS),
    "encode": Target("service/stages/encode.py", BATCHING_TESTS),
    "infer": Target("service/stages/infer.py", BATCHING_TESTS),
    "answer": Target("service/stages/answer.py", BATCHING_TESTS),
    # the export's parity code: the probes and the comparison that package.json records
    "export_parity": Target(
        "training/export.py",
        ("tests/training/test_export.py",),
        functions=("*probe_batches*", "*compare*", "*worst*"),
    ),
}

# What the copy needs besides the mutated module: every package the tests import, and the
# files the tests read (README, examples, deployment files).
SKIP = {".git", ".venv", "build", "models", "runs", "mutants", "__pycache__"}


def copy_tree(source: Path, dest: Path) -> None:
    """The files git would see in `source` (tracked, and untracked but not ignored) into dest."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=source,
        check=True,
        capture_output=True,
    ).stdout.split(b"\0")
    if dest.exists():
        shutil.rmtree(dest)
    for raw in filter(None, listed):
        rel = Path(raw.decode())
        if rel.parts[0] in SKIP or not (source / rel).is_file():
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source / rel, dest / rel)


def tree_name(source: Path) -> str:
    """The tree measured: its commit, with `+` when it has uncommitted changes; else its path."""
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=source, capture_output=True, text=True
    )
    if head.returncode != 0:
        return str(source)
    changed = subprocess.run(["git", "diff", "--quiet", "HEAD", "--"], cwd=source).returncode
    return head.stdout.strip() + ("+" if changed else "")


def configure(tree: Path, target: Target, pytest_args: list[str]) -> None:
    """mutmut's settings, in the copy's setup.cfg: one module mutated; every top-level package
    and file copied beside it, so the tests import the copy and nothing else."""
    top = sorted(p.name for p in tree.iterdir() if p.name not in SKIP and p.name != "setup.cfg")
    packages = [name for name in top if (tree / name / "__init__.py").is_file()]
    also = [name for name in top if name not in packages]

    def lines(values: list[str]) -> str:
        return "".join(f"\n    {v}" for v in values)

    (tree / "setup.cfg").write_text(
        "[mutmut]\n"
        f"source_paths ={lines(packages)}\n"
        f"only_mutate ={lines([target.module])}\n"
        f"also_copy ={lines(also)}\n"
        f"pytest_add_cli_args ={lines(pytest_args)}\n"
        f"pytest_add_cli_args_test_selection ={lines(list(target.tests))}\n"
        "use_git_change_detection = false\n"
        # mutmut's CPU-time limit a mutant is (the selected tests' time + constant) x multiplier x 2,
        # the tests' time taken from one run where a module fixture's setup counts only to the
        # first test: a mutant reached by a later test alone got ~20 CPU s for a fixture that
        # exports four packages, and "timed out" (counted killed) without any test failing.
        # The constant covers such a setup; a mutant that really hangs meets pytest's --timeout.
        "timeout_multiplier = 10\n"
        "timeout_constant = 30\n"
    )


STATUS = {1: "killed", 3: "killed", 0: "survived", 5: "no tests", 33: "no tests", 34: "skipped",
          36: "timeout", 24: "timeout", -24: "timeout", 152: "timeout", 255: "timeout",
          None: "not checked"}  # fmt: skip


def run_target(name: str, target: Target, source: Path, jobs: int, work: Path) -> dict:
    tree = work / name
    measured = tree_name(source)  # now: the source may change while mutmut runs
    copy_tree(source, tree)
    empty = tree.parent / f"{name}-no-shared-data"
    empty.mkdir(parents=True, exist_ok=True)
    # a test file the tree lacks (an older commit's) is left out
    present = tuple(t for t in target.tests if (tree / t).exists())
    target = Target(target.module, present, target.functions)
    configure(tree, target, ["-p", "no:cacheprovider", "-q", "-x", "--timeout=300"])
    env = {**os.environ, "BERT_HEADS_TEST_DATA": str(empty), "PYTHONDONTWRITEBYTECODE": "1"}
    names = [f"{target.module[:-3].replace('/', '.')}.{f}" for f in target.functions]
    mutmut = [sys.executable, "-m", "mutmut", "run", "--max-children", str(jobs), *names]
    start = time.perf_counter()
    log = tree.parent / f"{name}.log"
    with open(log, "w") as out:
        done = subprocess.run(mutmut, cwd=tree, env=env, stdout=out, stderr=subprocess.STDOUT)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"mutmut failed on {name} ({done.returncode}): see {log}")
    meta = json.loads((tree / "mutants" / (target.module + ".meta")).read_text())
    codes = meta["exit_code_by_key"]
    if names:
        import fnmatch

        codes = {k: v for k, v in codes.items() if any(fnmatch.fnmatch(k, n) for n in names)}
    statuses = {key: STATUS.get(code, "suspicious") for key, code in codes.items()}
    survivors = sorted(k for k, s in statuses.items() if s in ("survived", "no tests"))
    diffs = {key: _changed_lines(diff) for key, diff in _diffs(tree, env, survivors).items()}
    counts = {s: sum(v == s for v in statuses.values()) for s in sorted(set(statuses.values()))}
    killed = counts.get("killed", 0) + counts.get("timeout", 0)
    total = len(statuses) - counts.get("skipped", 0)
    return {
        "module": target.module,
        "tests": list(target.tests),
        "functions": list(target.functions),
        "mutants": total,
        "killed": killed,
        "counts": counts,
        "score": round(killed / total, 4) if total else None,
        "seconds": round(seconds),
        "machine": f"{cpu_name()}, {os.cpu_count()} cores, {jobs} mutants at once",
        "tree": measured,
        "date": time.strftime("%Y-%m-%d"),
        "survivors": {k: diffs[k] for k in survivors},
    }


def mark_equivalents(result: dict, listed: dict[str, dict[str, dict[str, str]]]) -> None:
    """Which of a module's survivors are equivalent (listed, with the same diff), and its
    score without them: killed / (mutants - equivalent). None for a module whose survivors
    nobody has gone through yet (not in the list)."""
    if result["module"] not in listed:
        result["equivalent"] = result["score_without_equivalent"] = None
        return
    prefix = result["module"][:-3].replace("/", ".") + "."
    known = listed[result["module"]]
    equivalent = {}
    for key, diff in result["survivors"].items():
        entry = known.get(key.removeprefix(prefix))
        if entry is not None and entry["diff"] == diff:
            equivalent[key] = entry["reason"]
    result["equivalent"] = equivalent
    live = result["mutants"] - len(equivalent)
    result["score_without_equivalent"] = round(result["killed"] / live, 4) if live else None


# `mutmut show` for many mutants in one process (a process per mutant costs seconds each)
_SHOW = """
import json, sys
from mutmut.mutation.diff_apply import find_mutant, get_diff_for_mutant
names = json.loads(sys.stdin.read())
print(json.dumps({n: get_diff_for_mutant(n, path=find_mutant(n).path) for n in names}))
"""


def _diffs(tree: Path, env: dict[str, str], names: list[str]) -> dict[str, str]:
    shown = subprocess.run(
        [sys.executable, "-c", _SHOW],
        cwd=tree,
        env=env,
        input=json.dumps(names),
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(shown.stdout.strip().splitlines()[-1])


def _changed_lines(diff: str) -> str:
    return "\n".join(
        line
        for line in diff.splitlines()
        if line.startswith(("+", "-")) and not line.startswith(("+++", "---"))
    )


def report(results: dict[str, dict]) -> str:
    lines = [
        "# Mutation scores (`make mutate`)",
        "",
        "mutmut over each module with the tests named, run as `make test-fresh` runs them (no",
        "../shared). Score = killed / mutants (a timeout counts as killed); survivors include",
        "mutants no selected test reaches. Equivalent: survivors that change nothing a caller",
        "can observe, each with its reason below (benchmarks/mutation_equivalents.json); the next",
        'score leaves them out ("not sorted": nobody has gone through that module\'s survivors',
        "yet). Before: the score of the tree named. Time: the module's whole run, on the machine",
        "named.",
        "",
        "| module | tests | mutants | killed | survived | of them equivalent | no tests | score "
        "| score, equivalents left out | before | time | measured on |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---|",
    ]
    for r in results.values():
        c = r["counts"]
        without = r.get("score_without_equivalent")
        equivalent = r.get("equivalent")
        b = r.get("before")
        before = f"{b['score']:.1%} ({b['killed']}/{b['mutants']}, {b['tree']})" if b else "-"
        lines.append(
            f"| `{r['module']}`{' (' + ', '.join(r['functions']) + ')' if r['functions'] else ''} "
            f"| {', '.join(r['tests'])} | {r['mutants']} | {r['killed']} | "
            f"{c.get('survived', 0)} | {'not sorted' if equivalent is None else len(equivalent)} "
            f"| {c.get('no tests', 0)} | {r['score']:.1%} "
            f"| {'-' if without is None else f'{without:.1%}'} | {before} "
            f"| {r['seconds'] // 60} min | {r.get('date', '-')}, {r.get('machine', '-')} |"
        )
    for r in results.values():
        equivalent = r.get("equivalent") or {}
        live = {k: d for k, d in r["survivors"].items() if k not in equivalent}
        if live:
            lines += ["", f"## Survivors in `{r['module']}`", ""]
            for key, diff in live.items():
                lines += [f"- `{key}`", "", "  ```diff", *("  " + d for d in diff.splitlines()),
                          "  ```"]  # fmt: skip
        if equivalent:
            lines += ["", f"## Equivalent mutants in `{r['module']}`", ""]
            for key, reason in equivalent.items():
                diff = r["survivors"][key]
                lines += [f"- `{key}`: {reason}", "", "  ```diff",
                          *("  " + d for d in diff.splitlines()), "  ```"]  # fmt: skip
    return "\n".join(lines) + "\n"


def write(results: dict[str, dict], out: Path, before: Path | None = None) -> None:
    """mutation.json and mutation.md, the equivalents marked as listed now; `before`: an older
    tree's mutation.json, whose scores are kept beside each module's (its `tree` field names
    that tree, else the file's folder)."""
    listed = json.loads(EQUIVALENTS.read_text()) if EQUIVALENTS.is_file() else {}
    older = json.loads(before.read_text()) if before is not None else {}
    for name, r in results.items():
        mark_equivalents(r, listed)
        if name in older:
            b = older[name]
            tree = b.get("tree", before.parent.name if before else "")
            r["before"] = {k: b[k] for k in ("score", "killed", "mutants")} | {"tree": tree}
    out.mkdir(parents=True, exist_ok=True)
    (out / "mutation.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "mutation.md").write_text(report(results))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=sorted(TARGETS), help="these targets only")
    parser.add_argument("--tree", type=Path, default=REPO, help="the tree to measure (git)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="mutants at once")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where mutation.{json,md} go")
    parser.add_argument(
        "--work", type=Path, default=REPO / "build" / "mutate", help="where the copies go"
    )
    parser.add_argument(
        "--report", action="store_true", help="rewrite the results from mutation.json; run nothing"
    )
    parser.add_argument(
        "--before", type=Path, help="an older tree's mutation.json, to show its scores beside"
    )
    args = parser.parse_args(argv)
    out_json = args.out / "mutation.json"
    # targets run now replace their old figures; the others keep theirs
    results = json.loads(out_json.read_text()) if out_json.is_file() else {}
    if args.report:
        write(results, args.out, args.before)
        return
    for name in args.only or TARGETS:
        print(f"[mutate] {name}: {TARGETS[name].module}", flush=True)
        results[name] = run_target(
            name, TARGETS[name], args.tree.resolve(), args.jobs, args.work.resolve()
        )
        r = results[name]
        print(f"[mutate] {name}: {r['killed']}/{r['mutants']} killed ({r['score']:.1%}), "
              f"{r['seconds']} s", flush=True)  # fmt: skip
        write(results, args.out, args.before)


if __name__ == "__main__":
    main()
