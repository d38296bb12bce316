"""/embed and /v1/embeddings `windows` over HTTP, on the service tests' tiny embedding package
(a window of 64 tokens) in real ONNX Runtime: a long input's vector is the one heads.tasks.embed
answers by windows (pooled there, checked against windows run alone in
tests/heads/tasks/test_embed_windows.py), an input that fits is unchanged, OpenAI's usage
counts every window's tokens, the windowed counter counts the input, and a prompt that leaves
no room for text is a 422 that says what to change."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from heads.package import read_package
from heads.tasks import embed
from service.settings import Settings
from tests.heads.tasks.served import run_job
from tests.service.conftest import MAX_SEQ_LENGTH, Service, metric, serve

pytestmark = pytest.mark.anyio

LONG = "john lives in paris and mary works in rome " * 15  # 195 tokens: 4 windows of 64
SHORT = "the film was good"
PROMPTS = {"query": "query: ", "long": "represent this sentence for searching passages: " * 3}
TOL = 1e-5
LABELS = {"model": "minilm", "task": "embedding"}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory, make_package: Callable[..., Path]) -> Path:
    root = tmp_path_factory.mktemp("windows") / "models"
    make_package(root, "embedding", prompts=PROMPTS)
    return root


@pytest.fixture(scope="module")
async def served(models: Path) -> AsyncIterator[Service]:
    async with serve(Settings(model_dir=models)) as s:
        yield s


async def post(served: Service, path: str, body: dict[str, Any], status: int = 200) -> Any:
    response = await served.client.post(path, json=body)
    assert response.status_code == status, response.text
    return response.json()


def by_windows(models: Path, texts: list[str], **options: Any) -> tuple[embed.Job, Any]:
    """heads.tasks.embed's job for `texts` with windows, run on the package outside the
    service, and its answer."""
    package = read_package(models / "minilm")
    assert package.max_seq_length == MAX_SEQ_LENGTH
    job = embed.Job(package, texts, embed.Options(windows=True, **options))
    return job, run_job(package, job)


async def test_embed_by_windows_is_the_heads_answer(served: Service, models: Path) -> None:
    got = np.array(await post(served, "/embed", {"inputs": [SHORT, LONG], "windows": True}))
    job, want = by_windows(models, [SHORT, LONG])
    assert job.windowed == 1 and len(job.weights) == 5  # the short text's row and 4 windows
    np.testing.assert_allclose(got, want, atol=TOL)
    truncated = np.array(await post(served, "/embed", {"inputs": [SHORT, LONG]}))
    np.testing.assert_allclose(got[0], truncated[0], atol=TOL)  # a text that fits: unchanged
    assert float(got[1] @ truncated[1]) < 1 - 1e-3  # the long one: read whole now
    # with a prompt in every window, and Matryoshka's first values normalised after pooling
    body = {"inputs": LONG, "windows": True, "prompt_name": "query", "dimensions": 8}
    _, prompted = by_windows(models, [LONG], prompt_name="query", dimensions=8)
    np.testing.assert_allclose(await post(served, "/embed", body), prompted, atol=TOL)


async def test_openai_usage_counts_every_windows_tokens(served: Service, models: Path) -> None:
    body = {"input": [SHORT, LONG], "model": "minilm"}
    plain = await post(served, "/v1/embeddings", body)
    windowed = await post(served, "/v1/embeddings", {**body, "windows": True})
    job, want = by_windows(models, [SHORT, LONG])
    vectors = np.array([d["embedding"] for d in windowed["data"]])
    np.testing.assert_allclose(vectors, want, atol=TOL)
    assert windowed["usage"] == {"prompt_tokens": job.tokens, "total_tokens": job.tokens}
    # [CLS] short [SEP] + the long text cut to the window, against + 4 windows of it
    assert plain["usage"]["prompt_tokens"] == 6 + MAX_SEQ_LENGTH
    assert job.tokens == 6 + 3 * MAX_SEQ_LENGTH + (195 - 3 * 55 + 2)


async def test_the_counters_say_windowed_not_truncated(served: Service) -> None:
    before = await served.metrics()
    await post(served, "/embed", {"inputs": [SHORT, LONG, LONG], "windows": True})
    after = await served.metrics()

    def grew(name: str) -> float:
        def read(text: str) -> float:
            try:
                return metric(text, f"bert_heads_{name}_total", **LABELS)
            except KeyError:  # not yet counted
                return 0.0

        return read(after) - read(before)

    assert (grew("inputs_windowed"), grew("inputs_truncated")) == (2, 0)


async def test_a_prompt_that_fills_the_window_is_a_422(served: Service) -> None:
    body = {"inputs": [SHORT, LONG], "windows": True, "prompt_name": "long"}
    error = await post(served, "/embed", body, 422)
    assert error["error"] == (
        "inputs[0]: its prompt is 90 tokens, which leaves no room for text in model 'minilm''s "
        "window of 64 tokens, so it cannot be embedded by windows; use a shorter prompt "
        "(prompt_name) or leave windows off to truncate it"
    )
    assert "windows" in (await post(served, "/embed", {"inputs": "x", "windows": 1}, 422))["error"]
