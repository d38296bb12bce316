"""heads.tasks.embed_all on dense embedding packages: the jobs behind /embed_all run as the
batcher runs them (served.py) on tiny exported family folders, against transformers'
`last_hidden_state` of the same folder on the same ids: every token's vector, [CLS] and [SEP]
included (TEI's answer); raw unless `normalize`; each vector's token as /tokenize names it,
offsets into the input (less a prompt's); truncation from either end counted, or refused; a
sparse package and a package exported without the output refused, each saying what to do."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from heads.package import read_package, write_package
from heads.rows import InvalidInput
from heads.tasks import embed_all, tokenize
from tests.families import family_checkpoint, family_package
from tests.heads.tasks.served import run_job

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

FAMILIES = ("bert", "roberta")
TEXTS = ["Hello  world, café!", "Paris is in France.", ""]
TOL = 1e-5


def reference(family: str) -> tuple[Any, Any]:
    folder = family_checkpoint(family, "embedding")
    model = transformers.AutoModel.from_pretrained(folder)
    return transformers.AutoTokenizer.from_pretrained(folder), model.eval()


def hidden(model: Any, ids: list[int]) -> np.ndarray:
    with torch.inference_mode():
        return model(torch.tensor([ids])).last_hidden_state[0].numpy()


@pytest.mark.parametrize("family", FAMILIES)
def test_every_tokens_last_hidden_state_as_transformers_computes_it(family: str):
    package = read_package(family_package(family, "embedding"))
    hf, model = reference(family)
    answer = run_job(package, embed_all.Options().job(package, TEXTS))
    assert len(answer) == len(TEXTS)
    for text, vectors in zip(TEXTS, answer, strict=True):
        ids = hf(text)["input_ids"]  # with [CLS] / <s> and [SEP] / </s>, as TEI answers
        want = hidden(model, ids)
        assert vectors.shape == want.shape and vectors.dtype == np.float32
        assert np.abs(vectors - want).max() <= TOL, text


def test_normalize_gives_unit_vectors_in_the_same_directions():
    package = read_package(family_package("bert", "embedding"))
    raw = run_job(package, embed_all.Options().job(package, TEXTS[:2]))
    unit = run_job(package, embed_all.Options(normalize=True).job(package, TEXTS[:2]))
    for r, u in zip(raw, unit, strict=True):
        assert np.allclose(np.linalg.norm(u, axis=1), 1, atol=1e-6)
        assert np.abs(u - r / np.linalg.norm(r, axis=1, keepdims=True)).max() <= TOL


@pytest.mark.parametrize("family", FAMILIES)
def test_tokens_are_named_as_tokenize_names_them(family: str):
    package = read_package(family_package(family, "embedding"))
    answer = run_job(package, embed_all.Options(return_tokens=True).job(package, TEXTS))
    named = run_job(package, tokenize.TokenizeOptions().job(package, TEXTS))
    for item, tokens in zip(answer, named, strict=True):
        assert item["tokens"] == tokens  # ids, texts, special, character offsets
        assert len(item["embeddings"]) == len(tokens)


def test_a_prompts_tokens_carry_no_offsets_and_the_inputs_count_from_its_start(tmp_path: Path):
    folder = tmp_path / "prompted"
    manifest = json.loads((family_package("bert", "embedding") / "package.json").read_text())
    for f in manifest["sha256"]:
        (folder / f).parent.mkdir(parents=True, exist_ok=True)
        (folder / f).write_bytes((family_package("bert", "embedding") / f).read_bytes())
    manifest |= {"prompts": {"query": "query: "}, "default_prompt_name": None}
    write_package(folder, {k: v for k, v in manifest.items() if k not in ("sha256", "format")})
    package = read_package(folder)
    hf, model = reference("bert")
    options = embed_all.Options(return_tokens=True, prompt_name="query")
    [item] = run_job(package, options.job(package, ["Paris is big"]))
    ids = hf("query: Paris is big")["input_ids"]
    assert np.abs(item["embeddings"] - hidden(model, ids)).max() <= TOL
    text = [t for t in item["tokens"] if t["start"] is not None]
    spans = hf("query: Paris is big", add_special_tokens=False, return_offsets_mapping=True)
    n = len("query: ")
    want = [("Paris is big"[a - n : b - n], a - n, b - n)
            for a, b in spans["offset_mapping"] if a >= n]  # fmt: skip
    assert [(t["text"], t["start"], t["stop"]) for t in text] == want
    prompt = [t for t in item["tokens"] if not t["special"] and t["start"] is None]
    assert "".join(t["text"] for t in prompt).startswith("query")


@pytest.mark.parametrize("direction", ["right", "left"])
def test_a_long_input_is_cut_from_the_asked_end_and_counted(direction: str):
    package = read_package(family_package("bert", "embedding", max_seq_length=8))
    hf, model = reference("bert")
    text = "one two three four five six seven eight nine ten"
    options = embed_all.Options(return_tokens=True, truncation_direction=direction)
    job = options.job(package, [text, "short"])
    [long_, short] = run_job(package, job)
    body = hf(text, add_special_tokens=False)["input_ids"]
    kept = body[:6] if direction == "right" else body[-6:]
    ids = [hf.cls_token_id, *kept, hf.sep_token_id]
    assert np.abs(long_["embeddings"] - hidden(model, ids)).max() <= TOL
    body_tokens = [t for t in long_["tokens"] if not t["special"]]
    assert [t["id"] for t in body_tokens] == kept
    spans = hf(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    want = spans[:6] if direction == "right" else spans[-6:]  # offsets into the whole input
    assert [(t["start"], t["stop"]) for t in body_tokens] == [tuple(s) for s in want]
    assert job.truncated == 1 and len(short["embeddings"]) == len(hf("short")["input_ids"])


def test_truncate_false_refuses_a_long_input():
    package = read_package(family_package("bert", "embedding", max_seq_length=8))
    job = embed_all.Options(truncate=False).job(package, ["one two three four five six seven"])
    with pytest.raises(InvalidInput, match="max_seq_length 8"):
        run_job(package, job)


def test_a_sparse_package_is_refused_with_its_endpoint():
    package = read_package(family_package("bert", "embedding", pooling="splade"))
    with pytest.raises(InvalidInput, match="/embed_sparse"):
        embed_all.Options().job(package, ["a"])


def test_a_package_without_the_output_says_to_export_it_again(tmp_path: Path):
    source = family_package("bert", "embedding")
    manifest = json.loads((source / "package.json").read_text())
    folder = tmp_path / "old"
    folder.mkdir()
    for f in manifest["sha256"]:
        (folder / f).write_bytes((source / f).read_bytes())
    manifest["outputs"] = [o for o in manifest["outputs"] if o["name"] != "token_embeddings"]
    write_package(folder, {k: v for k, v in manifest.items() if k not in ("sha256", "format")})
    with pytest.raises(InvalidInput, match="export it again"):
        embed_all.Options().job(read_package(folder), ["a"])
