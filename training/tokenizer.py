"""Tokenization through the `tokenizers` library: train (WordPiece), load (any fast
tokenizer.json, vocab.txt, RoBERTa's vocab.json + merges.txt), save, encode.

The service reads the `tokenizer.json` this module saves, so what training sees is what the
service sees. There is no second wrapper: everything here returns a plain
`tokenizers.Tokenizer`, with padding and truncation off (callers decide both per call).

    >>> tok = train_tokenizer(["corpus/a.txt", "corpus/b.txt"], vocab_size=8000)
    >>> save_tokenizer(tok, "runs/mini")          # tokenizer.json, vocab.txt, tokenizer_config.json
    >>> tok = load_tokenizer("runs/mini")         # or a vocab.txt, a tokenizer.json, a HF folder
    >>> enc = encode(tok, "Who wrote it?", "Tolstoy wrote it.", max_length=128)
    >>> enc.input_ids, enc.token_type_ids, enc.attention_mask, enc.offsets
    >>> with truncating(tok, 384, "only_second"):   # the library's own batch API, truncated
    ...     encodings = tok.encode_batch(list(zip(questions, contexts)))

Special tokens of a vocabulary we train: [PAD] [UNK] [CLS] [SEP] [MASK] at ids 0..4, in that
order. [PAD] = 0 is what matters: it is `BertConfig.pad_token_id`'s default and what every
Hugging Face BERT vocabulary uses. (Google's vocabularies put [UNK] [CLS] [SEP] [MASK] at
100..103 after 99 [unused] slots; nothing depends on those ids, so we do not copy the gap.)
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders
from tokenizers.models import BPE, WordPiece
from tokenizers.normalizers import BertNormalizer
from tokenizers.pre_tokenizers import BertPreTokenizer, ByteLevel
from tokenizers.processors import RobertaProcessing, TemplateProcessing
from tokenizers.trainers import WordPieceTrainer

from training.special_tokens import special_tokens

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
# The mask token's usual names: BERT, ALBERT, DistilBERT, DeBERTa, ModernBERT / RoBERTa, XLM-R,
# CamemBERT, MPNet.
MASK_TOKENS = ("[MASK]", "<mask>")
TRUNCATION_STRATEGIES = ("longest_first", "only_first", "only_second")
MAX_INPUT_CHARS_PER_WORD = 100  # longer words become [UNK], as in Google's tokenization.py


class TokenizerError(ValueError):
    """A vocabulary or tokenizer file that cannot be used."""


# --- building ---------------------------------------------------------------------------


def _bert_pipeline(
    tok: Tokenizer,
    lowercase: bool,
    strip_accents: bool | None,
    specials: dict[str, str] | None = None,
    double_sep: bool = False,
) -> Tokenizer:
    """BERT's normalizer (clean text, CJK spacing, optional lower-casing / accent stripping,
    where strip_accents=None follows lowercase), whitespace+punctuation pre-tokenizer,
    `[CLS] A [SEP] B [SEP]` template with segment ids 0 / 1, and the ## decoder. specials:
    the folder's declared `<role>_token`s over BERT's names; double_sep: MPNet's pair
    `<s> A </s></s> B </s>` (transformers' MPNet tokenizer, its fast converter's types)."""
    names = {"cls_token": "[CLS]", "sep_token": "[SEP]", "unk_token": "[UNK]"} | (specials or {})
    tok.normalizer = BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=strip_accents, lowercase=lowercase
    )
    tok.pre_tokenizer = BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    special = dict.fromkeys(
        t for t in (*SPECIAL_TOKENS, *names.values()) if tok.token_to_id(t) is not None
    )
    # <mask> takes the space before it, as transformers declares it for RoBERTa and MPNet
    tok.add_special_tokens([AddedToken(t, lstrip=t == "<mask>") for t in special])
    cls, sep = names["cls_token"], names["sep_token"]
    ids = {t: tok.token_to_id(t) for t in (cls, sep, names["unk_token"])}
    if None in ids.values():
        missing = ", ".join(t for t, i in ids.items() if i is None)
        raise TokenizerError(f"the vocabulary has no {missing}")
    tok.post_processor = TemplateProcessing(
        single=f"{cls} $A {sep}",
        pair=f"{cls} $A {sep} {sep} $B:1 {sep}:1" if double_sep else f"{cls} $A {sep} $B:1 {sep}:1",
        special_tokens=[(cls, ids[cls]), (sep, ids[sep])],
    )
    return tok


def _read_lines(files: Iterable[str | Path]) -> Iterator[str]:
    # Text mode with universal newlines and utf-8-sig: the corpus has CR-only and CRLF files
    # and a BOM, which would otherwise become one giant "line" or a stray token.
    for f in files:
        with open(f, encoding="utf-8-sig", errors="replace") as fh:
            yield from fh


def train_tokenizer(
    files: Iterable[str | Path],
    vocab_size: int,
    lowercase: bool = True,
    strip_accents: bool | None = None,
    min_frequency: int = 2,
    limit_alphabet: int = 1000,
) -> Tokenizer:
    """Learn a WordPiece vocabulary of `vocab_size` entries (specials included) from text files."""
    tok = Tokenizer(WordPiece(unk_token="[UNK]", max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD))
    tok.normalizer = BertNormalizer(strip_accents=strip_accents, lowercase=lowercase)
    tok.pre_tokenizer = BertPreTokenizer()
    trainer = WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        limit_alphabet=limit_alphabet,  # rare characters beyond this become [UNK]
        special_tokens=list(SPECIAL_TOKENS),
        continuing_subword_prefix="##",
        show_progress=False,
    )
    tok.train_from_iterator(_read_lines(files), trainer=trainer)
    return _bert_pipeline(tok, lowercase, strip_accents)


# --- loading and saving -----------------------------------------------------------------


def _looks_cased(vocab: Iterable[str]) -> bool:
    # An uncased vocabulary was built from lower-cased text: bert-base-uncased has 2 entries
    # with an upper-case letter (ℝ), bert-base-cased has 8,368 of 28,996.
    tokens = [t for t in vocab if not (t.startswith("[") and t.endswith("]"))]
    upper = sum(any(c.isupper() for c in t) for t in tokens)
    return upper > 0.01 * max(len(tokens), 1)


def _from_vocab_txt(path: Path, lowercase: bool | None) -> Tokenizer:
    vocab = WordPiece.read_file(str(path))
    if not vocab:
        raise TokenizerError(f"{path}: empty vocabulary")
    strip_accents = None
    config_path = path.parent / "tokenizer_config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    if lowercase is None:
        lowercase = config.get("do_lower_case")
    strip_accents = config.get("strip_accents")
    if lowercase is None:
        lowercase = not _looks_cased(vocab)
    # A vocab.txt alone says nothing of the row template: the folder's declared tokens do, and
    # the model type (MPNet's vocab.txt is BERT's with <s> <pad> </s> <unk> in front, and its
    # rows are <s> a </s></s> b </s>), as transformers picks its tokenizer class.
    specials = {k: v for k, v in _special_tokens(path.parent).items() if v in vocab}
    model_json = path.parent / "config.json"
    model_type = (
        json.loads(model_json.read_text()).get("model_type") if model_json.is_file() else None
    )
    mpnet = str(config.get("tokenizer_class", "")).startswith("MPNet") or model_type == "mpnet"
    if mpnet:
        defaults = {"cls_token": "<s>", "sep_token": "</s>", "unk_token": "[UNK]",
                    "pad_token": "<pad>", "mask_token": "<mask>", "bos_token": "<s>",
                    "eos_token": "</s>"}  # fmt: skip
        specials = defaults | specials
    unk = specials.get("unk_token", "[UNK]")
    model = WordPiece(vocab, unk_token=unk, max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD)
    try:
        return _bert_pipeline(Tokenizer(model), bool(lowercase), strip_accents, specials, mpnet)
    except TokenizerError as e:
        raise TokenizerError(f"{path}: {e}") from None


def load_tokenizer(path: str | Path, lowercase: bool | None = None) -> Tokenizer:
    """A tokenizer.json, a vocab.txt, or a folder holding one of them or RoBERTa's slow
    vocab.json + merges.txt (tokenizer.json preferred).

    For a vocab.txt, lower-casing comes from `lowercase`, else the folder's
    tokenizer_config.json `do_lower_case`, else from the vocabulary itself (uncased vocab ->
    lower-case). A tokenizer.json keeps its own normalizer. Padding and truncation are turned
    off on the result (all-MiniLM-L6-v2's tokenizer.json pads everything to 128)."""
    path = Path(path)
    if path.is_dir():
        candidates = [path / "tokenizer.json", path / "vocab.txt", path / "merges.txt"]
        found = [p for p in candidates if p.is_file()]
        if not found:
            sentencepiece = [p.name for p in path.glob("*.model")]
            raise TokenizerError(
                f"{path}: no tokenizer.json, vocab.txt or vocab.json + merges.txt"
                + (
                    f"; {', '.join(sentencepiece)} is a SentencePiece model, which is read "
                    "through its fast tokenizer.json: save one on a machine with transformers "
                    "and sentencepiece (AutoTokenizer.from_pretrained(folder)"
                    ".save_pretrained(folder))"
                    if sentencepiece
                    else ""
                )
            )
        path = found[0]
    if not path.is_file():
        raise TokenizerError(f"{path}: no such file")
    if path.name == "merges.txt":
        tok = _from_bpe_files(path.parent)
    elif path.suffix == ".json":
        try:
            tok = Tokenizer.from_file(str(path))
        except Exception as e:  # the Rust side raises plain Exception
            raise TokenizerError(f"{path}: not a tokenizers file ({e})") from None
    else:
        tok = _from_vocab_txt(path, lowercase)
    tok.no_padding()
    tok.no_truncation()
    return tok


def _special_tokens(folder: Path) -> dict[str, str]:
    """A slow tokenizer's special tokens: special_tokens_map.json over tokenizer_config.json
    (a value is a string or an AddedToken dict with "content")."""
    found: dict[str, str] = {}
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        if (folder / name).is_file():
            for key, value in json.loads((folder / name).read_text()).items():
                if key.endswith("_token") and value is not None:
                    found[key] = value["content"] if isinstance(value, dict) else value
    return found


def mask_token(tok: Tokenizer, folder: str | Path | None = None) -> str | None:
    """The token a masked LM fills in, as the folder's files declare it (special_tokens_map.json,
    tokenizer_config.json, training.special_tokens' order), else [MASK] or <mask> by name;
    None when there is none."""
    return special_tokens(folder, tok).tokens.get("mask")


def clean_up_tokenization_spaces(folder: str | Path | None) -> bool:
    """tokenizer_config.json's clean_up_tokenization_spaces: whether transformers' decode
    removes the space before punctuation and contractions (" ." -> "."). transformers'
    default, false, when the folder does not say."""
    path = Path(folder) / "tokenizer_config.json" if folder else None
    if path is None or not path.is_file():
        return False
    return bool(json.loads(path.read_text()).get("clean_up_tokenization_spaces", False))


def _from_bpe_files(folder: Path) -> Tokenizer:
    """RoBERTa's slow format, vocab.json + merges.txt, built into the fast tokenizer
    transformers converts it to: byte-level BPE, `<s> A </s></s> B </s>`, offsets trimmed of
    the spaces the byte-level pieces carry (so a word's offsets cover the word alone)."""
    vocab_path = folder / "vocab.json"
    if not vocab_path.is_file():
        raise TokenizerError(f"{folder}: merges.txt without vocab.json")
    try:
        model = BPE.from_file(str(vocab_path), str(folder / "merges.txt"))
    except Exception as e:  # the Rust side raises plain Exception
        raise TokenizerError(f"{folder}: vocab.json / merges.txt do not load ({e})") from None
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    prefix_space = bool(config.get("add_prefix_space", False))
    trim = bool(config.get("trim_offsets", True))
    special = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
               "sep_token": "</s>", "cls_token": "<s>", "pad_token": "<pad>",
               "mask_token": "<mask>"} | _special_tokens(folder)  # fmt: skip
    tok = Tokenizer(model)
    tok.pre_tokenizer = ByteLevel(add_prefix_space=prefix_space)
    tok.decoder = decoders.ByteLevel()
    # <mask> takes the space before it, as transformers' RobertaTokenizer declares it
    tok.add_special_tokens(
        [AddedToken(t, lstrip=key == "mask_token") for key, t in special.items()]
    )
    ids = {key: tok.token_to_id(special[key]) for key in ("cls_token", "sep_token")}
    if None in ids.values():
        raise TokenizerError(
            f"{folder}: vocab.json has no {special['cls_token']} / {special['sep_token']}"
        )
    tok.post_processor = RobertaProcessing(
        (special["sep_token"], ids["sep_token"]),
        (special["cls_token"], ids["cls_token"]),
        trim_offsets=trim,
        add_prefix_space=prefix_space,
    )
    return tok


def _normalizer_json(tok: Tokenizer) -> dict[str, Any] | None:
    return json.loads(tok.to_str()).get("normalizer")


def do_lower_case(tok: Tokenizer) -> bool:
    """Whether the tokenizer lower-cases its input (BertNormalizer or a Lowercase step)."""

    def lowers(n: dict[str, Any] | None) -> bool:
        if not n:
            return False
        if n["type"] == "BertNormalizer":
            return bool(n.get("lowercase"))
        if n["type"] == "Sequence":
            return any(lowers(m) for m in n["normalizers"])
        return n["type"] == "Lowercase"

    return lowers(_normalizer_json(tok))


def save_tokenizer(
    tok: Tokenizer, directory: str | Path, model_max_length: int | None = None
) -> Path:
    """Write tokenizer.json, and for a BERT WordPiece model also vocab.txt, tokenizer_config.json and
    special_tokens_map.json, so that transformers' AutoTokenizer (and sentence-transformers)
    build the same tokenizer: without do_lower_case in tokenizer_config.json,
    BertTokenizerFast would lower-case a cased tokenizer.json. Padding and truncation are not
    saved: whoever reads the file decides them per call."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    clean = Tokenizer.from_str(tok.to_str())
    clean.no_padding()
    clean.no_truncation()
    clean.save(str(directory / "tokenizer.json"))
    vocab = tok.get_vocab(with_added_tokens=True)
    if not isinstance(tok.model, WordPiece) or not {"[CLS]", "[SEP]"} <= set(vocab):
        # BERT's slow files describe BERT's template only (MPNet's WordPiece has <s> ... </s>):
        # others are read from tokenizer.json alone
        return directory
    by_id = sorted(vocab, key=vocab.__getitem__)
    if [vocab[t] for t in by_id] != list(range(len(by_id))):
        raise TokenizerError("token ids are not contiguous from 0: cannot write vocab.txt")
    (directory / "vocab.txt").write_text("".join(t + "\n" for t in by_id), encoding="utf-8")
    normalizer = _normalizer_json(tok) or {}
    specials = {
        f"{name}_token": t
        for name, t in zip(("pad", "unk", "cls", "sep", "mask"), SPECIAL_TOKENS, strict=True)
        if t in vocab
    }
    config: dict[str, Any] = {
        "tokenizer_class": "BertTokenizer",
        "do_lower_case": do_lower_case(tok),
        "strip_accents": normalizer.get("strip_accents"),
        "tokenize_chinese_chars": normalizer.get("handle_chinese_chars", True),
        **specials,
    }
    if model_max_length:
        config["model_max_length"] = model_max_length
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (directory / "special_tokens_map.json").write_text(json.dumps(specials, indent=2) + "\n")
    return directory


# --- encoding ---------------------------------------------------------------------------


@dataclass
class Encoded:
    input_ids: list[int]
    token_type_ids: list[int]  # 0 for [CLS] A [SEP], 1 for B [SEP]
    attention_mask: list[int]  # all ones: nothing is padded here
    offsets: list[tuple[int, int]]  # character span in its own text; (0, 0) for specials


@contextmanager
def truncating(tok: Tokenizer, max_length: int | None, strategy: str = "longest_first"):
    """Truncate to `max_length` tokens (specials included) inside the block, then restore the
    tokenizer's previous setting. longest_first trims the longer of a pair first; only_first /
    only_second trim one side (and fail if that side alone cannot make room). This mutates
    `tok`: do not share one tokenizer between threads while inside the block."""
    if strategy not in TRUNCATION_STRATEGIES:
        raise ValueError(f"truncation must be one of {TRUNCATION_STRATEGIES}, not {strategy!r}")
    previous = tok.truncation
    if max_length is None:
        tok.no_truncation()
    else:
        tok.enable_truncation(max_length, strategy=strategy)
    try:
        yield tok
    finally:
        if previous is None:
            tok.no_truncation()
        else:
            tok.enable_truncation(**previous)


def encode_batch(
    tok: Tokenizer,
    texts: Sequence[str],
    pairs: Sequence[str] | None = None,
    max_length: int | None = None,
    truncation: str = "longest_first",
) -> list[Encoded]:
    """Encode texts (or text pairs) in parallel, unpadded; truncated when max_length is set."""
    inputs: list[Any] = list(texts) if pairs is None else list(zip(texts, pairs, strict=True))
    with truncating(tok, max_length, truncation):
        encodings = tok.encode_batch(inputs)
    return [
        Encoded(e.ids, e.type_ids, e.attention_mask, [tuple(o) for o in e.offsets])
        for e in encodings
    ]


def encode(
    tok: Tokenizer,
    text: str,
    pair: str | None = None,
    max_length: int | None = None,
    truncation: str = "longest_first",
) -> Encoded:
    """One text (or pair): ids, segment ids, attention mask and character offsets."""
    pairs = None if pair is None else [pair]
    return encode_batch(tok, [text], pairs, max_length, truncation)[0]
