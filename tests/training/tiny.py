"""A tiny encoder for the fine-tuning tests that do not need ../shared, on the one tiny
vocabulary of the tests (benchmarks.tiny.tiny_tokenizer: any English sentence tokenizes)."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer

from benchmarks.tiny import tiny_tokenizer
from training.checkpoint import save_model
from training.config import BertConfig
from training.model import BertForEmbedding


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


__all__ = ["tiny_bert_config", "tiny_init", "tiny_tokenizer"]
