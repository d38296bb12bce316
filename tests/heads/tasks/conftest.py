"""Fixtures for the task tests: tokenizers (a toy one, and the real bert-base vocabularies with
their transformers twins), tiny random-weight transformers models, and real text samples.

The parity tests run transformers' own pipelines on a tiny model and our pre/post steps on
the same model, so any difference is ours. torch and transformers are dev-only: those tests
skip on a service-only install.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import WordPiece

from heads.rows import InvalidInput, ModelRow, Outputs, prepare_tokenizer

NER_LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG", "B-MISC", "I-MISC"]

TOY_WORDS = [
    "the",
    "a",
    "cat",
    "dog",
    "sat",
    "on",
    "mat",
    "new",
    "york",
    "city",
    "is",
    "in",
    "state",
    "paris",
    "france",
    "ran",
    "fast",
]
TOY_PIECES = ["##s", "##ed", "##ing", "##er", *(f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz")]


def bert_tokenizer(vocab: dict[str, int] | str, lowercase: bool = True) -> Tokenizer:
    """A BERT WordPiece tokenizer built with the `tokenizers` library alone."""
    model = (
        WordPiece.from_file(vocab, unk_token="[UNK]")
        if isinstance(vocab, str)
        else WordPiece(vocab, unk_token="[UNK]")
    )
    tok = Tokenizer(model)
    tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.BertProcessing(("[SEP]", sep_id), ("[CLS]", cls_id))
    tok.decoder = decoders.WordPiece()
    return tok


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """Tiny models gain nothing from threads, and on a busy shared CPU threads that wait on
    each other make them ten times slower. Restored after each module."""
    try:
        import torch
    except ImportError:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def toy_tokenizer() -> Tokenizer:
    """Needs no shared data: specials, letters, a few words and `##` pieces."""
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ",", *"abcdefghijklmnopqrstuvwxyz"]
    tokens += TOY_WORDS + TOY_PIECES
    return bert_tokenizer({t: i for i, t in enumerate(dict.fromkeys(tokens))})


@pytest.fixture(scope="session")
def uncased_vocab(shared_data: Path) -> str:
    return str(shared_data / "vocab" / "bert-base-uncased" / "vocab.txt")


@pytest.fixture(scope="session")
def tok_uncased(uncased_vocab: str) -> Tokenizer:
    return bert_tokenizer(uncased_vocab, lowercase=True)


@pytest.fixture(scope="session")
def tok_cased(shared_data: Path) -> Tokenizer:
    return prepare_tokenizer(
        Tokenizer.from_file(str(shared_data / "vocab" / "bert-base-cased" / "tokenizer.json"))
    )


@pytest.fixture(scope="session")
def hf_uncased(uncased_vocab: str) -> Any:
    transformers = pytest.importorskip("transformers")
    return transformers.BertTokenizerFast(vocab_file=uncased_vocab, do_lower_case=True)


@pytest.fixture(scope="session")
def hf_cased(shared_data: Path) -> Any:
    transformers = pytest.importorskip("transformers")
    folder = shared_data / "vocab" / "bert-base-cased"
    return transformers.BertTokenizerFast(
        vocab_file=str(folder / "vocab.txt"),
        tokenizer_file=str(folder / "tokenizer.json"),
        do_lower_case=False,
    )


@pytest.fixture(scope="session")
def tiny_model() -> Callable[..., Any]:
    """tiny_model("BertForTokenClassification", vocab_size, seed=0, **config) -> eval model.

    Weights are drawn wider than BERT's 0.02 so that heads give spread-out logits: with nearly
    uniform scores, rounding alone would reorder near-ties and the comparison would test noise.
    """
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")

    def make(cls_name: str, vocab_size: int, seed: int = 0, **config: Any) -> Any:
        torch.manual_seed(seed)
        cfg = transformers.BertConfig(
            vocab_size=vocab_size,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=37,
            max_position_embeddings=512,
            initializer_range=0.3,
            **config,
        )
        return getattr(transformers, cls_name)(cfg).eval()

    return make


def forward(model: Any, seq: ModelRow) -> Outputs:
    """One unpadded row through a torch model, as the batcher hands rows back: batch axis gone."""
    import torch

    with torch.no_grad():
        out = model(
            input_ids=torch.from_numpy(seq.input_ids)[None],
            token_type_ids=torch.from_numpy(seq.token_type_ids)[None],
            attention_mask=torch.ones(1, len(seq), dtype=torch.long),
        )
    names = ("logits", "start_logits", "end_logits")
    return {k: out[k][0].numpy() for k in names if k in out}


def sst2_sentences(shared_data: Path, n: int) -> list[str]:
    with open(shared_data / "sst2" / "dev.tsv", encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [r["sentence"].strip() for r in rows[:n]]


def conll_sentences(shared_data: Path, n: int, min_words: int = 1) -> list[str]:
    """CoNLL-2003 dev sentences, words joined with spaces (cased, real entities)."""
    sentences, words = [], []
    for line in (
        (shared_data / "conll2003" / "iob2" / "eng.testa").read_text(encoding="utf-8").splitlines()
    ):
        if line.strip():
            words.append(line.split()[0])
        elif words:
            if len(words) >= min_words:
                sentences.append(" ".join(words))
            words = []
        if len(sentences) == n:
            break
    return sentences


def squad_pairs(shared_data: Path, n: int) -> list[tuple[str, str]]:
    """(question, context) pairs from SQuAD v1.1 dev, one question per paragraph."""
    data = json.loads((shared_data / "squad" / "dev-v1.1.json").read_text(encoding="utf-8"))
    pairs = []
    for article in data["data"]:
        for para in article["paragraphs"]:
            pairs.append((para["qas"][0]["question"], para["context"]))
            if len(pairs) == n:
                return pairs
    return pairs


# --- text the repository ships, for the fresh-clone twins of the tests above ----------------
# examples/data (made-up CoNLL and SQuAD files) and the demo heads' seeded generators
# (demo.data, demo.qa_data): real sentence shapes, many entities, paragraphs that span several
# windows, and no ../shared.


@pytest.fixture(scope="session")
def hf_repo() -> Any:
    """A cased WordPiece tokenizer trained on text the repository ships (tests/families.py),
    as transformers' BertTokenizerFast: the fresh-clone twin of `hf_cased`, with many words
    cut into `##` pieces."""
    pytest.importorskip("transformers")
    from tests.families import hf_tokenizer

    return hf_tokenizer("bert")


@pytest.fixture(scope="session")
def tok_repo(hf_repo: Any) -> Tokenizer:
    """The same tokenizer as `hf_repo`, as the service loads one."""
    return prepare_tokenizer(Tokenizer.from_str(hf_repo.backend_tokenizer.to_str()))


def repo_ner_sentences(n: int) -> list[str]:
    """The sentences of examples/data/ner, then the demo's generated NER sentences (seeded)."""
    import random

    from demo.data import ner_examples
    from tests.conftest import EXAMPLES

    sentences = []
    for path in sorted((EXAMPLES / "ner").glob("*.conll")):
        for block in path.read_text(encoding="utf-8").split("\n\n"):
            words = [line.split()[0] for line in block.splitlines() if line.strip()]
            if words:
                sentences.append(" ".join(words))
    rng = random.Random(0)
    sentences += [" ".join(e["tokens"]) for e in ner_examples(max(0, n - len(sentences)), rng)]
    return sentences[:n]


def repo_squad_pairs(n: int) -> list[tuple[str, str]]:
    """(question, context) pairs: every question of examples/data/qa, then the demo's
    generated paragraphs (4 to 7 sentences, several windows at 64 tokens), one question each."""
    import random

    from demo.qa_data import qa_examples
    from tests.conftest import EXAMPLES

    pairs = []
    for path in sorted((EXAMPLES / "qa").glob("*.json")):
        for article in json.loads(path.read_text(encoding="utf-8"))["data"]:
            for para in article["paragraphs"]:
                pairs += [(qa["question"], para["context"]) for qa in para["qas"]]
    generated = qa_examples(4 * max(0, n - len(pairs)), random.Random(0))  # ~3 per paragraph
    for article in generated["data"]:
        for para in article["paragraphs"]:
            pairs.append((para["qas"][0]["question"], para["context"]))
    return pairs[:n]


def ids_of(hf_encoding: Any) -> list[list[int]]:
    ids = hf_encoding["input_ids"]
    return ids if ids and isinstance(ids[0], list) else [ids]


def refused(message: str, error: type[Exception] = InvalidInput) -> Any:
    """pytest.raises(error) whose message is `message`, word for word."""
    return pytest.raises(error, match=f"^{re.escape(message)}$")


def hf_windows(hf: Any, question: str, context: str, max_length: int, stride: int) -> Any:
    """transformers' QA windows of a (question, context): the rows the pipeline runs."""
    return hf(
        question,
        context,
        truncation="only_second",
        max_length=max_length,
        stride=stride,
        return_overflowing_tokens=True,
    )


def as_lists(seqs: list[ModelRow]) -> list[list[int]]:
    return [np.asarray(s.input_ids).tolist() for s in seqs]
