"""The import graph, read from the source (AST, every import statement, also those inside
functions): no cycle among the project's modules, and imports only go one way between packages:

    heads       <- what training and serving share (contract, rows, packages, the heads' pre- and
                   post-processing): numpy and tokenizers only
    training    -> heads                      (never service; training.families and
                                               training.blocks import no other training module:
                                               training.config and training.model import them)
    service     -> heads                      (never training, never torch)
    demo        -> training, service, heads   (the quickstart's data, default models, checks)
    benchmarks  -> anything but tests
    tests       -> anything
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

PACKAGES = ("heads", "service", "training", "demo", "benchmarks", "tests")
ALLOWED = {  # package -> the project packages it may import
    "heads": set(),
    "training": {"heads"},
    "service": {"heads"},
    "demo": {"heads", "training", "service"},
    "benchmarks": {"heads", "training", "service", "demo"},
    "tests": set(PACKAGES),
}
HEADS_THIRD_PARTY = {"numpy", "tokenizers"}


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def imports(path: Path) -> set[str]:
    """Every module name an import statement in `path` names (absolute imports only)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names |= {f"{node.module}.{alias.name}" for alias in node.names} | {node.module}
    return names


def graph() -> dict[str, set[str]]:
    """module -> the project modules it imports (a name resolves to the longest module it
    starts with: `from heads.rows import pad` -> heads.rows)."""
    known = modules()
    edges: dict[str, set[str]] = {}
    for name, path in known.items():
        targets = set()
        for imported in imports(path):
            parts = imported.split(".")
            for n in range(len(parts), 0, -1):
                candidate = ".".join(parts[:n])
                if candidate in known:
                    targets.add(candidate)
                    break
        edges[name] = targets - {name}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    assert cycles(graph()) == []


def test_packages_import_only_downward():
    wrong = [
        f"{module} imports {target}"
        for module, targets in graph().items()
        for target in targets
        if target.split(".")[0] not in ALLOWED[module.split(".")[0]] | {module.split(".")[0]}
    ]
    assert wrong == []


def test_the_families_import_only_blocks_and_each_other():
    edges = graph()
    inside = ("training.families", "training.blocks")
    for name, targets in edges.items():
        if name.startswith(inside):
            outside = {t for t in targets if t.startswith("training") and not t.startswith(inside)}
            assert not outside, f"{name} imports {sorted(outside)}"
        if name.startswith("training.families."):  # a family module: torch, not transformers
            assert not any(i.startswith("transformers") for i in imports(modules()[name])), name


def test_heads_imports_only_numpy_and_tokenizers():
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    for name, path in modules().items():
        if name.split(".")[0] != "heads":
            continue
        for imported in imports(path):
            top = imported.split(".")[0]
            assert top in stdlib | HEADS_THIRD_PARTY | {"heads"}, f"{name} imports {imported}"


@pytest.mark.parametrize(
    ("module", "absent"),
    [
        (
            "training.finetune",
            ["service", "fastapi", "uvicorn", "onnxruntime", "prometheus_client"],
        ),
        ("service.app", ["torch", "training"]),
        ("heads.tasks.qa", ["torch", "onnxruntime", "fastapi", "service", "training"]),
    ],
)
def test_importing_loads_only_its_side(module: str, absent: list[str]):
    code = (
        f"import sys, {module}; print(' '.join(sorted({{m.split('.')[0] for m in sys.modules}})))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    loaded = set(done.stdout.split())
    assert not loaded & set(absent), f"import {module} loads {sorted(loaded & set(absent))}"
