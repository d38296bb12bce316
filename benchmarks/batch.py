"""Offline batch inference (issue 53), side by side in one run: MiniLM embeddings of N SST-2
sentences through `python -m service.batch`, beside the HTTP server at its best concurrency,
ONNX Runtime alone on the same rows (the ceiling) and sentence-transformers' `encode` on the
same threads; the command's peak memory at two sizes; two local Ray actors against one process
on the same cores; and the resume check (killed with SIGKILL at half, resumed, compared part by
part with an uninterrupted run).

    python -m benchmarks.packages --only minilm-embed           # models/bench/minilm-embed
    python -m benchmarks.batch --package models/bench/minilm-embed --rows 100000 \\
        --memory-rows 100000,1000000
    python -m benchmarks.batch --only memory --memory-rows 100000,1000000   # that table alone
    python -m benchmarks.batch --only ray --ray-rows 100000                 # or that one

Every figure has two forms: rows per second, and CPU milliseconds per row (user + system of
every process doing the work, the load generator left out). On a machine shared with other
jobs rows/s follows their load; CPU per row does not, and says what each door costs. The
"others" column is the machine's busy cores that none of ours used, during that measurement.

Results: benchmarks/results/batch[-tag].{json,md}.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks import _engine, _load, _server
from benchmarks._data import shared_data
from benchmarks._machine import cpu_name
from benchmarks._paths import REPO, shown, write_results
from benchmarks.packages import minilm_path
from benchmarks.serve import CpuMeter, log
from heads.package import read_package
from heads.rows import load_package_tokenizer
from heads.tasks import embed

PER_REQUEST = 32  # sentences per HTTP request: the server's best throughput shape (serve.py)
PART_ROWS = 10_000  # the command's default; smaller runs get a tenth of their rows a part


def sentences(data: Path, n: int) -> list[str]:
    """SST-2's train sentences, in file order, repeated to `n`."""
    with (data / "sst2" / "train.tsv").open(newline="") as f:
        found = [r["sentence"] for r in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)]
    return [found[i % len(found)] for i in range(n)]


def write_input(folder: Path, data: Path, n: int) -> Path:
    path = folder / f"sentences-{n}.parquet"
    if not path.exists():
        pq.write_table(pa.table({"sentence": sentences(data, n)}), path, row_group_size=50_000)
    return path


def command(args: list[str], kill_at_parts: tuple[Path, int] | None = None) -> dict[str, Any]:
    """Run `python -m service.batch args`; its wall time, CPU seconds, peak RSS (this process
    alone, os.wait4), and the figures it wrote to _SUCCESS. kill_at_parts (folder, k): SIGKILL
    it once folder holds k part files."""
    meter = CpuMeter()
    start = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", "service.batch", *args], cwd=REPO,
                               stderr=subprocess.PIPE, text=True)  # fmt: skip
    peak = 0  # KiB: the process's own high-water mark (VmHWM), read until it exits
    out = Path(args[args.index("--output") + 1])
    by_parts: dict[int, int] = {}  # parts written -> the high-water mark when they were
    sent = False
    while True:
        peak = max(peak, high_water_kib(process.pid))
        by_parts.setdefault(len(list(out.glob("part-*.parquet"))) if out.is_dir() else 0, peak)
        if kill_at_parts is not None:
            folder, k = kill_at_parts
            if not sent and len(list(folder.glob("part-*.parquet"))) >= k:
                os.kill(process.pid, signal.SIGKILL)  # not send_signal: its poll() would reap it
                sent = True
        if os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is not None:
            break  # exited; not reaped yet
        time.sleep(0.02 if kill_at_parts is not None else 0.1)
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    stderr = process.stderr.read() if process.stderr else ""
    wall = time.perf_counter() - start
    if kill_at_parts is None and process.returncode != 0:
        raise RuntimeError(f"service.batch failed ({process.returncode}):\n{stderr[-3000:]}")
    success = out / "_SUCCESS"
    return {
        "wall_s": round(wall, 2),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        # not wait4's ru_maxrss: after a fork and exec it is the parent's peak when larger
        "peak_rss_mib": round(peak / 1024, 1),
        "peak_rss_mib_by_parts": {k: round(v / 1024, 1) for k, v in sorted(by_parts.items())},
        "exit": process.returncode,
        "figures": json.loads(success.read_text()) if success.exists() else None,
        # the machine's busy cores that were neither this harness's nor the command's
        "others_cpu_cores": round(
            max(0.0, meter.read()["others_cpu_cores"] - (usage.ru_utime + usage.ru_stime) / wall), 3
        ),
        "last_line": stderr.strip().splitlines()[-1] if stderr.strip() else "",
    }


SPIN = ["--no-intra-op-spinning"]  # main() sets it: every door spins or none does


def high_water_kib(pid: int) -> int:
    """VmHWM of `pid` (its peak resident set since its exec), 0 once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    return next(
        (int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")), 0
    )


def batch_args(
    package: Path,
    variant: str,
    threads: int,
    source: Path,
    out: Path,
    part: int | None = None,
    task: str = "embed",
) -> list[str]:
    """The command's arguments; `part` rows a part (default: a tenth of the rows, at most
    PART_ROWS, so that the resume check has ten parts to stop in)."""
    part = part or part_rows(pq.read_metadata(source).num_rows)
    return [task, "--model-dir", str(package.parent), "--model", package.name,
            "--variant", variant, "--intra-op-threads", str(threads), "--input", str(source),
            "--text-column", "sentence", "--output", str(out), "--part-rows", str(part),
            "--quiet", "--overwrite", *SPIN]  # fmt: skip


def part_rows(rows: int) -> int:
    return max(1, min(PART_ROWS, rows // 10))


def per_row(cpu_s: float, rows: int) -> float:
    return round(1000 * cpu_s / rows, 3)


def batch_figure(run: dict[str, Any], rows: int) -> dict[str, Any]:
    figures = run["figures"]
    return {
        "rows_per_s": figures["steady_rows_per_s"] or figures["rows_per_s"],  # after the first part
        "rows_per_s_with_start": round(rows / run["wall_s"], 1),
        "cpu_ms_per_row": figures["steady_cpu_ms_per_row"] or per_row(run["cpu_s"], rows),
        "cpu_ms_per_row_with_start": per_row(run["cpu_s"], rows),
        "others_cpu_cores": run["others_cpu_cores"],
        "peak_rss_mib": run["peak_rss_mib"],
    }


def ceiling(package: Path, variant: str, threads: int, texts: list[str], budget: float) -> dict:
    """ONNX Runtime alone on the sentences' rows, tokenized beforehand (`best_layout`)."""
    pkg = read_package(package)
    tokenizer = load_package_tokenizer(pkg.tokenizer_path)
    rows = embed.preprocess(tokenizer, texts, pkg.max_seq_length).sequences
    return best_layout(package, variant, threads, rows, budget)


def best_layout(
    package: Path,
    variant: str,
    threads: int,
    rows: list[Any],
    budget: float,
    sizes: tuple[int, ...] = (32, 64),
) -> dict:
    """ONNX Runtime alone on `rows`, length-sorted batches of each of `sizes`, in both layouts
    the service can run: one session on every thread, and (on CPU, its default) one
    single-thread session per thread, all running at once, each on its share of the batches
    (service.runtime's lanes). The best is the ceiling."""
    path = read_package(package).variant_path(variant)
    spin = SPIN == ["--intra-op-spinning"]
    one = _engine.open_session(path, threads, spin)
    lanes = [_engine.open_session(path, 1, spin) for _ in range(threads)]
    best: dict[str, Any] = {}
    for size in sizes:
        for layout in ("one session", "lanes"):
            meter, cpu0 = CpuMeter(), time.process_time()
            if layout == "one session":
                r = _engine.throughput(one, rows, size, "sorted", budget)
                done, rate = (
                    round(r["sequences_per_s"] * r["batches"] * r["ms_per_batch"] / 1000),
                    r["sequences_per_s"],
                )
            else:
                done, rate = at_once(lanes, rows, size, budget)
            figure = {"rows_per_s": rate, "batch_size": size, "layout": f"{layout} x {threads} threads"
                      if layout == "one session" else f"{threads} sessions x 1 thread",
                      "cpu_ms_per_row": per_row(time.process_time() - cpu0, max(done, 1)),
                      "others_cpu_cores": meter.read()["others_cpu_cores"]}  # fmt: skip
            if figure["rows_per_s"] > best.get("rows_per_s", 0):
                best = figure
    return best


def at_once(backends: list[Any], rows: list[Any], size: int, budget: float) -> tuple[int, float]:
    """Rows and rows/s of every backend running its share of the length-sorted batches at
    once, each in its own thread (ONNX Runtime releases the GIL), for about `budget` s. The
    rows are sorted before they are cut, as the command sorts them, and the batches visited
    in `_engine.spread` order, as `_engine.throughput` does for the one-session layout: a
    short budget measures short and long rows alike."""
    ordered = sorted(rows, key=len)
    cut = [ordered[i : i + size] for i in range(0, len(ordered), size)]
    batches = [cut[i] for i in _engine.spread(len(cut))]
    feeds = [_engine.feeds_for(backends[0], b) for b in batches]
    for backend in backends:
        backend.session.run(None, feeds[0])
    done = [0] * len(backends)
    start = time.perf_counter()

    def lane(k: int) -> None:
        n = k
        while time.perf_counter() - start < budget:
            f = feeds[n % len(feeds)]
            backends[k].session.run(None, f)
            done[k] += len(f["input_ids"])
            n += len(backends)

    threads = [threading.Thread(target=lane, args=(k,)) for k in range(len(backends))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    return sum(done), round(sum(done) / wall, 2)


def http(package: Path, variant: str, threads: int, texts: list[str], levels: list[int],
         seconds: float) -> dict[str, Any]:  # fmt: skip
    """POST /embed, PER_REQUEST sentences a request, at each level of closed-loop clients;
    the best level, and each level's figures (server CPU per row: its process, all threads)."""
    bodies = [{"inputs": texts[i : i + PER_REQUEST]} for i in range(0, len(texts), PER_REQUEST)]
    rows = [len(b["inputs"]) for b in bodies]
    tokens = [0] * len(bodies)
    out: dict[str, Any] = {"levels": []}
    with _server.serve(package, variant, threads, SPIN == ["--intra-op-spinning"], []) as server:
        for clients in levels:
            meter, cpu0 = CpuMeter(server), server.cpu_seconds()
            level = _load.run_level(server.base_url + "/embed", bodies, rows, tokens, clients,
                                    warmup=2.0, duration=seconds)  # fmt: skip
            cpu = server.cpu_seconds() - cpu0
            cores = meter.read()
            served = level.summary()
            figure = {
                "clients": clients,
                "rows_per_s": served["sequences_per_s"],
                "cpu_ms_per_row": per_row(cpu * level.seconds / max(cores["wall_s"], 1e-9), max(level.rows, 1)),
                "client_cpu_cores": served["client_cpu_cores"],
                "others_cpu_cores": cores["others_cpu_cores"],
                "errors": served["errors"],
            }  # fmt: skip
            out["levels"].append(figure)
    out["best"] = max(out["levels"], key=lambda f: f["rows_per_s"])
    return out


def st_encode(checkpoint: Path, texts: list[str], threads: int) -> dict[str, Any]:
    """sentence-transformers' encode, as a user writes it (batch_size 32, its own length
    sort), torch on `threads` threads: fp32 (it has no int8)."""
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(threads)
    model = SentenceTransformer(str(checkpoint), device="cpu")
    model.encode(texts[:64])  # warm up
    meter, cpu0, start = CpuMeter(), time.process_time(), time.perf_counter()
    model.encode(texts, batch_size=32)
    wall = time.perf_counter() - start
    return {"rows_per_s": round(len(texts) / wall, 1),
            "cpu_ms_per_row": per_row(time.process_time() - cpu0, len(texts)),
            "others_cpu_cores": meter.read()["others_cpu_cores"], "rows": len(texts)}  # fmt: skip


def resume_check(args: list[str], reference: Path, parts: int) -> dict[str, Any]:
    """Kill the command at half its parts, run it again, compare every part with `reference`."""
    out = Path(args[args.index("--output") + 1])
    resumed_args = [a for a in args if a != "--overwrite"]
    killed = command(args, kill_at_parts=(out, parts // 2))
    left = len(list(out.glob("part-*.parquet")))
    again = command(resumed_args)
    same = all(
        pq.read_table(p).equals(pq.read_table(out / p.name)) for p in sorted(reference.glob("part-*.parquet"))
    )  # fmt: skip
    errors_same = (out / "_errors.jsonl").exists() == (reference / "_errors.jsonl").exists()
    return {"killed_exit": killed["exit"], "parts_when_killed": left, "parts": parts,
            "resumed_parts": again["figures"]["parts"], "skipped_parts": again["figures"]["skipped_parts"],
            "identical": same and errors_same}  # fmt: skip


def peak_memory(package: Path, threads: int, data: Path, work: Path, sizes: str) -> list[dict]:
    """The command's peak RSS (int8, parts of PART_ROWS) at each of `sizes` rows ("100000,...")."""
    memory = []
    for n in sorted(int(x) for x in sizes.split(",")):
        log(f"peak memory at {n:,} rows, parts of {PART_ROWS:,}")
        big = write_input(work, data, n)
        run = command(batch_args(package, "int8", threads, big, work / f"mem-{n}", PART_ROWS))
        f = batch_figure(run, n)
        marks = run["peak_rss_mib_by_parts"]  # the peak once a tenth, and half, were written
        tenth = {share: next((v for k, v in marks.items() if k >= share * n / PART_ROWS), None)
                 for share in (0.1, 0.5)}  # fmt: skip
        memory.append({"rows": n, "peak_rss_mib": f["peak_rss_mib"], "rows_per_s": f["rows_per_s"],
                       "wall_s": run["wall_s"], "peak_rss_mib_at_10pct": tenth[0.1],
                       "peak_rss_mib_at_50pct": tenth[0.5]})  # fmt: skip
        shutil.rmtree(work / f"mem-{n}", ignore_errors=True)
    return memory


def ray_vs_single(package: Path, threads: int, source: Path, rows: int, work: Path) -> dict:
    """The command on `threads` threads in one process, and --ray with 2 actors of
    threads / 2 each, int8: steady rows/s (after the first part) and wall time with start."""
    single = command(batch_args(package, "int8", threads, source, work / "single"))
    on_ray = command([*batch_args(package, "int8", max(1, threads // 2), source, work / "ray"),
                      "--ray", "--ray-actors", "2"])  # fmt: skip
    same = pq.read_table(work / "single").num_rows == pq.read_table(work / "ray").num_rows == rows
    return {"single": batch_figure(single, rows) | {"wall_s": single["wall_s"]},
            "ray_2_actors": {"rows_per_s": on_ray["figures"]["steady_rows_per_s"],
                             "rows_per_s_with_start": round(rows / on_ray["wall_s"], 1),
                             "wall_s": on_ray["wall_s"], "others_cpu_cores": on_ray["others_cpu_cores"]},
            "rows": rows, "all_rows_written": same}  # fmt: skip


def markdown(result: dict[str, Any]) -> str:
    rows = result["rows"]
    lines = [
        "# Offline batch inference: MiniLM embeddings (issue 53)",
        "",
        f"`{result['command']}` on {result['cpu']} ({result['cores']} cores, shared with other "
        f"jobs: see the others column), {result['threads']} ONNX Runtime / torch threads, "
        f"spinning {'on' if result['spinning'] else 'off'}; "
        f"{rows:,} SST-2 train sentences (repeated), parts of {part_rows(rows):,} rows. The command's "
        "figures leave out its start (imports, model load) and first part: they are its steady "
        "rate; the start is in the memory table's wall times.",
        "",
        "| door | variant | rows/s | x ceiling | CPU ms / row | x ceiling CPU | others (cores) |",
        "|---|---|---|---|---|---|---|",
    ]
    for variant, doors in result["throughput"].items():
        top = doors["ceiling"]
        for name, f in doors.items():
            if f is None:
                continue
            shown_name = {"ceiling": "ONNX Runtime alone (ceiling)", "batch": "python -m service.batch",
                          "http": f"HTTP /embed, best of {result['http_levels']} clients x {PER_REQUEST}",
                          "st": "sentence-transformers encode"}[name]  # fmt: skip
            if name == "http":
                shown_name += f" ({f['clients']})"
            if name == "ceiling" and "layout" in f:
                shown_name += f": {f['layout']}, batches of {f['batch_size']}"
            lines.append(
                f"| {shown_name} | {variant} | {f['rows_per_s']:,.0f} | {f['rows_per_s'] / top['rows_per_s']:.2f} "
                f"| {f['cpu_ms_per_row']:.2f} | {top['cpu_ms_per_row'] / f['cpu_ms_per_row']:.2f} "
                f"| {f['others_cpu_cores']:.2f} |"
            )  # fmt: skip
    st = result["throughput"].get("fp32", {}).get("st")
    if st:
        lines += ["", "Batch command against sentence-transformers fp32 on the same threads: "
                  + ", ".join(f"{v} {d['batch']['rows_per_s'] / st['rows_per_s']:.2f}x rows/s, "
                              f"{st['cpu_ms_per_row'] / d['batch']['cpu_ms_per_row']:.2f}x less CPU per row"
                              for v, d in result["throughput"].items()) + "."]  # fmt: skip
    apart = (f"; measured apart, by `{result['memory_command']}` on {result['memory_cpu']}"
             if result.get("memory_command") else "")  # fmt: skip
    lines += ["", f"## Peak memory of the command (int8, parts of {PART_ROWS:,} rows)", "",
              f"Its own peak resident set (VmHWM, read every 0.1 s until it exits){apart}; "
              "the same run's peak so far once a tenth and half its rows were written.", "",
              "| rows | peak RSS MiB | at 10% of the rows | at 50% | rows/s, start included | wall s |",
              "|---|---|---|---|---|---|"]  # fmt: skip
    for m in result["memory"]:
        lines.append(
            f"| {m['rows']:,} | {m['peak_rss_mib']} | {m.get('peak_rss_mib_at_10pct', '-')} "
            f"| {m.get('peak_rss_mib_at_50pct', '-')} | {m['rows'] / m['wall_s']:,.0f} | {m['wall_s']} |"
        )
    if result.get("ray"):
        r = result["ray"]
        apart = (f"Measured apart, by `{result['ray_command']}` on {result['ray_cpu']}."
                 if result.get("ray_command") else "")  # fmt: skip
        lines += ["", f"## Ray: two local actors against one process ({r['rows']:,} rows, int8)", "",
                  *([apart, ""] if apart else []),
                  "| run | rows/s after the first part | rows/s with start-up | wall s |", "|---|---|---|---|",
                  f"| one process, {result['threads']} threads | {r['single']['rows_per_s']:,.0f} | "
                  f"{r['single']['rows_per_s_with_start']:,.0f} | {r['single']['wall_s']} |",
                  f"| --ray, 2 actors x {max(1, result['threads'] // 2)} threads | "
                  f"{r['ray_2_actors']['rows_per_s'] or 0:,.0f} | {r['ray_2_actors']['rows_per_s_with_start']:,.0f} "
                  f"| {r['ray_2_actors']['wall_s']} |"]  # fmt: skip
    if result.get("resume"):
        r = result["resume"]
        lines += ["", "## Resume check", "",
                  f"The command on {r['rows']:,} rows (int8), SIGKILLed once {r['parts_when_killed']} of "
                  f"{r['parts']} parts were written (exit {r['killed_exit']}), then run again: it skipped "
                  f"{r['skipped_parts']} parts, wrote {r['resumed_parts']}, and every part "
                  + ("equals" if r["identical"] else "DIFFERS from")
                  + " the uninterrupted run's (pyarrow Table.equals, bit for bit)."]  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.batch", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--package", type=Path, default=Path("models/bench/minilm-embed"))
    p.add_argument("--rows", type=int, default=100_000, help="sentences of the rows/s figures")
    p.add_argument("--memory-rows", default="100000,1000000", help="two sizes for peak memory")
    p.add_argument("--only", choices=("memory", "ray"),
                   help="run only the peak-memory table (1M rows: ~17 min on 2 cores) or the Ray one, "
                   "and put it in the results file already there, its other figures kept")  # fmt: skip
    p.add_argument("--variants", default="fp32,int8")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--http-levels", default="4,16", help="closed-loop clients to try")
    p.add_argument("--http-seconds", type=float, default=15.0)
    p.add_argument("--ceiling-seconds", type=float, default=15.0)
    p.add_argument(
        "--st-rows", type=int, default=5_000, help="sentences sentence-transformers encodes"
    )
    p.add_argument("--ray-rows", type=int, default=0, help="rows of the Ray comparison (0: --rows)")
    p.add_argument("--no-ray", action="store_true")
    p.add_argument("--spinning", action="store_true",
                   help="ONNX Runtime threads busy-wait (the server's default; off here: the cores are "
                   "shared, and spinning makes CPU per row count waiting)")  # fmt: skip
    p.add_argument("--data", type=Path, default=None)
    p.add_argument("--results", type=Path, default=REPO / "benchmarks" / "results")
    p.add_argument("--tag", default="")
    a = p.parse_args(argv)
    SPIN[:] = ["--intra-op-spinning" if a.spinning else "--no-intra-op-spinning"]
    data = shared_data(a.data)
    package = a.package.resolve()
    stem = "batch" + (f"-{a.tag}" if a.tag else "")
    if a.only:
        kept = json.loads((a.results / f"{stem}.json").read_text())
        with tempfile.TemporaryDirectory(prefix="bench-batch-") as tmp:
            work = Path(tmp)
            if a.only == "memory":
                kept["memory"] = peak_memory(package, a.threads, data, work, a.memory_rows)
            else:
                n = a.ray_rows or a.rows
                kept["ray"] = ray_vs_single(package, a.threads, write_input(work, data, n), n, work)
        kept[f"{a.only}_command"] = "python -m benchmarks.batch " + " ".join(
            argv if argv is not None else sys.argv[1:]
        )
        kept[f"{a.only}_cpu"] = f"{cpu_name()} ({os.cpu_count()} cores)"
        log(f"wrote {write_results(a.results, stem, kept, shown(markdown(kept)))}")
        return 0
    checkpoint = minilm_path()  # the checkpoint the package was exported from
    levels = [int(x) for x in a.http_levels.split(",")]
    result: dict[str, Any] = {
        "command": "python -m benchmarks.batch " + " ".join(argv if argv is not None else sys.argv[1:]),
        "cpu": cpu_name(), "cores": os.cpu_count(), "threads": a.threads, "rows": a.rows,
        "http_levels": a.http_levels, "throughput": {}, "memory": [], "spinning": a.spinning,
        "loadavg_at_start": os.getloadavg(),
    }  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-batch-") as tmp:
        work = Path(tmp)
        source = write_input(work, data, a.rows)
        texts = sentences(data, a.rows)
        for variant in a.variants.split(","):
            log(f"{variant}: ceiling")
            doors: dict[str, Any] = {
                "ceiling": ceiling(package, variant, a.threads, texts[:20_000], a.ceiling_seconds)
            }
            log(f"{variant}: python -m service.batch on {a.rows:,} rows")
            run = command(batch_args(package, variant, a.threads, source, work / f"out-{variant}"))
            doors["batch"] = batch_figure(run, a.rows)
            log(f"{variant}: HTTP at {levels} clients")
            served = http(package, variant, a.threads, texts[:20_000], levels, a.http_seconds)
            doors["http"] = served["best"] | {"levels": served["levels"]}
            doors["st"] = None
            if variant == "fp32" and checkpoint.is_dir() and a.st_rows:
                log(f"sentence-transformers encode of {a.st_rows:,}")
                doors["st"] = st_encode(checkpoint, texts[: a.st_rows], a.threads)
            result["throughput"][variant] = doors
            log(json.dumps(doors))
        if "int8" in a.variants.split(","):
            out = work / "out-int8"
            parts = len(list(out.glob("part-*.parquet")))
            log("resume check: kill at half, run again")
            resumed = work / "resumed"
            args = batch_args(package, "int8", a.threads, source, resumed)
            result["resume"] = resume_check(args, out, parts) | {"rows": a.rows}
            log(json.dumps(result["resume"]))
            result["memory"] = peak_memory(package, a.threads, data, work, a.memory_rows)
        if not a.no_ray:
            n = a.ray_rows or a.rows
            log(f"Ray: 2 actors against one process, {n:,} rows")
            result["ray"] = ray_vs_single(package, a.threads, write_input(work, data, n), n, work)
    result["loadavg_at_end"] = os.getloadavg()
    result["peak_rss_harness_mib"] = round(
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1
    )
    path = write_results(a.results, stem, result, shown(markdown(result)))
    log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
