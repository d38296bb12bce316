"""Metric functions against known values: the SQuAD script's normalisation, seqeval's entity
counting (strict IOB2, and IOB1 input converted), GLUE accuracy / F1, Spearman as scipy."""

from __future__ import annotations

import math

import pytest

from training.metrics import (
    classification_scores,
    entity_spans,
    ner_scores,
    normalize_answer,
    rankdata,
    spearman,
    squad_exact,
    squad_f1,
    squad_scores,
    to_iob2,
)

# --- SQuAD ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "normalized"),
    [
        ("The Eiffel Tower", "eiffel tower"),
        ("  an   apple,  a pear. ", "apple pear"),
        ("Theory of the Leisure Class!", "theory of leisure class"),  # "the" only as a word
        ("U.S.A.", "usa"),
        ("Denver's", "denvers"),
        ("the", ""),
    ],
)
def test_normalize_answer_lowercases_strips_punctuation_articles_and_spaces(text, normalized):
    assert normalize_answer(text) == normalized


def test_squad_exact_match_and_token_f1():
    assert squad_exact("the Broncos", "Broncos") == 1.0
    assert squad_exact("Denver Broncos", "Broncos") == 0.0
    # pred 2 tokens, gold 1, overlap 1: precision 1/2, recall 1 -> F1 2/3
    assert squad_f1("Denver Broncos", "Broncos") == pytest.approx(2 / 3)
    assert squad_f1("Carolina Panthers", "Broncos") == 0.0
    # repeated tokens count once per occurrence on each side
    assert squad_f1("the cat the cat", "cat") == pytest.approx(2 * 0.5 * 1 / 1.5)


def test_squad_scores_take_the_best_gold_answer_and_report_percent():
    preds = ["Denver Broncos", "Santa Clara"]
    golds = [["Broncos", "Denver Broncos"], ["Levi's Stadium"]]
    scores = squad_scores(preds, golds)
    assert scores["exact_match"] == pytest.approx(50.0)
    assert scores["f1"] == pytest.approx(50.0)


def test_squad_unanswerable_questions_score_the_empty_answer():
    assert squad_scores([""], [[]]) == {"exact_match": 100.0, "f1": 100.0}
    assert squad_scores(["something"], [[]]) == {"exact_match": 0.0, "f1": 0.0}


# --- entity spans -----------------------------------------------------------------------


def test_iob1_is_converted_to_iob2():
    iob1 = ["I-PER", "I-PER", "B-PER", "O", "I-LOC", "I-ORG", "I-ORG"]
    assert to_iob2(iob1) == ["B-PER", "I-PER", "B-PER", "O", "B-LOC", "B-ORG", "I-ORG"]


def test_iob2_input_is_left_unchanged():
    iob2 = ["B-PER", "I-PER", "B-PER", "O", "B-LOC", "I-LOC"]
    assert to_iob2(iob2) == iob2


def test_strict_spans_start_at_b_and_run_over_matching_i():
    tags = ["B-PER", "I-PER", "O", "B-LOC", "B-LOC", "I-LOC", "B-ORG"]
    assert entity_spans(tags) == [("PER", 0, 2), ("LOC", 3, 4), ("LOC", 4, 6), ("ORG", 6, 7)]


@pytest.mark.parametrize(
    ("tags", "strict", "lenient"),
    [
        (["O", "I-PER", "I-PER"], [], [("PER", 1, 3)]),
        (["B-PER", "I-LOC"], [("PER", 0, 1)], [("PER", 0, 1), ("LOC", 1, 2)]),
        (["B-PER", "I-PER", "I-LOC", "I-LOC"], [("PER", 0, 2)], [("PER", 0, 2), ("LOC", 2, 4)]),
    ],
)
def test_an_i_tag_without_its_b_is_no_entity_in_strict_mode(tags, strict, lenient):
    assert entity_spans(tags, strict=True) == strict
    assert entity_spans(tags, strict=False) == lenient


def test_ner_scores_match_seqevals_readme_example():
    # seqeval README: f1_score(y_true, y_pred) == 0.50
    y_true = [["O", "O", "O", "B-MISC", "I-MISC", "I-MISC", "O"], ["B-PER", "I-PER", "O"]]
    y_pred = [["O", "O", "B-MISC", "I-MISC", "I-MISC", "I-MISC", "O"], ["B-PER", "I-PER", "O"]]
    scores = ner_scores(y_true, y_pred)
    assert scores["precision"] == scores["recall"] == scores["f1"] == pytest.approx(0.5)
    assert scores["f1_PER"] == 1.0
    assert scores["f1_MISC"] == 0.0


def test_ner_scores_strict_mode_as_seqeval_iob2_strict():
    # seqeval README: default (conlleval) mode gives 1.00 here, mode="strict" with IOB2 0.00.
    y_true, y_pred = [["B-NP", "I-NP", "O"]], [["I-NP", "I-NP", "O"]]
    assert ner_scores(y_true, y_pred, strict=True)["f1"] == 0.0
    assert ner_scores(y_true, y_pred, strict=False)["f1"] == 1.0


def test_ner_scores_on_iob1_gold_converted_first():
    gold = to_iob2(["I-ORG", "O", "I-PER", "I-PER", "B-PER"])  # IOB1, as eng.train
    pred = ["B-ORG", "O", "B-PER", "I-PER", "I-PER"]  # merges the two persons
    scores = ner_scores([gold], [pred])
    assert scores["precision"] == pytest.approx(1 / 2)  # ORG right, the merged PER wrong
    assert scores["recall"] == pytest.approx(1 / 3)
    assert scores["f1"] == pytest.approx(2 * (1 / 2) * (1 / 3) / (1 / 2 + 1 / 3))


def test_ner_scores_refuse_sentences_of_different_length():
    with pytest.raises(ValueError, match="sentence 0"):
        ner_scores([["O", "O"]], [["O"]])


# --- classification and Spearman --------------------------------------------------------


def test_classification_accuracy_and_binary_f1():
    scores = classification_scores([1, 1, 0, 0], [1, 0, 0, 1], num_labels=2)
    assert scores["accuracy"] == 0.5
    assert scores["precision"] == scores["recall"] == scores["f1"] == 0.5
    assert set(classification_scores([2, 1], [2, 0], num_labels=3)) == {"accuracy"}


def test_rankdata_gives_ties_their_average_rank():
    assert rankdata([10, 20, 20, 30]).tolist() == [1.0, 2.5, 2.5, 4.0]
    assert rankdata([3, 1, 2]).tolist() == [3.0, 1.0, 2.0]


def test_spearman_matches_scipys_documented_example():
    # scipy.stats.spearmanr([1, 2, 3, 4, 5], [5, 6, 7, 8, 7]).statistic
    assert spearman([1, 2, 3, 4, 5], [5, 6, 7, 8, 7]) == pytest.approx(0.8207826816681233)
    assert spearman([1, 2, 3], [30, 20, 10]) == pytest.approx(-1.0)
    assert math.isnan(spearman([1, 2, 3], [4, 4, 4]))
