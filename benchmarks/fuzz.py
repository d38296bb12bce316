"""Schema fuzzing against the live server (issue 48): schemathesis generates requests for every
operation of the OpenAPI document the server publishes, requests the schema admits (positive)
and requests it refuses (negative), and sends them to `python -m service` on tiny packages of
every task. Each answer is judged: no 5xx, the status, content type and body as documented, a
refused request refused with a 4xx, and an admitted one accepted unless what refuses it is the
server's state (a model name that is not loaded, several models of a task, a limit of the
settings, what a loaded model can do) or a rule between two fields that JSON Schema cannot
state (REFUSALS). Any other refusal of an admitted request is a schema gap: the document
promises what the server does not take.

    python -m benchmarks.fuzz                          # 100 examples per operation and mode, seed 0
    python -m benchmarks.fuzz --root before=/tmp/old --root after=.   # an older checkout beside
    python -m benchmarks.fuzz --examples 25 --no-write --check  # a quick look; exit 1 on a failure

An older checkout: `git archive <commit> service heads | tar -x -C /tmp/old` (its server runs
on this tree's packages and harness).

Results: benchmarks/results/fuzz[-tag].{json,md}. CI's short run is `make fuzz`
(tests/service/test_fuzz.py, the same cases through pytest).
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hypothesis
import requests
import schemathesis
from schemathesis.core.failures import Failure, FailureGroup

from benchmarks import _server
from benchmarks._machine import cpu_name
from benchmarks._paths import write_results

# Tiny packages of every task the fuzzed routes serve (benchmarks.tiny): name -> task.
MODELS = {
    "sst2": "classification",
    "conll": "token-classification",
    "squad": "question-answering",
    "minilm": "embedding",
    "mlm": "fill-mask",
}
MAX_SEQ_LENGTH = 64
# Small limits, so that generated requests reach them, and one intra-op thread: cheap inference.
SERVER_FLAGS = [
    "--max-client-batch-size", "8", "--max-text-chars", "2000", "--payload-limit", "100000",
    "--intra-op-threads", "1", "--max-concurrent-requests", "64", "--log-level", "error",
]  # fmt: skip
CONFIG = {
    "checks": {
        # every refusal of an admitted request is looked at (classify): state or schema gap
        "positive_data_acceptance": {"expected-statuses": ["2xx"]},
        # a request over the limits is refused with 413 before anything else is checked
        "negative_data_rejection": {"expected-statuses": ["4xx"]},
    }
}

# What refuses a request the schema admits for a reason the schema cannot hold: the server's
# state ("state"), or a rule between two fields that JSON Schema has no words for ("rule").
# (status, pattern of the error message, which, why); the first match names the refusal.
REFUSALS: list[tuple[int, str, str, str]] = [
    (404, r"^no model named", "state", "unknown model name"),
    (404, r"^no embedding model named", "state", "unknown model name (GET /v1/models/{id})"),
    (404, r"has no version", "state", "unknown model version (v2)"),
    (404, r"^no .*model .*(is loaded|serves is loaded)", "state", "no model of the endpoint's kind loaded"),
    (422, r"^several .* are loaded", "state", "several models of the task loaded, none named"),
    (422, r"^model '.*' is for ", "state", "a model of another task named"),
    (422, r"has no entailment label", "state", "not an NLI model (zero-shot)"),
    (403, r"^model control is off", "state", "model control off (a setting)"),
    (413, r"", "state", "over a limit of the settings (inputs, characters, bytes)"),
    (429, r"", "state", "admission control (load)"),
    (503, r"", "state", "not ready or overloaded (load)"),
    (422, r"model window|window of|longer than", "state", "over the model's window with truncate false"),
    (422, r"dimensions|hidden.states|hidden states|layers|prompt", "state", "what the package holds"),
    (422, r"mask token|targets .*none of them|outside this model's vocabulary", "state",
     "the model's vocabulary and mask token"),
    (422, r"must be smaller than the .*(window|tokens that fit)|too long for max_seq_len", "state",
     "a stride or question against the window (the model's, and the question's tokens)"),
    (422, r"^(question|context) is empty: it has no tokens", "state",
     "no token in a text with characters (the model's tokenizer drops them all)"),
    (400, r"^(unexpected|missing) input ", "state", "the model's tensors (GET /v2/models/{name})"),
    (400, r"^parameter .* is not one a ", "state", "the model's parameters (GET /v2/models/{name})"),
    (400, r"^no output ", "state", "the model's outputs (GET /v2/models/{name})"),
    (400, r"shape \[.*\] but \d+ elements", "rule", "v2: shape [N] is the number of data elements"),
    (400, r"^input '.*' is given twice", "rule", "v2: each input tensor once (by name)"),
    (422, r"is given twice, in the body and in parameters", "rule",
     "the Hugging Face form: an option once, in the body or in parameters"),
    (400, r"must have the same number of elements", "rule",
     "v2: the input tensors of a request have the same N"),
]  # fmt: skip


def refusal(status: int, message: str) -> str | None:
    """'state: why' or 'rule: why' for a refusal of an admitted request the schema cannot
    prevent, or None: a schema gap (the document admits what the server refuses)."""
    for code, pattern, which, why in REFUSALS:
        if status == code and re.search(pattern, message):
            return f"{which}: {why}"
    return None


def build_models(folder: Path) -> Path:
    """One tiny package per entry of MODELS in `folder` (needs torch: the dev install)."""
    from benchmarks import tiny

    folder.mkdir(parents=True, exist_ok=True)
    for name, task in MODELS.items():
        if not (folder / name / "package.json").exists():
            tiny.build_tiny_package(folder / name, task, max_seq_length=MAX_SEQ_LENGTH)
    return folder


@contextmanager
def live_server(model_dir: Path, root: Path = _server.REPO) -> Iterator[str]:
    """`python -m service` from the tree `root` on `model_dir`; yields its base URL."""
    port = _server.free_port()
    with tempfile.TemporaryDirectory(prefix="fuzz-") as tmp:
        args = [sys.executable, "-m", "service", "--model-dir", str(model_dir),
                "--port", str(port), *SERVER_FLAGS]  # fmt: skip
        with _server.running(args, root, None, port, Path(tmp) / "server.log") as server:
            yield server.base_url


@dataclass
class Target:
    """One operation in one generation mode, with path parameters pinned (a loaded model's
    name and version for the v2 model routes: a random name only ever gets 404)."""

    label: str
    mode: str
    pins: dict[str, str] = field(default_factory=dict)
    operation: Any = field(default=None, repr=False)

    @property
    def id(self) -> str:
        pinned = self.pins.get("name")
        return f"{self.label} {self.mode}" + (f" [{pinned}]" if pinned else "")


def load_schema(base_url: str) -> schemathesis.schemas.BaseSchema:
    config = schemathesis.Config.from_dict(CONFIG)
    return schemathesis.openapi.from_url(f"{base_url}/openapi.json", config=config)


def model_versions(base_url: str) -> dict[str, str]:
    """name -> version of every model the server has loaded."""
    models = requests.get(f"{base_url}/models", timeout=30).json()["models"]
    return {m["name"]: m["version"] for m in models}


def targets(schema: Any, versions: dict[str, str]) -> list[Target]:
    """Every operation, positive, and negative where a body can break the schema; the v2
    model routes once per loaded model (infer) or for the first one (metadata, ready)."""
    out = []
    for result in schema.get_all_operations():
        op = result.ok()
        pinned: list[dict[str, str]] = [{}]
        if op.path.startswith("/v2/models/{name}"):
            each = op.path == "/v2/models/{name}/infer"  # the others: as for one model
            names = sorted(versions) if each else sorted(versions)[:1]
            pinned = [{"name": n, "version": versions[n]} for n in names]
        for pins in pinned:
            names = {p.name for p in op.iter_parameters() if p.location == "path"}
            pins = {k: v for k, v in pins.items() if k in names}
            out.append(Target(op.label, "positive", pins, op))
            if op.body:
                out.append(Target(op.label, "negative", pins, op))
    return out


@dataclass
class Outcome:
    """One answered (or unanswered) request: its status and every finding about it."""

    status: int | None
    findings: list[tuple[str, str]]  # (kind, detail): KINDS' keys, or refusal()'s
    request: str = ""


KINDS = {
    "server_error": "5xx, or no answer",
    "status_undocumented": "a status the document does not list",
    "body_mismatch": "a body that is not the documented one (schema, content type, headers)",
    "accepted_invalid": "a request the schema refuses, answered 2xx",
    "rejected_valid": "a request the schema admits, refused for no reason of state (a schema gap)",
}
_KIND_OF = {
    "ServerError": "server_error",
    "UndefinedStatusCode": "status_undocumented",
    "AcceptedNegativeData": "accepted_invalid",
    "RejectedPositiveData": "rejected_valid",
}


def judge(case: Any, response: requests.Response) -> list[tuple[str, str]]:
    """Schemathesis' checks on one answer, each failure as (kind, detail)."""
    try:
        case.validate_response(response)
        return []
    except FailureGroup as group:
        failures: list[Failure] = list(group.exceptions)
    except Failure as failure:
        failures = [failure]
    out = []
    if response.status_code >= 500:  # said once: its status and body are that error's
        failures = [f for f in failures if type(f).__name__ == "ServerError"] or failures[:1]
    for f in failures:
        kind = _KIND_OF.get(type(f).__name__, "body_mismatch")
        message = _message(response)
        if kind == "rejected_valid" and (why := refusal(response.status_code, message)):
            out.append((why, message))
            continue
        detail = message if kind in ("rejected_valid", "server_error") else f.title
        out.append((kind, f"{response.status_code} {detail}"[:300]))
    return out


def _message(response: requests.Response) -> str:
    try:
        return str(response.json().get("error", ""))
    except (ValueError, AttributeError):
        return response.text[:200]


def run_target(target: Target, base_url: str, examples: int, seed: int) -> list[Outcome]:
    """`examples` generated requests of `target`, each sent and judged (never raising: a
    failure is recorded and generation goes on, unshrunk)."""
    operation = target.operation
    mode = schemathesis.GenerationMode(target.mode)
    session = requests.Session()
    outcomes: list[Outcome] = []

    @hypothesis.seed(seed)
    @hypothesis.settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=list(hypothesis.HealthCheck),
        phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
    )
    @hypothesis.given(case=operation.as_strategy(generation_mode=mode, path_parameters=target.pins))
    def fuzz(case: Any) -> None:
        try:
            response = case.call(base_url=base_url, session=session, timeout=60)
        except requests.RequestException as exc:  # a crash or a hang is a server error
            outcomes.append(Outcome(None, [("server_error", f"no answer: {exc}"[:300])]))
            return
        outcomes.append(Outcome(response.status_code, judge(case, response), _request(case)))

    fuzz()
    return outcomes


def _request(case: Any) -> str:
    body = "" if case.body is schemathesis.core.NOT_SET else repr(case.body)[:300]
    return f"{case.method} {case.formatted_path} {body}".strip()


def tally(outcomes: list[tuple[Target, list[Outcome]]]) -> dict[str, Any]:
    """Requests, statuses and findings by kind, with the first example of each distinct one."""
    statuses: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    examples: dict[tuple[str, str, str], dict[str, Any]] = {}
    for target, found in outcomes:
        for outcome in found:
            statuses[str(outcome.status)] += 1
            for kind, detail in outcome.findings:
                kinds[kind] += 1
                # digits and quoted values vary between examples of one finding
                key = (kind, target.label, re.sub(r"'[^']*'|\d+", "_", detail)[:120])
                seen = examples.setdefault(
                    key, {"kind": kind, "operation": target.label, "mode": target.mode,
                          "detail": detail, "request": outcome.request, "count": 0},
                )  # fmt: skip
                seen["count"] += 1
    return {
        "requests": sum(statuses.values()),
        "operations": len({t.label for t, _ in outcomes}),
        "targets": len(outcomes),
        "statuses": dict(sorted(statuses.items())),
        "failures": {k: kinds.get(k, 0) for k in KINDS},
        "refused": {k: n for k, n in sorted(kinds.items()) if k not in KINDS},
        "examples": sorted(examples.values(), key=lambda e: (e["kind"], e["operation"])),
    }


def fuzz(
    base_url: str,
    examples: int,
    seed: int,
    progress: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    schema = load_schema(base_url)
    outcomes = []
    start = time.perf_counter()
    for target in targets(schema, model_versions(base_url)):
        found = run_target(target, base_url, examples, seed)
        outcomes.append((target, found))
        failed = sum(1 for o in found for k, _ in o.findings if k in KINDS)
        progress(f"{target.id}: {len(found)} requests, {failed} failures")
    return {**tally(outcomes), "seconds": round(time.perf_counter() - start, 1)}


def markdown(result: dict[str, Any]) -> str:
    runs = result["runs"]
    names = list(runs)
    lines = [
        "# Schema fuzzing (schemathesis) against the live server",
        "",
        f"`{result['command']}`: {result['examples']} examples per operation and mode, "
        f"seed {result['seed']}, schemathesis {result['schemathesis']}, on {result['cpu']}. "
        "Tiny packages: " + ", ".join(f"{n} ({t})" for n, t in MODELS.items()) + "; server "
        "flags `" + " ".join(SERVER_FLAGS) + "`.",
        "",
        "| | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
        "| requests | " + " | ".join(str(runs[n]["requests"]) for n in names) + " |",
        "| operations (targets) | "
        + " | ".join(f"{runs[n]['operations']} ({runs[n]['targets']})" for n in names)
        + " |",
        "| statuses | " + " | ".join(_statuses(runs[n]["statuses"]) for n in names) + " |",
        "| seconds | " + " | ".join(str(runs[n]["seconds"]) for n in names) + " |",
    ]
    for kind, what in KINDS.items():
        counts = " | ".join(str(runs[n]["failures"][kind]) for n in names)
        lines.append(f"| **{kind}**: {what} | {counts} |")
    for why in sorted({w for n in names for w in runs[n]["refused"]}):
        counts = " | ".join(str(runs[n]["refused"].get(why, 0)) for n in names)
        lines.append(f"| admitted, refused by {why} | {counts} |")
    for n in names:
        found = [e for e in runs[n]["examples"] if e["kind"] in KINDS]
        lines += ["", f"## {n}: failures, one example each ({len(found)} distinct)", ""]
        if not found:
            lines.append("None.")
        for e in found:
            lines.append(
                f"- **{e['kind']}** x{e['count']}, `{e['operation']}` ({e['mode']}): "
                f"{_md(e['detail'])}; e.g. `{_md(e['request'])}`"
            )
    return "\n".join(lines) + "\n"


def _statuses(statuses: dict[str, int]) -> str:
    return ", ".join(f"{s}: {n}" for s, n in statuses.items())


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("`", "'").replace("\n", " ")[:240]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--examples", type=int, default=100, help="per operation and mode")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--root",
        action="append",
        metavar="LABEL=DIR",
        help="serve the checkout DIR as run LABEL, in order (default: now=. alone); e.g. "
        "before=/tmp/old (git archive of an older commit) then after=.",
    )
    parser.add_argument(
        "--models", type=Path, help="where the tiny packages go (default: a temp dir)"
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--tag", default="", help="suffix of the result files")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--check", action="store_true", help="exit 1 on any failure")
    cli = parser.parse_args(argv)
    roots = {
        label: Path(folder).resolve()
        for label, _, folder in (r.partition("=") for r in cli.root or ["now=."])
    }
    runs = {}
    with tempfile.TemporaryDirectory(prefix="fuzz-models-") as tmp:
        models = build_models(cli.models or Path(tmp) / "models")
        for name, root in roots.items():
            print(f"[fuzz] {name}: the server from {root}", flush=True)
            with live_server(models, root) as url:
                runs[name] = fuzz(
                    url, cli.examples, cli.seed, lambda s: print("  " + s, flush=True)
                )
            print(f"[fuzz] {name}: {runs[name]['requests']} requests, {runs[name]['failures']}")
    args = argv if argv is not None else sys.argv[1:]
    result = {
        "command": " ".join(["python -m benchmarks.fuzz", *args]),
        "examples": cli.examples,
        "seed": cli.seed,
        "schemathesis": schemathesis.__version__,
        "cpu": cpu_name(),
        "runs": runs,
    }
    text = markdown(result)
    print(text)
    if not cli.no_write:
        stem = "fuzz" + (f"-{cli.tag}" if cli.tag else "")
        print(f"[fuzz] wrote {write_results(cli.out, stem, result, text)}")
    last = runs[list(runs)[-1]]
    return 1 if cli.check and any(last["failures"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
