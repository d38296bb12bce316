"""heads/rows.py on its own: every family's row layout, truncation and windows against the
`tokenizers` library doing the same on the published tokenizer files (tests/published: the
real files' structure, shrunk vocabularies), and the module's small rules (pad ids, subword
flags, caches) against what their docstrings promise.

The task tests reach this module through the tasks; these pin it where a task would not tell
(a pad id nobody declared, a tokenizer without a post-processor, the 17th tokenizer of a
process, a tab before a token).
"""

from __future__ import annotations

import itertools
import random
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from tokenizers import AddedToken, Tokenizer, processors
from tokenizers.models import BPE, WordPiece

from heads import rows
from heads.rows import (
    ModelRow,
    Template,
    encode,
    encode_texts,
    forget,
    guess_pad_id,
    longest_first,
    pad,
    pad_id,
    prepare_tokenizer,
    row,
    template,
    text_rows,
    tokens,
    windows,
)
from tests.heads.tasks.conftest import refused

PUBLISHED = Path(__file__).parents[1] / "published"
# One of each layout and tokenizer kind the families ship with.
FAMILIES = (
    "bert-base-uncased",  # WordPiece, [CLS] a [SEP] b [SEP], types 0 / 1
    "bert-base-cased",
    "roberta-base",  # byte-level BPE, <s> a </s></s> b </s>, all type 0
    "xlm-roberta-base",  # Unigram (Metaspace)
    "camembert-base",
    "albert-base-v2",  # Unigram, [CLS] a [SEP] b [SEP]
    "deberta-v3-base",
    "ModernBERT-base",  # byte-level BPE, [CLS] a [SEP] b [SEP]
    "all-mpnet-base-v2",  # WordPiece, <s> a </s></s> b </s>; the file pads and truncates
)
TEXTS = (
    "Paris is the capital of France.",
    "The committee's unanimous decision surprised everyone , again!",
    "naïve café owners ran 12,000 meters",
    "a",
)


def published(name: str) -> Tokenizer:
    """The published file as it is (padding / truncation as the file says)."""
    return Tokenizer.from_file(str(PUBLISHED / name / "tokenizer.json"))


def prepared(name: str) -> Tokenizer:
    return prepare_tokenizer(published(name))


# --- the row layout ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", FAMILIES)
def test_rows_are_laid_out_as_the_tokenizers_own_template_lays_them_out(name: str):
    tok = prepared(name)
    layout = template(tok)
    for a_text, b_text in itertools.permutations(TEXTS, 2):
        a = tok.encode(a_text, add_special_tokens=False)
        b = tok.encode(b_text, add_special_tokens=False)
        for b_enc, b_ids in ((None, None), (b, b.ids)):
            want = tok.post_process(a, b_enc, add_special_tokens=True)
            got = row(layout, a.ids, b_ids)
            assert got.input_ids.tolist() == want.ids, (name, a_text, b_text)
            assert got.token_type_ids.tolist() == want.type_ids, (name, a_text, b_text)
            assert got.input_ids.dtype == got.token_type_ids.dtype == np.int64
            assert len(got) == len(want.ids)


@pytest.mark.parametrize("name", FAMILIES)
def test_the_first_token_of_every_row_is_the_null_answer(name: str):
    tok = prepared(name)
    first = tok.post_process(tok.encode("x", add_special_tokens=False)).ids[0]
    assert template(tok).cls_id == first


def test_every_part_of_a_layout_is_int64():
    """_Parts promises (n,) int64 arrays; a float part would turn the rows' types into floats
    wherever a caller reads the layout itself."""
    for name in FAMILIES:
        layout = template(prepared(name))
        for parts in (layout.single, layout.pair):
            for field in ("prefix", "prefix_types", "middle", "middle_types"):
                assert getattr(parts, field).dtype == np.int64, (name, field)
            assert parts.suffix.dtype == parts.suffix_types.dtype == np.int64, name


def bare_bert() -> Tokenizer:
    """BERT's tokenizer.json without its post-processor, as tokenizer.json files were written
    before they carried the template."""
    tok = prepared("bert-base-uncased")
    tok.post_processor = None
    return tok


def test_without_a_post_processor_the_layout_is_berts_by_its_token_names():
    bare, full = bare_bert(), prepared("bert-base-uncased")
    layout = template(bare)
    assert _same_layout(layout, template(full))
    for parts in (layout.single, layout.pair):
        for value in vars_of(parts).values():
            if isinstance(value, np.ndarray):
                assert value.dtype == np.int64
    a = full.encode("Paris is the capital", add_special_tokens=False)
    b = full.encode("of France", add_special_tokens=False)
    for b_enc in (None, b):
        want = full.post_process(a, b_enc, add_special_tokens=True)
        got = row(layout, a.ids, None if b_enc is None else b_enc.ids)
        assert got.input_ids.tolist() == want.ids
        assert got.token_type_ids.tolist() == want.type_ids
    assert layout.single.n_special == 2 and layout.pair.n_special == 3


def vars_of(parts) -> dict:
    return {field: getattr(parts, field) for field in parts.__slots__}


def _same_layout(x: Template, y: Template) -> bool:
    def same(p, q) -> bool:
        return all(
            np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b
            for a, b in zip(vars_of(p).values(), vars_of(q).values(), strict=True)
        )

    return same(x.single, y.single) and same(x.pair, y.pair)


@pytest.mark.parametrize("missing", ["[CLS]", "[SEP]"])
def test_without_a_post_processor_or_bert_tokens_the_layout_is_refused(missing: str):
    vocab = {"[UNK]": 0, "[CLS]": 1, "[SEP]": 2, "a": 3, "b": 4}
    del vocab[missing]
    tok = Tokenizer(WordPiece(vocab, unk_token="[UNK]"))
    message = (
        "the tokenizer has no post-processor (the template that adds [CLS] / <s>) "
        "and no [CLS] / [SEP] tokens to fall back on"
    )
    with refused(message, ValueError):
        template(tok)


def test_a_post_processor_that_adds_no_special_token_is_refused():
    tok = prepared("roberta-base")
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    message = (
        "the tokenizer's post-processor adds no special tokens: a BERT-family model "
        "needs its [CLS]/<s> template in tokenizer.json"
    )
    with refused(message, ValueError):
        template(tok)


@pytest.mark.parametrize("known", [(), ("a",), ("b",)])
def test_a_tokenizer_that_cannot_encode_a_letter_is_refused(known: tuple[str, ...]):
    """The layout is read from how the post-processor places "a" and "b": a tokenizer that
    makes no token of either (no unknown token) cannot show it, and a pair read without "b"
    would put its [SEP]s together."""
    vocab = {"[CLS]": 0, "[SEP]": 1} | {letter: 2 + i for i, letter in enumerate(known)}
    tok = Tokenizer(BPE(vocab, []))  # no unknown token: a letter not in vocab -> nothing
    tok.post_processor = processors.BertProcessing(("[SEP]", 1), ("[CLS]", 0))
    with refused(
        "the tokenizer encodes 'a' or 'b' to no token: cannot read its row layout", ValueError
    ):
        template(tok)


def test_a_tokenizer_that_knows_only_a_and_b_is_read():
    """The probes are "a" and "b" as written: a vocabulary of those two letters is enough."""
    tok = Tokenizer(BPE({"[CLS]": 0, "[SEP]": 1, "a": 2, "b": 3}, []))
    tok.post_processor = processors.BertProcessing(("[SEP]", 1), ("[CLS]", 0))
    layout = template(tok)
    assert row(layout, [2], [3]).input_ids.tolist() == [0, 2, 1, 3, 1]
    assert row(layout, [2], [3]).token_type_ids.tolist() == [0, 0, 0, 1, 1]


class _Processed:
    """A stand-in post-processor answer: the layouts `tokenizers` cannot be made to produce
    (a template that drops or interleaves the texts), to check they are refused."""

    def __init__(self, ids: list[int], special: list[int]):
        self.tokenizer = SimpleNamespace(post_process=self.post_process)
        self.ids, self.special = ids, special

    def post_process(self, a, b, add_special_tokens: bool):
        assert add_special_tokens
        return SimpleNamespace(
            ids=self.ids, type_ids=[0] * len(self.ids), special_tokens_mask=self.special
        )


def probe(ids: list[int], special: list[int], n_a: int, n_b: int | None):
    a = SimpleNamespace(ids=list(range(n_a)))
    b = None if n_b is None else SimpleNamespace(ids=list(range(n_b)))
    return rows._probe_parts(_Processed(ids, special).tokenizer, a, b)


CHANGES = "the tokenizer's post-processor changes the texts; not a row layout"
INTERLEAVES = "the tokenizer's post-processor interleaves the texts; not a row layout"


@pytest.mark.parametrize(
    ("ids", "special", "n_a", "n_b", "message"),
    [
        # a token of A dropped, the order kept
        ([9, 5, 8], [1, 0, 1], 2, None, CHANGES),
        # as many text tokens as A and B have, but A's two are not side by side
        ([9, 5, 8, 6, 8, 7], [1, 0, 1, 0, 1, 0], 2, 1, CHANGES),
        # A whole, then B's two tokens apart
        ([9, 5, 8, 6, 8, 7, 8], [1, 0, 1, 0, 1, 0, 1], 1, 2, INTERLEAVES),
    ],
)
def test_a_post_processor_that_does_not_keep_the_texts_whole_is_refused(
    ids, special, n_a, n_b, message
):
    with refused(message, ValueError):
        probe(ids, special, n_a, n_b)


def test_a_post_processor_that_keeps_the_texts_whole_is_read():
    parts = probe([9, 5, 6, 8, 7, 8], [1, 0, 0, 1, 0, 1], 2, 1)
    assert parts.prefix.tolist() == [9] and parts.middle.tolist() == [8]
    assert parts.suffix.tolist() == [8] and parts.n_special == 3


# --- the tokenizer must be prepared; the caches ----------------------------------------------


def test_a_tokenizer_that_pads_or_truncates_is_refused_until_prepared():
    tok = published("all-mpnet-base-v2")  # the published file pads and truncates
    assert tok.padding is not None and tok.truncation is not None
    message = (
        "the tokenizer pads or truncates by itself; pass it through "
        "heads.rows.prepare_tokenizer once at load time"
    )
    with refused(message, ValueError):
        template(tok)
    tok.no_padding()  # still truncates
    with refused(message, ValueError):
        template(tok)
    assert prepare_tokenizer(tok) is tok
    assert template(tok).single.prefix.tolist() == [tok.token_to_id("<s>")]


def test_layouts_and_subword_tables_are_cached_per_tokenizer_and_forgotten_on_request():
    tok, other = prepared("bert-base-uncased"), prepared("bert-base-uncased")
    layout, table = template(tok), rows._subword_table(tok)[0]
    assert template(tok) is layout and rows._subword_table(tok)[0] is table
    assert template(other) is not layout  # an equal tokenizer is another entry
    assert rows._subword_table(other)[0] is not table
    forget(tok)
    assert id(tok) not in rows._TEMPLATES and id(tok) not in rows._SUBWORD
    assert id(other) in rows._TEMPLATES and id(other) in rows._SUBWORD
    assert template(tok) is not layout and rows._subword_table(tok)[0] is not table
    forget(tok)
    forget(other)


def test_forget_leaves_an_entry_whose_tokenizer_is_another_one():
    """A cache entry holds its tokenizer so its id cannot be reused; forget checks it is the
    same object before dropping the entry (another tokenizer at a reused id is not dropped)."""
    tok, other = prepared("bert-base-uncased"), prepared("roberta-base")
    for cache in (rows._TEMPLATES, rows._SUBWORD):
        cache[id(tok)] = (other, "held")
    try:
        forget(tok)
        assert rows._TEMPLATES[id(tok)] == (other, "held")
        assert rows._SUBWORD[id(tok)] == (other, "held")
        assert template(tok).single.prefix.tolist() == [tok.token_to_id("[CLS]")]
        assert rows._subword_table(tok)[1] == tok.token_to_id("[UNK]")
    finally:
        forget(tok)
    assert id(tok) not in rows._TEMPLATES and id(tok) not in rows._SUBWORD


def test_the_caches_hold_sixteen_tokenizers_at_most():
    held = [prepared("bert-base-uncased") for _ in range(20)]  # kept alive: ids stay unique
    for tok in held:
        template(tok)
        rows._subword_table(tok)
    assert len(rows._TEMPLATES) == len(rows._SUBWORD) == 16
    assert id(held[-1]) in rows._TEMPLATES and id(held[-1]) in rows._SUBWORD
    assert id(held[0]) not in rows._TEMPLATES and id(held[0]) not in rows._SUBWORD
    for tok in held:
        forget(tok)


# --- pad ids ----------------------------------------------------------------------------------


def test_pad_fills_with_the_id_given_and_masks_the_padding():
    short = ModelRow(np.array([5, 6], np.int64), np.array([0, 1], np.int64))
    long_ = ModelRow(np.array([7, 8, 9], np.int64), np.array([0, 0, 1], np.int64))
    for feeds, filler in ((pad([short, long_]), 0), (pad([short, long_], pad_token_id=1), 1)):
        assert feeds["input_ids"].tolist() == [[5, 6, filler], [7, 8, 9]]
        assert feeds["token_type_ids"].tolist() == [[0, 1, 0], [0, 0, 1]]
        assert feeds["attention_mask"].tolist() == [[1, 1, 0], [1, 1, 1]]
        assert all(v.dtype == np.int64 for v in feeds.values())


def test_the_declared_pad_id_wins_over_any_guess():
    mpnet = prepared("all-mpnet-base-v2")  # vocabulary: [PAD] at 4, <pad> at 1; pads with 1
    assert guess_pad_id(mpnet) == 4  # a guess by name is wrong for it: why packages declare
    assert pad_id(1, mpnet) == 1
    assert pad_id(0, mpnet) == 0  # 0 is a declared id, not "none"
    assert pad_id(None, mpnet) == 4


@pytest.mark.parametrize(
    ("name", "guess"),
    [("bert-base-uncased", 0), ("roberta-base", 1), ("xlm-roberta-base", 1), ("albert-base-v2", 0)],
)
def test_an_undeclared_pad_id_is_guessed_by_name(name: str, guess: int):
    tok = prepared(name)
    assert guess_pad_id(tok) == guess
    assert pad_id(None, tok) == guess


def test_a_vocabulary_without_a_pad_token_pads_with_zero():
    tok = prepared("ModernBERT-base")  # its [PAD] is there: take a vocabulary without one
    no_pad = Tokenizer(WordPiece({"[UNK]": 3, "[CLS]": 4, "[SEP]": 5, "x": 6}, unk_token="[UNK]"))
    assert guess_pad_id(tok) == tok.token_to_id("[PAD]")
    assert guess_pad_id(no_pad) is None
    assert pad_id(None, no_pad) == 0
    assert pad_id(7, no_pad) == 7


# --- tokens: ids, offsets, words, subword flags ------------------------------------------------


def pipeline_subword(text: str, starts: list[int]) -> list[bool]:
    """The token-classification pipeline's rule for tokenizers without a subword prefix: the
    token is a subword when it does not start the text and no " " is just before or at it."""
    return [s > 0 and " " not in text[s - 1 : s + 1] for s in starts]


def test_a_token_touching_no_space_is_a_subword_by_the_pipelines_rule():
    rng = random.Random(7)
    alphabet = "ab \t\n.é😀"  # a tab or newline is no space; 😀 is outside the BMP
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12)))
        starts = sorted(rng.sample(range(len(text) + 1), rng.randint(1, len(text) + 1)))
        got = rows._no_space_before(np.array(starts, np.int64), text)
        assert got.tolist() == pipeline_subword(text, starts), (text, starts)
        assert got.dtype == bool


@pytest.mark.parametrize("name", ["roberta-base", "ModernBERT-base", "xlm-roberta-base"])
def test_without_a_subword_prefix_the_flags_come_from_the_text(name: str):
    tok = prepared(name)
    text = "Paris\tis   unanimously 😀 reconsidered,again"
    got = encode(tok, text)
    starts = got.offsets[:, 0].tolist()
    unk = rows._subword_table(tok)[1]
    want = [s and i != unk for s, i in zip(pipeline_subword(text, starts), got.ids, strict=True)]
    assert got.subword.tolist() == want
    assert any(want) and not all(want)
    assert got.subword.dtype == bool
    # Without the text there is nothing to read the spaces from: no token is a subword.
    bare = tokens(tok, tok.encode(text, add_special_tokens=False))
    assert bare.subword.tolist() == [False] * len(got) and bare.subword.dtype == bool
    assert bare.ids.tolist() == got.ids.tolist()


def test_the_unknown_token_never_continues_a_word():
    tok = prepared("xlm-roberta-base")  # Unigram: unknown token by id, 3
    assert rows._subword_table(tok) == (None, 3)
    text = "ab\u4e2d\u6587cd"  # Chinese is not in the shrunk vocabulary: unknown
    got = encode(tok, text)
    assert 3 in got.ids.tolist()
    assert not got.subword[got.ids == 3].any()
    starts = got.offsets[:, 0].tolist()
    want = [s and i != 3 for s, i in zip(pipeline_subword(text, starts), got.ids, strict=True)]
    assert got.subword.tolist() == want


def test_wordpiece_subwords_are_its_prefixed_pieces():
    tok = prepared("bert-base-uncased")
    table, unk = rows._subword_table(tok)
    vocab = tok.get_vocab(with_added_tokens=True)
    assert unk == vocab["[UNK]"]
    assert table is not None and table.dtype == bool and len(table) == len(vocab)
    assert {t for t, i in vocab.items() if table[i]} == {t for t in vocab if t.startswith("##")}
    got = encode(tok, "unanimously reconsidered")
    pieces = [tok.id_to_token(i) for i in got.ids]
    assert got.subword.tolist() == [p.startswith("##") for p in pieces]
    assert any(got.subword) and got.subword.dtype == bool


def test_an_added_token_past_the_vocabulary_has_a_subword_flag():
    tok = prepared("bert-base-uncased")
    tok.add_tokens([AddedToken("<new-entity>", single_word=True)])
    added = tok.token_to_id("<new-entity>")
    assert added == tok.get_vocab_size(with_added_tokens=False)  # past the model's vocabulary
    got = encode(tok, "see <new-entity> there")
    assert added in got.ids.tolist()
    assert not got.subword[got.ids == added].any()


def test_byte_level_bpe_has_no_table_and_no_unknown_token():
    assert rows._subword_table(prepared("roberta-base")) == (None, -1)
    assert rows._subword_table(prepared("ModernBERT-base")) == (None, -1)


def test_an_empty_wordpiece_vocabulary_has_an_empty_table():
    table, unk = rows._subword_table(Tokenizer(WordPiece({}, unk_token="[UNK]")))
    assert table is not None and table.shape == (0,) and unk == -1


def test_tokens_keep_offsets_and_words_as_int64():
    tok = prepared("bert-base-cased")
    text = "Hello  world, café!"
    enc = tok.encode(text, add_special_tokens=False)
    got = encode(tok, text)
    assert got.ids.tolist() == enc.ids and len(got) == len(enc.ids)
    assert got.offsets.tolist() == [list(o) for o in enc.offsets]
    assert got.words.tolist() == enc.word_ids
    assert got.ids.dtype == got.offsets.dtype == got.words.dtype == np.int64
    assert got.offsets.shape == (len(enc.ids), 2)


def test_a_token_without_a_word_gets_word_minus_one():
    tok = prepared("roberta-base")
    enc = SimpleNamespace(ids=[10, 11, 12], word_ids=[0, None, 1], offsets=[(0, 1), (1, 2), (3, 4)])
    got = tokens(tok, enc, "ab cd")
    assert got.words.tolist() == [0, -1, 1] and got.words.dtype == np.int64
    assert got.subword.tolist() == [False, True, False]


def test_an_empty_text_has_no_tokens():
    for name in ("bert-base-uncased", "roberta-base"):
        got = encode(prepared(name), "")
        assert len(got) == 0 and got.offsets.shape == (0, 2) and got.subword.shape == (0,)


# --- truncation and windows against tokenizers' own ------------------------------------------


def truncating(name: str, max_length: int, direction: str, stride: int = 0) -> Tokenizer:
    tok = published(name)
    tok.no_padding()
    tok.enable_truncation(max_length, stride=stride, strategy="longest_first", direction=direction)
    return tok


@pytest.mark.parametrize("name", ["bert-base-uncased", "roberta-base", "xlm-roberta-base"])
@pytest.mark.parametrize("direction", ["right", "left"])
def test_truncation_equals_tokenizers_longest_first(name: str, direction: str):
    tok = prepared(name)
    words = [
        "the",
        "cat",
        "sat",
        "on",
        "the",
        "mat",
        "in",
        "new",
        "york",
        "city",
        "while",
        "paris",
        "ran",
        "fast",
    ]
    texts = [" ".join(words[:n]) for n in range(0, len(words) + 1, 2)]
    inputs = list(texts) + list(itertools.product(texts, texts))
    for max_length in (5, 6, 7, 8, 9, 12, 17, 40):
        reference = truncating(name, max_length, direction)
        got = encode_texts(tok, inputs, max_length, direction=direction)
        truncated = 0
        for x, r in zip(inputs, got.sequences, strict=True):
            want = reference.encode(*((x,) if isinstance(x, str) else x))
            assert r.input_ids.tolist() == want.ids, (name, direction, max_length, x)
            assert r.token_type_ids.tolist() == want.type_ids, (name, direction, max_length, x)
            truncated += bool(want.overflowing)
        assert got.truncated == truncated


def test_longest_first_keeps_the_shorter_whole_when_it_fits_in_half():
    assert longest_first(3, 10, 13) == (3, 10)  # fits as it is
    assert longest_first(3, 10, 12) == (3, 9)
    assert longest_first(10, 3, 12) == (9, 3)
    assert longest_first(7, 7, 9) == (4, 5)  # both over half: halves, the odd one to b
    assert longest_first(8, 7, 9) == (5, 4)  # ... to the longer
    assert longest_first(20, 30, 6) == (3, 3)


@pytest.mark.parametrize("stride", [0, 1, 3, 7])
def test_windows_equal_tokenizers_overflowing_tokens(stride: int):
    tok = prepared("bert-base-uncased")
    text = "the cat sat on the mat in new york city while paris ran fast " * 3
    ids = tok.encode(text, add_special_tokens=False).ids
    for room in (8, 10, len(ids), len(ids) + 3):
        if stride >= room:
            continue
        reference = Tokenizer.from_str(tok.to_str())
        reference.post_processor = None
        reference.enable_truncation(room, stride=stride, strategy="longest_first")
        done = reference.encode(text, add_special_tokens=False)
        want = [done.ids] + [o.ids for o in done.overflowing]
        got = [ids[start:stop] for start, stop in windows(len(ids), room, stride)]
        assert got == want, (room, stride)


def test_a_stride_as_long_as_the_window_is_refused():
    assert windows(5, 5, 9) == [(0, 5)]  # fits: the stride is never used
    with refused("stride (4) must be in [0, 4), the tokens per window", ValueError):
        windows(9, 4, 4)
    with refused("stride (-1) must be in [0, 4), the tokens per window", ValueError):
        windows(9, 4, -1)


# --- text_rows' arguments ---------------------------------------------------------------------


def test_truncation_is_on_and_keeps_the_first_tokens_unless_asked_otherwise():
    tok = prepared("bert-base-uncased")
    layout = template(tok)
    text = "the cat sat on the mat in new york"
    encodings = tok.encode_batch([text], add_special_tokens=False)
    ids = encodings[0].ids
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    default = text_rows(layout, [text], encodings, 6)
    assert default.sequences[0].input_ids.tolist() == [cls, *ids[:4], sep]
    assert default.truncated == 1
    left = encode_texts(tok, [text], 6, direction="left")
    assert left.sequences[0].input_ids.tolist() == [cls, *ids[-4:], sep]
    right = encode_texts(tok, [text], 6)
    assert right.sequences[0].input_ids.tolist() == default.sequences[0].input_ids.tolist()


def test_without_truncation_a_long_input_is_named():
    tok = prepared("bert-base-uncased")
    text = "the cat sat on the mat in new york"
    n = len(tok.encode(text).ids)  # with [CLS] and [SEP]
    assert encode_texts(tok, ["a", "a"], 6, truncate=False).truncated == 0
    with refused(
        f"inputs[1] is {n} tokens long, more than max_seq_length {n - 1}; "
        "shorten it or allow truncation"
    ):
        encode_texts(tok, ["a", text], n - 1, truncate=False)
    assert len(encode_texts(tok, ["a", text], n, truncate=False).sequences[1]) == n


def test_an_unknown_truncation_direction_is_named():
    tok = prepared("bert-base-uncased")
    with refused("truncation_direction must be one of right, left, not 'middle'"):
        encode_texts(tok, ["a"], 8, direction="middle")


def test_a_row_may_hold_its_special_tokens_alone():
    tok = prepared("bert-base-uncased")
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    only = encode_texts(tok, ["paris is in france"], 2)
    assert only.sequences[0].input_ids.tolist() == [cls, sep] and only.truncated == 1
    pair = encode_texts(tok, [("paris", "france")], 3)
    assert pair.sequences[0].input_ids.tolist() == [cls, sep, sep]
    with refused("max_seq_length (1) leaves no room for any token", ValueError):
        encode_texts(tok, ["paris"], 1)
    # a pair needs three: two fit a single text but not a pair
    with refused("max_seq_length (2) leaves no room for any token", ValueError):
        encode_texts(tok, ["paris", ("paris", "france")], 2)


@pytest.mark.parametrize("bad", [3, ("a",), ("a", "b", "c"), ("a", 1), None])
def test_an_input_that_is_neither_a_text_nor_a_pair_is_named(bad):
    with refused("inputs[1]: expected a string or a pair of two strings"):
        rows.flatten(["fine", bad])
