"""Raw text -> a tokenized, memory-mapped corpus cache, for pretraining (training.pretrain).

    >>> tokenizer = load_tokenizer("../shared/data/vocab/bert-base-uncased/vocab.txt")
    >>> corpus = tokenize_corpus(["corpus/gutenberg_nltk", "corpus/misc_pd_books"], tokenizer)
    corpus: built ~/.cache/bert-heads/pretraining/... (20 files, 27,521 documents, ...)
    >>> corpus.tokens[corpus.sentences[0] : corpus.sentences[1]]   # the first sentence's ids

A second call with the same files and tokenizer reuses the cache (about 20 s to build for the
19 MB of ../shared/data/corpus on one busy CPU core; milliseconds to reuse).

Reading. Every file, and every blank-line-separated block inside a file, is one document
(Devlin et al.'s create_pretraining_data input format; a folder stands for the files under it);
documents="files" makes each file one document instead, for prose whose blank lines only end
paragraphs (War and Peace: 11,338 blocks of 2.7 sentences on average, too short to fill 128).
Files are UTF-8 (a BOM is dropped); CRLF and CR-only line endings become LF. A file with a NUL
byte or bytes that are not UTF-8 raises `CorpusError` naming the file and the offset
(`skip_bad_files=True` skips it instead and counts it); an empty file is skipped and counted;
a corpus with no text at all is an error.

Sentences. A rule-based splitter over whitespace-separated words: a sentence ends at a word
ending in . ! or ? (closing quotes and brackets after it allowed) when the next word starts,
after any opening quote, with an upper-case letter or a digit; not after a known abbreviation
(Mr. Dr. St. ...) or a single-letter initial (H. G. Wells). Space-tokenized text ("rich ." as
in the Gutenberg files and WikiText) splits the same way. It needs cased text: a lower-cased
block stays one "sentence", which is still fine for MLM and gets truncated for NSP.

The cache. `<cache_dir>/pretraining/<key>/` holds tokens.bin (uint16 ids; int32 for
vocabularies past 65,536), sentences.npy (S + 1 token offsets), documents.npy (D + 1 sentence
offsets) and meta.json. The key hashes every file's path, size and mtime, the tokenizer's JSON
and CACHE_FORMAT, so a changed file or tokenizer builds a new cache. Sentences of a document
are stored contiguously: a run of sentences is one token range.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from training.data.records import DataError

CACHE_FORMAT = 1  # bump when reading, splitting or the file layout changes: old caches go stale
# What a document is: every blank-line-separated block (create_pretraining_data's input format),
# or every file (for prose whose blank lines only end paragraphs: longer NSP pairs).
DOCUMENT_UNITS = ("blocks", "files")


class CorpusError(DataError):
    """Pretraining text that cannot be used; the message names the file."""


# --- reading ----------------------------------------------------------------------------

_BLANK_LINE = re.compile(r"\n[ \t\f\v]*\n")
_CLOSERS = "\"')]}»”’"
_OPENERS = "\"'([{«“‘`"
_ABBREVIATIONS = frozenset(
    re.findall(
        r"\S+",
        "mr mrs ms messrs dr prof rev st jr sr gen col capt lt sgt hon gov sen rep vs etc "
        "no vol ch fig co corp inc ltd mt ft esq viz cf e.g i.e a.m p.m",
    )
)


def _ends_sentence(word: str, next_word: str) -> bool:
    core = word.rstrip(_CLOSERS)
    if not core or core[-1] not in ".!?":
        return False
    if core[-1] == ".":
        stem = core[:-1].lower()
        if stem in _ABBREVIATIONS or (len(stem) == 1 and stem.isalpha()):
            return False
    start = next_word.lstrip(_OPENERS)
    return not start or start[0].isupper() or start[0].isdigit()


def split_sentences(text: str) -> list[str]:
    """Rule-based sentence splitter (see the module docstring); words re-joined by one space.
    A closing quote written as a word of its own ("? ''" in space-tokenized text) stays with
    the sentence it closes."""
    words = text.split()
    sentences, start = [], 0
    for i in range(len(words)):
        if i < start:
            continue
        j = i + 1
        while j < len(words) and not words[j].strip(_CLOSERS):
            j += 1
        if j < len(words) and _ends_sentence(words[i], words[j]):
            sentences.append(" ".join(words[start:j]))
            start = j
    if start < len(words):
        sentences.append(" ".join(words[start:]))
    return sentences


def read_text(path: Path) -> str:
    """A file's text with LF line endings and no BOM; CorpusError for binary or non-UTF-8."""
    data = path.read_bytes()
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        raise CorpusError(f"{path}: UTF-16 text; convert it to UTF-8 (iconv -f utf-16 -t utf-8)")
    if b"\x00" in data:
        raise CorpusError(
            f"{path}: looks binary (NUL byte at offset {data.index(0)}); pass plain-text files"
        )
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise CorpusError(
            f"{path}: not UTF-8 (byte 0x{data[e.start]:02x} at offset {e.start}); re-encode it, "
            "e.g. iconv -f latin1 -t utf-8"
        ) from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def read_documents(path: Path, documents: str = "blocks") -> Iterator[list[str]]:
    """The file's documents as lists of sentences: each blank-line-separated block
    (documents="blocks"), or the whole file as one ("files"). Empty ones are dropped."""
    if documents not in DOCUMENT_UNITS:
        raise ValueError(f"documents must be one of {DOCUMENT_UNITS}, not {documents!r}")
    blocks = [split_sentences(block) for block in _BLANK_LINE.split(read_text(path))]
    if documents == "files":
        blocks = [[s for block in blocks for s in block]]
    yield from (b for b in blocks if b)


def corpus_files(paths: Sequence[str | Path]) -> list[Path]:
    """Files named, plus every non-hidden file under a named folder (sorted)."""
    files: list[Path] = []
    for p in map(Path, paths):
        p = p.expanduser()
        if p.is_dir():
            found = sorted(
                f
                for f in p.rglob("*")
                if f.is_file() and not any(part.startswith(".") for part in f.relative_to(p).parts)
            )
            if not found:
                raise CorpusError(f"{p}: folder holds no files")
            files += found
        elif p.is_file():
            files.append(p)
        else:
            raise CorpusError(f"{p}: no such file or folder")
    return files


# --- the tokenized cache ----------------------------------------------------------------


@dataclass
class TokenizedCorpus:
    """A corpus tokenized once. tokens (N,) memmap of ids; sentences (S + 1,) token offsets;
    documents (D + 1,) sentence offsets. Document d's tokens are
    tokens[sentences[documents[d]] : sentences[documents[d + 1]]]."""

    tokens: np.ndarray
    sentences: np.ndarray
    documents: np.ndarray
    meta: dict[str, Any]
    path: Path

    @property
    def num_documents(self) -> int:
        return len(self.documents) - 1

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    def document_token_offsets(self) -> np.ndarray:
        """(D + 1,) token offsets of the documents."""
        return self.sentences[self.documents]


def tokenizer_hash(tokenizer: Tokenizer) -> str:
    return hashlib.sha256(tokenizer.to_str().encode()).hexdigest()


def cache_key(files: Sequence[Path], tokenizer: Tokenizer, documents: str = "blocks") -> str:
    h = hashlib.sha256(f"pretraining-cache {CACHE_FORMAT} {documents}\n".encode())
    h.update(f"{tokenizer_hash(tokenizer)}\n".encode())
    for f in files:
        st = f.stat()
        h.update(f"{f.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:24]


def default_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser() / "bert-heads"


def load_cache(directory: Path) -> TokenizedCorpus:
    meta = json.loads((directory / "meta.json").read_text())
    tokens = np.memmap(directory / "tokens.bin", dtype=meta["dtype"], mode="r")
    return TokenizedCorpus(
        tokens,
        np.load(directory / "sentences.npy", mmap_mode="r"),
        np.load(directory / "documents.npy", mmap_mode="r"),
        meta,
        directory,
    )


def tokenize_corpus(
    paths: Sequence[str | Path],
    tokenizer: Tokenizer,
    cache_dir: str | Path | None = None,
    documents: str = "blocks",
    skip_bad_files: bool = False,
    log: Any = print,
) -> TokenizedCorpus:
    """The corpus's tokenized cache: reused when the files, the tokenizer and the document
    unit are unchanged, built otherwise (in a temporary folder, renamed into place at the end)."""
    files = corpus_files(paths)
    root = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    directory = root / "pretraining" / cache_key(files, tokenizer, documents)
    if (directory / "meta.json").is_file():
        corpus = load_cache(directory)
        log(f"corpus: reusing {directory} ({_describe(corpus)})")
        return corpus

    tmp = directory.with_name(f"{directory.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    dtype = np.uint16 if vocab_size <= np.iinfo(np.uint16).max + 1 else np.int32
    sentence_ends: list[int] = [0]
    document_ends: list[int] = [0]
    skipped: dict[str, list[str]] = {"empty": [], "bad": []}
    with open(tmp / "tokens.bin", "wb") as out:
        for f in files:
            try:
                docs_of_file = list(read_documents(f, documents))
            except CorpusError as e:
                if not skip_bad_files:
                    raise
                log(f"corpus: skipping {e}")
                skipped["bad"].append(str(f))
                continue
            before = len(document_ends)
            for docs in _chunks(docs_of_file, 2000):
                flat = [s for d in docs for s in d]
                encodings = tokenizer.encode_batch(flat, add_special_tokens=False)
                k = 0
                for d in docs:
                    n_sentences = len(sentence_ends)
                    for enc in encodings[k : k + len(d)]:
                        if enc.ids:
                            out.write(np.asarray(enc.ids, dtype=dtype).tobytes())
                            sentence_ends.append(sentence_ends[-1] + len(enc.ids))
                    k += len(d)
                    if len(sentence_ends) > n_sentences:  # a document with some tokens
                        document_ends.append(len(sentence_ends) - 1)
            if len(document_ends) == before:
                skipped["empty"].append(str(f))
    if len(document_ends) == 1:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CorpusError(f"empty corpus: no text in {', '.join(map(str, paths))}")
    np.save(tmp / "sentences.npy", np.asarray(sentence_ends, dtype=np.int64))
    np.save(tmp / "documents.npy", np.asarray(document_ends, dtype=np.int64))
    meta = {
        "format": CACHE_FORMAT,
        "documents_are": documents,
        "dtype": np.dtype(dtype).name,
        "files": [str(f) for f in files],
        "skipped_empty_files": skipped["empty"],
        "skipped_bad_files": skipped["bad"],
        "tokenizer_sha256": tokenizer_hash(tokenizer),
        "tokens": sentence_ends[-1],
        "sentences": len(sentence_ends) - 1,
        "documents": len(document_ends) - 1,
    }
    (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    try:
        tmp.rename(directory)
    except OSError:  # another process finished the same cache first: use theirs
        shutil.rmtree(tmp, ignore_errors=True)
    corpus = load_cache(directory)
    log(f"corpus: built {directory} ({_describe(corpus)})")
    return corpus


def _chunks(items: list, n: int) -> Iterator[list]:
    for i in range(0, len(items), n):
        yield items[i : i + n]


def _describe(corpus: TokenizedCorpus) -> str:
    m = corpus.meta
    skipped = len(m["skipped_empty_files"]) + len(m["skipped_bad_files"])
    return (
        f"{len(m['files']) - skipped} files, {m['documents']:,} documents, "
        f"{m['sentences']:,} sentences, {m['tokens']:,} tokens"
        + (
            f"; skipped {len(m['skipped_empty_files'])} empty, "
            f"{len(m['skipped_bad_files'])} unreadable"
            if skipped
            else ""
        )
    )
