"""Text -> model rows, the one public numpy-only module both the service and `training/` use:
the row type (`Sequence`), padding (`pad`), one encoding path, the BERT row layout
`[CLS] A [SEP] (B [SEP])`, and the truncation and windowing rules of Hugging Face fast
tokenizers, reproduced by hand. It imports numpy and `tokenizers` only: no ONNX Runtime, no
HTTP, no metrics, so a fine-tuning run that pads its batches pulls in none of those.

Why by hand: `Tokenizer.enable_truncation` / `enable_padding` mutate a tokenizer that all
request threads share, and a request's `max_seq_len` or `doc_stride` would race. So each text
is encoded once without special tokens and rows are cut from its token ids here. The tests
check the rows equal what `BertTokenizerFast` gives with `truncation=True` (longest_first) or
`return_overflowing_tokens=True, stride=...`.

The tokenizer must come with padding and truncation off: `load_tokenizer` / `prepare_tokenizer`
do that once, at load time; `special_ids` refuses a tokenizer that still pads or truncates.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Encoding, Tokenizer

from service.contract import INPUT_NAMES


class InvalidInput(ValueError):
    """An input that cannot be made into rows as asked (too long with truncation off, not a
    string or a pair). The service answers it with a 422; training readers name the record."""


@dataclass(frozen=True, slots=True)
class Sequence:
    """One unpadded model input row. `pad` pads rows and builds the attention mask.

    input_ids, token_type_ids: (L,) int64.
    """

    input_ids: np.ndarray
    token_type_ids: np.ndarray

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])


# What a model run hands back for one Sequence: output name -> array with the batch axis
# removed and, for per-token outputs, the padding cut off: logits (C,) or (L, C),
# start_logits / end_logits (L,), embeddings (H,).
Outputs = dict[str, np.ndarray]


def pad(rows: list[Sequence], pad_token_id: int = 0) -> dict[str, np.ndarray]:
    """Rows -> int64 feeds (B, T), T = longest row; attention_mask 1 on real tokens."""
    longest = max(len(row) for row in rows)
    input_ids = np.full((len(rows), longest), pad_token_id, dtype=np.int64)
    token_type_ids = np.zeros((len(rows), longest), dtype=np.int64)
    attention_mask = np.zeros((len(rows), longest), dtype=np.int64)
    for k, row in enumerate(rows):
        n = len(row)
        input_ids[k, :n] = row.input_ids
        token_type_ids[k, :n] = row.token_type_ids
        attention_mask[k, :n] = 1
    feeds = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "token_type_ids": token_type_ids,
    }
    return {name: feeds[name] for name in INPUT_NAMES}


CLS_TOKEN = "[CLS]"
SEP_TOKEN = "[SEP]"


def prepare_tokenizer(tokenizer: Tokenizer) -> Tokenizer:
    """Turn padding and truncation off (a shipped tokenizer.json may pad to 128). Call once,
    at load time, before the tokenizer is shared; returns the same object."""
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Read a package's tokenizer.json, ready for the task modules."""
    return prepare_tokenizer(Tokenizer.from_file(str(path)))


def special_ids(tokenizer: Tokenizer) -> tuple[int, int]:
    """(cls_id, sep_id). Also the one place that checks the tokenizer is safe to share."""
    if tokenizer.padding is not None or tokenizer.truncation is not None:
        raise ValueError(
            "the tokenizer pads or truncates by itself; pass it through "
            "service.rows.prepare_tokenizer once at load time"
        )
    cls_id, sep_id = tokenizer.token_to_id(CLS_TOKEN), tokenizer.token_to_id(SEP_TOKEN)
    if cls_id is None or sep_id is None:
        raise ValueError(f"the tokenizer's vocabulary has no {CLS_TOKEN} or {SEP_TOKEN}")
    return cls_id, sep_id


@dataclass(frozen=True, slots=True)
class Tokens:
    """One text encoded without special tokens, T tokens.

    ids (T,) int64; offsets (T, 2) int64 character offsets into the text; words (T,) int64
    index of the pre-tokenizer word each token comes from; subword (T,) bool: the token
    continues the previous token's word (WordPiece's `##` prefix; [UNK] never does).
    """

    ids: np.ndarray
    offsets: np.ndarray
    words: np.ndarray
    subword: np.ndarray

    def __len__(self) -> int:
        return int(self.ids.shape[0])


def encode(tokenizer: Tokenizer, text: str) -> Tokens:
    """Encode one text without special tokens, keeping offsets, words and subword flags."""
    return tokens(tokenizer, tokenizer.encode(text, add_special_tokens=False))


def tokens(tokenizer: Tokenizer, enc: Encoding) -> Tokens:
    """One encoding (made without special tokens, alone or by `encode_batch`) -> Tokens."""
    n = len(enc.ids)
    ids = np.asarray(enc.ids, dtype=np.int64)
    word_ids = enc.word_ids
    try:  # without special tokens every token has a word; None only for odd added tokens
        words = np.asarray(word_ids, dtype=np.int64)
    except TypeError:
        words = np.asarray([-1 if w is None else w for w in word_ids], dtype=np.int64)
    return Tokens(
        ids=ids,
        offsets=np.asarray(enc.offsets, dtype=np.int64).reshape(n, 2),
        words=words,
        subword=_subword_table(tokenizer)[ids],
    )


# tokenizer id -> (tokenizer, (V,) bool: token id is a continuing subword). The tokenizer is
# held so its id cannot be reused; a process has a handful of them.
_SUBWORD: dict[int, tuple[Tokenizer, np.ndarray]] = {}


def _subword_table(tokenizer: Tokenizer) -> np.ndarray:
    """(V,) bool over token ids: the token continues the previous token's word (it starts
    with the model's continuing-subword prefix, `##` by default, and is not the unknown
    token). Looked up by id: testing each token's string in Python made `tokens()` cost 83-91
    us per SQuAD context (160 tokens on average) against 44-52 us with this table (busy
    2-core EPYC, benchmarks/README.md "Issue 18, final")."""
    cached = _SUBWORD.get(id(tokenizer))
    if cached is not None and cached[0] is tokenizer:
        return cached[1]
    prefix = getattr(tokenizer.model, "continuing_subword_prefix", None) or "##"
    unk = getattr(tokenizer.model, "unk_token", None)
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    table = np.zeros(max(vocab.values(), default=-1) + 1, dtype=bool)
    for token, i in vocab.items():
        table[i] = token.startswith(prefix) and token != unk
    if len(_SUBWORD) >= 16:
        _SUBWORD.pop(next(iter(_SUBWORD)))
    _SUBWORD[id(tokenizer)] = (tokenizer, table)
    return table


def row(
    cls_id: int, sep_id: int, a: np.ndarray | list[int], b: np.ndarray | list[int] | None = None
) -> Sequence:
    """The BERT layout: `[CLS] a [SEP]`, or `[CLS] a [SEP] b [SEP]` with type id 1 on `b [SEP]`."""
    # Filled in place: np.concatenate of the parts cost several times more for short rows.
    n_a = len(a)
    n = n_a + 2 if b is None else n_a + len(b) + 3
    input_ids = np.empty(n, dtype=np.int64)
    input_ids[0], input_ids[n_a + 1], input_ids[n - 1] = cls_id, sep_id, sep_id
    input_ids[1 : n_a + 1] = a
    token_type_ids = np.zeros(n, dtype=np.int64)
    if b is not None:
        input_ids[n_a + 2 : n - 1] = b
        token_type_ids[n_a + 2 :] = 1
    return Sequence(input_ids=input_ids, token_type_ids=token_type_ids)


def longest_first(len_a: int, len_b: int, budget: int) -> tuple[int, int]:
    """Lengths to keep of a pair under `budget` tokens (special tokens excluded), as the
    `tokenizers` longest_first strategy computes them: the shorter sequence is kept whole
    when it fits in half the budget, the longer one gets the rest; when both are longer than
    half, each gets half and the longer one the odd token."""
    if len_a + len_b <= budget:
        return len_a, len_b
    short, long_ = sorted((len_a, len_b))
    long_ = short if short > budget else max(short, budget - short)
    if short + long_ > budget:
        short = budget // 2
        long_ = short + budget % 2
    return (long_, short) if len_a > len_b else (short, long_)


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
    """Rows for classification or embedding: one Sequence per input, in input order.

    truncated: how many inputs lost tokens to `max_seq_length`.
    """

    sequences: list[Sequence]
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


def encode_texts(
    tokenizer: Tokenizer, inputs: list[TextInput], max_seq_length: int, truncate: bool = True
) -> EncodedTexts:
    """Single texts or (a, b) pairs -> one row each, cut to `max_seq_length` (longest_first for
    pairs). With `truncate=False` an input that does not fit is an InvalidInput instead."""
    # One batch call: `tokenizers` encodes it in parallel in Rust, and a pair's two texts are
    # normalised and pre-tokenized independently anyway, so encoding them apart is exact.
    encodings = tokenizer.encode_batch(flatten(inputs), add_special_tokens=False)
    return text_rows(special_ids(tokenizer), inputs, encodings, max_seq_length, truncate)


def text_rows(
    specials: tuple[int, int],
    inputs: list[str] | list[TextInput],
    encodings: list[Encoding],
    max_seq_length: int,
    truncate: bool = True,
) -> EncodedTexts:
    """`encode_texts` from the encodings of `flatten(inputs)` (the batch worker encodes many
    requests' texts in one call). specials: (cls_id, sep_id)."""
    cls_id, sep_id = specials
    pairs = [not isinstance(x, str) for x in inputs]
    min_length = 3 if any(pairs) else 2
    if max_seq_length < min_length:
        raise ValueError(f"max_seq_length ({max_seq_length}) leaves no room for any token")
    ids = iter([e.ids for e in encodings])  # lists: row() copies them once, into the row
    sequences: list[Sequence] = []
    truncated = 0
    for i, is_pair in enumerate(pairs):
        a, b = next(ids), (next(ids) if is_pair else None)
        n_special = 3 if is_pair else 2
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
                a = a[:budget]
            else:
                keep_a, keep_b = longest_first(len(a), len(b), budget)
                a, b = a[:keep_a], b[:keep_b]
        sequences.append(row(cls_id, sep_id, a, b))
    return EncodedTexts(sequences=sequences, truncated=truncated)
