"""Text -> model rows, the one public numpy-only module both the service and `training/` use:
the row type (`ModelRow`), padding (`pad`), one encoding path, each family's row layout
(`Template`: `[CLS] A [SEP] (B [SEP])` for BERT, `<s> A </s>(</s> B </s>)` for RoBERTa, read
from the tokenizer's own post-processor), and the truncation and windowing rules of Hugging
Face fast tokenizers, reproduced by hand. It imports numpy and `tokenizers` only: no ONNX Runtime, no
HTTP, no metrics, so a fine-tuning run that pads its batches pulls in none of those.

Why by hand: `Tokenizer.enable_truncation` / `enable_padding` mutate a tokenizer that all
request threads share, and a request's `max_seq_len` or `doc_stride` would race. So each text
is encoded once without special tokens and rows are cut from its token ids here. The tests
check the rows equal what `BertTokenizerFast` gives with `truncation=True` (longest_first) or
`return_overflowing_tokens=True, stride=...`.

The tokenizer must come with padding and truncation off: `load_package_tokenizer` / `prepare_tokenizer`
do that once, at load time; `template` refuses a tokenizer that still pads or truncates.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Encoding, Tokenizer

from heads.contract import INPUT_NAMES


class InvalidInput(ValueError):
    """An input that cannot be made into rows as asked (too long with truncation off, not a
    string or a pair). The service answers it with a 422; training readers name the record."""


@dataclass(frozen=True, slots=True)
class ModelRow:
    """One unpadded model input row. `pad` pads rows and builds the attention mask.

    input_ids, token_type_ids: (L,) int64. attended: how many leading tokens the attention
    mask covers (None: all L); a ColBERT query's expansion tokens after them run, and answer
    vectors, unattended (heads.tasks.late_interaction).
    """

    input_ids: np.ndarray
    token_type_ids: np.ndarray
    attended: int | None = None

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])


# What a model run hands back for one ModelRow: output name -> array with the batch axis
# removed and, for per-token outputs, the padding cut off: logits (C,) or (L, C),
# start_logits / end_logits (L,), embeddings (H,).
Outputs = dict[str, np.ndarray]


def pad(rows: list[ModelRow], pad_token_id: int = 0) -> dict[str, np.ndarray]:
    """Rows -> int64 feeds (B, T), T = longest row; attention_mask 1 on real, attended tokens."""
    longest = max(len(row) for row in rows)
    input_ids = np.full((len(rows), longest), pad_token_id, dtype=np.int64)
    token_type_ids = np.zeros((len(rows), longest), dtype=np.int64)
    attention_mask = np.zeros((len(rows), longest), dtype=np.int64)
    for k, row in enumerate(rows):
        n = len(row)
        input_ids[k, :n] = row.input_ids
        token_type_ids[k, :n] = row.token_type_ids
        attention_mask[k, : n if row.attended is None else row.attended] = 1
    feeds = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "token_type_ids": token_type_ids,
    }
    return {name: feeds[name] for name in INPUT_NAMES}


CLS_TOKEN = "[CLS]"
SEP_TOKEN = "[SEP]"
# The pad id is the package's (package.json special_tokens, resolved at export from what the
# checkpoint declares). These names are the last resort for packages exported before it was
# recorded: BERT, ALBERT, ELECTRA, DistilBERT / RoBERTa, XLM-R, CamemBERT. A name is a guess:
# all-mpnet-base-v2's vocabulary holds "[PAD]" at id 4 while the model pads with "<pad>", 1.
PAD_TOKENS = ("[PAD]", "<pad>")


def guess_pad_id(tokenizer: Tokenizer) -> int | None:
    """The first of PAD_TOKENS the vocabulary has (None: neither). Only for a package that
    does not say its pad id."""
    return next((i for t in PAD_TOKENS if (i := tokenizer.token_to_id(t)) is not None), None)


def pad_id(declared: int | None, tokenizer: Tokenizer) -> int:
    """The id to pad rows with: the package's own (`ModelPackage.pad_token_id`); for a package
    exported before the export recorded it, a guess by name, and 0 when the vocabulary has no
    pad token (the attention mask hides whatever fills the padding of a BERT)."""
    if declared is not None:
        return declared
    guess = guess_pad_id(tokenizer)
    return 0 if guess is None else guess


def prepare_tokenizer(tokenizer: Tokenizer) -> Tokenizer:
    """Turn padding and truncation off (a shipped tokenizer.json may pad to 128). Call once,
    at load time, before the tokenizer is shared; returns the same object."""
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def load_package_tokenizer(path: str | Path) -> Tokenizer:
    """Read a package's tokenizer.json, ready for the task modules."""
    return prepare_tokenizer(Tokenizer.from_file(str(path)))


@dataclass(frozen=True, slots=True)
class _Parts:
    """One row layout: prefix, text a, middle, text b, suffix. ids / types of the special
    parts are (n,) int64; a_type / b_type the token type of every token of a / b."""

    prefix: np.ndarray
    prefix_types: np.ndarray
    a_type: int
    middle: np.ndarray
    middle_types: np.ndarray
    b_type: int
    suffix: np.ndarray
    suffix_types: np.ndarray

    @property
    def n_special(self) -> int:
        return len(self.prefix) + len(self.middle) + len(self.suffix)


@dataclass(frozen=True, slots=True)
class Template:
    """A model family's row layout for one text and for a pair.

    Read from the tokenizer's post-processor (`template`), so every family gets its own:
    BERT, ALBERT, ELECTRA, DistilBERT `[CLS] a [SEP]` / `[CLS] a [SEP] b [SEP]` with type 1
    on `b [SEP]`; RoBERTa, XLM-R, CamemBERT `<s> a </s>` / `<s> a </s></s> b </s>`, all type 0.
    """

    single: _Parts
    pair: _Parts

    @property
    def cls_id(self) -> int | None:
        """The row's first token ([CLS], <s>): the null answer's position in QA."""
        return int(self.single.prefix[0]) if len(self.single.prefix) else None


def _probe_parts(tokenizer: Tokenizer, a: Encoding, b: Encoding | None) -> _Parts:
    """Run the tokenizer's post-processor on probe encodings and read back where it put its
    special tokens and which token types it gave each part."""
    done = tokenizer.post_process(a, b, add_special_tokens=True)
    ids = np.asarray(done.ids, dtype=np.int64)
    types = np.asarray(done.type_ids, dtype=np.int64)
    # Not `sequence_ids`: TemplateProcessing leaves sequence A's at None. The texts are the
    # non-special tokens, A's first.
    texts = [i for i, special in enumerate(done.special_tokens_mask) if not special]
    n_a, n_b = len(a.ids), 0 if b is None else len(b.ids)
    if len(texts) != n_a + n_b or texts != list(range(texts[0], texts[0] + n_a)) + texts[n_a:]:
        raise ValueError("the tokenizer's post-processor changes the texts; not a row layout")
    a0, a1 = texts[0], texts[n_a - 1] + 1
    b0, b1 = (texts[n_a], texts[-1] + 1) if n_b else (a1, a1)
    if n_b and b1 - b0 != n_b:
        raise ValueError("the tokenizer's post-processor interleaves the texts; not a row layout")
    return _Parts(
        prefix=ids[:a0],
        prefix_types=types[:a0],
        a_type=int(types[a0]),
        middle=ids[a1:b0],
        middle_types=types[a1:b0],
        b_type=int(types[b0]) if n_b else 0,
        suffix=ids[b1:],
        suffix_types=types[b1:],
    )


def _read_template(tokenizer: Tokenizer) -> Template:
    if tokenizer.post_processor is None:
        # A bare tokenizer.json (no template): BERT's layout by its token names, as before
        # tokenizer.json carried one.
        cls_id, sep_id = tokenizer.token_to_id(CLS_TOKEN), tokenizer.token_to_id(SEP_TOKEN)
        if cls_id is None or sep_id is None:
            raise ValueError(
                "the tokenizer has no post-processor (the template that adds [CLS] / <s>) "
                f"and no {CLS_TOKEN} / {SEP_TOKEN} tokens to fall back on"
            )
        one, zero = np.array([cls_id], np.int64), np.zeros(1, np.int64)
        sep = np.array([sep_id], np.int64)
        empty = np.zeros(0, np.int64)
        return Template(
            single=_Parts(one, zero, 0, empty, empty, 0, sep, zero),
            pair=_Parts(one, zero, 0, sep, zero, 1, sep, np.ones(1, np.int64)),
        )
    a = tokenizer.encode("a", add_special_tokens=False)
    b = tokenizer.encode("b", add_special_tokens=False)
    if not a.ids or not b.ids:
        raise ValueError("the tokenizer encodes 'a' or 'b' to no token: cannot read its row layout")
    single, pair = _probe_parts(tokenizer, a, None), _probe_parts(tokenizer, a, b)
    if not single.n_special:
        raise ValueError(
            "the tokenizer's post-processor adds no special tokens: a BERT-family model "
            "needs its [CLS]/<s> template in tokenizer.json"
        )
    return Template(single=single, pair=pair)


# tokenizer id -> (tokenizer, its Template), held as _SUBWORD below holds its tables.
_TEMPLATES: dict[int, tuple[Tokenizer, Template]] = {}


def template(tokenizer: Tokenizer) -> Template:
    """The tokenizer's row layout (cached). Also the one place that checks the tokenizer is
    safe to share between request threads."""
    cached = _TEMPLATES.get(id(tokenizer))
    if cached is not None and cached[0] is tokenizer:
        return cached[1]
    if tokenizer.padding is not None or tokenizer.truncation is not None:
        raise ValueError(
            "the tokenizer pads or truncates by itself; pass it through "
            "heads.rows.prepare_tokenizer once at load time"
        )
    found = _read_template(tokenizer)
    if len(_TEMPLATES) >= 16:
        _TEMPLATES.pop(next(iter(_TEMPLATES)))
    _TEMPLATES[id(tokenizer)] = (tokenizer, found)
    return found


@dataclass(frozen=True, slots=True)
class Tokens:
    """One text encoded without special tokens, T tokens.

    ids (T,) int64; offsets (T, 2) int64 character offsets into the text; words (T,) int64
    index of the pre-tokenizer word each token comes from; subword (T,) bool: the token
    continues the previous word, by the transformers token-classification pipeline's rules:
    WordPiece's `##` prefix; for tokenizers without such a prefix (byte-level BPE, Unigram)
    the token does not start the text and touches no space on its left or first character.
    The unknown token never continues a word.
    """

    ids: np.ndarray
    offsets: np.ndarray
    words: np.ndarray
    subword: np.ndarray

    def __len__(self) -> int:
        return int(self.ids.shape[0])


def encode(tokenizer: Tokenizer, text: str) -> Tokens:
    """Encode one text without special tokens, keeping offsets, words and subword flags."""
    return tokens(tokenizer, tokenizer.encode(text, add_special_tokens=False), text)


def tokens(tokenizer: Tokenizer, enc: Encoding, text: str | None = None) -> Tokens:
    """One encoding of `text` (made without special tokens, alone or by `encode_batch`) ->
    Tokens. Without `text`, a tokenizer with no subword prefix gets no subword flags (QA reads
    none)."""
    n = len(enc.ids)
    ids = np.asarray(enc.ids, dtype=np.int64)
    word_ids = enc.word_ids
    try:  # without special tokens every token has a word; None only for odd added tokens
        words = np.asarray(word_ids, dtype=np.int64)
    except TypeError:
        words = np.asarray([-1 if w is None else w for w in word_ids], dtype=np.int64)
    offsets = np.asarray(enc.offsets, dtype=np.int64).reshape(n, 2)
    table, unk = _subword_table(tokenizer)
    if table is not None:
        subword = table[ids]
    elif text is not None and n:
        subword = _no_space_before(offsets[:, 0], text) & (ids != unk)
    else:
        subword = np.zeros(n, dtype=bool)
    return Tokens(ids=ids, offsets=offsets, words=words, subword=subword)


def _no_space_before(starts: np.ndarray, text: str) -> np.ndarray:
    """(T,) bool: start > 0 and no " " in text[start - 1 : start + 1], the pipeline's rule for
    tokenizers that do not mark subwords (a literal space only: a tab does not count)."""
    space = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32) == 32
    space = np.append(space, False)  # a start at len(text) (an empty token) reads False
    before = space[np.maximum(starts - 1, 0)]  # a start of 0 reads text[0]: dropped below
    return (starts > 0) & ~before & ~space[starts]


# tokenizer id -> (tokenizer, (V,) bool table or None, unknown token id). The tokenizer is
# held so its id cannot be reused; a process has a handful of them.
_SUBWORD: dict[int, tuple[Tokenizer, np.ndarray | None, int]] = {}


def forget(tokenizer: Tokenizer) -> None:
    """Drop `tokenizer` from this module's caches (a model version is retired): each holds its
    tokenizer, about 6 MB for a 30,522-token vocabulary, so 16 reloads of one package kept
    96 MB alive (RSS 209 -> 341 MB over 20 reloads with no traffic; flat with this)."""
    for cache in (_TEMPLATES, _SUBWORD):
        held = cache.get(id(tokenizer))
        if held is not None and held[0] is tokenizer:
            del cache[id(tokenizer)]


def _subword_table(tokenizer: Tokenizer) -> tuple[np.ndarray | None, int]:
    """((V,) bool over token ids: the token starts with the model's continuing-subword prefix
    (WordPiece's `##`) and is not the unknown token; None when the model has no such prefix,
    as byte-level BPE and Unigram have none), the unknown token's id (-1 if none). Looked up by
    id: testing each token's string in Python made `tokens()` cost 83-91 us per SQuAD context
    (160 tokens on average) against 44-52 us with this table (busy 2-core EPYC,
    benchmarks/README.md "Issue 18, final")."""
    cached = _SUBWORD.get(id(tokenizer))
    if cached is not None and cached[0] is tokenizer:
        return cached[1], cached[2]
    prefix = getattr(tokenizer.model, "continuing_subword_prefix", None)
    unk_token = getattr(tokenizer.model, "unk_token", None)
    unk = tokenizer.token_to_id(unk_token) if isinstance(unk_token, str) else None
    if unk is None:  # Unigram names its unknown token by id, in its JSON only
        unk = json.loads(tokenizer.model.__getstate__()).get("unk_id")
    table = None
    if prefix:
        vocab = tokenizer.get_vocab(with_added_tokens=True)
        table = np.zeros(max(vocab.values(), default=-1) + 1, dtype=bool)
        for token, i in vocab.items():
            table[i] = token.startswith(prefix) and token != unk_token
    if len(_SUBWORD) >= 16:
        _SUBWORD.pop(next(iter(_SUBWORD)))
    found = (tokenizer, table, -1 if unk is None else unk)
    _SUBWORD[id(tokenizer)] = found
    return table, found[2]


def row(
    layout: Template, a: np.ndarray | list[int], b: np.ndarray | list[int] | None = None
) -> ModelRow:
    """One text or a pair in the family's layout: `[CLS] a [SEP] (b [SEP])` for BERT,
    `<s> a </s>(</s> b </s>)` for RoBERTa, with the template's token types."""
    # Filled in place: np.concatenate of the parts cost several times more for short rows.
    t = layout.single if b is None else layout.pair
    p, m = len(t.prefix), len(t.middle)
    a_end = p + len(a)
    b_start = a_end + m
    b_end = b_start if b is None else b_start + len(b)
    n = b_end + len(t.suffix)
    input_ids = np.empty(n, dtype=np.int64)
    token_type_ids = np.empty(n, dtype=np.int64)
    input_ids[:p], token_type_ids[:p] = t.prefix, t.prefix_types
    input_ids[p:a_end], token_type_ids[p:a_end] = a, t.a_type
    input_ids[a_end:b_start], token_type_ids[a_end:b_start] = t.middle, t.middle_types
    if b is not None:
        input_ids[b_start:b_end], token_type_ids[b_start:b_end] = b, t.b_type
    input_ids[b_end:], token_type_ids[b_end:] = t.suffix, t.suffix_types
    return ModelRow(input_ids=input_ids, token_type_ids=token_type_ids)


def longest_first(len_a: int, len_b: int, budget: int) -> tuple[int, int]:
    """Lengths to keep of a pair under `budget` tokens (special tokens excluded), as the
    `tokenizers` longest_first strategy computes them: the shorter sequence is kept whole
    when it fits in half the budget, the longer one gets the rest; when both are longer than
    half, each gets half and the longer one the odd token."""
    if len_a + len_b <= budget:
        return len_a, len_b
    short, long_ = sorted((len_a, len_b))
    long_ = max(short, budget - short)  # short > budget: budget - short < 0, so short
    if short + long_ > budget:
        short = budget // 2
        long_ = short + budget % 2
    return (long_, short) if len_a > len_b else (short, long_)


class Windowed:
    """A text cut into windows, each a model row (`sequence`): heads.tasks.ner's texts and
    heads.tasks.qa's contexts. Its dataclass declares `windows`."""

    __slots__ = ()
    windows: list[Any]

    @property
    def sequences(self) -> list[ModelRow]:
        return [w.sequence for w in self.windows]

    @property
    def windowed(self) -> bool:
        """More than one window."""
        return len(self.windows) > 1


def windows(n_tokens: int, room: int, stride: int) -> list[tuple[int, int]]:
    """Token ranges [start, stop) of overlapping windows, as `tokenizers` cuts overflowing
    tokens: windows of `room` tokens, each starting `room - stride` after the previous one,
    so consecutive windows share `stride` tokens; the last window ends at the text's end."""
    if n_tokens <= room:
        return [(0, n_tokens)]
    if not 0 <= stride < room:
        raise ValueError(f"stride ({stride}) must be in [0, {room}), the tokens per window")
    spans = []
    for start in range(0, n_tokens, room - stride):
        stop = min(start + room, n_tokens)
        spans.append((start, stop))
        if stop == n_tokens:
            break
    return spans


@dataclass(frozen=True, slots=True)
class EncodedTexts:
    """Rows for classification or embedding: one ModelRow per input, in input order.

    truncated: how many inputs lost tokens to `max_seq_length`.
    """

    sequences: list[ModelRow]
    truncated: int


TextInput = str | tuple[str, str]


def flatten(inputs: list[str] | list[TextInput]) -> list[str]:
    """Single texts and (a, b) pairs -> the texts to encode, a pair's two in order."""
    flat: list[str] = []
    for i, x in enumerate(inputs):
        if isinstance(x, str):
            flat.append(x)
        elif isinstance(x, tuple | list) and len(x) == 2 and all(isinstance(s, str) for s in x):
            flat.extend(x)
        else:
            raise InvalidInput(f"inputs[{i}]: expected a string or a pair of two strings")
    return flat


TRUNCATION_DIRECTIONS = ("right", "left")


def encode_texts(
    tokenizer: Tokenizer,
    inputs: list[TextInput],
    max_seq_length: int,
    truncate: bool = True,
    direction: str = "right",
) -> EncodedTexts:
    """Single texts or (a, b) pairs -> one row each, cut to `max_seq_length` (longest_first for
    pairs; "right" keeps each text's first tokens, "left" its last, as `tokenizers`'
    truncation direction). With `truncate=False` an input that does not fit is an
    InvalidInput instead."""
    # One batch call: `tokenizers` encodes it in parallel in Rust, and a pair's two texts are
    # normalised and pre-tokenized independently anyway, so encoding them apart is exact.
    encodings = tokenizer.encode_batch(flatten(inputs), add_special_tokens=False)
    return text_rows(template(tokenizer), inputs, encodings, max_seq_length, truncate, direction)


def _keep(ids: list[int], n: int, direction: str) -> list[int]:
    """The n tokens of `ids` that truncation keeps: the first ("right") or the last ("left")."""
    return ids[:n] if direction == "right" else ids[len(ids) - n :]


def text_rows(
    layout: Template,
    inputs: list[str] | list[TextInput],
    encodings: list[Encoding],
    max_seq_length: int,
    truncate: bool = True,
    direction: str = "right",
) -> EncodedTexts:
    """`encode_texts` from the encodings of `flatten(inputs)` (the batch worker encodes many
    requests' texts in one call). layout: `template(tokenizer)`."""
    if direction not in TRUNCATION_DIRECTIONS:
        raise InvalidInput(
            f"truncation_direction must be one of {', '.join(TRUNCATION_DIRECTIONS)}, "
            f"not {direction!r}"
        )
    pairs = [not isinstance(x, str) for x in inputs]
    min_length = layout.pair.n_special if any(pairs) else layout.single.n_special
    if max_seq_length < min_length:
        raise ValueError(f"max_seq_length ({max_seq_length}) leaves no room for any token")
    ids = iter([e.ids for e in encodings])  # lists: row() copies them once, into the row
    sequences: list[ModelRow] = []
    truncated = 0
    for i, is_pair in enumerate(pairs):
        a, b = next(ids), (next(ids) if is_pair else None)
        n_special = (layout.pair if is_pair else layout.single).n_special
        length = len(a) + (0 if b is None else len(b)) + n_special
        if length > max_seq_length:
            if not truncate:
                raise InvalidInput(
                    f"inputs[{i}] is {length} tokens long, more than max_seq_length "
                    f"{max_seq_length}; shorten it or allow truncation"
                )
            truncated += 1
            budget = max_seq_length - n_special
            if b is None:
                a = _keep(a, budget, direction)
            else:
                keep_a, keep_b = longest_first(len(a), len(b), budget)
                a, b = _keep(a, keep_a, direction), _keep(b, keep_b, direction)
        sequences.append(row(layout, a, b))
    return EncodedTexts(sequences=sequences, truncated=truncated)
