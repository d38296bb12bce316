"""Published checkpoints' tokenizer and config files (tests/published/, issue 46), read by our
loaders as transformers reads them: the same ids for texts and pairs, the same special tokens,
nothing guessed by name where a file says otherwise. No model is needed here; the exported and
served answers are tests/service/test_published_http.py's.

The fixtures themselves are checked against what the published files hold: special tokens at
their published ids, the rows the published config.json has beyond its tokenizer (deberta-v3-base
99, the 30,500-token classifier 22, every other 0).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.published import make_fixtures
from tests.published.checkpoints import CHECKPOINTS, fixture, published_config
from training.special_tokens import special_tokens
from training.tokenizer import encode, load_tokenizer

transformers = pytest.importorskip("transformers")

ROLES = ("pad", "cls", "sep", "mask", "unk")
BERT = {"[PAD]": 0, "[UNK]": 100, "[CLS]": 101, "[SEP]": 102, "[MASK]": 103}
ROBERTA = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
MPNET = {**ROBERTA, **{token: i + 4 for token, i in BERT.items()}}  # [PAD] 4 ... [MASK] 107
# token -> id in the published tokenizer, where shrinking kept it ("last": the last id)
PUBLISHED_IDS: dict[str, dict[str, int | str]] = {
    "bert-base-uncased": BERT,
    "bert-base-cased": BERT,
    "bert-base-uncased-30500": BERT,
    "distilbert-base-uncased": BERT,
    "distilbert-base-uncased-finetuned-sst-2-english": BERT,
    "electra-base-discriminator": BERT,
    "roberta-base": {**ROBERTA, "<mask>": "last"},
    "xlm-roberta-base": {**ROBERTA, "<mask>": "last"},
    "camembert-base": {
        "<s>NOTUSED": 0,
        "<pad>": 1,
        "</s>NOTUSED": 2,
        "<unk>": 3,
        "<unk>NOTUSED": 4,
        "<s>": 5,
        "</s>": 6,
        "<mask>": "last",
    },  # fmt: skip
    "albert-base-v2": {"<pad>": 0, "<unk>": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4},
    "deberta-v3-base": {"[PAD]": 0, "[CLS]": 1, "[SEP]": 2, "[UNK]": 3, "[MASK]": "last"},
    "ModernBERT-base": {"|||IP_ADDRESS|||": 0, "<|padding|>": 1},
    "mpnet-base": {**MPNET, "<mask>": "last"},
    "all-mpnet-base-v2": {**MPNET, "<mask>": "last"},
}
TEXTS = [
    "Hello  world, café naïve!",
    " São Paulo 🙂 New-York's mayor (2024): 3.5%\tand tabs",
    "Control\x07 char, zero\u200bwidth, ﬁne ligature, 東京, Ελλάδα",
]


def hf_tokenizer(name: str):
    return transformers.AutoTokenizer.from_pretrained(fixture(name))


def with_specials(name: str) -> list[str]:
    """TEXTS and one with the checkpoint's own special tokens written out in it (after a space
    and glued to a word: lstrip), as a fill-mask user or a careless input writes them."""
    hf = hf_tokenizer(name)
    mask, sep = hf.mask_token, hf.sep_token
    return TEXTS + [f"The film was {mask} and{mask} good {sep} the end {hf.cls_token}"]


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_the_fixture_keeps_the_published_ids_and_vocabulary_size(name: str) -> None:
    hf = hf_tokenizer(name)
    size = len(hf)
    for token, want in PUBLISHED_IDS[name].items():
        assert hf.convert_tokens_to_ids(token) == (size - 1 if want == "last" else want), token
    config = published_config(name)
    assert config["vocab_size"] - size == make_fixtures.VOCAB_GAP.get(name, 0)
    if name == "ModernBERT-base":  # BERT's specials in a row, then unused rows to a multiple of 64
        ids = [hf.convert_tokens_to_ids(t) for t in make_fixtures.MODERNBERT_SPECIALS]
        assert ids == list(range(ids[0], ids[0] + 5))
        assert (config["cls_token_id"], config["sep_token_id"], config["pad_token_id"]) == (
            ids[1], ids[2], ids[3])  # fmt: skip
        assert size == config["vocab_size"] and size % 64 == 0


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_special_tokens_are_the_ones_transformers_uses(name: str) -> None:
    """pad, cls, sep, mask and unk as training.special_tokens reads them from the folder, and
    as transformers' tokenizer class of the same folder has them."""
    hf = hf_tokenizer(name)
    found = special_tokens(fixture(name), load_tokenizer(fixture(name)))
    ours = {role: (found.tokens.get(role), found.ids.get(role)) for role in ROLES}
    theirs = {
        role: (getattr(hf, f"{role}_token"), getattr(hf, f"{role}_token_id")) for role in ROLES
    }
    assert ours == theirs, found.sources


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_texts_and_pairs_tokenize_as_transformers(name: str) -> None:
    """Ids (and segment ids, where the model takes them) of single texts and pairs, character
    offsets of single texts: what every head's rows are built from."""
    hf = hf_tokenizer(name)
    ours = load_tokenizer(fixture(name))
    texts = with_specials(name)
    for text in texts:
        theirs = hf(text, return_offsets_mapping=True)
        mine = encode(ours, text)
        assert mine.input_ids == theirs["input_ids"], text
        assert mine.offsets == [tuple(o) for o in theirs["offset_mapping"]], text
    for a, b in zip(texts, texts[1:], strict=False):
        theirs, mine = hf(a, b), encode(ours, a, b)
        assert mine.input_ids == theirs["input_ids"], (a, b)
        if "token_type_ids" in theirs:
            assert mine.token_type_ids == theirs["token_type_ids"], (a, b)


SLOW_FILES = [n for n in CHECKPOINTS if (fixture(n) / "tokenizer.json").is_file()
              and ((fixture(n) / "vocab.txt").is_file() or (fixture(n) / "merges.txt").is_file())]  # fmt: skip


@pytest.mark.parametrize("name", SLOW_FILES)
def test_the_slow_files_alone_tokenize_as_transformers(tmp_path: Path, name: str) -> None:
    """The folder as an older save leaves it: the published vocab.txt (or vocab.json +
    merges.txt) and the small JSON files, no tokenizer.json; transformers builds its fast
    tokenizer from them with its class's defaults."""
    folder = tmp_path / name
    shutil.copytree(fixture(name), folder, ignore=shutil.ignore_patterns("tokenizer.json"))
    hf = transformers.AutoTokenizer.from_pretrained(folder)
    ours = load_tokenizer(folder)
    found = special_tokens(folder, ours)
    assert {role: found.ids.get(role) for role in ROLES} == {
        role: getattr(hf, f"{role}_token_id") for role in ROLES
    }, found.sources
    texts = with_specials(name)
    for a, b in [(t, None) for t in texts] + list(zip(texts, texts[1:], strict=False)):
        assert encode(ours, a, b).input_ids == hf(a, b)["input_ids"], (a, b)


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_config_json_is_the_published_one_but_for_sizes(name: str) -> None:
    """The committed config.json loads in transformers as the family's config, with the
    published special-token ids it declares still naming the tokens they name when published."""
    config = transformers.AutoConfig.from_pretrained(fixture(name))
    raw = json.loads((fixture(name) / "config.json").read_text())
    assert config.model_type == raw["model_type"]
    hf = hf_tokenizer(name)
    for field, role in (("pad_token_id", "pad"), ("cls_token_id", "cls"), ("sep_token_id", "sep")):
        if field in raw:
            assert raw[field] == getattr(hf, f"{role}_token_id"), field


@pytest.mark.slow
def test_make_fixtures_writes_what_is_committed() -> None:
    """The generator is deterministic and the committed files are its output (about 10 s)."""
    assert make_fixtures.main(["--check"]) == 0


def test_no_fixture_names_a_path_on_a_machine() -> None:
    # where this checkout, the user's home and temporary files live, as they are here
    above = Path(make_fixtures.HERE).resolve().parents[2]  # the folder holding the checkout
    places = {f"{above}/", f"{Path.home()}/", "/tmp/"}
    for path in Path(make_fixtures.HERE).rglob("*.json"):
        text = path.read_text(encoding="utf-8")
        assert not [p for p in places if p in text], path
