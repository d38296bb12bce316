"""The generated demo data: readable by finetune's readers, the phenomena the demo heads need
are in it, and the hand-written check set (demo.checks) is not."""

from __future__ import annotations

import json
import random
import re
from collections import Counter

import pytest

from demo import checks as demo_checks
from demo import data as demo
from demo.models import DEMO_HEADS
from demo.qa_data import paragraph
from training.data.classification import read_classification
from training.data.squad import encode_squad, read_squad
from training.data.token_classification import read_tagged
from training.metrics import entity_spans
from training.tokenizer import load_tokenizer

SIZES = {h.stem: h.examples for h in DEMO_HEADS.values()}  # what the build generates


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return demo.write_demo_data(tmp_path_factory.mktemp("demo"), seed=0, sizes=SIZES)


def test_files_read_back_with_the_sizes_asked(files):
    sentiment = read_classification(files["sentiment.train"])
    assert len(sentiment) == SIZES["sentiment"]
    assert Counter(e.label for e in sentiment) == {
        "positive": SIZES["sentiment"] // 2,
        "negative": SIZES["sentiment"] // 2,
    }
    assert len(read_tagged(files["ner.train"])) == SIZES["ner"]
    assert len(read_squad(files["qa.train"])) == SIZES["qa"]


def test_the_same_seed_writes_the_same_files(tmp_path, files):
    again = demo.write_demo_data(tmp_path, seed=0, sizes=SIZES)
    for name, path in files.items():
        assert again[name].read_bytes() == path.read_bytes(), name


def test_a_negated_adjective_has_the_opposite_word():
    rng = random.Random(0)
    for positive in (True, False):
        for _ in range(300):
            phrase = demo._adjective(positive, rng)
            negator = next((n for n in demo.NEGATORS if phrase.startswith(n + " ")), None)
            word = phrase.split()[-1]
            if negator:  # "not bad" is positive: the adjective itself is from the other list
                assert word in (demo.BAD if positive else demo.GOOD), phrase
            else:
                assert word in (demo.GOOD if positive else demo.BAD), phrase


def test_sentiment_has_negation_contrast_and_both_labels_for_each(files):
    rows = [json.loads(line) for line in files["sentiment.train"].read_text().splitlines()]
    for pattern in (r", but ", r"^(Although|Even though|While) ", r"\bnot\b", r"\bnever\b"):
        labels = {r["label"] for r in rows if re.search(pattern, r["text"])}
        assert labels == {"positive", "negative"}, pattern


def test_ner_tags_are_iob2_words_are_bert_words_and_every_type_occurs(files):
    sentences = read_tagged(files["ner.train"])
    types = Counter()
    for s in sentences:
        for i, tag in enumerate(s.tags):
            if tag.startswith("I-"):  # strict IOB2: an I- continues the same type
                assert s.tags[i - 1][2:] == tag[2:], (s.words, s.tags)
        for word in s.words:
            assert demo.WORD.fullmatch(word), word  # punctuation is its own word
        types.update(t for t, _, _ in entity_spans(s.tags))
    assert set(types) == {"PER", "LOC", "ORG", "MISC"}
    assert min(types.values()) > 100
    # multi-word names are one entity: B- then I- (New Zealand, ... Inc.)
    multi = sum(1 for s in sentences for _, a, b in entity_spans(s.tags) if b - a > 1)
    assert multi > len(sentences) // 2


def test_ner_company_suffix_with_a_period_stays_inside_the_entity():
    text, spans = demo.ner_sentence("{ORG} said so.", random.Random(0))
    rng = random.Random(0)
    while not any(text[a:b].endswith(".") for a, b, _ in spans):
        text, spans = demo.ner_sentence("{ORG} said so.", rng)
    ((start, end, tag),) = spans
    assert tag == "ORG" and text[end - 1] == "."


def test_qa_answers_sit_at_their_offsets_in_the_service_windows(files, minilm_path):
    examples = read_squad(files["qa.train"])
    _, skipped = encode_squad(examples, load_tokenizer(minilm_path), 192, 64)
    assert skipped == 0
    for e in examples:
        text, start = e.answers[0]
        assert e.context[start : start + len(text)] == text


def test_qa_asks_every_kind_of_question_about_dates_numbers_money_and_durations(files):
    examples = read_squad(files["qa.train"])
    openings = Counter(
        re.match(r"(In which year|How many|How much|How long|\w+)", e.question)[0] for e in examples
    )
    for kind in (
        "Who",
        "What",
        "When",
        "Where",
        "Which",
        "In which year",
        "How many",
        "How much",
        "How long",
    ):
        assert openings[kind] >= 20, (kind, openings)
    answers = [e.answers[0][0] for e in examples]
    assert sum(bool(re.search(r"[$€£]|dollars|euros|pounds", a)) for a in answers) > 100  # money
    assert sum(bool(re.fullmatch(r"\d{4}", a)) for a in answers) > 50  # years
    assert sum(bool(re.search(r"(days|weeks|months|years|minutes)$", a)) for a in answers) > 50


def test_qa_paragraphs_hold_distractors_of_the_answer_type():
    """Most paragraphs with a year in the answer hold another year too."""
    rng = random.Random(1)
    with_year = with_two = 0
    for _ in range(300):
        context, questions = paragraph(rng)
        if any(re.search(r"\d{4}", answer) for _, answer, _ in questions):
            with_year += 1
            with_two += len(re.findall(r"\b1[89]\d\d\b|\b20[0-2]\d\b", context)) >= 2
    assert with_two > with_year // 2


def _generated_text(files) -> str:
    parts = [json.loads(line)["text"] for line in files["sentiment.train"].read_text().splitlines()]
    parts += [" ".join(s.words) for s in read_tagged(files["ner.train"])]
    parts += sorted({e.context for e in read_squad(files["qa.train"])})
    return "\n".join(parts)


def test_the_check_set_is_held_out_of_the_generated_data(files):
    generated = _generated_text(files)
    ner_text = " ".join(" ".join(s.words) for s in read_tagged(files["ner.train"]))
    names = [e for _, entities in demo_checks.NER for e, _ in entities]
    names += [
        a for _, qs in demo_checks.QA for _, answers in qs for a in answers if re.search("[A-Z]", a)
    ]
    for name in names:
        spaced = " ".join(demo.WORD.findall(name))  # as the NER data's words are joined
        assert not re.search(rf"\b{re.escape(name)}\b", generated), name
        assert not re.search(rf"\b{re.escape(spaced)}\b", ner_text), name
    sentences = {line.strip().lower() for line in generated.splitlines()}
    for text, _ in demo_checks.SENTIMENT:
        assert text.lower() not in sentences, text


def test_the_check_set_is_well_formed():
    assert len(demo_checks.SENTIMENT) >= 30 and len(demo_checks.NER) >= 30
    assert sum(len(qs) for _, qs in demo_checks.QA) >= 30
    assert Counter(label for _, label in demo_checks.SENTIMENT) == {"positive": 16, "negative": 16}
    for text, entities in demo_checks.NER:
        spans = demo_checks._entity_spans(text, entities)  # each found, in order
        assert len(spans) == len(entities)
    for context, questions in demo_checks.QA:
        for _, answers in questions:
            assert all(a in context for a in answers)
