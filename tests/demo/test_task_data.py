"""The generated data of the task packages (demo.task_data): readable by finetune's and
pretrain's readers, labelled as the packages' endpoints read them, and apart from the checks."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from demo import checks as demo_checks
from demo import task_data
from demo.models import TASK_HEADS
from training.data.classification import read_classification

SIZES = {h.stem: h.examples for h in TASK_HEADS.values()}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return task_data.write_task_data(tmp_path_factory.mktemp("tasks"), seed=0, sizes=SIZES)


def test_pairs_read_back_as_finetune_reads_them(files):
    rerank = read_classification(files["rerank.train"])
    nli = read_classification(files["nli.train"])
    assert len(rerank) == SIZES["rerank"] and len(nli) == SIZES["nli"]
    assert all(e.text_pair for e in rerank + nli)  # pairs, not single texts
    assert set(Counter(e.label for e in rerank)) == set(task_data.RERANK_LABELS)
    assert Counter(e.label for e in nli) == dict.fromkeys(task_data.NLI_LABELS, SIZES["nli"] // 2)
    # /rerank scores a two-label model's second label; /zero-shot finds "entail..."
    assert task_data.RERANK_LABELS[1] == "relevant" and task_data.NLI_LABELS[1] == "entailment"


def test_a_relevant_passage_holds_the_answer_and_the_others_come_from_the_same_paragraph():
    rng = random.Random(3)
    rows = task_data.rerank_examples(300, rng)
    by_query: dict[str, list[dict]] = {}
    for r in rows:
        by_query.setdefault(r["sentence1"], []).append(r)
    # hard negatives: most questions meet a passage about their own subject that does not answer
    mixed = [
        q for q, rs in by_query.items() if {r["label"] for r in rs} == {"relevant", "irrelevant"}
    ]
    assert len(mixed) > len(by_query) / 2
    relevant = Counter(r["label"] for r in rows)["relevant"]
    assert 0.25 < relevant / len(rows) < 0.45


def test_each_premise_entails_its_own_topic_and_contradicts_another():
    rows = task_data.nli_examples(400, random.Random(4))
    topics = {w: kind for kind, words in task_data.TOPICS.items() for w in words}
    by_premise: dict[str, list[dict]] = {}
    for r in rows:
        by_premise.setdefault(r["sentence1"], []).append(r)
    for premise, rs in by_premise.items():
        kinds = {r["label"]: topics[_label_in(r["sentence2"], set(topics))] for r in rs}
        if len(kinds) == 2:  # both rows of the premise drawn among the n
            assert kinds["entailment"] != kinds["contradiction"], premise


def _label_in(hypothesis: str, labels: set[str]) -> str:
    found = [lb for lb in labels if hypothesis.endswith(f" {lb}.")]
    assert len(found) == 1, hypothesis
    return found[0]


def test_sentences_split_where_the_paragraph_does():
    text = "The hall opened in 1961. It cost $4 million. 300 people came."
    assert task_data.sentences(text) == [
        (0, "The hall opened in 1961."),
        (25, "It cost $4 million."),
        (45, "300 people came."),
    ]


def test_the_task_checks_are_held_out_of_the_generated_pairs(files):
    generated = files["rerank.train"].read_text() + files["nli.train"].read_text()
    for query, documents, gold in demo_checks.RERANK:
        assert query not in generated and documents[gold] not in generated
        assert 0 <= gold < len(documents)
    for text, candidates, _, gold in demo_checks.ZERO_SHOT:
        assert text not in generated and gold in candidates
