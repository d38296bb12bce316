"""Readers of the fine-tuning data: every format, labels, token positions, and bad input
that names its file and line. Real-data checks are marked `shared`."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tests.training.tiny import tiny_tokenizer
from training.data.batch import collate
from training.data.classification import (
    encode_classification,
    label_ids,
    label_vocabulary,
    read_classification,
)
from training.data.pairs import ScoredPair, TextPair, encode_pairs, read_pairs, training_pairs
from training.data.records import DataError
from training.data.squad import encode_squad, read_squad
from training.data.token_classification import (
    encode_tagged,
    read_tagged,
    tag_vocabulary,
    word_pieces,
)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return tiny_tokenizer(tmp_path_factory.mktemp("vocab"))


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


# --- classification ---------------------------------------------------------------------


def test_glue_tsv_single_sentences_keep_quotes(tmp_path):
    path = write(tmp_path, "train.tsv", 'sentence\tlabel\na "good film\t1\n\nbad\t0\n')
    examples = read_classification(path)
    assert [(e.text, e.text_pair, e.label) for e in examples] == [
        ('a "good film', None, "1"),
        ("bad", None, "0"),
    ]
    assert examples[1].where == f"{path}:4"


def test_glue_tsv_pairs_and_extra_columns(tmp_path):
    path = write(tmp_path, "mnli.tsv", "id\tsentence1\tsentence2\tlabel\n7\ta\tb\tentailment\n")
    (e,) = read_classification(path)
    assert (e.text, e.text_pair, e.label) == ("a", "b", "entailment")


def test_csv_with_quoted_commas(tmp_path):
    path = write(tmp_path, "train.csv", 'text,label\n"good, great",positive\nawful,negative\n')
    assert [(e.text, e.label) for e in read_classification(path)] == [
        ("good, great", "positive"),
        ("awful", "negative"),
    ]


def test_jsonl_texts_pairs_and_integer_labels(tmp_path):
    rows = [{"text": "a", "label": 1}, {"text": "b", "text_pair": "c", "label": 0}]
    path = write(tmp_path, "train.jsonl", "\n".join(map(json.dumps, rows)) + "\n")
    examples = read_classification(path)
    assert [(e.text, e.text_pair, e.label) for e in examples] == [("a", None, "1"), ("b", "c", "0")]


def test_label_vocabulary_orders_ids_numerically_and_names_alphabetically(tmp_path):
    ids = write(tmp_path, "ids.tsv", "sentence\tlabel\na\t10\nb\t2\nc\t0\n")
    names = write(tmp_path, "names.tsv", "sentence\tlabel\na\tpos\nb\tneg\n")
    assert label_vocabulary(read_classification(ids)) == ["0", "2", "10"]
    assert label_vocabulary(read_classification(names)) == ["neg", "pos"]
    # a checkpoint's own label order is kept when the data uses its names
    assert label_vocabulary(read_classification(names), known=["pos", "neg", "meh"]) == [
        "pos",
        "neg",
        "meh",
    ]


def test_numeric_labels_are_ids_of_a_checkpoints_label_names(tmp_path):
    # A GLUE TSV (0/1) against a checkpoint fine-tuned with --labels negative,positive: the
    # numbers are ids of the checkpoint's names, so the names are kept and 0/1 map by position.
    glue = read_classification(write(tmp_path, "dev.tsv", "sentence\tlabel\na\t1\nb\t0\n"))
    named = ["negative", "positive"]
    assert label_vocabulary(glue, known=named) == named
    assert label_ids(glue, named) == [1, 0]
    # an id past the names is still an unknown label, and numbers that are names stay names
    with pytest.raises(DataError, match="label '2'"):
        label_ids(read_classification(write(tmp_path, "x.tsv", "sentence\tlabel\na\t2\n")), named)
    assert label_ids(glue, ["1", "0"]) == [0, 1]


def test_encoded_rows_are_the_services_rows(tmp_path, tok):
    path = write(tmp_path, "train.tsv", "sentence1\tsentence2\tlabel\ngood film\tbad\tyes\n")
    (row,) = encode_classification(read_classification(path), tok, ["no", "yes"], max_seq_length=16)
    tokens = [tok.id_to_token(i) for i in row["sequence"].input_ids]
    assert tokens == ["[CLS]", "good", "film", "[SEP]", "bad", "[SEP]"]
    assert row["sequence"].token_type_ids.tolist() == [0, 0, 0, 0, 1, 1]
    assert row["labels"] == 1


def test_a_row_with_a_missing_field_names_file_and_line(tmp_path):
    path = write(tmp_path, "train.tsv", "sentence\tlabel\ngood\t1\nno label here\n")
    with pytest.raises(DataError, match=rf"{path}:3: 1 tab-separated fields, expected 2"):
        read_classification(path)


def test_a_bad_json_line_names_file_and_line(tmp_path):
    path = write(tmp_path, "train.jsonl", '{"text": "a", "label": 1}\n{"text": "b", label: 0}\n')
    with pytest.raises(DataError, match=rf"{path}:2: not valid JSON"):
        read_classification(path)


def test_a_missing_column_says_what_was_expected(tmp_path):
    path = write(tmp_path, "train.tsv", "review\tlabel\ngood\t1\n")
    with pytest.raises(DataError, match="missing 'sentence' or 'text'; found 'review', 'label'"):
        read_classification(path)


@pytest.mark.parametrize(
    ("text", "message"), [("", "the file is empty"), ("sentence\tlabel\n", "no examples")]
)
def test_an_empty_dataset_says_what_was_expected(tmp_path, text, message):
    path = write(tmp_path, "train.tsv", text)
    with pytest.raises(DataError, match=f"{message}.*sentence,label"):
        read_classification(path)


def test_squad_json_given_to_classification_is_refused_with_what_was_expected(tmp_path):
    path = write(tmp_path, "squad.json", json.dumps({"version": "1.1", "data": []}))
    with pytest.raises(DataError, match="missing 'sentence' or 'text'; found 'version', 'data'"):
        read_classification(path)


def test_an_eval_label_never_seen_in_training_is_named(tmp_path):
    path = write(tmp_path, "dev.tsv", "sentence\tlabel\na\tpos\nb\tneutral\n")
    with pytest.raises(
        DataError, match=rf"{path}:3: label 'neutral' was not seen in the training data"
    ):
        label_ids(read_classification(path), ["neg", "pos"])


# --- token classification ---------------------------------------------------------------

CONLL_IOB1 = """-DOCSTART- -X- -X- O

EU NNP I-NP I-ORG
rejects VBZ I-VP O
John NNP I-NP I-PER
Smith NNP I-NP I-PER
Paris NNP I-NP B-PER

Paris NNP I-NP I-LOC
"""


def test_conll_iob1_is_read_as_iob2_and_docstart_skipped(tmp_path):
    path = write(tmp_path, "eng.train", CONLL_IOB1)
    first, second = read_tagged(path)
    assert first.words == ["EU", "rejects", "John", "Smith", "Paris"]
    assert first.tags == ["B-ORG", "O", "B-PER", "I-PER", "B-PER"]
    assert first.where == f"{path}:3"
    assert (second.words, second.tags) == (["Paris"], ["B-LOC"])


def test_token_jsonl(tmp_path):
    path = write(
        tmp_path,
        "train.jsonl",
        json.dumps({"tokens": ["John", "lives"], "tags": ["B-PER", "O"]}) + "\n",
    )
    (s,) = read_tagged(path)
    assert (s.words, s.tags) == (["John", "lives"], ["B-PER", "O"])


def test_tag_vocabulary_gives_every_type_both_tags():
    from training.data.token_classification import TaggedSentence

    sentences = [
        TaggedSentence(["Paris"], ["B-LOC"], "x:1"),
        TaggedSentence(["a", "b"], ["B-PER", "I-PER"], "x:3"),
    ]
    assert tag_vocabulary(sentences) == ["O", "B-LOC", "I-LOC", "B-PER", "I-PER"]


def test_a_bad_tag_names_file_and_line(tmp_path):
    path = write(tmp_path, "eng.train", "EU NNP B-ORG\nrejects VBZ 3\n")
    with pytest.raises(DataError, match=rf"{path}:2: last column '3' is not a tag; expected CoNLL"):
        read_tagged(path)


def test_a_tsv_given_to_token_classification_says_what_was_expected(tmp_path):
    path = write(tmp_path, "train.tsv", "sentence\tlabel\ngood film\t1\n")
    with pytest.raises(
        DataError, match=r"train.tsv:1: last column 'label' is not a tag; expected CoNLL"
    ):
        read_tagged(path)


def test_jsonl_with_mismatched_tags_names_the_line(tmp_path):
    path = write(tmp_path, "train.jsonl", json.dumps({"tokens": ["a", "b"], "tags": ["O"]}) + "\n")
    with pytest.raises(DataError, match=rf"{path}:1: 2 tokens and 1 tags"):
        read_tagged(path)


def test_only_the_first_word_piece_carries_the_tag(tmp_path, tok):
    path = write(tmp_path, "eng.train", "johnny B-PER\nlives O\nin O\nparis B-LOC\n")
    tags = ["O", "B-LOC", "I-LOC", "B-PER", "I-PER"]
    (row,) = encode_tagged(read_tagged(path), tok, tags, max_seq_length=32)
    tokens = [tok.id_to_token(i) for i in row["sequence"].input_ids]
    assert tokens == ["[CLS]", "john", "##n", "##y", "lives", "in", "paris", "[SEP]"]
    assert row["labels"].tolist() == [-100, 3, -100, -100, 0, 0, 1, -100]


def test_a_long_sentence_is_cut_at_words_and_every_word_labelled_once(tmp_path, tok):
    words = ["paris", "xyz", "john", "smith"] * 6  # "xyz" is three pieces
    tags = ["B-LOC", "O", "B-PER", "I-PER"] * 6
    path = write(tmp_path, "train.jsonl", json.dumps({"tokens": words, "tags": tags}) + "\n")
    vocab = ["O", "B-LOC", "I-LOC", "B-PER", "I-PER"]
    rows = encode_tagged(read_tagged(path), tok, vocab, max_seq_length=12)
    assert len(rows) > 1 and all(len(r["sequence"]) <= 12 for r in rows)
    labelled = np.concatenate([r["labels"][r["labels"] != -100] for r in rows])
    assert [vocab[i] for i in labelled] == tags


def test_a_word_the_tokenizer_drops_still_gets_a_position(tok):
    pieces = word_pieces(tok, ["paris", "\u200b", "john"])
    assert [len(p) for p in pieces] == [1, 1, 1]
    assert tok.id_to_token(int(pieces[1][0])) == "[UNK]"


# --- SQuAD ------------------------------------------------------------------------------


def squad_file(tmp_path, qas, context="john smith lives in paris, france. " * 1):
    doc = {
        "version": "2.0",
        "data": [{"title": "t", "paragraphs": [{"context": context, "qas": qas}]}],
    }
    return write(tmp_path, "squad.json", json.dumps(doc))


def test_squad_answers_map_to_their_tokens(tmp_path, tok):
    context = "john smith lives in paris, france."
    qas = [{"id": "q1", "question": "where?", "answers": [{"text": "paris", "answer_start": 20}]}]
    (e,) = read_squad(squad_file(tmp_path, qas, context))
    (row,), skipped = encode_squad([e], tok, max_seq_length=64, doc_stride=16)
    ids = row["sequence"].input_ids
    span = ids[row["start_positions"] : row["end_positions"] + 1]
    assert [tok.id_to_token(i) for i in span] == ["paris"] and skipped == 0


def test_squad_windows_without_the_answer_and_impossible_questions_point_at_cls(tmp_path, tok):
    context = "who is john smith? " * 8 + "john lives in paris."
    start = context.index("paris")
    qas = [
        {"id": "q1", "question": "where", "answers": [{"text": "paris", "answer_start": start}]},
        {"id": "q2", "question": "what", "answers": [], "is_impossible": True},
    ]
    answerable, impossible = read_squad(squad_file(tmp_path, qas, context))
    assert impossible.answers == []
    rows, _ = encode_squad([answerable], tok, max_seq_length=24, doc_stride=8)
    spans = [(r["start_positions"], r["end_positions"]) for r in rows]
    assert len(rows) > 2
    assert 1 <= sum(s > 0 for s, _ in spans) < len(rows)  # only windows holding "paris" point at it
    assert all(e == 0 for s, e in spans if s == 0)
    rows, _ = encode_squad([impossible], tok, max_seq_length=24, doc_stride=8)
    assert {(r["start_positions"], r["end_positions"]) for r in rows} == {(0, 0)}


def test_squad_answers_not_at_their_start_are_skipped_and_counted(tmp_path, tok):
    qas = [{"id": "q1", "question": "who", "answers": [{"text": "paris", "answer_start": 0}]}]
    rows, skipped = encode_squad(read_squad(squad_file(tmp_path, qas)), tok, 64, 16)
    assert rows == [] and skipped == 1


def test_a_question_the_service_would_refuse_is_a_data_error_naming_it(tmp_path, tok):
    # the service answers this with a 422; a reader names the record and says nothing of HTTP
    qas = [{"id": "q1", "question": "who " * 40, "answers": []}]
    (e,) = read_squad(squad_file(tmp_path, qas))
    with pytest.raises(DataError, match=r"qas\[0\].*question is too long for max_seq_len 24"):
        encode_squad([e], tok, max_seq_length=24, doc_stride=8)


def test_fine_tuning_imports_no_serving_runtime():
    # training shares the package contract and the rows with the service, not its runtime
    code = (
        "import sys, training.finetune\n"
        "loaded = [m for m in ('onnxruntime', 'prometheus_client', 'fastapi', 'service.errors')"
        " if m in sys.modules]\n"
        "assert not loaded, loaded"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]


def test_malformed_squad_names_the_question(tmp_path):
    qas = [{"id": "q1", "answers": []}]
    with pytest.raises(DataError, match=r"data\[0\].paragraphs\[0\].qas\[0\]: missing 'question'"):
        read_squad(squad_file(tmp_path, qas))
    path = write(tmp_path, "train.jsonl", '{"text": "a", "label": 1}\n{"text": "b", "label": 0}\n')
    with pytest.raises(DataError, match="not valid JSON.*expected SQuAD JSON"):
        read_squad(path)


# --- pairs ------------------------------------------------------------------------------


def test_anchor_positive_jsonl(tmp_path):
    path = write(tmp_path, "pairs.jsonl", json.dumps({"anchor": "a", "positive": "b"}) + "\n")
    assert read_pairs(path) == [TextPair("a", "b", f"{path}:1")]


def test_stsb_tsv_is_read_without_quote_processing_and_scored_pairs_train_from_4_up(tmp_path):
    header = (
        "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"
    )
    rows = ['0\tx\tx\tx\t0\tx\tx\tsays "hello\tsays hello\t4.800', "1\tx\tx\tx\t1\tx\tx\ta\tb\t1.0"]
    path = write(tmp_path, "train.tsv", "\n".join([header, *rows]) + "\n")
    pairs = read_pairs(path)
    assert pairs[0] == ScoredPair('says "hello', "says hello", 4.8, f"{path}:2")
    assert [(p.anchor, p.positive) for p in training_pairs(pairs)] == [
        ('says "hello', "says hello")
    ]


def test_scored_jsonl_with_a_bad_score_names_the_line(tmp_path):
    path = write(
        tmp_path,
        "dev.jsonl",
        json.dumps({"sentence1": "a", "sentence2": "b", "score": "high"}) + "\n",
    )
    with pytest.raises(DataError, match=rf"{path}:1: score 'high' is not a number"):
        read_pairs(path)


def test_pairs_collate_into_one_batch_anchors_first(tmp_path, tok):
    pairs = [TextPair("good film", "great movie", "x:1"), TextPair("bad", "awful film", "x:2")]
    batch = collate(encode_pairs(pairs, tok, max_seq_length=16))
    assert batch["input_ids"].shape == (4, 4)  # 2 anchors then 2 positives, padded to 4
    assert batch["attention_mask"].sum(1).tolist() == [4, 3, 4, 4]


def test_collate_pads_token_labels_with_ignore_index(tmp_path, tok):
    path = write(
        tmp_path,
        "t.jsonl",
        "\n".join(
            json.dumps({"tokens": w, "tags": ["O"] * len(w)}) for w in (["a"], ["a", "b", "c"])
        ),
    )
    batch = collate(encode_tagged(read_tagged(path), tok, ["O"], max_seq_length=16))
    assert batch["labels"].tolist() == [[-100, 0, -100, -100, -100], [-100, 0, 0, 0, -100]]


# --- the real files ---------------------------------------------------------------------


@pytest.mark.shared
def test_real_sst2_dev(shared_data):
    examples = read_classification(shared_data / "sst2" / "dev.tsv")
    assert len(examples) == 872
    assert sum(e.label == "1" for e in examples) == 444
    assert label_vocabulary(examples) == ["0", "1"]


@pytest.mark.shared
def test_real_conll_iob1_reads_as_the_iob2_release(shared_data):
    iob1 = read_tagged(shared_data / "conll2003" / "eng.testa")
    iob2 = read_tagged(shared_data / "conll2003" / "iob2" / "eng.testa")
    assert len(iob1) == len(iob2) == 3250
    assert [s.tags for s in iob1] == [s.tags for s in iob2]
    assert tag_vocabulary(iob1) == [
        "O",
        "B-LOC",
        "I-LOC",
        "B-MISC",
        "I-MISC",
        "B-ORG",
        "I-ORG",
        "B-PER",
        "I-PER",
    ]


@pytest.mark.shared
def test_real_squad_and_stsb(shared_data):
    assert len(read_squad(shared_data / "squad" / "dev-v1.1.json")) == 10570
    dev = read_pairs(shared_data / "stsb" / "dev.tsv")
    assert len(dev) == 1500 and all(0 <= p.score <= 5 for p in dev)
    assert len(training_pairs(read_pairs(shared_data / "stsb" / "train.tsv"))) == 1406
