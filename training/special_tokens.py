"""A checkpoint's special tokens and their ids, read from what its files declare.

    >>> found = special_tokens("all-mpnet-base-v2/", load_tokenizer("all-mpnet-base-v2/"))
    >>> found.ids["pad"], found.tokens["pad"], found.sources["pad"]
    (1, '<pad>', 'tokenizer.json padding')
    >>> found.notes   # one line for each role where the files disagree

Why: a name is a guess. all-mpnet-base-v2's vocabulary holds `<s> <pad> </s> <unk>` at ids 0-3
and BERT's vocabulary after them, `[PAD]` at 4 included; the model pads with 1, and its position
ids count from the pad id, so padding with 4 changes every embedding.

For each role (pad, cls, sep, mask, unk, bos, eos) the first of these that names a token the
tokenizer has wins, in this order of authority:
1. tokenizer.json: its padding block (pad), its post-processor's template (cls: the row's first
   token, sep: its last), its model's unknown token (unk);
2. special_tokens_map.json, then tokenizer_config.json (`<role>_token`, a string or an
   AddedToken dict), what transformers' tokenizer classes read;
3. config.json's `<role>_token_id` (pad_token_id, bos_token_id, eos_token_id; ModernBERT also
   cls_token_id, sep_token_id);
4. the usual names ([PAD] / <pad>, [CLS] / <s>, ...; RoBERTa's first when the rows start
   with <s>), the last resort.
A later file that names another id is reported in `notes`, one line a role, saying which won.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from heads.rows import prepare_tokenizer, template

ROLES = ("pad", "cls", "sep", "mask", "unk", "bos", "eos")
NAMES: dict[str, tuple[str, ...]] = {  # the last resort, BERT's names before RoBERTa's
    "pad": ("[PAD]", "<pad>"),
    "cls": ("[CLS]", "<s>"),
    "sep": ("[SEP]", "</s>"),
    "mask": ("[MASK]", "<mask>"),
    "unk": ("[UNK]", "<unk>"),
    "bos": (),
    "eos": (),
}


@dataclass(frozen=True)
class SpecialTokens:
    """role -> token text, id, and the source that said so; roles nothing names are absent.
    notes: one line per role whose sources disagree, naming the one that won."""

    tokens: dict[str, str] = field(default_factory=dict)
    ids: dict[str, int] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def record(self) -> dict[str, Any]:
        """What package.json keeps: role -> {token, id, source}, and the notes."""
        found = {
            role: {"token": self.tokens[role], "id": self.ids[role], "source": self.sources[role]}
            for role in ROLES
            if role in self.ids
        }
        return {**found, **({"notes": self.notes} if self.notes else {})}


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}  # the loaders that need the file say what is wrong with it
    return found if isinstance(found, dict) else {}


def _token_text(value: Any) -> str | None:
    """A `<role>_token` value: a string, or an AddedToken dict with its "content"."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _candidates(folder: Path | None, tokenizer: Tokenizer) -> dict[str, list[tuple[str, Any]]]:
    """role -> [(source, token text or id)], in order of authority (names excluded)."""
    found: dict[str, list[tuple[str, Any]]] = {role: [] for role in ROLES}
    raw = _read_json(folder / "tokenizer.json") if folder else {}
    padding = raw.get("padding") if raw else tokenizer.padding
    if isinstance(padding, dict) and isinstance(padding.get("pad_id"), int):
        found["pad"].append(("tokenizer.json padding", padding["pad_id"]))
    if tokenizer.post_processor is not None:
        plain = tokenizer
        if tokenizer.padding is not None or tokenizer.truncation is not None:
            plain = prepare_tokenizer(Tokenizer.from_str(tokenizer.to_str()))
        try:
            single = template(plain).single
        except ValueError:
            single = None  # a post-processor that is no row layout: the loaders refuse it
        if single is not None and len(single.prefix):
            found["cls"].append(("tokenizer.json post-processor", int(single.prefix[0])))
        if single is not None and len(single.suffix):
            found["sep"].append(("tokenizer.json post-processor", int(single.suffix[-1])))
    unk = getattr(tokenizer.model, "unk_token", None)
    if isinstance(unk, str):
        found["unk"].append(("tokenizer.json model", unk))
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        declared = _read_json(folder / name) if folder else {}
        for role in ROLES:
            text = _token_text(declared.get(f"{role}_token"))
            if text is not None:
                found[role].append((name, text))
    config = _read_json(folder / "config.json") if folder else {}
    for role in ROLES:
        value = config.get(f"{role}_token_id")
        if isinstance(value, int) and not isinstance(value, bool):
            found[role].append(("config.json", value))
    return found


def special_tokens(folder: str | Path | None, tokenizer: Tokenizer) -> SpecialTokens:
    """The special tokens `folder`'s files declare for `tokenizer` (the one loaded from that
    folder, or a file in it). Without a folder: what the tokenizer itself declares (its
    post-processor, its padding if still on), then names."""
    folder = Path(folder) if folder is not None else None
    if folder is not None and folder.is_file():
        folder = folder.parent
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    result = SpecialTokens()
    found = _candidates(folder, tokenizer)
    # The names follow the row template's family: a tokenizer whose rows start with <s>
    # (RoBERTa's, MPNet's: whose vocabulary holds BERT's [MASK] too) tries <mask> first.
    cls_ids = [v for _, v in found["cls"] if isinstance(v, int)]
    angled = bool(cls_ids) and tokenizer.id_to_token(cls_ids[0]) == "<s>"
    for role, said in found.items():
        names = NAMES[role][::-1] if angled else NAMES[role]
        said = said + [("name", name) for name in names]
        resolved: list[tuple[str, str, int]] = []  # (source, token, id), the usable ones
        for source, value in said:
            if isinstance(value, int):
                text = tokenizer.id_to_token(value) if 0 <= value < size else None
                if text is None:
                    continue  # an id the tokenizer does not have (a stale config.json)
                resolved.append((source, text, value))
            elif (i := tokenizer.token_to_id(value)) is not None:
                resolved.append((source, value, i))
        if not resolved:
            continue
        source, text, i = resolved[0]
        result.tokens[role], result.ids[role], result.sources[role] = text, i, source
        others = [f"{s} says {t} ({j})" for s, t, j in resolved[1:] if s != "name" and j != i]
        if others:
            result.notes.append(
                f"{role}: {source} says {text} ({i}); " + "; ".join(others) + f"; using {source}'s"
            )
    return result
