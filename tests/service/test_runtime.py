"""Provider and variant choice: decided from the session, not from what the wheel lists."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from heads.package import read_package, write_package
from heads.rows import ModelRow, pad
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
    return pad([ModelRow(np.array([2, 40, 41, 3]), np.zeros(4, dtype=np.int64))])


def test_choose_variant(package) -> None:
    assert choose_variant(package, "auto", "cpu") == "fp32"
    assert choose_variant(package, "auto", "gpu") == "int8"
    assert choose_variant(package, "int8", "cpu") == "int8"
    assert choose_variant(package, "fp16", "cpu") == "fp32"  # not in the package: its preference


def int8_package(folder: Path, make_package: Callable[..., Path], **agreement: Any) -> Any:
    """The classification stand-in whose package.json's int8 agreement is changed by
    `agreement` (a field set to None is removed; agreement=None removes the record)."""
    path = make_package(folder, "classification")
    manifest = json.loads((path / "package.json").read_text())
    int8 = manifest["parity"]["int8"]
    if agreement.pop("record", True) is None:
        del int8["agreement"]
    int8.get("agreement", {}).update(agreement)
    write_package(path, {k: v for k, v in manifest.items() if k not in ("sha256", "format")})
    return read_package(path)


def test_int8_below_its_gate_or_unmeasured_is_served_with_a_warning(
    tmp_path: Path, make_package: Callable[..., Path], caplog
) -> None:
    settings = Settings(device="cpu", variant="int8", intra_op_threads=1)
    cases = {
        "passed": ({"metrics": {"top1_agreement": 1.0}}, None),
        "below": ({"metrics": {"top1_agreement": 0.9}}, "top1_agreement 0.9 < 0.99"),
        "older": ({"record": None}, "no recorded agreement with fp32"),
    }
    for name, (agreement, warning) in cases.items():
        package = int8_package(tmp_path / name, make_package, **agreement)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="service.runtime"):
            _, variant = open_backend(package, settings)
        assert variant == "int8"
        if warning is None:
            assert not caplog.records, name
        else:
            assert "sst2: serving int8, but int8 " in caplog.text and warning in caplog.text, name
    # the recorded gate is not the last word: this code's own gate for the task applies too
    lenient = int8_package(
        tmp_path / "lenient", make_package,
        gate={"top1_agreement": 0.5}, metrics={"top1_agreement": 0.9}, passed=True,
    )  # fmt: skip
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="service.runtime"):
        open_backend(lenient, settings)
    assert "top1_agreement 0.9 < 0.99" in caplog.text


def test_an_int8_the_export_left_out_says_why(tmp_path: Path, make_package, caplog) -> None:
    path = make_package(tmp_path, "classification", variants={"fp32": "model.onnx"})
    manifest = json.loads((path / "package.json").read_text())
    manifest["parity"]["int8"] = {"written": False, "reason": "no int8 choice met the gate"}
    (path / "model.int8.onnx").unlink()
    write_package(path, {k: v for k, v in manifest.items() if k not in ("sha256", "format")})
    with caplog.at_level(logging.WARNING, logger="service.runtime"):
        assert choose_variant(read_package(path), "int8", "cpu") == "fp32"
    assert "the export left it out: no int8 choice met the gate" in caplog.text


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


def test_cuda_sessions_leave_out_cudnn_attention_unless_ort_is_told(monkeypatch) -> None:
    # cuDNN's flash attention builds a graph per new shape (39 ms each on an H200): every
    # other attention kernel stays allowed, and ORT's own switch, when set, decides instead.
    monkeypatch.delenv(runtime.CUDNN_ATTENTION_ENV, raising=False)
    name, options = runtime.cuda_provider()
    kernels = int(options["sdpa_kernel"])
    assert name == runtime.CUDA
    assert kernels & 8 == 0  # cuDNN flash attention
    assert kernels & (1 | 2 | 4 | 16) == 1 | 2 | 4 | 16  # flash, memory-efficient, TRT, unfused
    monkeypatch.setenv(runtime.CUDNN_ATTENTION_ENV, "1")
    assert runtime.cuda_provider() == (runtime.CUDA, {})


def test_cpu_sessions_do_not_fuse_skip_layer_norms_back(tmp_path, monkeypatch) -> None:
    # training.export splits SkipLayerNormalization for the CPU (its CPU kernel is 4-5x slower
    # than Add + LayerNormalization); ORT's session-level fusion would undo that on a graph of
    # fixed shapes like this one.
    h, hidden = onnx.helper, 16
    weights = [
        h.make_tensor(name, onnx.TensorProto.FLOAT, [hidden], np.full(hidden, value))
        for name, value in (("gamma", 1.0), ("beta", 0.0))
    ]
    nodes = [
        h.make_node("Add", ["x", "skip"], ["sum"]),
        h.make_node("LayerNormalization", ["sum", "gamma", "beta"], ["y"], axis=-1),
    ]
    value = [h.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [2, 4, hidden]) for n in "xy"]
    skip = h.make_tensor_value_info("skip", onnx.TensorProto.FLOAT, [2, 4, hidden])
    graph = h.make_graph(nodes, "g", [value[0], skip], [value[1]], weights)
    path = tmp_path / "model.onnx"
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 18)]), str(path))
    optimized = tmp_path / "optimized.onnx"
    real = ort.InferenceSession

    def saving_its_graph(model: str, sess_options: ort.SessionOptions, **kwargs):
        sess_options.optimized_model_filepath = str(optimized)
        return real(model, sess_options=sess_options, **kwargs)

    def fused_ops() -> set[str]:
        return {n.op_type for n in onnx.load(str(optimized)).graph.node}

    monkeypatch.setattr(ort, "InferenceSession", saving_its_graph)
    runtime.OrtBackend(path, [runtime.CPU], intra_op_threads=1)
    assert "SkipLayerNormalization" not in fused_ops()
    assert "LayerNormalization" in fused_ops()
    options = ort.SessionOptions()  # the same session without the service's choice fuses it
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    saving_its_graph(str(path), options, providers=[runtime.CPU])
    assert "SkipLayerNormalization" in fused_ops()


def test_device_cuda_without_cuda_fails_the_package(package) -> None:
    if runtime.CUDA in ort.get_available_providers():
        pytest.skip("this onnxruntime has CUDA")
    with pytest.raises(RuntimeError, match="no CUDAExecutionProvider"):
        open_backend(package, Settings(device="cuda"))


def test_warm_up_refuses_non_finite_outputs() -> None:
    class NaNs:
        provider = "cpu"
        lanes = 1

        def run(self, feeds, alone=True, wants=frozenset()):
            return {"logits": np.array([[np.nan, 0.0]], dtype=np.float32)}

    with pytest.raises(RuntimeError, match="not finite"):
        warm_up(NaNs(), feeds())


def test_lanes_open_a_second_session_that_answers_the_same(package) -> None:
    path = package.variant_path("fp32")
    backend = runtime.OrtBackend(path, [runtime.CPU], 2, False, lanes=2, lane_threads=1)
    assert backend.lanes == 2
    wide, lane = backend.run(feeds(), alone=True), backend.run(feeds(), alone=False)
    np.testing.assert_allclose(wide["logits"], lane["logits"], rtol=1e-5, atol=1e-6)
    assert backend._lane_session is not backend.session
    assert backend._lane_session.get_session_options().intra_op_num_threads == 1
    single = runtime.OrtBackend(path, [runtime.CPU], 2, False)
    assert single.lanes == 1 and single._lane_session is single.session


def test_cpu_lanes_split_the_thread_budget(monkeypatch) -> None:
    monkeypatch.setattr(runtime.os, "sched_getaffinity", lambda pid: set(range(8)))
    assert runtime.cpu_lanes(Settings()) == (8, 1)  # one per core, a thread each
    assert runtime.cpu_lanes(Settings(concurrent_batches=1)) == (1, 8)  # one session
    assert runtime.cpu_lanes(Settings(concurrent_batches=4)) == (4, 2)
    assert runtime.cpu_lanes(Settings(intra_op_threads=2)) == (2, 1)  # --workers' share
    assert runtime.cpu_lanes(Settings(intra_op_threads=1)) == (1, 1)


def test_open_backend_gives_a_cpu_model_its_lanes(package) -> None:
    backend, _ = open_backend(package, Settings(device="cpu", concurrent_batches=2))
    assert backend.lanes == 2
    backend, _ = open_backend(package, Settings(device="cpu", concurrent_batches=1))
    assert backend.lanes == 1
