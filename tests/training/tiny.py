"""A tiny vocabulary and encoder for the fine-tuning tests that do not need ../shared.

Every lower-case word tokenizes (single letters and their `##` continuations are in the
vocabulary), so any English test sentence works; a few whole words make some multi-piece
and some single-piece words.
"""

from __future__ import annotations

import string
from pathlib import Path

import torch
from tokenizers import Tokenizer

from training.checkpoint import save_model
from training.config import BertConfig
from training.model import BertForEmbedding
from training.tokenizer import load_tokenizer

WORDS = [
    "the",
    "a",
    "an",
    "is",
    "was",
    "good",
    "bad",
    "film",
    "movie",
    "great",
    "awful",
    "paris",
    "france",
    "who",
    "where",
    "what",
    "john",
    "smith",
    "lives",
    "in",
]
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def tiny_tokenizer(directory: Path) -> Tokenizer:
    letters = list(string.ascii_lowercase + string.digits)
    vocab = SPECIALS + letters + [f"##{c}" for c in letters] + list(string.punctuation) + WORDS
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "vocab.txt").write_text("\n".join(dict.fromkeys(vocab)) + "\n")
    return load_tokenizer(directory / "vocab.txt", lowercase=True)


def tiny_bert_config(vocab_size: int) -> BertConfig:
    # hidden 32, 2 layers, 4 heads, FFN 37: the shape transformers' own BERT tests use
    return BertConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=128,
    )


def tiny_init(directory: Path, tokenizer: Tokenizer, seed: int = 0) -> Path:
    """An encoder checkpoint (sentence-transformers layout, mean pooling) to fine-tune from."""
    torch.manual_seed(seed)
    model = BertForEmbedding(tiny_bert_config(tokenizer.get_vocab_size(with_added_tokens=True)))
    return save_model(model, directory, tokenizer)
