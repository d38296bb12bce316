"""Provider and variant choice: decided from the session, not from what the wheel lists."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from heads.package import read_package
from heads.rows import Sequence, pad
from service import runtime
from service.runtime import choose_variant, open_backend, warm_up
from service.settings import Settings


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory, make_package: Callable[..., Path]):
    folder = make_package(
        tmp_path_factory.mktemp("runtime"), "classification", prefer={"cpu": "fp32", "gpu": "int8"}
    )
    return read_package(folder)


def feeds() -> dict[str, np.ndarray]:
    return pad([Sequence(np.array([2, 40, 41, 3]), np.zeros(4, dtype=np.int64))])


def test_choose_variant(package) -> None:
    assert choose_variant(package, "auto", "cpu") == "fp32"
    assert choose_variant(package, "auto", "gpu") == "int8"
    assert choose_variant(package, "int8", "cpu") == "int8"
    assert choose_variant(package, "fp16", "cpu") == "fp32"  # not in the package: its preference


def test_cpu_session_runs_and_says_so(package) -> None:
    backend, variant = open_backend(package, Settings(device="cpu", intra_op_threads=1))
    assert (backend.provider, variant) == ("cpu", "fp32")
    outputs = warm_up(backend, feeds())
    assert outputs["logits"].shape == (1, 2) and outputs["logits"].dtype == np.float32


@pytest.mark.parametrize("spinning", [True, False])
def test_threads_spin_inside_a_run_only_as_set(package, spinning: bool) -> None:
    backend, _ = open_backend(package, Settings(device="cpu", intra_op_spinning=spinning))
    options = backend.session.get_session_options()
    entry = options.get_session_config_entry
    assert entry("session.intra_op.allow_spinning") == ("1" if spinning else "0")
    assert entry("session.force_spinning_stop") == "1"  # never between batches
    assert Settings().intra_op_spinning  # the default: spin while a batch runs


@pytest.mark.filterwarnings("ignore:Specified provider")
def test_cuda_listed_but_unusable_falls_back_to_cpu_and_its_variant(package, monkeypatch) -> None:
    # The GPU wheel lists CUDA on machines without a GPU; the session then runs on CPU.
    monkeypatch.setattr(ort, "get_available_providers", lambda: [runtime.CUDA, runtime.CPU])
    backend, variant = open_backend(package, Settings())
    assert (backend.provider, variant) == ("cpu", "fp32")
    with pytest.raises(RuntimeError, match="device=cuda"):
        open_backend(package, Settings(device="cuda"))


def test_device_cuda_without_cuda_fails_the_package(package) -> None:
    if runtime.CUDA in ort.get_available_providers():
        pytest.skip("this onnxruntime has CUDA")
    with pytest.raises(RuntimeError, match="no CUDAExecutionProvider"):
        open_backend(package, Settings(device="cuda"))


def test_warm_up_refuses_non_finite_outputs() -> None:
    class NaNs:
        provider = "cpu"

        def run(self, feeds):
            return {"logits": np.array([[np.nan, 0.0]], dtype=np.float32)}

    with pytest.raises(RuntimeError, match="not finite"):
        warm_up(NaNs(), feeds())
