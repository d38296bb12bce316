"""DistilBERT (Sanh et al. 2019): BERT's encoder without token-type embeddings, optionally with
a fixed sinusoidal position table, no pooler, and a pre_classifier (linear + ReLU) before its
classifier. Its config.json and parameters use names of their own:

    distilbert.transformer.layer.{i}.attention.q_lin.*  <-> bert.encoder.layer.{i}.attention.self.query.*
    distilbert.embeddings.*                             <-> bert.embeddings.*
    vocab_transform.* / vocab_layer_norm.* / vocab_projector.*  <-> cls.vocab_...  (masked LM)
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from training.blocks import activation
from training.families.base import (
    ConfigError,
    Family,
    architectures,
    layer_renames,
    rename_by_prefix,
)

# DistilBertConfig's names for BertConfig's fields; it has no token types and a fixed eps.
NAMES = {
    "hidden_size": "dim",
    "num_hidden_layers": "n_layers",
    "num_attention_heads": "n_heads",
    "intermediate_size": "hidden_dim",
    "hidden_act": "activation",
    "hidden_dropout_prob": "dropout",
    "attention_probs_dropout_prob": "attention_dropout",
}
LAYER_NORM_EPS = 1e-12  # hard-coded in modeling_distilbert's LayerNorms
_DEFAULTS = {"dim": 768, "n_layers": 6, "n_heads": 12, "hidden_dim": 3072,
             "activation": "gelu", "dropout": 0.1, "attention_dropout": 0.1}  # fmt: skip

# Inside one layer: our module path -> DistilBERT's (TransformerBlock).
IN_LAYER = {
    "attention.self.query": "attention.q_lin",
    "attention.self.key": "attention.k_lin",
    "attention.self.value": "attention.v_lin",
    "attention.output.dense": "attention.out_lin",
    "attention.output.LayerNorm": "sa_layer_norm",
    "intermediate.dense": "ffn.lin1",
    "output.dense": "ffn.lin2",
    "output.LayerNorm": "output_layer_norm",
}
_to_layer, _from_layer = layer_renames("distilbert.transformer.layer.{i}.", IN_LAYER)
_to_rest = rename_by_prefix((("bert.", "distilbert."), ("cls.vocab_", "vocab_")))
# DistilBertForMaskedLM's vocab_transform, vocab_layer_norm, vocab_projector: our `cls` module
# (fill-mask), dropped with checkpoint.py's note by the other heads.
_from_rest = rename_by_prefix((("distilbert.", "bert."), ("vocab_", "cls.vocab_")))


def _to_hf(name: str) -> str:
    return _to_layer(name) or _to_rest(name)


def _from_hf(name: str) -> str:
    if name.startswith(("embeddings.", "transformer.")):  # a bare DistilBertModel
        name = "distilbert." + name
    return _from_layer(name) or _from_rest(name)


class DistilBertMaskedLMHead(nn.Module):
    """DistilBertForMaskedLM's head: vocab_transform (H -> H), the config's activation,
    vocab_layer_norm, then vocab_projector (H -> V, its own bias) whose weight is the word
    embedding matrix (tied: the same Parameter)."""

    def __init__(self, config: Any, word_embeddings: nn.Embedding) -> None:
        super().__init__()
        H = config.hidden_size
        self.vocab_transform = nn.Linear(H, H)
        self.act = activation(config.hidden_act)
        self.vocab_layer_norm = nn.LayerNorm(H, eps=LAYER_NORM_EPS)
        self.vocab_projector = nn.Linear(H, config.vocab_size)
        self.vocab_projector.weight = word_embeddings.weight

    def forward(self, hidden: Tensor) -> Tensor:
        """hidden (B, T, H) -> logits (B, T, V)."""
        return self.vocab_projector(self.vocab_layer_norm(self.act(self.vocab_transform(hidden))))


def _read_fields(d: dict[str, Any]) -> dict[str, Any]:
    """A DistilBertConfig dict in BertConfig's names (its defaults where absent)."""
    out = {k: v for k, v in d.items() if k not in NAMES}  # its attribute_map aliases
    for ours, theirs in NAMES.items():
        out[ours] = d.get(theirs, _DEFAULTS[theirs])
    return out | {"type_vocab_size": 0, "layer_norm_eps": LAYER_NORM_EPS}


def _write_fields(d: dict[str, Any]) -> dict[str, Any]:
    d = {k: v for k, v in d.items() if k not in ("type_vocab_size", "layer_norm_eps")}
    return {NAMES.get(k, k): v for k, v in d.items()}


def _check(config: Any) -> None:
    if config.layer_norm_eps != LAYER_NORM_EPS:
        raise ConfigError(f"DistilBERT's layer_norm_eps is fixed at {LAYER_NORM_EPS}")


FAMILY = Family(
    model_type="distilbert",
    name="DistilBERT",
    prefix="distilbert.",
    architectures=architectures("DistilBert"),
    to_hf=_to_hf,
    from_hf=_from_hf,
    classifier="pre_classifier",
    read_fields=_read_fields,
    write_fields=_write_fields,
    check=_check,
    options=frozenset({"sinusoidal_pos_embds"}),
    has_pooler=False,
    token_types="never",
    masked_lm=DistilBertMaskedLMHead,
    masked_lm_names=(
        "cls.vocab_transform.weight",
        "cls.vocab_layer_norm.bias",
        "cls.vocab_projector.bias",
    ),
)
