"""Writes the small tokenizer files of tests/published/: each published checkpoint's tokenizer
rebuilt at a few hundred to a thousand entries, from text the repository ships, with the
published file's structure kept (see README.md: what each keeps and what it shrinks).

    python -m tests.published.make_fixtures          # rewrite them (deterministic)
    python -m tests.published.make_fixtures --check  # exit 1 if a committed file differs

The small JSON files copied from the published checkpoints (config.json, tokenizer_config.json,
special_tokens_map.json, sentence-transformers' files) are committed as they are and are not
written here, except where a field names token ids that the shrinking moved (ModernBERT's
added_tokens_decoder, DeBERTa-v3's added_tokens.json).

What the vocabularies are learned from: tests/families.training_lines() (examples/data and the
demo heads' seeded sentences). The tokenizers library's trainers only pick the pieces; the ids
of the special tokens, the normalizer, pre-tokenizer, post-processor, decoder, padding,
truncation and added-token flags are set here to the published files' values.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

HERE = Path(__file__).resolve().parent
LEARNED = 1000  # pieces the trainers learn per vocabulary (the published ones: 28k-250k)

# bert-base-uncased: [PAD] 0, [unused0..98] 1-99, [UNK] 100, [CLS] 101, [SEP] 102, [MASK] 103,
# [unused99..993] 104-998, then the pieces. bert-base-cased numbers its unused tokens from 1.
UNUSED_KEPT = 2  # of the unused tokens after [MASK] (994 published, 894 in the cased one)


def _lines() -> list[str]:
    from tests.families import training_lines

    return training_lines()


_cache: dict[str, Any] = {}


def _learned(kind: str) -> Any:
    """The pieces of `kind`, once per run: WordPiece tokens (uncased or cased), byte-level BPE
    (vocab, merges), or Unigram (piece, score) pairs. WordPiece and Unigram pieces are counted
    here (the library's trainers break ties differently from run to run): every character, then
    the most frequent words, ties by text; BPE comes from its trainer, which is deterministic."""
    if kind in _cache:
        return _cache[kind]
    lines = _lines()
    if kind.startswith("bpe"):
        tok = Tokenizer(models.BPE())
        tok.normalizer = normalizers.NFC() if kind == "bpe-nfc" else None
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        trainer = trainers.BpeTrainer(
            vocab_size=LEARNED, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        )
        tok.train_from_iterator(lines, trainer)
        model = json.loads(tok.to_str())["model"]
        merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
        found: Any = (sorted(model["vocab"], key=model["vocab"].__getitem__), merges)
    elif kind.startswith("wordpiece"):
        counts = _word_counts(
            normalizers.BertNormalizer(lowercase=kind == "wordpiece-uncased"),
            pre_tokenizers.BertPreTokenizer(),
            lines,
        )
        chars = sorted({c for word in counts for c in word})
        words = [w for w in _most_frequent(counts) if len(w) > 1][: LEARNED - 2 * len(chars)]
        found = chars + words + ["##" + c for c in chars]
    else:  # unigram-nfkc, unigram-albert, unigram-deberta: SentencePiece's "▁word" pieces
        counts = _word_counts(
            _unigram_normalizer(kind),
            pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always"),
            lines,
        )
        total = sum(counts.values())
        chars = sorted({c for word in counts for c in word})
        words = [w for w in _most_frequent(counts) if len(w) > 1][: LEARNED - len(chars)]
        # log-frequency scores, as a Unigram model's; a single character always loses to a
        # whole word it spells, and stays the fallback for the rest
        found = [(w, round(math.log(counts[w] / total), 4)) for w in words]
        found += [(c, round(math.log(1 / total) - 10, 4)) for c in chars]
    _cache[kind] = found
    return found


def _word_counts(normalizer: Any, pre_tokenizer: Any, lines: list[str]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for line in lines:
        for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(line)):
            counts[word] += 1
    return counts


def _most_frequent(counts: Counter[str]) -> list[str]:
    return sorted(counts, key=lambda w: (-counts[w], w))


def _unigram_normalizer(kind: str) -> Any:
    """SentencePiece's normalisation as the converters write it; the published files'
    Precompiled charsmap (nmt_nfkc, hundreds of kB) is replaced by NFKC."""
    if kind == "unigram-albert":  # AlbertConverter: keep_accents False, do_lower_case True
        return normalizers.Sequence(
            [normalizers.Replace("``", '"'), normalizers.Replace("''", '"'), normalizers.NFKD(),
             normalizers.StripAccents(), normalizers.Lowercase(), normalizers.NFKC(),
             normalizers.Replace(Regex(" {2,}"), " ")]
        )  # fmt: skip
    if kind == "unigram-deberta":  # DebertaV2Converter: do_lower_case False
        return normalizers.Sequence(
            [normalizers.Strip(left=True, right=True), normalizers.NFKC(),
             normalizers.Replace(Regex(" {2,}"), " ")]
        )  # fmt: skip
    return normalizers.Sequence([normalizers.NFKC(), normalizers.Replace(Regex(" {2,}"), " ")])


def _special(content: str, lstrip: bool = False, normalized: bool = False) -> AddedToken:
    return AddedToken(content, lstrip=lstrip, rstrip=False, normalized=normalized, special=True)


def _bert_vocab(cased: bool, fewer: int = 0) -> list[str]:
    """BERT's layout around the counted pieces; `fewer` leaves out that many of the rarest
    whole words (a tokenizer smaller than the model's vocab_size)."""
    first = 1 if cased else 0  # bert-base-cased's unused tokens count from 1
    unused = [f"[unused{i}]" for i in range(first, first + 99)]
    tail = [f"[unused{i}]" for i in range(first + 99, first + 99 + UNUSED_KEPT)]
    head = ["[PAD]", *unused, "[UNK]", "[CLS]", "[SEP]", "[MASK]", *tail]
    pieces = _learned("wordpiece-cased" if cased else "wordpiece-uncased")
    words = [t for t in pieces if len(t) > 1 and not t.startswith("##")]  # by frequency
    rarest = set(words[len(words) - fewer :]) if fewer else set()
    return head + [t for t in pieces if t not in head and t not in rarest]


def _wordpiece(vocab: list[str], lowercase: bool) -> Tokenizer:
    tok = Tokenizer(
        models.WordPiece(
            {t: i for i, t in enumerate(vocab)}, unk_token="[UNK]", max_input_chars_per_word=100
        )
    )
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=lowercase
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=True)
    return tok


def bert(cased: bool, fewer: int = 0) -> Tokenizer:
    """bert-base-uncased's / bert-base-cased's tokenizer.json (also distilbert-base-uncased's
    and electra-base-discriminator's, which are bert-base-uncased's); `fewer` leaves out that
    many of its rarest words (a tokenizer smaller than the model's vocab_size)."""
    vocab = _bert_vocab(cased, fewer)
    tok = _wordpiece(vocab, lowercase=not cased)
    ids = {t: vocab.index(t) for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")}
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0",
        pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])],
    )
    tok.add_special_tokens([_special(t) for t in ids])
    return tok


def mpnet_vocab() -> list[str]:
    """MPNet's vocabulary: `<s> <pad> </s> <unk>`, then bert-base-uncased's (its own [PAD] at 4,
    [UNK] at 104), then `<mask>` last."""
    return ["<s>", "<pad>", "</s>", "<unk>", *_bert_vocab(cased=False), "<mask>"]


def all_mpnet() -> Tokenizer:
    """all-mpnet-base-v2's tokenizer.json: WordPiece with RoBERTa's post-processor, padding
    Fixed 128 with <pad> (1), truncation 128."""
    vocab = mpnet_vocab()
    tok = _wordpiece(vocab, lowercase=True)
    tok.post_processor = processors.RobertaProcessing(
        ("</s>", 2), ("<s>", 0), trim_offsets=True, add_prefix_space=False
    )
    tok.add_special_tokens(
        [_special("<s>"), _special("<pad>"), _special("</s>"),
         _special("<unk>", normalized=True), _special("[UNK]"), _special("<mask>", lstrip=True)]
    )  # fmt: skip
    tok.enable_truncation(128, stride=0, strategy="longest_first")
    tok.enable_padding(direction="right", pad_id=1, pad_type_id=0, pad_token="<pad>", length=128)
    return tok


def _byte_level_bpe(vocab: list[str], merges: list[tuple[str, str]]) -> Tokenizer:
    tok = Tokenizer(
        models.BPE(
            {t: i for i, t in enumerate(vocab)},
            merges,
            dropout=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
        )
    )
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(
        add_prefix_space=False, trim_offsets=True, use_regex=True
    )
    tok.decoder = decoders.ByteLevel()
    return tok


def roberta() -> Tokenizer:
    """roberta-base's tokenizer.json: byte-level BPE, `<s> <pad> </s> <unk>` at 0-3, `<mask>`
    last with lstrip, RobertaProcessing."""
    pieces, merges = _learned("bpe")
    specials = ["<s>", "<pad>", "</s>", "<unk>"]
    vocab = specials + [p for p in pieces if p not in specials] + ["<mask>"]
    tok = _byte_level_bpe(vocab, merges)
    tok.post_processor = processors.RobertaProcessing(
        ("</s>", 2), ("<s>", 0), trim_offsets=True, add_prefix_space=False
    )
    tok.add_special_tokens(
        [*(_special(t, normalized=True) for t in specials),
         _special("<mask>", lstrip=True, normalized=True)]
    )  # fmt: skip
    return tok


# ModernBERT-base: the OLMo tokenizer's pieces (ids 0-50279, with its own specials among them),
# BERT's five specials at 50280-50284, then 83 unused tokens to 50,368 rows (a multiple of 64).
MODERNBERT_OLMO_SPECIALS = {"head": ["|||IP_ADDRESS|||", "<|padding|>"],
                            "tail": ["|||EMAIL_ADDRESS|||", "|||PHONE_NUMBER|||", "<|endoftext|>"]}  # fmt: skip
MODERNBERT_SPECIALS = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]


def modernbert_vocab() -> list[str]:
    pieces, _ = _learned("bpe-nfc")
    head, tail = MODERNBERT_OLMO_SPECIALS["head"], MODERNBERT_OLMO_SPECIALS["tail"]
    vocab = head + [p for p in pieces if p not in head + tail] + tail + MODERNBERT_SPECIALS
    unused = -len(vocab) % 64 or 64  # the published 83 would be most of a small vocabulary
    return vocab + [f"[unused{i}]" for i in range(unused)]


def modernbert() -> Tokenizer:
    """ModernBERT-base's tokenizer.json: NFC, byte-level BPE, `[CLS] a [SEP] b [SEP]`."""
    _, merges = _learned("bpe-nfc")
    vocab = modernbert_vocab()
    tok = _byte_level_bpe(vocab, merges)
    tok.normalizer = normalizers.NFC()
    ids = {t: vocab.index(t) for t in MODERNBERT_SPECIALS}
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0",
        pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])],
    )
    olmo = MODERNBERT_OLMO_SPECIALS["head"] + MODERNBERT_OLMO_SPECIALS["tail"]
    tok.add_special_tokens(
        [_special(t) for t in olmo]
        + [_special(t, lstrip=t == "[MASK]") for t in MODERNBERT_SPECIALS]
    )
    unused = [t for t in vocab if t.startswith("[unused")]
    tok.add_tokens([AddedToken(t, normalized=True, special=False) for t in unused])
    return tok


def _unigram(vocab: list[tuple[str, float]], unk: str, kind: str) -> Tokenizer:
    tok = Tokenizer(
        models.Unigram(vocab, unk_id=[p for p, _ in vocab].index(unk), byte_fallback=False)
    )
    tok.normalizer = _unigram_normalizer(kind)
    tok.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="▁", prepend_scheme="always", split=True
    )
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    return tok


def _pieces(kind: str, leave_out: list[str]) -> list[tuple[str, float]]:
    return [(p, s) for p, s in _learned(kind) if p not in leave_out]


def xlm_roberta() -> Tokenizer:
    """xlm-roberta-base's tokenizer.json: Unigram, `<s> <pad> </s> <unk>` at 0-3, `<mask>`
    last with lstrip, `<s> a </s></s> b </s>` (all type 0)."""
    specials = ["<s>", "<pad>", "</s>", "<unk>"]
    vocab = [(t, 0.0) for t in specials] + _pieces("unigram-nfkc", specials) + [("<mask>", 0.0)]
    tok = _unigram(vocab, "<unk>", "unigram-nfkc")
    tok.post_processor = processors.TemplateProcessing(
        single="<s>:0 $A:0 </s>:0",
        pair="<s>:0 $A:0 </s>:0 </s>:0 $B:0 </s>:0",
        special_tokens=[("<s>", 0), ("</s>", 2)],
    )
    tok.add_special_tokens([*(_special(t) for t in specials), _special("<mask>", lstrip=True)])
    return tok


def camembert() -> Tokenizer:
    """camembert-base's tokenizer.json (transformers' CamembertConverter): `<s>NOTUSED <pad>
    </s>NOTUSED <unk> <unk>NOTUSED` at 0-4, the SentencePiece `<s>` `</s>` at 5 and 6 (the
    config's bos/eos ids), `<mask>` last."""
    head = [("<s>NOTUSED", 0.0), ("<pad>", 0.0), ("</s>NOTUSED", 0.0), ("<unk>", 0.0),
            ("<unk>NOTUSED", -100.0), ("<s>", 0.0), ("</s>", 0.0)]  # fmt: skip
    names = [p for p, _ in head]
    vocab = head + _pieces("unigram-nfkc", names) + [("<mask>", 0.0)]
    tok = _unigram(vocab, "<unk>", "unigram-nfkc")
    tok.post_processor = processors.TemplateProcessing(
        single="<s>:0 $A:0 </s>:0",
        pair="<s>:0 $A:0 </s>:0 </s>:0 $B:0 </s>:0",
        special_tokens=[("<s>", 5), ("</s>", 6)],
    )
    tok.add_special_tokens([*(_special(t) for t in names), _special("<mask>", lstrip=True)])
    return tok


def albert() -> Tokenizer:
    """albert-base-v2's tokenizer.json: Unigram, lower-cased, accents stripped, `<pad> <unk>
    [CLS] [SEP] [MASK]` at 0-4, `[CLS] a [SEP] b [SEP]`."""
    specials = ["<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]"]
    vocab = [(t, 0.0) for t in specials] + _pieces("unigram-albert", specials)
    tok = _unigram(vocab, "<unk>", "unigram-albert")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0",
        pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 2), ("[SEP]", 3)],
    )
    # [MASK] with lstrip, as AlbertTokenizer declares it (and the converter wrote it)
    tok.add_special_tokens([_special(t, lstrip=t == "[MASK]") for t in specials])
    return tok


def deberta_v3() -> Tokenizer:
    """deberta-v3-base's tokenizer.json as transformers converts its spm.model: Unigram,
    `[PAD] [CLS] [SEP] [UNK]` at 0-3, [MASK] added after the pieces (128,000 of 128,001),
    `[CLS] a [SEP] b [SEP]`."""
    specials = ["[PAD]", "[CLS]", "[SEP]", "[UNK]"]
    vocab = [(t, 0.0) for t in specials] + _pieces("unigram-deberta", specials)
    tok = _unigram(vocab, "[UNK]", "unigram-deberta")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0",
        pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 1), ("[SEP]", 2)],
    )
    tok.add_special_tokens([*(_special(t) for t in specials), _special("[MASK]")])
    return tok


def _tokenizer_json(tok: Tokenizer) -> str:
    return json.dumps(json.loads(tok.to_str()), indent=2, ensure_ascii=False) + "\n"


def _lines_file(tokens: list[str]) -> str:
    return "".join(t + "\n" for t in tokens)


def _roberta_vocab_json() -> str:
    model = json.loads(roberta().to_str())["model"]
    return json.dumps(model["vocab"], ensure_ascii=False) + "\n"


def _roberta_merges_txt() -> str:
    merges = json.loads(roberta().to_str())["model"]["merges"]
    lines = [" ".join(m) if isinstance(m, list) else m for m in merges]
    return "#version: 0.2\n" + "".join(line + "\n" for line in lines)


def _modernbert_tokenizer_config() -> str:
    """ModernBERT-base's tokenizer_config.json with its added_tokens_decoder at the shrunk ids
    (the published one lists every added token; [MASK] with lstrip)."""
    tok = modernbert()
    decoder = {}
    for i, added in sorted(tok.get_added_tokens_decoder().items()):
        decoder[str(i)] = {"content": added.content, "lstrip": added.lstrip,
                           "normalized": added.normalized, "rstrip": added.rstrip,
                           "single_word": added.single_word, "special": added.special}  # fmt: skip
    config = {
        "added_tokens_decoder": decoder,
        "clean_up_tokenization_spaces": True,
        "cls_token": "[CLS]",
        "mask_token": "[MASK]",
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": 8192,
        "pad_token": "[PAD]",
        "sep_token": "[SEP]",
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": "[UNK]",
    }
    return json.dumps(config, indent=2) + "\n"


# Rows the published config.json has beyond its tokenizer's tokens, kept as published (the
# shrunk vocabularies keep the gap, not the ratio); every other checkpoint has none.
VOCAB_GAP = {
    "deberta-v3-base": 128_100 - 128_001,  # 128,000 SentencePiece pieces + [MASK]
    "bert-base-uncased-30500": 30_522 - 30_500,
}


def _set_field(text: str, name: str, value: int) -> str:
    """`text` (a committed config.json) with the integer field `name` set, formatting kept."""
    pattern = rf'("{name}":\s*)-?\d+'
    if not re.search(pattern, text):
        raise ValueError(f"no integer {name!r} to set")
    return re.sub(pattern, lambda m: m.group(1) + str(value), text)


def _config(name: str, size: int, ids: dict[str, int] | None = None) -> Callable[[], str]:
    """The committed config.json of `name` with vocab_size (and `ids`) at the shrunk values."""

    def make() -> str:
        text = (HERE / name / "config.json").read_text(encoding="utf-8")
        for field, value in {"vocab_size": size + VOCAB_GAP.get(name, 0), **(ids or {})}.items():
            text = _set_field(text, field, value)
        return text

    return make


def _size(tok: Tokenizer) -> int:
    return tok.get_vocab_size(with_added_tokens=True)


def _modernbert_ids() -> dict[str, int]:
    """ModernBERT's config names its special ids (published: bos = cls 50281, eos = sep 50282,
    pad 50283)."""
    tok = modernbert()
    cls, sep, pad = (tok.token_to_id(t) for t in ("[CLS]", "[SEP]", "[PAD]"))
    assert cls is not None and sep is not None and pad is not None
    return {"bos_token_id": cls, "cls_token_id": cls, "eos_token_id": sep,
            "sep_token_id": sep, "pad_token_id": pad}  # fmt: skip


def outputs() -> dict[str, Callable[[], str]]:
    """relative path -> its text, for every file this script writes."""
    return (
        {
            "bert-base-uncased/tokenizer.json": lambda: _tokenizer_json(bert(cased=False)),
            "bert-base-cased/tokenizer.json": lambda: _tokenizer_json(bert(cased=True)),
            "bert-base-uncased-30500/tokenizer.json": lambda: _tokenizer_json(
                bert(cased=False, fewer=22)  # 30,522 - 30,500
            ),
            "distilbert-base-uncased/tokenizer.json": lambda: _tokenizer_json(bert(cased=False)),
            "distilbert-base-uncased-finetuned-sst-2-english/vocab.txt": lambda: _lines_file(
                _bert_vocab(cased=False)
            ),
            "electra-base-discriminator/tokenizer.json": lambda: _tokenizer_json(bert(cased=False)),
            "roberta-base/tokenizer.json": lambda: _tokenizer_json(roberta()),
            "xlm-roberta-base/tokenizer.json": lambda: _tokenizer_json(xlm_roberta()),
            "camembert-base/tokenizer.json": lambda: _tokenizer_json(camembert()),
            "albert-base-v2/tokenizer.json": lambda: _tokenizer_json(albert()),
            "deberta-v3-base/tokenizer.json": lambda: _tokenizer_json(deberta_v3()),
            "deberta-v3-base/added_tokens.json": lambda: (
                json.dumps({"[MASK]": deberta_v3().token_to_id("[MASK]")}) + "\n"
            ),
            "ModernBERT-base/tokenizer.json": lambda: _tokenizer_json(modernbert()),
            "ModernBERT-base/tokenizer_config.json": _modernbert_tokenizer_config,
            "mpnet-base/vocab.txt": lambda: _lines_file(mpnet_vocab()),
            "all-mpnet-base-v2/tokenizer.json": lambda: _tokenizer_json(all_mpnet()),
        }
        | {  # the slow tokenizer's files the published folders carry beside tokenizer.json
            f"{name}/vocab.txt": vocab
            for name, vocab in {
                "bert-base-uncased": lambda: _lines_file(_bert_vocab(cased=False)),
                "bert-base-cased": lambda: _lines_file(_bert_vocab(cased=True)),
                "bert-base-uncased-30500": lambda: _lines_file(_bert_vocab(False, fewer=22)),
                "distilbert-base-uncased": lambda: _lines_file(_bert_vocab(cased=False)),
                "electra-base-discriminator": lambda: _lines_file(_bert_vocab(cased=False)),
                "all-mpnet-base-v2": lambda: _lines_file(mpnet_vocab()),
            }.items()
        }
        | {
            "roberta-base/vocab.json": _roberta_vocab_json,
            "roberta-base/merges.txt": _roberta_merges_txt,
        }
        | {  # after the tokenizers: each config.json's vocab_size is its tokenizer's size
            f"{name}/config.json": _config(name, size())
            for name, size in {
                "bert-base-uncased": lambda: _size(bert(cased=False)),
                "bert-base-cased": lambda: _size(bert(cased=True)),
                "bert-base-uncased-30500": lambda: _size(bert(cased=False, fewer=22)),
                "distilbert-base-uncased": lambda: _size(bert(cased=False)),
                "distilbert-base-uncased-finetuned-sst-2-english": lambda: len(
                    _bert_vocab(cased=False)
                ),
                "electra-base-discriminator": lambda: _size(bert(cased=False)),
                "roberta-base": lambda: _size(roberta()),
                "xlm-roberta-base": lambda: _size(xlm_roberta()),
                "camembert-base": lambda: _size(camembert()),
                "albert-base-v2": lambda: _size(albert()),
                "deberta-v3-base": lambda: _size(deberta_v3()),
                "mpnet-base": lambda: len(mpnet_vocab()),
                "all-mpnet-base-v2": lambda: _size(all_mpnet()),
            }.items()
        }
        | {
            "ModernBERT-base/config.json": _config(
                "ModernBERT-base", _size(modernbert()), _modernbert_ids()
            )
        }
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare, write nothing")
    args = parser.parse_args(argv)
    differ = []
    for relative, make in outputs().items():
        path, text = HERE / relative, make()
        if args.check:
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                differ.append(relative)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    if differ:
        print("differ from what make_fixtures writes:", ", ".join(differ), file=sys.stderr)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
