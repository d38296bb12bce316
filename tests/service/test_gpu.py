"""The CUDA path, on a lent GPU machine only (marker gpu; CI never runs it): the session says
CUDA, each variant answers as the CPU's fp32 does, and the service reports the device."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from heads.package import read_package
from heads.rows import ModelRow, pad
from service import runtime
from service.runtime import open_backend, warm_up
from service.settings import Settings

pytestmark = [pytest.mark.gpu, pytest.mark.anyio]

# fp16 weights and activations: a tiny random model's logits agree to about 1e-3.
TOLERANCE = {"fp32": 1e-4, "fp16": 2e-2}


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory):
    from benchmarks import tiny

    folder = tmp_path_factory.mktemp("gpu") / "sst2"
    tiny.build_tiny_package(folder, "classification", variants=("fp32", "fp16"), name="sst2")
    return read_package(folder)


def batch() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    rows = [
        ModelRow(np.concatenate([[2], rng.integers(5, 90, n), [3]]), np.zeros(n + 2, np.int64))
        for n in (3, 17, 60)
    ]
    return pad(rows)


@pytest.mark.parametrize("variant", ["fp32", "fp16"])
def test_cuda_session_answers_as_the_cpu_does(package, variant: str) -> None:
    cpu, _ = open_backend(package, Settings(device="cpu", variant="fp32"))
    gpu, chosen = open_backend(package, Settings(device="cuda", variant=variant))
    assert (gpu.provider, chosen) == ("cuda", variant)
    assert gpu.session.get_providers()[0] == runtime.CUDA
    options = gpu.session.get_provider_options()[runtime.CUDA]
    assert options["sdpa_kernel"] == str(runtime.CUDA_ATTENTION_KERNELS)  # no cuDNN attention
    feeds = batch()
    want = cpu.run(feeds)["logits"]
    got = warm_up(gpu, feeds)["logits"]
    assert got.dtype == np.float32  # fp16 outputs come back as float32
    np.testing.assert_allclose(got, want, atol=TOLERANCE[variant])


def test_auto_takes_the_gpu_and_its_preferred_variant(package) -> None:
    backend, variant = open_backend(package, Settings())
    assert backend.provider == "cuda"
    assert variant == package.prefer.get("gpu", "fp32")


async def test_service_reports_cuda(package, tmp_path: Path) -> None:
    from tests.service.conftest import serve

    async with serve(Settings(model_dir=package.path.parent, device="cuda")) as service:
        models = (await service.client.get("/models")).json()
        answer = await service.client.post("/classify", json={"inputs": ["a fine film"]})
    assert answer.status_code == 200, answer.text
    assert '"provider": "cuda"' in json.dumps(models), models
