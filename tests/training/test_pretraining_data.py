"""Pretraining data: reading and splitting raw text, the token cache, segment pairs (NSP, SOP,
packed MLM segments) and dynamic masking, checked against the recipe's numbers."""

from __future__ import annotations

import random
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.training.corpus_text import write_corpus
from training.data.corpus import (
    CorpusError,
    read_documents,
    read_text,
    split_sentences,
    tokenize_corpus,
)
from training.data.pretraining import (
    Instances,
    Masker,
    PretrainingStream,
    Vocabulary,
    build_batch,
    create_instances,
    max_predictions,
)
from training.tokenizer import train_tokenizer
from training.trainer import Prefetched

quiet = dict(log=lambda message: None)


@pytest.fixture(scope="module")
def text(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus") / "stories.txt", documents=1000)


@pytest.fixture(scope="module")
def tokenizer(text):
    # Small enough that the longer topic words are split into ## pieces.
    return train_tokenizer([text], vocab_size=120)


@pytest.fixture(scope="module")
def corpus(text, tokenizer, tmp_path_factory):
    return tokenize_corpus([text], tokenizer, tmp_path_factory.mktemp("cache"), **quiet)


def epochs(corpus, objective: str, max_seq_length: int, n: int, **kw) -> list[Instances]:
    return [
        create_instances(corpus, objective, max_seq_length, random.Random(e), **kw)
        for e in range(n)
    ]


def document_of(corpus, token_positions: np.ndarray) -> np.ndarray:
    return np.searchsorted(corpus.document_token_offsets(), token_positions, side="right") - 1


def pairs(instances: Instances) -> np.ndarray:
    """(N, 6): a_start, a_end, a_segment, b_start, b_end, b_segment."""
    assert (np.diff(instances.offsets) == 2).all()
    return instances.pieces.reshape(-1, 6)


# --- reading ----------------------------------------------------------------------------


def test_sentences_split_at_final_punctuation_before_a_capital():
    assert split_sentences("He left. She stayed! Did they? Yes.") == [
        "He left.",
        "She stayed!",
        "Did they?",
        "Yes.",
    ]


def test_abbreviations_initials_and_lower_case_do_not_end_a_sentence():
    text = "Mr. Brown met H. G. Wells at 5 p.m. today. it was late. Then they left."
    assert split_sentences(text) == [
        "Mr. Brown met H. G. Wells at 5 p.m. today. it was late.",
        "Then they left.",
    ]


def test_space_tokenized_text_and_closing_quotes():
    # Gutenberg (NLTK) style: punctuation and quotes are words of their own.
    text = "` Oh dear ! ' said the Rabbit . `` I shall be late ! '' Alice ran ."
    assert split_sentences(text) == [
        "` Oh dear ! ' said the Rabbit .",
        "`` I shall be late ! ''",
        "Alice ran .",
    ]


def test_cr_only_line_endings_and_a_bom_are_normalised(tmp_path):
    # War and Peace: a UTF-8 BOM and CR-only line endings.
    path = tmp_path / "war.txt"
    path.write_bytes("\ufeffWell, Prince.\rSo Genoa.\r\rIt was in July.\r".encode())
    assert read_text(path) == "Well, Prince.\nSo Genoa.\n\nIt was in July.\n"
    assert list(read_documents(path)) == [["Well, Prince.", "So Genoa."], ["It was in July."]]


def test_crlf_blank_lines_separate_documents(tmp_path):
    path = tmp_path / "lincoln.txt"
    path.write_bytes(b"Fellow citizens.\r\nWe meet.\r\n   \r\nA new one.\r\n")
    assert list(read_documents(path)) == [["Fellow citizens.", "We meet."], ["A new one."]]
    assert list(read_documents(path, documents="files")) == [
        ["Fellow citizens.", "We meet.", "A new one."]
    ]


@pytest.mark.parametrize(
    "content, message",
    [
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "looks binary (NUL byte at offset 8)"),
        (b"caf\xe9 au lait", "not UTF-8 (byte 0xe9 at offset 3)"),
        ("Hello.".encode("utf-16"), "UTF-16"),
    ],
)
def test_a_bad_file_is_an_error_naming_it(tmp_path, tokenizer, content, message):
    bad = tmp_path / "bad.bin"
    bad.write_bytes(content)
    good = write_corpus(tmp_path / "good.txt", documents=3)
    with pytest.raises(CorpusError, match=rf"bad\.bin: .*{re.escape(message)}"):
        tokenize_corpus([good, bad], tokenizer, tmp_path / "cache", **quiet)


def test_bad_and_empty_files_can_be_skipped_and_are_counted(tmp_path, tokenizer):
    (tmp_path / "bad.bin").write_bytes(b"\x00\x01")
    (tmp_path / "empty.txt").write_text("\n\n  \n")
    write_corpus(tmp_path / "good.txt", documents=3)
    corpus = tokenize_corpus(
        [tmp_path], tokenizer, tmp_path / "cache", skip_bad_files=True, **quiet
    )
    assert corpus.meta["skipped_bad_files"] == [str(tmp_path / "bad.bin")]
    assert corpus.meta["skipped_empty_files"] == [str(tmp_path / "empty.txt")]
    assert corpus.num_documents == 3


def test_an_empty_corpus_is_an_error(tmp_path, tokenizer):
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(CorpusError, match="empty corpus: no text in .*empty.txt"):
        tokenize_corpus([tmp_path / "empty.txt"], tokenizer, tmp_path / "cache", **quiet)
    with pytest.raises(CorpusError, match="missing.txt: no such file"):
        tokenize_corpus([tmp_path / "missing.txt"], tokenizer, tmp_path / "cache", **quiet)


# --- the cache --------------------------------------------------------------------------


def test_the_cache_holds_every_sentence_and_is_reused(tmp_path, tokenizer):
    path = tmp_path / "two.txt"
    path.write_text("The sailor saw the sea. The whale left.\n\nThe king found a crown.\n")
    messages: list[str] = []
    corpus = tokenize_corpus([path], tokenizer, tmp_path / "cache", log=messages.append)
    assert isinstance(corpus.tokens, np.memmap) and corpus.tokens.dtype == np.uint16
    assert (corpus.num_documents, len(corpus.sentences) - 1) == (2, 3)
    first = corpus.tokens[corpus.sentences[0] : corpus.sentences[1]].tolist()
    assert first == tokenizer.encode("The sailor saw the sea.", add_special_tokens=False).ids

    again = tokenize_corpus([path], tokenizer, tmp_path / "cache", log=messages.append)
    assert again.path == corpus.path and messages[-1].startswith("corpus: reusing")

    path.write_text("The sailor saw the sea.\n")  # a changed file is a new cache
    assert tokenize_corpus([path], tokenizer, tmp_path / "cache", **quiet).path != corpus.path
    other = train_tokenizer([path], vocab_size=60)  # so is another tokenizer
    assert tokenize_corpus([path], other, tmp_path / "cache", **quiet).path != corpus.path


@pytest.mark.shared
def test_the_real_corpus_files_read_cleanly(shared_data):
    books = shared_data / "corpus" / "misc_pd_books"
    war = list(read_documents(books / "war_and_peace.txt"))  # CR-only, BOM
    assert len(war) > 10_000
    assert war[0][0].startswith('"Well, Prince, so Genoa')
    lincoln = read_text(books / "lincoln_collected_clean.txt")  # CRLF
    assert "\r" not in lincoln and "\ufeff" not in lincoln
    emma = list(read_documents(shared_data / "corpus" / "gutenberg_nltk" / "austen-emma.txt"))
    assert len(emma) == 1 and len(emma[0]) > 5_000  # no blank lines: the book is one document


# --- segment pairs ----------------------------------------------------------------------


def test_nsp_labels_are_a_fair_coin_and_random_b_comes_from_another_document(corpus):
    labels, docs_a, docs_b, a_ends, b_starts = [], [], [], [], []
    for inst in epochs(corpus, "mlm+nsp", 32, 5):
        p = pairs(inst)
        labels.append(inst.labels)
        # Every piece lies inside one document.
        for start, end in ((p[:, 0], p[:, 1]), (p[:, 3], p[:, 4])):
            assert (end > start).all()
            assert (document_of(corpus, start) == document_of(corpus, end - 1)).all()
        docs_a.append(document_of(corpus, p[:, 0]))
        docs_b.append(document_of(corpus, p[:, 3]))
        a_ends.append(p[:, 1])
        b_starts.append(p[:, 3])
        assert (p[:, 1] - p[:, 0] + p[:, 4] - p[:, 3] + 3 <= 32).all()
        assert (p[:, 2] == 0).all() and (p[:, 5] == 1).all()
    labels, docs_a, docs_b = map(np.concatenate, (labels, docs_a, docs_b))
    a_ends, b_starts = np.concatenate(a_ends), np.concatenate(b_starts)
    assert len(labels) >= 10_000
    assert abs(labels.mean() - 0.5) < 0.02
    random_b, next_b = labels == 1, labels == 0
    assert (docs_a[random_b] != docs_b[random_b]).all()
    # IsNext: B continues A in the same document (truncation may trim A's end or B's start).
    assert (docs_a[next_b] == docs_b[next_b]).all()
    assert (a_ends[next_b] <= b_starts[next_b]).all()


def test_short_seq_prob_draws_a_short_target_one_time_in_ten(corpus):
    targets = np.concatenate([i.targets for i in epochs(corpus, "mlm+nsp", 64, 5)])
    max_num_tokens = 64 - 3
    short = targets < max_num_tokens
    # randint(2, max) lands on max itself 1 time in 60: 9.8% expected.
    assert abs(short.mean() - 0.1 * (1 - 1 / 60)) < 0.01
    assert targets[short].min() >= 2
    never = create_instances(corpus, "mlm+nsp", 64, random.Random(0), short_seq_prob=0.0)
    assert (never.targets == max_num_tokens).all()


def test_sop_negatives_are_the_same_two_segments_swapped(corpus):
    inst = create_instances(corpus, "mlm+sop", 32, random.Random(0))
    p = pairs(inst)
    assert abs(inst.labels.mean() - 0.5) < 0.03
    same_doc = document_of(corpus, p[:, 0]) == document_of(corpus, p[:, 3])
    assert same_doc.all()
    swapped, in_order = inst.labels == 1, inst.labels == 0
    assert (p[swapped, 4] <= p[swapped, 0]).all()  # the segment shown second came first
    assert (p[in_order, 1] <= p[in_order, 3]).all()


def test_mlm_packs_full_length_segments_over_documents(corpus):
    inst = create_instances(corpus, "mlm", 64, random.Random(0))
    assert (inst.labels == -1).all()
    pieces_per_example = np.diff(inst.offsets)
    lengths = (
        np.add.reduceat(inst.pieces[:, 1] - inst.pieces[:, 0], inst.offsets[:-1])
        + 1
        + pieces_per_example
    )
    assert lengths.max() <= 64
    assert (lengths >= 64 - 20).mean() > 0.95  # full but for the last sentence that did not fit
    assert (pieces_per_example > 1).any()  # documents joined, each closed by [SEP]
    assert (
        document_of(corpus, inst.pieces[:, 0]) == document_of(corpus, inst.pieces[:, 1] - 1)
    ).all()
    # One epoch is every token of the corpus exactly once.
    ranges = inst.pieces[np.argsort(inst.pieces[:, 0]), :2]
    assert ranges[0, 0] == 0 and ranges[-1, 1] == corpus.num_tokens
    assert (ranges[1:, 0] == ranges[:-1, 1]).all()


def test_a_batch_is_cls_a_sep_b_sep_with_segment_ids(corpus, tokenizer):
    vocab = Vocabulary.from_tokenizer(tokenizer)
    inst = create_instances(corpus, "mlm+nsp", 32, random.Random(0))
    batch = build_batch(corpus, inst, [0, 1, 2], vocab)
    (a0, a1, _, b0, b1, _) = pairs(inst)[0]
    n_a, n_b = a1 - a0, b1 - b0
    ids = batch["input_ids"][0].tolist()
    assert ids[0] == vocab.cls and ids[1 + n_a] == vocab.sep and ids[2 + n_a + n_b] == vocab.sep
    assert ids[1 : 1 + n_a] == corpus.tokens[a0:a1].tolist()
    assert batch["token_type_ids"][0, : 2 + n_a].eq(0).all()
    assert batch["token_type_ids"][0, 2 + n_a : 3 + n_a + n_b].eq(1).all()
    assert batch["attention_mask"][0].sum() == 3 + n_a + n_b
    assert batch["next_sentence_label"].tolist() == inst.labels[:3].tolist()


# --- masking ----------------------------------------------------------------------------


def masked_batches(corpus, tokenizer, masker_args: dict, seed: int, tokens: int = 100_000):
    """Batches of real examples, masked, until `tokens` non-special tokens were seen."""
    vocab = Vocabulary.from_tokenizer(tokenizer)
    masker = Masker(vocab, **masker_args)
    generator = torch.Generator().manual_seed(seed)
    inst = create_instances(corpus, "mlm", 128, random.Random(0))
    seen, out = 0, []
    for start in range(0, len(inst) - 64, 64):
        batch = build_batch(corpus, inst, range(start, start + 64), vocab)
        masked, labels = masker(batch["input_ids"], generator)
        out.append((batch["input_ids"], masked, labels))
        seen += int((~torch.isin(batch["input_ids"], torch.tensor(vocab.special))).sum())
        if seen >= tokens:
            return vocab, out
    raise AssertionError("corpus too small")


def test_masking_statistics_over_100k_tokens(corpus, tokenizer):
    vocab, batches = masked_batches(corpus, tokenizer, {}, seed=0)
    original = torch.cat([b[0].flatten() for b in batches])
    masked = torch.cat([b[1].flatten() for b in batches])
    labels = torch.cat([b[2].flatten() for b in batches])
    special = torch.isin(original, torch.tensor(vocab.special))
    assert (~special).sum() >= 100_000
    chosen = labels != -100
    assert not (chosen & special).any()  # never [CLS], [SEP], [PAD], ...
    assert (masked[special] == original[special]).all()
    assert (labels[chosen] == original[chosen]).all()
    assert abs(chosen.sum() / (~special).sum() - 0.15) < 0.005
    as_mask = (masked[chosen] == vocab.mask).float().mean()
    kept = (masked[chosen] == original[chosen]).float().mean()
    replaced = 1 - as_mask - kept
    assert abs(as_mask - 0.8) < 0.02 and abs(kept - 0.1) < 0.02 and abs(replaced - 0.1) < 0.02
    random_tokens = masked[chosen][
        (masked[chosen] != vocab.mask) & (masked[chosen] != original[chosen])
    ]
    assert not torch.isin(random_tokens, torch.tensor(vocab.special)).any()
    assert (masked[~chosen] == original[~chosen]).all()


def test_masking_is_seeded(corpus, tokenizer):
    _, first = masked_batches(corpus, tokenizer, {}, seed=1, tokens=5_000)
    _, again = masked_batches(corpus, tokenizer, {}, seed=1, tokens=5_000)
    _, other = masked_batches(corpus, tokenizer, {}, seed=2, tokens=5_000)
    assert all(
        torch.equal(a[1], b[1]) and torch.equal(a[2], b[2])
        for a, b in zip(first, again, strict=True)
    )
    assert not torch.equal(first[0][2], other[0][2])


def test_whole_word_masking_takes_every_piece_of_a_word(corpus, tokenizer):
    vocab, batches = masked_batches(corpus, tokenizer, {"whole_word": True}, seed=0, tokens=20_000)
    pieces = torch.from_numpy(vocab.continuation)
    n_pieces = n_chosen = n_candidates = 0
    for original, _, labels in batches:
        chosen = labels != -100
        inner = pieces[original]  # "##" pieces: the middle or end of a word
        inner[:, 0] = False
        n_pieces += int((chosen & inner).sum())
        # A piece is chosen exactly when the token before it (same word) is.
        assert torch.equal(chosen[:, 1:][inner[:, 1:]], chosen[:, :-1][inner[:, 1:]])
        n_chosen += int(chosen.sum())
        n_candidates += int((~torch.isin(original, torch.tensor(vocab.special))).sum())
    assert n_pieces > 100  # the test vocabulary does split words
    assert abs(n_chosen / n_candidates - 0.15) < 0.01


@pytest.mark.parametrize("whole_word", [False, True])
def test_the_stream_bound_on_chosen_positions_holds_and_never_changes_the_masks(
    corpus, tokenizer, whole_word
):
    # The GPU's MLM head reads max_predictions positions a row (BertForPreTraining): a row
    # with more chosen would lose some silently; the stream's cap must therefore never bind.
    bound = max_predictions(128, 0.15)
    assert bound == 20  # create_pretraining_data's max_predictions_per_seq for 128 tokens
    args = {"whole_word": whole_word}
    _, free = masked_batches(corpus, tokenizer, args, seed=4, tokens=30_000)
    _, capped = masked_batches(corpus, tokenizer, args | {"max_predictions": bound}, 4, 30_000)
    counts = torch.cat([(labels != -100).sum(1) for _, _, labels in free])
    assert counts.max() <= bound and counts.max() >= bound - 2  # the rows are full: near it
    for (_, m1, l1), (_, m2, l2) in zip(free, capped, strict=True):
        assert torch.equal(m1, m2) and torch.equal(l1, l2)


# --- the stream -------------------------------------------------------------------------


def test_the_stream_resumes_exactly_from_its_state(corpus, tokenizer):
    stream = PretrainingStream(corpus, tokenizer, "mlm+nsp", 32, batch_size=16, seed=3)
    per_epoch = stream.batches_per_epoch
    for _ in range(per_epoch - 2):  # resume just before an epoch boundary
        stream.next_batch()
    state = stream.state_dict()
    expected = [stream.next_batch() for _ in range(4)]
    resumed = PretrainingStream(corpus, tokenizer, "mlm+nsp", 32, batch_size=16, seed=3)
    resumed.load_state_dict(state)
    for a, b in zip(expected, [resumed.next_batch() for _ in range(4)], strict=True):
        assert all(torch.equal(a[k], b[k]) for k in a)
    assert resumed.epoch == 1


def test_a_prefetched_stream_hands_the_same_batches_and_resumes_where_training_was(
    corpus, tokenizer
):
    def stream() -> PretrainingStream:
        return PretrainingStream(corpus, tokenizer, "mlm+nsp", 32, batch_size=16, seed=5)

    bare, ahead = stream(), Prefetched(stream(), depth=3)
    per_epoch = bare.batches_per_epoch
    for _ in range(per_epoch - 1):  # the thread reads past the epoch's end meanwhile
        a, b = bare.next_batch(), ahead.next_batch()
        assert all(torch.equal(a[k], b[k]) for k in a)
    state, epoch = ahead.state_dict(), ahead.epoch
    assert epoch == bare.epoch == 0
    assert state["position"] == bare.state_dict()["position"]  # not the thread's, 3 further
    expected = [bare.next_batch() for _ in range(3)]
    resumed = Prefetched(stream())
    resumed.load_state_dict(state)
    ahead.close()  # rewinds: the next batch is the one after the last handed out
    for other in (resumed, ahead):
        got = [other.next_batch() for _ in range(3)]
        assert all(torch.equal(a[k], b[k]) for a, b in zip(expected, got, strict=True) for k in a)
        assert other.epoch == 1
        other.close()


def test_an_error_in_the_prefetching_thread_is_raised_by_next_batch():
    class Broken:
        epoch = 0.0

        def next_batch(self) -> dict:
            raise CorpusError("disk gone")

        def state_dict(self) -> dict:
            return {}

        def load_state_dict(self, state: dict) -> None:
            pass

    with pytest.raises(CorpusError, match="disk gone"):
        Prefetched(Broken()).next_batch()


def test_processes_read_disjoint_equal_shares(corpus, tokenizer):
    streams = [
        PretrainingStream(corpus, tokenizer, "mlm+nsp", 32, batch_size=8, rank=r, world_size=2)
        for r in (0, 1)
    ]
    assert streams[0].batches_per_epoch == streams[1].batches_per_epoch
    mine = [set(s._mine.tolist()) for s in streams]
    assert not mine[0] & mine[1] and len(mine[0]) == len(mine[1])


def test_nsp_needs_two_documents(tmp_path, tokenizer):
    path = tmp_path / "one.txt"
    path.write_text("The sailor saw the sea. The whale left. The ship sailed.\n")
    corpus = tokenize_corpus([path], tokenizer, tmp_path / "cache", **quiet)
    with pytest.raises(CorpusError, match="only one"):
        create_instances(corpus, "mlm+nsp", 32, random.Random(0))
    assert len(create_instances(corpus, "mlm", 32, random.Random(0))) == 1
