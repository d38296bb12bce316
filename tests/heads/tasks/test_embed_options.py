"""heads.tasks.embed's request options, each against a value computed here: layer features
(`layers`, `pooling`, `combine`: which outputs, which layers, combined how), prompts,
`dimensions`, truncation, and several jobs answered together each with its own vectors."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from tokenizers import Tokenizer

from heads.rows import InvalidInput
from heads.tasks import embed
from tests.heads.tasks.conftest import as_lists

H = 8  # the embedding width
STATES = 3  # hidden states: the embeddings output and two layers


def package(pooling: str = "mean", *, layers: bool = True, **changes: Any) -> Any:
    """What embed reads of a package: an embedding output (N, H), and with `layers` every
    state pooled both ways (N, STATES, H), listed as training.export writes them."""
    outputs = [{"name": "embeddings", "shape": ["batch", H]}]
    if layers:
        outputs = [
            {"name": name, "shape": ["batch", STATES, H]} for name in embed.LAYER_OUTPUTS.values()
        ] + outputs  # the embeddings output last: its width is found by name
    fields = {
        "name": "m",
        "pooling": pooling,
        "normalize": True,
        "sparse": False,
        "max_seq_length": 8,
        "outputs": outputs,
        "prompts": {},
        "default_prompt_name": None,
    }
    return SimpleNamespace(**{**fields, **changes})


def states(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, STATES, H)).astype(np.float32)


def unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_layer_indices_count_from_either_end_and_are_checked():
    assert embed.check_layers([0, 2, -1, -3], STATES) == [0, 2, 2, 0]
    for bad in (3, -4):
        with pytest.raises(InvalidInput) as refused:
            embed.check_layers([0, bad], STATES)
        assert str(refused.value) == (
            f"layers [{bad}] out of range: this model has 3 hidden states "
            "(0 the embeddings output, 2 or -1 the last layer)"
        )


def test_layers_are_combined_in_request_order():
    s = states(2)
    np.testing.assert_array_equal(
        embed.combine_layers(s, [2, 0], "concat"), np.concatenate([s[:, 2], s[:, 0]], axis=1)
    )
    np.testing.assert_allclose(embed.combine_layers(s, [0, -1], "sum"), s[:, 0] + s[:, 2])
    np.testing.assert_allclose(
        embed.combine_layers(s, [0, 1, -1], "mean"), (s[:, 0] + s[:, 1] + s[:, 2]) / 3, rtol=1e-6
    )
    with pytest.raises(InvalidInput, match=r"layers \[3\] out of range"):
        embed.combine_layers(s, [3], "sum")  # 3 < H: the states axis is the one checked
    with pytest.raises(ValueError) as unknown:
        embed.combine_layers(s, [0], "max")
    assert str(unknown.value) == "combine must be one of ('concat', 'sum', 'mean'), not 'max'"


def test_the_outputs_say_the_width_and_how_many_states():
    assert embed.embedding_width(package()) == H
    assert embed.embedding_width(package(outputs=[{"name": "embeddings"}])) is None
    assert embed.hidden_states(package().outputs) == STATES
    assert embed.hidden_states(package(layers=False).outputs) is None


def test_features_name_the_output_layers_and_combination():
    mean, cls = embed.LAYER_OUTPUTS["mean"], embed.LAYER_OUTPUTS["cls"]
    assert embed.features(package("cls")) is None  # the package's own vector
    assert embed.features(package("cls"), pooling="cls") is None
    assert embed.features(package("mean"), layers=[0]) == embed.Features(mean, [0], "concat")
    assert embed.features(package("mean"), pooling="cls") == embed.Features(cls, [-1], "concat")
    assert embed.features(package("cls"), layers=[1, 0], combine="sum") == embed.Features(
        cls, [1, 0], "sum"
    )


@pytest.mark.parametrize(
    "pkg, options, message",
    [
        (
            package(layers=False),
            {"layers": [0]},
            "model 'm' has no hidden-state outputs, so `layers` and a `pooling` other than its "
            "own (mean) cannot be served; export it with "
            "`python -m training.export --task embedding --hidden-states`",
        ),
        (
            package(),
            {"layers": [0], "combine": "max"},
            "combine must be one of ('concat', 'sum', 'mean'), not 'max'",
        ),  # fmt: skip
        (
            package(),
            {"pooling": "splade"},
            "pooling 'splade': the hidden states are pooled cls or mean",
        ),  # fmt: skip
        (
            package(),
            {"layers": [5]},
            "layers [5] out of range: this model has 3 hidden states "
            "(0 the embeddings output, 2 or -1 the last layer)",
        ),  # fmt: skip
    ],
)
def test_features_a_package_cannot_serve_are_refused(pkg: Any, options: dict, message: str):
    with pytest.raises(InvalidInput) as refused:
        embed.features(pkg, **options)
    assert str(refused.value) == message


def test_prompts_by_name_the_default_or_none():
    prompts = {"query": "query: ", "passage": "passage: "}
    assert embed.prompt(package(prompts=prompts), "passage") == "passage: "
    assert embed.prompt(package(prompts=prompts), None) == ""
    assert embed.prompt(package(prompts=prompts, default_prompt_name="query"), None) == "query: "
    with pytest.raises(InvalidInput) as unknown:
        embed.prompt(package(prompts=prompts), "doc")
    assert (
        str(unknown.value) == "prompt_name 'doc' is not one of model 'm''s prompts: query, passage"
    )
    with pytest.raises(InvalidInput) as none:
        embed.prompt(package(), "query")
    assert str(none.value) == (
        "prompt_name 'query': model 'm' has no prompts (its sentence-transformers folder's "
        "config_sentence_transformers.json names none)"
    )


def test_postprocess_answers_float32_and_refuses_other_shapes():
    x = np.random.default_rng(0).normal(size=(2, H))  # float64
    assert embed.postprocess(x, normalize=False).dtype == np.float32
    assert embed.postprocess(x, normalize=True).dtype == np.float32
    with pytest.raises(ValueError) as refused:
        embed.postprocess(np.zeros(3), normalize=True)
    assert str(refused.value) == "embeddings must be (N, H), got (3,)"


def test_dimensions_from_one_to_the_full_width():
    x = np.arange(2 * H, dtype=np.float32).reshape(2, H)
    np.testing.assert_array_equal(embed.shorten(x, 1), x[:, :1])
    np.testing.assert_array_equal(embed.shorten(x, H), x)
    assert embed.shorten(x, None) is x


def test_a_job_reads_prompt_truncation_and_direction(toy_tokenizer: Tokenizer):
    long = "the cat sat on the mat a dog ran fast in paris new york city"  # 15 tokens, window 8
    encode = toy_tokenizer.encode

    def rows(job: embed.Job) -> list[list[int]]:
        made = job.rows(
            toy_tokenizer, toy_tokenizer.encode_batch(job.texts, add_special_tokens=False)
        )
        return as_lists(made)

    default = embed.Job(package(), ["a cat", long])
    assert default.texts == ["a cat", long]
    body = encode(long, add_special_tokens=False).ids
    cls, sep = encode("").ids
    assert rows(default) == [encode("a cat").ids, [cls, *body[:6], sep]]  # right: the first ones
    assert default.truncated == 1 and default.tokens == len(encode("a cat").ids) + 8

    left = embed.Job(package(), [long], embed.Options(truncation_direction="left"))
    assert rows(left) == [[cls, *body[-6:], sep]]
    with pytest.raises(InvalidInput, match="more than max_seq_length 8"):
        rows(embed.Job(package(), [long], embed.Options(truncate=False)))
    prompted = embed.Job(
        package(prompts={"the": "the "}), ["a cat"], embed.Options(prompt_name="the")
    )
    assert prompted.texts == ["the a cat"] and rows(prompted) == [encode("the a cat").ids]


def test_a_sparse_package_is_sent_to_embed_sparse():
    with pytest.raises(InvalidInput) as refused:
        embed.Job(package("splade", sparse=True), ["a"])
    assert str(refused.value) == (
        "model 'm' answers sparse embeddings (pooling splade): ask POST /embed_sparse"
    )


def test_a_job_with_features_answers_the_combined_layers():
    s = states(3, seed=1)
    outputs = [{embed.LAYER_OUTPUTS["mean"]: row, "embeddings": row[-1]} for row in s]
    job = embed.Job(package(), ["a", "b", "c"], embed.Options(layers=[0, -1], combine="mean"))
    np.testing.assert_allclose(job.answer(outputs), unit((s[:, 0] + s[:, 2]) / 2), rtol=1e-5)
    # `dimensions` is checked against the combined width (2 H concatenated), not H
    wide = embed.Job(package(), ["a"] * 3, embed.Options(layers=[0, 1], dimensions=H + 4))
    want = np.concatenate([s[:, 0], s[:, 1]], axis=1)[:, : H + 4]
    np.testing.assert_allclose(wide.answer(outputs), unit(want), rtol=1e-5)


def test_jobs_answered_together_each_get_their_own_vectors():
    s = states(7, seed=2)
    outputs = [{embed.LAYER_OUTPUTS["mean"]: row, "embeddings": row[-1] * 3} for row in s]
    pkg = package()
    jobs = [
        embed.Job(pkg, ["a", "b"]),
        embed.Job(pkg, ["c"], embed.Options(layers=[0])),
        embed.Job(pkg, ["d", "e"], embed.Options(normalize=False)),
        embed.Job(pkg, ["f"]),
        embed.Job(pkg, ["g"]),  # a third of the first group: its rows start after both others'
    ]
    split = [outputs[0:2], outputs[2:3], outputs[3:5], outputs[5:6], outputs[6:7]]
    answers = embed.Job.answer_many(jobs, split)
    np.testing.assert_allclose(answers[0], unit(s[0:2, -1]), rtol=1e-6)
    np.testing.assert_allclose(answers[1], unit(s[2:3, 0]), rtol=1e-6)
    np.testing.assert_allclose(answers[2], s[3:5, -1] * 3, rtol=1e-6)
    np.testing.assert_allclose(answers[3], unit(s[5:6, -1]), rtol=1e-6)
    np.testing.assert_allclose(answers[4], unit(s[6:7, -1]), rtol=1e-6)
    for job, outs, answer in zip(jobs, split, answers, strict=True):
        np.testing.assert_allclose(job.answer(outs), answer, rtol=1e-6)
