"""A ColBERT package's `late_interaction` block: how the service builds its rows and which of
their vectors answer, resolved from a PyLate or colbert-ai folder's settings
(training.checkpoint.read_late_interaction) with the package's own tokenizer.

    >>> folder = read_late_interaction("runs/colbert")
    >>> block, notes = package_block(folder, tok, special_tokens("runs/colbert", tok))
    >>> block["query_prefix_id"], block["skiplist_ids"][:3]

Token texts become ids as the library that wrote the folder looks them up, so that the service
builds the rows the model was trained on (PyLate 1.0.0, colbert-ai 0.2.22):

- the markers (query / document prefix) by name in the vocabulary, an unknown name as the
  unknown token's id: transformers' `convert_tokens_to_ids`, which both call. PyLate adds its
  prefixes to the tokenizer before saving it; colbert-ai looks up `[unused0]` / `[unused1]`,
  which a vocabulary without them turns into `[UNK]`;
- PyLate's skiplist_words by name the same way (`ColBERT.skiplist`, an unknown word as
  `[UNK]`, so a WordPiece vocabulary without `~` drops every `[UNK]` from documents);
  colbert-ai's punctuation as the first token each symbol encodes to
  (`ColBERT.__init__`: `encode(symbol, add_special_tokens=False)[0]`).

The block is the contract of heads.tasks.late_interaction (the service) and is checked where
package.json is read (heads.package.read_package).
"""

from __future__ import annotations

from typing import Any

from tokenizers import Tokenizer

from heads.rows import prepare_tokenizer, template
from training.checkpoint import LateInteractionFolder
from training.special_tokens import SpecialTokens


class LateInteractionError(ValueError):
    """A ColBERT folder whose rows the service could not build as its library does."""


def package_block(
    folder: LateInteractionFolder, tok: Tokenizer, specials: SpecialTokens
) -> tuple[dict[str, Any], list[str]]:
    """package.json's `late_interaction` block, and notes for the export's log (the names
    looked up as the unknown token). Raises LateInteractionError when a row cannot be built:
    no mask token to expand queries with, no room for text, no first token to put the marker
    after, a name missing from a vocabulary with no unknown token."""
    mask = specials.ids.get("mask")
    if folder.query_expansion and mask is None:
        raise LateInteractionError(
            "the tokenizer has no mask token, which query expansion fills queries with"
        )
    _check_rows(folder, tok)
    ids = Lookup(tok, specials)
    block = {
        "query_prefix": folder.query_prefix,
        "query_prefix_id": ids(folder.query_prefix, "query prefix"),
        "document_prefix": folder.document_prefix,
        "document_prefix_id": ids(folder.document_prefix, "document prefix"),
        "query_length": folder.query_length,
        "document_length": folder.document_length,
        "query_expansion": folder.query_expansion,
        "attend_to_expansion_tokens": folder.attend_to_expansion_tokens,
        "mask_id": mask,
        "skiplist_ids": skiplist_ids(folder, tok, ids),
        "source": folder.source,
    }
    return block, ids.notes(folder.source)


class Lookup:
    """Token name -> id as transformers' convert_tokens_to_ids gives it: the vocabulary's
    (added tokens included), else the unknown token's; remembers which names were unknown."""

    def __init__(self, tok: Tokenizer, specials: SpecialTokens) -> None:
        self.tok, self.specials = tok, specials
        self.unknown: dict[str, list[str]] = {}  # what ("query prefix", ...) -> names

    def __call__(self, token: str | None, what: str) -> int | None:
        if token is None:
            return None
        found = self.tok.token_to_id(token)
        if found is not None:
            return found
        unk = self.specials.ids.get("unk")
        if unk is None:
            raise LateInteractionError(
                f"{what} {token!r} is not in the tokenizer's vocabulary, and it has no unknown "
                "token to stand for it (as the library would)"
            )
        self.unknown.setdefault(what, []).append(token)
        return unk

    def notes(self, source: str) -> list[str]:
        unk = f"{self.specials.tokens.get('unk')} ({self.specials.ids.get('unk')})"
        return [
            f"{what} {' '.join(map(repr, names))} not in the vocabulary: {unk} stands for "
            f"{'it' if len(names) == 1 else 'them'}, as {source} looks names up"
            for what, names in self.unknown.items()
        ]


def skiplist_ids(folder: LateInteractionFolder, tok: Tokenizer, lookup: Lookup) -> list[int]:
    """The ids whose vectors documents leave out, sorted: PyLate's words looked up by name,
    colbert-ai's symbols as the first token each encodes to (on its own: no padding)."""
    if folder.source == "pylate":
        ids = {lookup(word, "skiplist words") for word in folder.skiplist}
        return sorted(i for i in ids if i is not None)
    plain = Tokenizer.from_str(tok.to_str())
    plain.no_padding()
    plain.no_truncation()
    pieces = [plain.encode(symbol, add_special_tokens=False).ids for symbol in folder.skiplist]
    # colbert-ai indexes [0]: a symbol the normaliser drops would fail there; here it adds none
    return sorted({p[0] for p in pieces if p})


def _check_rows(folder: LateInteractionFolder, tok: Tokenizer) -> None:
    """Both libraries put the marker right after the row's first token (`[CLS]`) and count
    it in the lengths: a row needs a first special token and room for a text token."""
    single = template(prepare_tokenizer(Tokenizer.from_str(tok.to_str()))).single
    marked = folder.query_prefix is not None or folder.document_prefix is not None
    if marked and not single.prefix:
        raise LateInteractionError(
            "the tokenizer's rows start with no special token, after which PyLate and "
            "colbert-ai put their marker ([CLS] [Q] ...)"
        )
    for what, length, prefix in (
        ("query_length", folder.query_length, folder.query_prefix),
        ("document_length", folder.document_length, folder.document_prefix),
    ):
        room = length - single.n_special - (prefix is not None)
        if room < 1:
            raise LateInteractionError(
                f"{what} {length} leaves no room for text after the row's {single.n_special} "
                f"special token(s){' and the marker' if prefix is not None else ''}"
            )
