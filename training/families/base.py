"""What a checkpoint family is: the one record each family module declares.

A family module (training/families/<name>.py) holds everything that tells its checkpoints apart
from BERT's: config.json's names and defaults, the options it sets on the one encoder (or the
encoder pieces of its own), the weight layout both ways, which sequence-classification head it
puts on top, and whether its pretraining head is implemented. `training.families` lists the
modules and checks each record at import, so a missing piece fails there with a message.

This module and the family modules import neither training.config nor training.model (those
import the families): a config reaches them as any object with BertConfig's attribute names.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

# The tasks whose heads every family has (config.json architectures name them), and the ones
# that only some have: BERT's NSP and ALBERT's SOP head; the masked-LM head (every family but
# ELECTRA, whose discriminator predicts replaced tokens, not masked ones).
HEAD_TASKS = ("classification", "token-classification", "question-answering", "embedding")
PRETRAINING = "pretraining"
FILL_MASK = "fill-mask"

# What a sequence classifier puts between the encoder and the labels (training.model builds it):
# "pooler": BERT's tanh pooler on the first token, then a linear layer; "pre_classifier":
# DistilBERT's linear + ReLU, then a linear layer; "tanh" / "gelu": RoBERTa's / ELECTRA's
# dense -> activation -> out_proj head on the first token; "context_pooler": the family's
# `pooler` module (DeBERTa's dense + activation on the first token), then a linear layer;
# "head": the family's `head` module on the pooled states (classifier_pooling), then a linear
# layer (ModernBERT, whose token and QA heads put the same `head` before their linear layer).
CLASSIFIERS = ("pooler", "pre_classifier", "tanh", "gelu", "context_pooler", "head")
# Whether a family's encoder has token-type (segment) embeddings.
TOKEN_TYPES = ("always", "never", "optional")

# BertConfig options a family may set; each family names those it accepts (`options`).
OPTIONS = ("embedding_size", "share_layers", "sinusoidal_pos_embds")


class ConfigError(ValueError):
    """A config.json that cannot describe one of our encoders."""


def rename_by_prefix(table: tuple[tuple[str, str], ...]) -> Callable[[str], str]:
    """A renamer: the first (most specific) prefix of `table` that `name` starts with is
    replaced; a name that matches none comes back unchanged."""

    def rename(name: str) -> str:
        for old, new in table:
            if name.startswith(old):
                return new + name[len(old) :]
        return name

    return rename


_OUR_LAYER = re.compile(r"bert\.encoder\.layer\.(\d+)\.(.+)\.(weight|bias)")


def layer_renames(
    theirs: str, in_layer: Mapping[str, str]
) -> tuple[Callable[[str], str | None], Callable[[str], str | None]]:
    """Renames of the weights inside one layer, both ways: ours
    `bert.encoder.layer.{i}.<module>.<weight|bias>` <-> `theirs.format(i=i)` + their module, by
    `in_layer` (our module path -> theirs). Each gives None for a name outside any layer (for
    the family's prefix renames); a layer's module missing from the table keeps its name."""
    ours_of = {v: k for k, v in in_layer.items()}
    their_layer = re.compile(
        re.escape(theirs).replace(re.escape("{i}"), r"(\d+)") + r"(.+)\.(weight|bias)"
    )

    def to_hf(name: str) -> str | None:
        if (m := _OUR_LAYER.fullmatch(name)) and m[2] in in_layer:
            return f"{theirs.format(i=m[1])}{in_layer[m[2]]}.{m[3]}"
        return None

    def from_hf(name: str) -> str | None:
        if m := their_layer.fullmatch(name):
            ours = ours_of.get(m[2])
            return f"bert.encoder.layer.{m[1]}.{ours}.{m[3]}" if ours else name
        return None

    return to_hf, from_hf


def same(name: str) -> str:
    return name


def architectures(
    class_prefix: str, pretraining: bool = False, masked_lm: bool = True
) -> dict[str, str]:
    """task -> the transformers class a checkpoint of the family is saved as."""
    names = {
        "classification": f"{class_prefix}ForSequenceClassification",
        "token-classification": f"{class_prefix}ForTokenClassification",
        "question-answering": f"{class_prefix}ForQuestionAnswering",
        "embedding": f"{class_prefix}Model",
    }
    if masked_lm:
        names[FILL_MASK] = f"{class_prefix}ForMaskedLM"
    return ({PRETRAINING: f"{class_prefix}ForPreTraining"} if pretraining else {}) | names


def _no_fields(d: dict[str, Any]) -> dict[str, Any]:
    return d


# Our names of BERT's masked-LM head (`cls.predictions`: transform, tied decoder, bias), which
# BERT and ALBERT use and whose renames check_family tries.
BERT_MASKED_LM_NAMES = (
    "cls.predictions.transform.dense.weight",
    "cls.predictions.transform.LayerNorm.bias",
    "cls.predictions.bias",
)


@dataclass(frozen=True)
class Family:
    model_type: str  # config.json's model_type
    name: str  # as people write it: "RoBERTa"
    prefix: str  # the encoder's module name in transformers' heads: "roberta."
    architectures: dict[str, str]  # task -> the transformers class saved as (config.json)
    to_hf: Callable[[str], str]  # our parameter name -> the family's
    from_hf: Callable[[str], str]  # the family's (prefixed or bare) -> ours; unknown unchanged
    classifier: str  # one of CLASSIFIERS
    # Another class of the family that config.json may name, read as task "pretraining" rather
    # than as its own task (bert-base-uncased says BertForMaskedLM, yet its file has the NSP
    # head too).
    also_pretraining: str | None = None
    # config.json fields transformers' config class defaults when the file leaves them out.
    defaults: Mapping[str, Any] = field(default_factory=dict)
    # config.json (defaults filled in) -> BertConfig's field names, where the family's differ.
    read_fields: Callable[[dict[str, Any]], dict[str, Any]] = _no_fields
    # BertConfig.to_dict's output -> the family's config.json names and fields.
    write_fields: Callable[[dict[str, Any]], dict[str, Any]] = _no_fields
    # A config's field changes that make it what its values say it is (a BERT config given an
    # embedding_size is ALBERT's; ELECTRA with E = H has no projection); {} when none.
    settle: Callable[[Any], dict[str, Any]] = lambda config: {}
    # Checks of a config beyond the shared ones (raise ConfigError).
    check: Callable[[Any], None] = lambda config: None
    options: frozenset[str] = frozenset()  # of OPTIONS, those the family may set
    # RoBERTa's position ids: real tokens count from pad_token_id + 1, padding keeps pad.
    positions_after_pad: bool = False
    has_pooler: bool = True  # the encoder has BERT's pooler (trained by NSP / SOP)
    token_types: str = "always"  # of TOKEN_TYPES; "never": type_vocab_size is 0
    # config.json fields of the family beyond BertConfig's, with transformers' defaults: they
    # travel in BertConfig.extra and read as attributes (config.position_buckets).
    fields: Mapping[str, Any] = field(default_factory=dict)
    # Modules of the family's own (torch nn.Module classes, each built from a config), for the
    # families that are not BERT's encoder with options: the encoder (its forward(input_ids,
    # attention_mask, token_type_ids) gives the L + 1 hidden states, embeddings first), the
    # "context_pooler" and the "head" of `classifier`.
    qa_outputs: str = "qa_outputs"  # transformers' name of the QA head's linear layer
    encoder: type[Any] | None = None  # a class: training.model subclasses it
    pooler: Callable[[Any], Any] | None = None
    head: Callable[[Any], Any] | None = None
    # The masked-LM head (task "fill-mask"), where it is not BERT's: a module built from
    # (config, the encoder's word-embedding nn.Embedding, which its decoder shares), held as
    # `cls` after the family's `head` if it has one (ModernBERT's head -> decoder), its
    # parameters named as transformers' under the family's renames; and some of our names of
    # its weights, which the renames must bring back (check_family).
    masked_lm: Callable[[Any, Any], Any] | None = None
    masked_lm_names: tuple[str, ...] = BERT_MASKED_LM_NAMES

    @property
    def pretraining(self) -> bool:
        """The NSP / SOP pretraining head is implemented for this family."""
        return PRETRAINING in self.architectures

    @property
    def fill_mask(self) -> bool:
        """The family has a masked-LM head (config.json's *ForMaskedLM loads as fill-mask)."""
        return FILL_MASK in self.architectures


# Parameter names of every head, in our layout: a family's renames must bring each back.
_OUR_NAMES = (
    "bert.embeddings.word_embeddings.weight",
    "bert.embeddings.LayerNorm.bias",
    "bert.encoder.layer.0.attention.self.query.weight",
    "bert.encoder.layer.1.attention.output.LayerNorm.weight",
    "bert.encoder.layer.0.intermediate.dense.bias",
    "bert.encoder.layer.0.output.dense.weight",
    "classifier.weight",
    "qa_outputs.bias",
)
_PRETRAINING_NAMES = (
    "bert.pooler.dense.weight",
    "cls.predictions.transform.dense.weight",
    "cls.predictions.bias",
    "cls.seq_relationship.weight",
)


def check_family(family: Family) -> None:
    """Raise ValueError naming what `family` lacks: a head's architecture, a classifier this
    code does not build, an option it does not know, a parameter name that does not come back
    through both renames."""
    where = f"family {family.model_type!r}"
    if missing := [t for t in HEAD_TASKS if t not in family.architectures]:
        raise ValueError(f"{where}: no architecture for {', '.join(missing)}")
    if family.classifier not in CLASSIFIERS:
        raise ValueError(f"{where}: classifier {family.classifier!r} is not one of {CLASSIFIERS}")
    if family.token_types not in TOKEN_TYPES:
        raise ValueError(f"{where}: token_types {family.token_types!r} is not one of {TOKEN_TYPES}")
    for kind, module in (("context_pooler", family.pooler), ("head", family.head)):
        if (family.classifier == kind) != (module is not None):
            raise ValueError(
                f"{where}: classifier {family.classifier!r} with pooler/head set "
                "for the other kind: a 'context_pooler' needs `pooler`, a 'head' `head`"
            )
    if family.masked_lm is not None and not family.fill_mask:
        raise ValueError(f"{where}: a masked_lm module but no {FILL_MASK} architecture")
    if unknown := set(family.options) - set(OPTIONS):
        raise ValueError(f"{where}: unknown options {sorted(unknown)}")
    if not family.prefix.endswith("."):
        raise ValueError(f"{where}: prefix {family.prefix!r} must end with '.'")
    names = _OUR_NAMES + (_PRETRAINING_NAMES if family.pretraining else ())
    names += family.masked_lm_names if family.fill_mask else ()
    for name in names:
        theirs = family.to_hf(name)
        if family.from_hf(theirs) != name:
            raise ValueError(
                f"{where}: {name} -> {theirs} -> {family.from_hf(theirs)}: the renames disagree"
            )
