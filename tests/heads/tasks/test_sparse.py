"""heads.tasks.sparse: a SPLADE package's vectors as their non-zero entries, sorted by index,
equal to the formula on transformers' masked-LM logits (through the exported package, tiny
random BertForMaskedLM and RobertaForMaskedLM folders, tests/families.py)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from heads.package import ModelPackage, read_package
from heads.rows import InvalidInput, load_package_tokenizer
from heads.tasks import sparse
from tests.families import family_checkpoint, family_package
from tests.heads.tasks.served import run_job

SEED = 5  # tests/training/test_masked_lm.py's: one export per family for both
TOL = 1e-4  # ONNX Runtime against PyTorch, as the exporter's parity
TEXTS = ["A cat sat on the mat.", "Paris is the capital of France, and a big city.", "film"]


def package(family: str) -> ModelPackage:
    return read_package(family_package(family, "embedding", seed=SEED, pooling="splade"))


def formula(family: str, texts: list[str]) -> np.ndarray:
    """(N, V): max over the real tokens of log(1 + relu(logits)), transformers' logits, each
    text alone."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    folder = family_checkpoint(family, "masked-lm", seed=SEED)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForMaskedLM.from_pretrained(folder).eval()
    rows = []
    for text in texts:
        with torch.inference_mode():
            logits = model(**tokenizer(text, return_tensors="pt")).logits[0]  # (T, V)
        rows.append(torch.log1p(torch.relu(logits)).max(dim=0).values.numpy())
    return np.stack(rows)


def test_postprocess_keeps_the_non_zero_entries_by_index() -> None:
    vectors = np.array([[0.0, 1.5, 0.0, 0.25], [0.0, 0.0, 0.0, 0.0], [2.0, 0.0, 0.0, 1.0]])
    assert sparse.postprocess(vectors) == [
        [{"index": 1, "value": 1.5}, {"index": 3, "value": 0.25}],
        [],
        [{"index": 0, "value": 2.0}, {"index": 3, "value": 1.0}],
    ]
    tokenizer = load_package_tokenizer(package("bert").tokenizer_path)
    [named] = sparse.postprocess(vectors[:1], tokenizer)
    assert [e["token"] for e in named] == [tokenizer.id_to_token(1), tokenizer.id_to_token(3)]
    with pytest.raises(ValueError, match="must be \\(N, V\\)"):
        sparse.postprocess(vectors[0])
    # the values are float32's, whatever the graph's output type
    [[entry]] = sparse.postprocess(np.array([[0.0, 0.1]]))
    assert entry["value"] == float(np.float32(0.1)) != 0.1


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_the_served_answer_is_the_formula(family: str) -> None:
    pkg = package(family)
    want = formula(family, TEXTS)
    answers = run_job(pkg, sparse.Job(pkg, TEXTS))  # one padded batch
    tokenizer = load_package_tokenizer(pkg.tokenizer_path)
    for entries, row in zip(answers, want, strict=True):
        indices = [e["index"] for e in entries]
        assert indices == np.flatnonzero(row).tolist()  # the same non-zero entries, by index
        values = np.array([e["value"] for e in entries])
        assert np.abs(values - row[indices]).max() <= TOL
        assert all(e["value"] > 0 for e in entries) and 0 < len(entries) < len(row)
    named = run_job(pkg, sparse.Job(pkg, TEXTS[:1], sparse.Options(return_tokens=True)))[0]
    assert [e["token"] for e in named] == [tokenizer.id_to_token(e["index"]) for e in named]
    # alone, not in the padded batch: the same entries, values to float rounding
    assert [e["index"] for e in named] == [e["index"] for e in answers[0]]
    values = np.array([[e["value"] for e in named], [e["value"] for e in answers[0]]])
    assert np.abs(values[0] - values[1]).max() <= TOL


def test_several_jobs_answer_as_each_alone() -> None:
    pkg = package("bert")
    tokenizer = load_package_tokenizer(pkg.tokenizer_path)
    jobs = [
        sparse.Job(pkg, TEXTS[:2], sparse.Options(return_tokens=True)),
        sparse.Job(pkg, TEXTS[2:]),
    ]
    rng = np.random.default_rng(0)
    outputs = []
    for job in jobs:
        rows = job.rows(tokenizer, tokenizer.encode_batch(job.texts, add_special_tokens=False))
        vectors = np.maximum(rng.normal(size=(len(rows), 40)), 0).astype(np.float32)
        outputs.append([{"embeddings": v} for v in vectors])
    together = sparse.Job.answer_many(jobs, outputs)
    assert together == [job.answer(outs) for job, outs in zip(jobs, outputs, strict=True)]
    assert "token" in together[0][0][0] and "token" not in together[1][0][0]
    # a third job: its rows start after both others' (each job's rows found by offset)
    third = sparse.Job(
        dataclasses.replace(pkg, prompts={"q": "query: "}),
        ["film", "a cat"],
        sparse.Options(prompt_name="q"),
    )
    assert third.texts == ["query: film", "query: a cat"]
    third.rows(tokenizer, tokenizer.encode_batch(third.texts, add_special_tokens=False))
    vectors = np.maximum(rng.normal(size=(2, 40)), 0).astype(np.float32)
    outputs.append([{"embeddings": v} for v in vectors])
    jobs.append(third)
    assert sparse.Job.answer_many(jobs, outputs)[2] == third.answer(outputs[2])
    assert jobs[0].tokens == sum(len(tokenizer.encode(t).ids) for t in TEXTS[:2])


def test_a_dense_package_and_bad_inputs_are_refused() -> None:
    pkg = package("bert")
    with pytest.raises(InvalidInput) as dense:
        sparse.Job(dataclasses.replace(pkg, pooling="mean"), TEXTS)
    assert str(dense.value) == (
        f"model {pkg.name!r} answers dense embeddings (pooling mean), not sparse ones"
    )
    with pytest.raises(InvalidInput, match=r"inputs\[1\]: expected a string"):
        sparse.Job(pkg, ["a", 3])  # type: ignore[list-item]
    long_text = "the cat sat on the mat " * 40
    with pytest.raises(InvalidInput, match="more than max_seq_length"):
        run_job(pkg, sparse.Job(pkg, [long_text], sparse.Options(truncate=False)))
    job = sparse.Job(pkg, [long_text])
    run_job(pkg, job)
    assert job.truncated == 1


def test_layer_features_are_not_pooled_sparsely(tmp_path) -> None:
    from benchmarks.tiny import build_tiny_package
    from heads.tasks import embed

    dense = build_tiny_package(tmp_path / "layers", "embedding", hidden_states=True)
    assert not dense.sparse
    with pytest.raises(InvalidInput, match="pooling 'splade': the hidden states are pooled"):
        embed.features(dense, [-1], "splade")
