"""heads.tasks.zero_shot: the Job run as the batcher runs it (tests/heads/tasks/served.py) on
tiny exported NLI folders (BERT with entailment first, RoBERTa with MNLI's contradiction-first
order), against transformers' zero-shot-classification pipeline on the same folders: label
order and scores single- and multi-label, one label, other templates, texts longer than the
window (cut and counted); and what is refused, word for word."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from heads.package import ModelPackage, read_package
from heads.rows import InvalidInput
from heads.tasks import zero_shot
from tests.families import family_checkpoint
from tests.heads.tasks.served import run_job

transformers = pytest.importorskip("transformers")
from training.export import export_package  # noqa: E402 (needs torch)

WINDOW = 48
NLI = {  # name -> (family, labels in id order)
    "bert": ("bert", ["entailment", "neutral", "contradiction"]),
    "roberta": ("roberta", ["CONTRADICTION", "NEUTRAL", "ENTAILMENT"]),
}
TEXTS = [
    "The match ended 2-1 after extra time.",
    "Parliament voted on the budget 🙂 today.",
    "Café naïve: São Paulo's mayor (2024) said 3.5% " * 6,  # longer than the window
]
LABELS = ["sports", "politics", "cooking", "money"]
TOL = 1e-5


def folder(name: str) -> Any:
    family, labels = NLI[name]
    return family_checkpoint(family, "classification", labels=labels, seed=1)


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ModelPackage]:
    root = tmp_path_factory.mktemp("zero-shot")
    return {
        name: read_package(
            export_package(
                folder(name), "classification", root / name, max_seq_length=WINDOW, verbose=False
            ).path
        )  # fmt: skip
        for name in NLI
    }


def pipeline(name: str) -> Any:
    tok = transformers.AutoTokenizer.from_pretrained(folder(name), model_max_length=WINDOW)
    return transformers.pipeline("zero-shot-classification", model=str(folder(name)), tokenizer=tok)


def assert_same(ours: list[dict], theirs: list[dict]) -> None:
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs, strict=True):
        assert a["sequence"] == b["sequence"]
        assert a["labels"] == b["labels"]
        assert max(abs(x - y) for x, y in zip(a["scores"], b["scores"], strict=True)) <= TOL


@pytest.mark.parametrize("multi_label", [False, True])
@pytest.mark.parametrize("name", list(NLI))
def test_answers_equal_the_pipeline(packages: dict, name: str, multi_label: bool):
    job = zero_shot.Job(
        packages[name], TEXTS, zero_shot.Options(candidate_labels=LABELS, multi_label=multi_label)
    )
    ours = run_job(packages[name], job)
    assert_same(ours, pipeline(name)(TEXTS, candidate_labels=LABELS, multi_label=multi_label))
    assert job.truncated == 1  # the third text, cut beside every hypothesis: counted once
    assert all(len(set(a["scores"])) == len(LABELS) for a in ours)  # the labels told apart


@pytest.mark.parametrize("name", list(NLI))
@pytest.mark.parametrize(
    "labels, template",
    [
        (["sports"], zero_shot.DEFAULT_TEMPLATE),
        (LABELS[:3], "Das Thema ist {}."),
        (["money", "sports"], "{} it is"),
    ],  # fmt: skip
)
def test_options_equal_the_pipeline(packages: dict, name: str, labels: list, template: str):
    job = zero_shot.Job(
        packages[name],
        TEXTS[:2],
        zero_shot.Options(candidate_labels=labels, hypothesis_template=template),
    )
    theirs = pipeline(name)(TEXTS[:2], candidate_labels=labels, hypothesis_template=template)
    assert_same(run_job(packages[name], job), theirs)
    assert job.truncated == 0


def test_the_labels_name_the_entailment_and_contradiction(packages: dict):
    bert, roberta = packages["bert"], packages["roberta"]
    assert zero_shot.entailment_id(bert) == 0 and zero_shot.entailment_id(roberta) == 2
    assert (
        zero_shot.Job(bert, ["a"], zero_shot.Options(candidate_labels=["x"])).contradiction == -1
    )  # entailment first: the last
    assert (
        zero_shot.Job(roberta, ["a"], zero_shot.Options(candidate_labels=["x"])).contradiction == 0
    )
    assert zero_shot.is_nli(bert) and zero_shot.is_nli(roberta)
    assert zero_shot.hypotheses(["a", "b"], "It is {}!") == ["It is a!", "It is b!"]


def test_what_cannot_be_asked_is_refused(packages: dict, tmp_path):
    bert = packages["bert"]
    plain = family_checkpoint("bert", "classification", labels=["negative", "positive"])
    sentiment = read_package(export_package(plain, "classification", tmp_path / "s", verbose=False).path)  # fmt: skip
    assert not zero_shot.is_nli(sentiment)
    refusals = [
        (lambda: zero_shot.Job(sentiment, ["a"], zero_shot.Options(candidate_labels=["x"])),
         f"model {sentiment.name!r} has no entailment label (its labels: negative, positive): "
         "zero-shot classification needs an NLI model whose labels name entailment"),
        (lambda: zero_shot.Job(bert, ["a"], zero_shot.Options(candidate_labels=[])),
         "candidate_labels is empty; send at least one label"),
        (lambda: zero_shot.Job(bert, ["a"], zero_shot.Options(candidate_labels=["x"], hypothesis_template="no slot")),
         "hypothesis_template 'no slot' has no {} for the label to go in"),
        (lambda: zero_shot.Job(bert, ["a"], zero_shot.Options(candidate_labels=["x"], hypothesis_template="{0} {1}")),
         "hypothesis_template '{0} {1}' cannot be formatted (Replacement index 1 out of range "
         "for positional args tuple); put {} where the label goes"),
        (lambda: zero_shot.Job(bert, ["a"], zero_shot.Options(candidate_labels=["x"], hypothesis_template="{label}")),
         "hypothesis_template '{label}' cannot be formatted ('label'); put {} where the label "
         "goes"),
        (lambda: zero_shot.Job(bert, ["a"], zero_shot.Options(candidate_labels=["x"], hypothesis_template="{:d}")),
         "hypothesis_template '{:d}' cannot be formatted (Unknown format code 'd' for object of "
         "type 'str'); put {} where the label goes"),
    ]  # fmt: skip
    for make, message in refusals:
        with pytest.raises(InvalidInput) as refused:
            make()
        assert str(refused.value) == message
    tok = transformers.AutoTokenizer.from_pretrained(folder("bert"))
    label = "word " * 60
    hypothesis = len(tok(zero_shot.DEFAULT_TEMPLATE.format(label), add_special_tokens=False)["input_ids"])  # fmt: skip
    with pytest.raises(InvalidInput) as long:
        run_job(bert, zero_shot.Job(bert, ["a"], zero_shot.Options(candidate_labels=["x", label])))
    assert str(long.value) == (
        f"a hypothesis is {hypothesis} tokens, more than this model's window of {WINDOW} "
        "leaves; shorten the label or the template"
    )


def test_a_hypothesis_that_fills_the_window_leaves_no_room_for_the_text(packages: dict):
    """room 0 is allowed (the text cut to nothing, as the pipeline's only_first does)."""
    tok = transformers.AutoTokenizer.from_pretrained(folder("bert"))

    def hypothesis(label: str) -> int:
        text = zero_shot.DEFAULT_TEMPLATE.format(label)
        return len(tok(text, add_special_tokens=False)["input_ids"])

    label = "a"
    while hypothesis(label + " a") <= WINDOW - 3:
        label += " a"
    assert hypothesis(label) == WINDOW - 3  # room 0 beside it
    job = zero_shot.Job(packages["bert"], ["a cat"], zero_shot.Options(candidate_labels=[label]))
    [answer] = run_job(packages["bert"], job)
    assert job.truncated == 1 and answer["labels"] == [label]


def test_jobs_answered_together_each_get_their_own(packages: dict):
    from heads.rows import load_package_tokenizer
    from tests.heads.tasks.served import run_rows

    pkg = packages["bert"]
    tok = load_package_tokenizer(pkg.tokenizer_path)
    jobs = [
        zero_shot.Job(pkg, TEXTS[:1], zero_shot.Options(candidate_labels=LABELS)),
        zero_shot.Job(pkg, TEXTS[1:2], zero_shot.Options(candidate_labels=LABELS[::-1])),
    ]
    outputs = [
        run_rows(pkg, job.rows(tok, tok.encode_batch(job.texts, add_special_tokens=False)))
        for job in jobs
    ]
    together = zero_shot.Job.answer_many(jobs, outputs)
    assert together == [job.answer(outs) for job, outs in zip(jobs, outputs, strict=True)]
    assert together[0][0]["sequence"] == TEXTS[0] and together[1][0]["sequence"] == TEXTS[1]


def test_texts_cut_are_counted_once_each_at_the_exact_edge(packages: dict):
    """A text counts as cut when some hypothesis leaves it too little room, even when a later,
    shorter one does not; a text exactly as long as the room is not cut."""
    tok = transformers.AutoTokenizer.from_pretrained(folder("bert"))

    def n(text: str) -> int:
        return len(tok(text, add_special_tokens=False)["input_ids"])

    long_label, short_label = "money " * 6, "a"
    room = WINDOW - 3 - n(zero_shot.DEFAULT_TEMPLATE.format(long_label.strip()))
    text = "anna"
    while n(text + " may") <= room:
        text += " may"
    assert n(text) == room
    exact = zero_shot.Job(
        packages["bert"],
        [text],
        zero_shot.Options(candidate_labels=[long_label.strip(), short_label]),
    )
    run_job(packages["bert"], exact)
    assert exact.truncated == 0
    over = zero_shot.Job(
        packages["bert"],
        [text + " may", text + " may may", "a cat"],
        zero_shot.Options(candidate_labels=[long_label.strip(), short_label]),
    )
    run_job(packages["bert"], over)
    assert over.truncated == 2


@pytest.mark.parametrize("multi_label", [False, True])
def test_scores_stay_finite_for_large_logits(packages: dict, multi_label: bool):
    """Softmaxes are taken per text (and per label when labels are independent) after
    subtracting that softmax's own largest logit."""
    job = zero_shot.Job(
        packages["bert"],
        ["a", "b"],
        zero_shot.Options(candidate_labels=["x", "y"], multi_label=multi_label),
    )
    # entailment is label 0 (the last is contradiction); text "a" huge logits, "b" small
    logits = [[1000.0, 0.0, 0.0], [990.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    outputs = [{"logits": np.array(row, dtype=np.float32)} for row in logits]
    a, b = job.answer(outputs)
    if multi_label:  # entailment against contradiction, each label alone
        assert a["scores"] == [1.0, 1.0]
        assert b["scores"] == pytest.approx([1 / (1 + np.exp(-1.0)), 0.5])
    else:  # the labels' entailment logits, softmaxed per text
        assert a["labels"] == ["x", "y"]
        assert a["scores"] == pytest.approx([1 / (1 + np.exp(-10.0)), 1 / (1 + np.exp(10.0))])
        assert b["scores"] == pytest.approx([1 / (1 + np.exp(-1.0)), 1 / (1 + np.exp(1.0))])
