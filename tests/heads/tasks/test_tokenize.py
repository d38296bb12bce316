"""heads.tasks.tokenize: the jobs behind /tokenize and /decode, run as the batcher runs them,
against transformers' fast tokenizer of the same folder (tests/families.py's tiny
checkpoints); the prompt goes first; each job keeps its own answer; an id outside the
vocabulary (added tokens included) is refused with the place named."""

from __future__ import annotations

from typing import Any

import pytest
from tokenizers import Tokenizer

from heads.rows import InvalidInput, load_package_tokenizer
from heads.tasks.tokenize import DecodeJob, TokenizeJob, decode
from tests.families import family_checkpoint, family_package
from tests.heads.tasks.served import run_job

transformers = pytest.importorskip("transformers")

FAMILIES = ("bert", "roberta")
TEXTS = ["Hello  world, café!", "Paris is in France.", ""]


def reference(family: str) -> Any:
    return transformers.AutoTokenizer.from_pretrained(family_checkpoint(family, "classification"))


def tokenizer(family: str) -> Tokenizer:
    return load_package_tokenizer(family_package(family, "classification") / "tokenizer.json")


@pytest.mark.parametrize("special", [True, False])
@pytest.mark.parametrize("family", FAMILIES)
def test_the_prompt_goes_first_as_the_model_would_read_it(family: str, special: bool):
    prompt = "query: "
    job = TokenizeJob(TEXTS, add_special_tokens=special, prompt=prompt)
    answer = run_job(family_package(family, "classification"), job)
    hf = reference(family)
    assert len(answer) == len(TEXTS)
    for text, tokens in zip(TEXTS, answer, strict=True):
        want = hf(prompt + text, add_special_tokens=special, return_offsets_mapping=True)
        assert [t["id"] for t in tokens] == want["input_ids"], text
        spans = [(t["start"], t["stop"]) for t in tokens if not t["special"]]
        assert spans == [s for s, i in zip(want["offset_mapping"], want["input_ids"], strict=True)
                         if i not in hf.all_special_ids]  # fmt: skip
        assert "".join(t["text"] for t in tokens if not t["special"]).startswith("query")


def test_special_tokens_are_named_and_have_no_offsets():
    hf = reference("bert")
    job = TokenizeJob(["a cat"], add_special_tokens=True, prompt="")
    [tokens] = run_job(family_package("bert", "classification"), job)
    ends = [tokens[0], tokens[-1]]
    assert ends == [
        {"id": i, "text": hf.convert_ids_to_tokens(i), "special": True, "start": None, "stop": None}
        for i in (hf.cls_token_id, hf.sep_token_id)
    ]
    assert tokens[1] == {"id": hf("a", add_special_tokens=False)["input_ids"][0], "text": "a",
                         "special": False, "start": 0, "stop": 1}  # fmt: skip


def test_without_a_prompt_the_texts_are_read_as_given():
    job = TokenizeJob(["a cat"], add_special_tokens=False, prompt="")
    assert job.texts == ["a cat"]
    tokens = run_job(family_package("bert", "classification"), job)[0]
    assert [t["id"] for t in tokens] == reference("bert")("a cat", add_special_tokens=False)[
        "input_ids"
    ]


def test_each_job_keeps_its_own_answer_when_answered_together():
    tok, hf = tokenizer("bert"), reference("bert")
    texts = [["a cat"], ["the dog ran", "Paris"]]
    jobs = [
        TokenizeJob(texts[0], add_special_tokens=True, prompt=""),
        TokenizeJob(texts[1], add_special_tokens=False, prompt=""),
    ]
    for job in jobs:
        job.rows(tok, tok.encode_batch(job.texts, add_special_tokens=False))
    first, second = TokenizeJob.answer_many(jobs, [[], []])
    assert [[t["id"] for t in tokens] for tokens in first] == [hf("a cat")["input_ids"]]
    assert [[t["id"] for t in tokens] for tokens in second] == [
        hf(t, add_special_tokens=False)["input_ids"] for t in texts[1]
    ]

    ids = [hf("a cat")["input_ids"], hf("the dog")["input_ids"]]
    decodes = [
        DecodeJob(ids[:1], skip_special_tokens=True),
        DecodeJob(ids, skip_special_tokens=False),
    ]
    for job in decodes:
        job.rows(tok, [])
    assert DecodeJob.answer_many(decodes, [[], []]) == [
        [hf.decode(ids[0], skip_special_tokens=True)],
        [hf.decode(row, skip_special_tokens=False) for row in ids],
    ]
    assert "[CLS]" in DecodeJob.answer_many(decodes, [[], []])[1][0]


def test_an_id_outside_the_vocabulary_is_named_where_it_is():
    tok = tokenizer("bert")
    size = tok.get_vocab_size(with_added_tokens=True)
    with pytest.raises(InvalidInput) as one:
        decode(tok, [[1, 2, size]], skip_special_tokens=True)
    assert str(one.value) == (
        f"ids[2] is {size}, outside this model's vocabulary: token ids run from 0 to {size - 1}"
    )
    with pytest.raises(InvalidInput) as several:
        decode(tok, [[1, 2], [3, -4, size]], skip_special_tokens=True)
    assert str(several.value).startswith("ids[1][1] is -4, outside")
    assert decode(tok, [[size - 1]], skip_special_tokens=False) == [tok.decode([size - 1])]
    assert decode(tok, [[0, 1]], skip_special_tokens=False) == [
        tok.decode([0, 1], skip_special_tokens=False)
    ]


def test_an_added_token_is_inside_the_vocabulary():
    tok = tokenizer("bert")
    base = tok.get_vocab_size(with_added_tokens=False)
    tok.add_tokens(["zebracorn"])
    assert tok.token_to_id("zebracorn") == base  # past the model's own vocabulary
    assert decode(tok, [[base]], skip_special_tokens=True) == ["zebracorn"]
