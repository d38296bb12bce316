"""heads.tasks.embed's `windows`: a text over the window is embedded as overlapping windows,
each `[CLS] prompt window [SEP]`, pooled by the mean of their vectors weighted by their text
tokens, then cut to `dimensions` and normalised once. Checked through exported tiny packages
in ONNX Runtime (tests/families.py) against windows cut here with transformers' own tokenizer
and each run alone; a text that fits gets the row and vector it gets without the option."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from heads.package import ModelPackage, read_package
from heads.rows import InvalidInput, ModelRow, Outputs, load_package_tokenizer
from heads.tasks import embed
from tests.families import family_checkpoint, family_package
from tests.heads.tasks.conftest import as_lists, refused, repo_ner_sentences
from tests.heads.tasks.served import run_job, run_rows

WINDOW = 32  # max_seq_length: the long text takes several windows of the tiny models
TOL = 1e-5
PROMPTS = {"query": "query: ", "long": "Represent this sentence for searching: " * 3}
SHORT = "the film was good"


@pytest.fixture(scope="module")
def long_text() -> str:
    """Repository sentences, several windows of WINDOW tokens in every family."""
    return " ".join(repo_ner_sentences(12))


def small(package: ModelPackage) -> ModelPackage:
    """The package with a window of WINDOW tokens and PROMPTS (the graph takes any length)."""
    return dataclasses.replace(package, max_seq_length=WINDOW, prompts=PROMPTS)


def package(family: str) -> ModelPackage:
    pytest.importorskip("torch")  # the exporter's
    return small(read_package(family_package(family, "embedding")))


@pytest.fixture(scope="module")
def layered(tmp_path_factory: pytest.TempPathFactory) -> ModelPackage:
    """The tiny BERT embedding model with every layer's pooled states (`--hidden-states`)."""
    pytest.importorskip("torch")
    from training.export import export_package

    out = tmp_path_factory.mktemp("windows") / "bert-layers"
    folder = family_checkpoint("bert", "embedding")
    return small(export_package(folder, "embedding", out, hidden_states=True, verbose=False))


def hf_tokenizer(package: ModelPackage) -> Any:
    """transformers' tokenizer of the checkpoint the package was exported from."""
    transformers = pytest.importorskip("transformers")
    family = package.name.split("-")[0]  # family_package's names, and `layered`'s
    return transformers.AutoTokenizer.from_pretrained(family_checkpoint(family, "embedding"))


def prompt_head(package: ModelPackage, prompt: str, text: str) -> int:
    """How many first tokens of `prompt + text` the prompt alone also starts with."""
    hf = hf_tokenizer(package)
    ids = hf(prompt + text, add_special_tokens=False)["input_ids"]
    alone = hf(prompt, add_special_tokens=False)["input_ids"] if prompt else []
    head = 0
    while head < min(len(alone), len(ids)) and alone[head] == ids[head]:
        head += 1
    return head


def reference_windows(package: ModelPackage, text: str, prompt: str = "") -> list[Any]:
    """[(row ids, text tokens)] of the text's windows, cut here with transformers' tokenizer:
    the prompt's tokens (those the prompt alone also starts with) first in every window, the
    text's in windows of the room left, each starting 7/8 of that room after the previous."""
    hf = hf_tokenizer(package)
    ids = hf(prompt + text, add_special_tokens=False)["input_ids"]
    head = prompt_head(package, prompt, text)
    room = package.max_seq_length - 2 - head
    body, step = ids[head:], room - room // 8
    cut, start = [], 0
    while True:
        cut.append(body[start : start + room])
        if start + room >= len(body):
            break
        start += step
    return [(hf.build_inputs_with_special_tokens(ids[:head] + w), len(w)) for w in cut]


def run_alone(package: ModelPackage, rows: list[list[int]]) -> list[Outputs]:
    """Each row through the graph in its own batch of one."""
    out = []
    for ids in rows:
        seq = ModelRow(np.asarray(ids, np.int64), np.zeros(len(ids), np.int64))
        out += run_rows(package, [seq])
    return out


def weighted(vectors: np.ndarray, weights: list[int]) -> np.ndarray:
    """(R, ...) -> (...): the mean weighted by `weights`, in float64."""
    w = np.asarray(weights, np.float64).reshape(-1, *([1] * (vectors.ndim - 1)))
    return (vectors.astype(np.float64) * w).sum(0) / w.sum()


def unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def made_rows(package: ModelPackage, job: embed.Job) -> list[ModelRow]:
    tokenizer = load_package_tokenizer(package.tokenizer_path)
    return job.rows(tokenizer, tokenizer.encode_batch(job.texts, add_special_tokens=False))


@pytest.mark.parametrize(
    ("family", "prompt_name"), [("bert", None), ("bert", "query"), ("roberta", "query")]
)
def test_a_long_text_is_the_token_weighted_mean_of_its_windows(
    family: str, prompt_name: str | None, long_text: str
) -> None:
    pkg = package(family)
    want = reference_windows(pkg, long_text, PROMPTS[prompt_name] if prompt_name else "")
    assert len(want) >= 3 and {len(r) for r, _ in want[:-1]} == {WINDOW}
    options = embed.Options(windows=True, prompt_name=prompt_name)
    job = embed.Job(pkg, [SHORT, long_text], options)
    rows = made_rows(pkg, job)
    assert as_lists(rows[1:]) == [r for r, _ in want]  # the rows cut here, prompt in each
    assert (job.windowed, job.truncated) == (1, 0)
    assert job.tokens == len(rows[0]) + sum(len(r) for r, _ in want)  # every window's tokens

    vectors = np.stack([o["embeddings"] for o in run_alone(pkg, [r for r, _ in want])])
    pooled = weighted(vectors, [n for _, n in want])
    got = run_job(pkg, embed.Job(pkg, [SHORT, long_text], options))  # one padded batch
    np.testing.assert_allclose(got[1], unit(pooled), atol=TOL)
    raw = run_job(pkg, embed.Job(pkg, [long_text], dataclasses.replace(options, normalize=False)))
    np.testing.assert_allclose(raw[0], pooled, atol=TOL)  # pooled before normalisation


def test_a_text_that_fits_is_unchanged(long_text: str) -> None:
    pkg = package("bert")
    full = " ".join(["the"] * (WINDOW - 2))  # fills the window exactly
    assert len(hf_tokenizer(pkg)(full)["input_ids"]) == WINDOW
    texts = [SHORT, "", full]
    on, off = (embed.Job(pkg, texts, embed.Options(windows=w)) for w in (True, False))
    assert as_lists(made_rows(pkg, on)) == as_lists(made_rows(pkg, off))
    assert (on.windowed, on.truncated, on.tokens) == (0, 0, off.tokens) and on.counts is None
    assert np.array_equal(run_job(pkg, on), run_job(pkg, off))  # the same vectors, bit for bit
    # beside a windowed text in one job, the same rows too
    mixed = embed.Job(pkg, [*texts, long_text], embed.Options(windows=True))
    assert as_lists(made_rows(pkg, mixed))[:3] == as_lists(made_rows(pkg, off))
    assert mixed.counts is not None and mixed.counts[:3] == [1, 1, 1]


def test_without_windows_a_long_text_is_truncated_and_counted(long_text: str) -> None:
    pkg = package("bert")
    job = embed.Job(pkg, [long_text])
    assert [len(r) for r in made_rows(pkg, job)] == [WINDOW]
    assert (job.windowed, job.truncated, job.tokens) == (0, 1, WINDOW)
    with pytest.raises(InvalidInput, match="more than max_seq_length 32"):
        made_rows(pkg, embed.Job(pkg, [long_text], embed.Options(truncate=False)))
    # with windows, truncate and truncation_direction change nothing: nothing is cut
    given = [{}, {"truncate": False}, {"truncation_direction": "left"}]
    cut = [
        made_rows(pkg, embed.Job(pkg, [long_text], embed.Options(windows=True, **o))) for o in given
    ]
    assert as_lists(cut[0]) == as_lists(cut[1]) == as_lists(cut[2])


def test_dimensions_are_cut_from_the_pooled_vector(long_text: str) -> None:
    pkg = package("bert")
    whole = run_job(pkg, embed.Job(pkg, [long_text], embed.Options(windows=True, normalize=False)))
    cut = run_job(pkg, embed.Job(pkg, [long_text], embed.Options(windows=True, dimensions=5)))
    np.testing.assert_allclose(cut, unit(whole[:, :5]), atol=TOL)


def test_layer_features_pool_each_windows_hidden_states(
    layered: ModelPackage, long_text: str
) -> None:
    options = embed.Options(windows=True, layers=[0, -1], pooling="cls", combine="concat")
    want = reference_windows(layered, long_text)
    alone = run_alone(layered, [r for r, _ in want])
    states = np.stack([o[embed.LAYER_OUTPUTS["cls"]] for o in alone])  # (R, L + 1, H)
    pooled = weighted(states, [n for _, n in want])  # (L + 1, H)
    got = run_job(layered, embed.Job(layered, [SHORT, long_text], options))
    np.testing.assert_allclose(got[1], unit(np.concatenate([pooled[0], pooled[-1]])), atol=TOL)


def test_jobs_answered_together_each_pool_their_own_windows(
    layered: ModelPackage, long_text: str
) -> None:
    """The batcher's way: several jobs' rows in one padded batch, answer_many over them."""
    pkg = layered
    jobs = [
        embed.Job(pkg, [long_text, SHORT], embed.Options(windows=True)),
        embed.Job(pkg, [SHORT, long_text]),  # truncated: one row each
        embed.Job(pkg, [long_text[:200], long_text], embed.Options(windows=True)),
        embed.Job(pkg, [long_text], embed.Options(windows=True, normalize=False)),
        embed.Job(pkg, [long_text], embed.Options(windows=True, dimensions=4)),
        embed.Job(pkg, ["a", long_text], embed.Options(windows=True, layers=[-1])),
    ]
    rows = [made_rows(pkg, job) for job in jobs]
    outputs = run_rows(pkg, [r for rs in rows for r in rs])
    split, at = [], 0
    for rs in rows:
        split.append(outputs[at : at + len(rs)])
        at += len(rs)
    answers = embed.Job.answer_many(jobs, split)
    for job, outs, answer, rs in zip(jobs, split, answers, rows, strict=True):
        assert len(answer) == len(job.texts)
        assert (len(rs) > len(job.texts)) == (job.windowed > 0)
        np.testing.assert_allclose(answer, job.answer(outs), atol=1e-6)
        alone = run_job(pkg, job)  # its rows in a batch of their own
        np.testing.assert_allclose(answer, alone, atol=TOL)


def test_pool_windows_keeps_single_rows_as_they_are() -> None:
    rows = np.random.default_rng(0).normal(size=(6, 3)).astype(np.float16)
    pooled = embed.pool_windows(rows, [1, 3, 1, 1], [7, 10, 10, 2, 5, 9])
    assert pooled.dtype == np.float32 and pooled.shape == (4, 3)
    assert np.array_equal(pooled[[0, 2, 3]], rows[[0, 4, 5]].astype(np.float32))
    np.testing.assert_allclose(pooled[1], weighted(rows[1:4], [10, 10, 2]), rtol=1e-6)


def test_a_prompt_that_fills_the_window_is_refused(long_text: str) -> None:
    pkg = package("bert")
    job = embed.Job(pkg, [long_text], embed.Options(windows=True, prompt_name="long"))
    head = prompt_head(pkg, PROMPTS["long"], long_text)
    assert head >= WINDOW - 2
    with refused(
        f"inputs[0]: its prompt is {head} tokens, which leaves no room for text in model "
        f"'{pkg.name}''s window of {WINDOW} tokens, so it cannot be embedded by windows; use a "
        "shorter prompt (prompt_name) or leave windows off to truncate it"
    ):
        made_rows(pkg, job)
