"""WordPiece through `tokenizers`: the same ids, segments, masks and offsets as transformers'
BertTokenizerFast on real text, and trained vocabularies that survive save / load."""

from __future__ import annotations

import json

import pytest

from tests.training.conftest import conll_sentences, squad_pairs, sst2_sentences, stsb_pairs
from training.tokenizer import (
    SPECIAL_TOKENS,
    TokenizerError,
    do_lower_case,
    encode,
    encode_batch,
    load_tokenizer,
    save_tokenizer,
    train_tokenizer,
)

transformers = pytest.importorskip("transformers")

TEXT = "Héllo, Wörld! Tolstoy's WAR and peace"


# --- parity with transformers on real text -------------------------------------------------


@pytest.fixture(scope="module")
def texts(shared_data) -> list[str]:
    """2,272 texts: SST-2 dev, SQuAD dev questions and contexts, CoNLL-2003 dev sentences."""
    squad = squad_pairs(shared_data)
    contexts = list(dict.fromkeys(c for _, c in squad))
    out = (
        sst2_sentences(shared_data)
        + [q for q, _ in squad[:600]]
        + contexts[:300]
        + conll_sentences(shared_data)[:500]
    )
    assert len(out) >= 2000
    return out


@pytest.fixture(scope="module")
def pairs(shared_data) -> dict[str, tuple[list[str], list[str]]]:
    """Pairs per truncation strategy, chosen so the truncated side can always make room."""
    squad = squad_pairs(shared_data)[::5]  # 2,114 questions over many contexts
    stsb = stsb_pairs(shared_data)
    questions, contexts = [q for q, _ in squad], [c for _, c in squad]
    assert len(questions) >= 2000
    return {
        "longest_first": (questions + [a for a, _ in stsb], contexts + [b for _, b in stsb]),
        "only_second": (questions, contexts),
        "only_first": (contexts, questions),
    }


VOCABS = {  # name -> (file under ../shared/data/vocab, lower-cased)
    "uncased vocab.txt": ("bert-base-uncased/vocab.txt", True),
    "cased vocab.txt": ("bert-base-cased/vocab.txt", False),
    "cased tokenizer.json": ("bert-base-cased/tokenizer.json", False),
}


@pytest.fixture(scope="module")
def pair_of_tokenizers(shared_data):
    """name -> (ours, transformers' BertTokenizerFast) on the same vocabulary, built once."""
    built = {}

    def get(name: str):
        if name not in built:
            file, lowercase = VOCABS[name]
            path = shared_data / "vocab" / file
            ours = load_tokenizer(path)  # lower-casing inferred from the vocab or the normalizer
            assert do_lower_case(ours) is lowercase
            source = {"vocab_file" if path.suffix == ".txt" else "tokenizer_file": str(path)}
            built[name] = ours, transformers.BertTokenizerFast(**source, do_lower_case=lowercase)
        return built[name]

    return get


def _assert_same(ours, theirs) -> None:
    assert [e.input_ids for e in ours] == theirs["input_ids"]
    assert [e.token_type_ids for e in ours] == theirs["token_type_ids"]
    assert [e.attention_mask for e in ours] == theirs["attention_mask"]
    assert [e.offsets for e in ours] == [
        [tuple(o) for o in row] for row in theirs["offset_mapping"]
    ]


HF_OUTPUTS = dict(
    return_token_type_ids=True, return_attention_mask=True, return_offsets_mapping=True
)
UNCASED, CASED, CASED_JSON = VOCABS
# Every setting on the uncased vocabulary; fewer on the cased ones, which share the code paths
# (each comparison costs about a CPU-second; the whole matrix would double this file's time).


@pytest.mark.shared
@pytest.mark.parametrize(
    "vocab, max_length",
    [
        (UNCASED, None),
        (UNCASED, 32),
        (UNCASED, 128),
        (CASED, None),
        (CASED, 32),
        (CASED_JSON, None),
    ],
)
def test_single_texts_match_transformers(pair_of_tokenizers, texts, vocab, max_length):
    ours, theirs = pair_of_tokenizers(vocab)
    expected = theirs(texts, truncation=max_length is not None, max_length=max_length, **HF_OUTPUTS)
    _assert_same(encode_batch(ours, texts, max_length=max_length), expected)


@pytest.mark.shared
@pytest.mark.parametrize(
    "vocab, strategy, max_length",
    [  # each strategy and each kind of vocabulary once by default; the rest of the cross product
        # in the slow stage (2-3 s a case on two cores: the unit suite stays under 10 minutes)
        (UNCASED, "longest_first", 32),
        (UNCASED, "only_first", 128),
        (CASED, "only_second", 128),
        (CASED_JSON, "longest_first", 32),
        *(
            pytest.param(*case, marks=pytest.mark.slow)
            for case in [
                (UNCASED, "longest_first", None),
                (UNCASED, "longest_first", 128),
                (UNCASED, "only_second", 128),
                (CASED, "longest_first", None),
            ]
        ),
    ],
)
def test_pairs_match_transformers(pair_of_tokenizers, pairs, vocab, strategy, max_length):
    ours, theirs = pair_of_tokenizers(vocab)
    first, second = pairs[strategy]
    truncation = strategy if max_length else False
    expected = theirs(first, second, truncation=truncation, max_length=max_length, **HF_OUTPUTS)
    _assert_same(encode_batch(ours, first, second, max_length, strategy), expected)


# --- training a vocabulary -----------------------------------------------------------------


@pytest.mark.shared
@pytest.mark.parametrize("lowercase", [True, False])
def test_trained_vocabulary_round_trips_and_opens_in_transformers(tmp_path, shared_data, lowercase):
    corpus = tmp_path / "corpus.txt"
    text = conll_sentences(shared_data)[:800] + sst2_sentences(shared_data, "train")[:800]
    corpus.write_text("\n".join(text) + "\n")
    tok = train_tokenizer([corpus], vocab_size=400, lowercase=lowercase)
    assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    assert 200 < tok.get_vocab_size() <= 400 and do_lower_case(tok) is lowercase

    save_tokenizer(tok, tmp_path / "tok", model_max_length=128)
    probe = conll_sentences(shared_data)[800:1000]
    expected = encode_batch(tok, probe)
    assert encode_batch(load_tokenizer(tmp_path / "tok"), probe) == expected
    assert encode_batch(load_tokenizer(tmp_path / "tok" / "vocab.txt"), probe) == expected
    # transformers' AutoTokenizer builds the same tokenizer, cased or not (tokenizer_config.json).
    auto = transformers.AutoTokenizer.from_pretrained(tmp_path / "tok")
    assert auto(probe)["input_ids"] == [e.input_ids for e in expected]
    assert auto.model_max_length == 128


def test_train_reads_bom_and_cr_only_files(tmp_path):
    corpus = tmp_path / "corpus.txt"
    lines = ["The quick brown fox jumps over the lazy dog."] * 20 + [
        "A lazy dog sleeps all day."
    ] * 20
    corpus.write_bytes(b"\xef\xbb\xbf" + "\r".join(lines).encode())  # as War and Peace is stored
    tok = train_tokenizer([corpus], vocab_size=120, min_frequency=1)
    assert "\ufeff" not in tok.get_vocab()
    enc = encode(tok, "the lazy fox", "a dog")
    assert (
        tok.id_to_token(enc.input_ids[0]) == "[CLS]"
        and tok.id_to_token(enc.input_ids[-1]) == "[SEP]"
    )
    assert enc.token_type_ids == [0] * 5 + [1] * 3
    assert tok.decode(enc.input_ids) == "the lazy fox a dog"


# --- loading ----------------------------------------------------------------------------


def test_minilm_tokenizer_has_padding_and_truncation_off(minilm_path):
    tok = load_tokenizer(minilm_path)  # its tokenizer.json pads and truncates to 128
    assert tok.padding is None and tok.truncation is None and do_lower_case(tok)
    short, long = encode_batch(tok, ["hello", "word " * 200])
    assert len(short.input_ids) == 3 and len(long.input_ids) == 202


def test_saved_tokenizer_json_neither_pads_nor_truncates(tmp_path, minilm_path):
    tok = load_tokenizer(minilm_path)
    tok.enable_padding(length=128)
    save_tokenizer(tok, tmp_path)
    saved = json.loads((tmp_path / "tokenizer.json").read_text())
    assert saved["padding"] is None and saved["truncation"] is None
    assert tok.padding is not None  # the caller's object is left as it was
    assert (tmp_path / "vocab.txt").read_text() == (minilm_path / "vocab.txt").read_text()


def test_vocab_txt_lower_casing_follows_tokenizer_config(tmp_path, minilm_path):
    vocab = (minilm_path / "vocab.txt").read_text()
    (tmp_path / "vocab.txt").write_text(vocab)
    assert (
        encode(load_tokenizer(tmp_path), TEXT).input_ids
        == encode(load_tokenizer(minilm_path), TEXT).input_ids
    )
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
    assert not do_lower_case(load_tokenizer(tmp_path / "vocab.txt"))
    assert do_lower_case(load_tokenizer(tmp_path / "vocab.txt", lowercase=True))


def test_truncation_is_per_call_and_restored(minilm_path):
    tok = load_tokenizer(minilm_path)
    tok.enable_truncation(50)
    enc = encode(tok, "a b c d e f g h", "i j k l", max_length=8)
    assert len(enc.input_ids) == 8 and enc.token_type_ids == [0, 0, 0, 0, 0, 1, 1, 1]
    assert tok.truncation["max_length"] == 50
    only_second = encode(tok, "a b c d e f g h", "i j k l", max_length=12, truncation="only_second")
    assert only_second.token_type_ids == [0] * 10 + [1] * 2
    with pytest.raises(ValueError, match="truncation must be one of"):
        encode(tok, "a", max_length=8, truncation="middle")


def test_offsets_point_into_each_text(minilm_path):
    text, pair = "She wrote it.", "Who wrote the playbook?"
    enc = encode(load_tokenizer(minilm_path), text, pair)
    pieces = [
        (text if t == 0 else pair)[s:e]
        for (s, e), t in zip(enc.offsets, enc.token_type_ids, strict=True)
    ]
    assert pieces == [
        "",
        "She",
        "wrote",
        "it",
        ".",
        "",
        "Who",
        "wrote",
        "the",
        "play",
        "book",
        "?",
        "",
    ]


def test_load_errors(tmp_path):
    with pytest.raises(
        TokenizerError, match=r"no tokenizer.json, vocab.txt or vocab.json \+ merges.txt"
    ):
        load_tokenizer(tmp_path)
    (tmp_path / "vocab.txt").write_text("[PAD]\nhello\n")
    with pytest.raises(
        TokenizerError, match=r"vocab.txt: the vocabulary has no \[CLS\], \[SEP\], \[UNK\]"
    ):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(TokenizerError, match="tokenizer.json: not a tokenizers file"):
        load_tokenizer(tmp_path)
