"""Fixtures for the training tests: transformers' tiny test config, a padded batch, real texts
from ../shared/data, and a `parity` recorder whose figures are listed at the end of the run."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

from training.config import BertConfig

# transformers' own BertModelTester shape: hidden 32, 2 layers, vocab 99, 4 heads, FFN 37.
TINY = dict(
    vocab_size=99,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=37,
    max_position_embeddings=64,
)

PARITY: dict[str, float] = {}


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Test models are small: intra-op threads buy nothing, and on a busy runner (load above
    the core count) OpenMP barriers made each op cost ~10 ms, a MiniLM forward 7x slower."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def parity():
    """record(name, a, b) -> max |a - b|, kept for the summary at the end of the run."""

    def record(name: str, a: torch.Tensor, b: torch.Tensor) -> float:
        diff = (a.detach().float() - b.detach().float()).abs().max().item()
        PARITY[name] = max(diff, PARITY.get(name, 0.0))
        return diff

    return record


def pytest_terminal_summary(terminalreporter) -> None:
    if PARITY:
        terminalreporter.section("parity: max abs diff")
        for name, diff in PARITY.items():
            terminalreporter.write_line(f"{diff:10.3e}  {name}")


@pytest.fixture
def tiny_config() -> BertConfig:
    return BertConfig(**TINY)


@pytest.fixture
def batch() -> dict[str, torch.Tensor]:
    """Three sequences of 10, 7 and 4 real tokens, right-padded with [PAD] = 0; segment B
    from position 5 on."""
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([10, 7, 4])
    attention_mask = (torch.arange(10)[None, :] < lengths[:, None]).long()  # (3, 10)
    input_ids = torch.randint(5, TINY["vocab_size"], (3, 10), generator=g) * attention_mask
    token_type_ids = (torch.arange(10)[None, :] >= 5).long() * attention_mask
    return dict(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)


# --- real texts (../shared/data) --------------------------------------------------------


def sst2_sentences(shared: Path, split: str = "dev") -> list[str]:
    with open(shared / "sst2" / f"{split}.tsv", encoding="utf-8") as f:
        return [
            row["sentence"] for row in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        ]


def squad_pairs(shared: Path) -> list[tuple[str, str]]:
    """(question, context) from the SQuAD v1.1 dev set."""
    data = json.loads((shared / "squad" / "dev-v1.1.json").read_text(encoding="utf-8"))
    return [
        (qa["question"], paragraph["context"])
        for article in data["data"]
        for paragraph in article["paragraphs"]
        for qa in paragraph["qas"]
    ]


def conll_sentences(shared: Path) -> list[str]:
    """CoNLL-2003 dev sentences, words joined by spaces (cased)."""
    sentences, words = [], []
    for line in (
        (shared / "conll2003" / "iob2" / "eng.testa").read_text(encoding="utf-8").splitlines()
    ):
        if line.strip():
            words.append(line.split()[0])
        elif words:
            sentences.append(" ".join(words))
            words = []
    return sentences + ([" ".join(words)] if words else [])


def stsb_pairs(shared: Path) -> list[tuple[str, str]]:
    with open(shared / "stsb" / "dev.tsv", encoding="utf-8") as f:
        rows = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        return [(row["sentence1"], row["sentence2"]) for row in rows]


@pytest.fixture(scope="module")
def init(tmp_path_factory):
    """A tiny encoder on a tiny vocabulary (no ../shared needed), once per module."""
    from tests.training.tiny import tiny_init, tiny_tokenizer

    root = tmp_path_factory.mktemp("tiny")
    return tiny_init(root / "init", tiny_tokenizer(root / "vocab"))


@pytest.fixture(scope="module")
def sentiment(tmp_path_factory):
    """Sixteen two-word reviews, SST-2's layout, once per module."""
    rows = [("good film", 1), ("great movie", 1), ("bad film", 0), ("awful movie", 0)] * 4
    path = tmp_path_factory.mktemp("data") / "train.tsv"
    path.write_text("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in rows))
    return path
