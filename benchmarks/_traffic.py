"""Traffic for benchmarks/soak.py and the service's load tests: a mix of valid requests over
every inference endpoint, the comparison of an answer under load with its sequential reference,
and percentiles. It lives on the benchmarks side so that tests import benchmarks, never the
other way round.

The requests name no model, so they run against any model_dir with one package per task (the
tiny test packages or real ones).
"""

from __future__ import annotations

import math
from typing import Any

TEXTS = [
    "the film was good",
    "john lives in paris and mary lives in london",
    "a terrible boring movie with a bad ending",
    "peter played for the team in rome last season",
    "what a wonderful story",
    "the company said its price was too high",
]
CONTEXT = "john lives in paris. mary works for google in london. the river runs north to the sea."

# (method, path, JSON body or None): every inference endpoint, single and batched forms.
INFERENCE: list[tuple[str, str, Any]] = [
    ("POST", "/classify", {"inputs": TEXTS[0], "top_k": None}),
    ("POST", "/classify", {"inputs": TEXTS[1:4], "top_k": None}),
    ("POST", "/classify", {"inputs": [[TEXTS[0], TEXTS[4]]], "top_k": None}),
    ("POST", "/ner", {"inputs": TEXTS[1]}),
    ("POST", "/ner", {"inputs": TEXTS[2:5], "aggregation_strategy": "none", "ignore_labels": []}),
    ("POST", "/qa", {"question": "where does john live?", "context": CONTEXT}),
    (
        "POST",
        "/qa",
        {
            "inputs": [
                {"question": "who works for google?", "context": CONTEXT},
                {"question": "where does the river run?", "context": CONTEXT},
            ],
            "top_k": 2,
        },
    ),
    ("POST", "/embed", {"inputs": TEXTS[5]}),
    ("POST", "/embed", {"inputs": TEXTS[:4], "normalize": False}),
    ("POST", "/v1/embeddings", {"input": TEXTS[2:6]}),
]
PROBES: list[tuple[str, str, Any]] = [
    ("GET", "/health", None),
    ("GET", "/ready", None),
    ("GET", "/models", None),
    ("GET", "/metrics", None),
]


def assert_same(actual: Any, expected: Any, tol: float = 1e-4, where: str = "answer") -> None:
    """`actual` equals `expected` but for float noise (batched and single forward passes differ
    in the last bits). Label lists compare by label: near-equal scores may swap places."""
    if _is_label_list(actual) and _is_label_list(expected):
        actual = {x["label"]: x["score"] for x in actual}
        expected = {x["label"]: x["score"] for x in expected}
    if isinstance(expected, dict):
        assert isinstance(actual, dict) and actual.keys() == expected.keys(), f"{where}: keys"
        for key in expected:
            assert_same(actual[key], expected[key], tol, f"{where}.{key}")
    elif isinstance(expected, list):
        assert isinstance(actual, list) and len(actual) == len(expected), f"{where}: length"
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_same(a, e, tol, f"{where}[{i}]")
    elif isinstance(expected, float):
        assert isinstance(actual, int | float), f"{where}: {actual!r} is not a number"
        assert math.isclose(actual, expected, abs_tol=tol), f"{where}: {actual} != {expected}"
    else:
        assert actual == expected, f"{where}: {actual!r} != {expected!r}"


def _is_label_list(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(x, dict) and x.keys() == {"label", "score"} for x in value)
    )


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) by nearest rank; nan for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]
