"""ALBERT (Lan et al. 2019): BERT's encoder with two options, `embedding_size` E (embeddings of
width E, then one E -> H projection) and `share_layers` (one layer's weights applied
num_hidden_layers times), and the sentence-order-prediction pretraining head.

ALBERT's layer is BERT's post-LayerNorm layer under other names (AlbertLayer puts query, key,
value, the attention output and its LayerNorm directly under `attention`; the feed-forward
is `ffn` / `ffn_output` / `full_layer_layer_norm`), layers sit in `albert_layer_groups`, and
the MLM head projects to the embedding width E before the tied decoder:

    albert.encoder.albert_layer_groups.{i}.albert_layers.0.ffn.weight
        <-> bert.encoder.layer.{i}.intermediate.dense.weight
    albert.encoder.embedding_hidden_mapping_in.*  <-> bert.encoder.embedding_hidden_mapping_in.*
    albert.pooler.*                               <-> bert.pooler.dense.*
    predictions.dense / LayerNorm / bias          <-> cls.predictions.transform.dense / ... / bias
    sop_classifier.classifier.*                   <-> cls.seq_relationship.*

Group i is our layer i: one group when the layers are shared, one per layer when they are not
(the only two layouts the config accepts). Heads (classifier, qa_outputs) keep their names.
"""

from __future__ import annotations

from typing import Any

from training.families.base import (
    ConfigError,
    Family,
    architectures,
    layer_renames,
    rename_by_prefix,
)

# ALBERT's recipe on top of a shape (Lan et al. 2019 §3.1, §4.9; google-research/albert's
# albert_base v2 config): E = 128, every layer shared, no dropout, and the tanh-approximated
# GELU of ALBERT's modeling.py (transformers' "gelu_new"). The albert-* presets use it.
RECIPE = dict(
    embedding_size=128,
    share_layers=True,
    hidden_act="gelu_new",
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
)

# Inside one layer: our module path -> ALBERT's.
IN_LAYER = {
    "attention.self.query": "attention.query",
    "attention.self.key": "attention.key",
    "attention.self.value": "attention.value",
    "attention.output.dense": "attention.dense",
    "attention.output.LayerNorm": "attention.LayerNorm",
    "intermediate.dense": "ffn",
    "output.dense": "ffn_output",
    "output.LayerNorm": "full_layer_layer_norm",
}
_to_layer, _from_layer = layer_renames(
    "albert.encoder.albert_layer_groups.{i}.albert_layers.0.", IN_LAYER
)
# Outside the layers, by prefix, most specific first.
_to_rest = rename_by_prefix(
    (
        ("bert.pooler.dense.", "albert.pooler."),
        ("bert.", "albert."),
        ("cls.predictions.transform.", "predictions."),
        ("cls.predictions.", "predictions."),
        ("cls.seq_relationship.", "sop_classifier.classifier."),
    )
)
_from_rest = rename_by_prefix(
    (
        ("albert.pooler.", "bert.pooler.dense."),
        ("albert.", "bert."),
        ("predictions.dense.", "cls.predictions.transform.dense."),
        ("predictions.LayerNorm.", "cls.predictions.transform.LayerNorm."),
        ("predictions.", "cls.predictions."),  # bias; decoder.weight / .bias, tied (dropped later)
        ("sop_classifier.classifier.", "cls.seq_relationship."),
    )
)
_BARE = ("embeddings.", "encoder.", "pooler.")  # an AlbertModel saved without the prefix


def to_albert(name: str) -> str:
    """Our parameter name -> transformers' ALBERT name (with the `albert.` prefix)."""
    return _to_layer(name) or _to_rest(name)


def from_albert(name: str) -> str:
    """transformers' ALBERT name (prefixed or bare) -> ours in BERT file terms (`bert.`...).
    A name we do not know comes back unchanged, for the caller to report as unexpected."""
    if name.startswith(_BARE):
        name = "albert." + name
    return _from_layer(name) or _from_rest(name)


def _read_fields(d: dict[str, Any]) -> dict[str, Any]:
    """embedding_size and share_layers from an AlbertConfig dict (its defaults where absent).
    ALBERT groups layers: num_hidden_groups groups of inner_group_num layers each, the
    groups' weights applied in turn. We implement the two layouts ALBERT's paper trains: one
    group (every layer shared) or one group per layer (none shared)."""
    layers = d.get("num_hidden_layers", 12)
    groups, inner = d.get("num_hidden_groups", 1), d.get("inner_group_num", 1)
    if inner != 1 or groups not in (1, layers):
        raise ConfigError(
            f"ALBERT with num_hidden_groups {groups} and inner_group_num {inner} is not "
            f"supported: one group (all layers shared) or {layers} (none), of one layer each"
        )
    return d | {
        "embedding_size": d.get("embedding_size", 128),
        "share_layers": groups == 1,
        "hidden_act": d.get("hidden_act", "gelu_new"),
    }


def _write_fields(d: dict[str, Any]) -> dict[str, Any]:
    # AlbertConfig's terms: groups of layers sharing weights
    groups = 1 if d["share_layers"] else d["num_hidden_layers"]
    d = {k: v for k, v in d.items() if k != "share_layers"}
    return d | {"num_hidden_groups": groups, "inner_group_num": 1}


FAMILY = Family(
    model_type="albert",
    name="ALBERT",
    prefix="albert.",
    architectures=architectures("Albert", pretraining=True),
    to_hf=to_albert,
    from_hf=from_albert,
    classifier="pooler",
    also_pretraining="AlbertForMaskedLM",  # no SOP head: it is initialised fresh
    read_fields=_read_fields,
    write_fields=_write_fields,
    # An ALBERT config without an embedding_size is plain BERT's (no projection).
    settle=lambda config: {"model_type": "bert"} if config.embedding_size is None else {},
    options=frozenset({"embedding_size", "share_layers"}),
)
