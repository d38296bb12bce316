"""Checkpoint families: one module each (its config names, encoder options or pieces, weight
layout both ways, classifier head, pretraining support), listed here and checked at import.

    bert        training/families/bert.py          BERT (our own names)
    albert      training/families/albert.py        factorised embeddings, shared layers, SOP
    roberta, xlm-roberta, camembert
                training/families/roberta.py       positions after pad, tanh classifier
    electra     training/families/electra.py       E -> H projection, GELU classifier
    distilbert  training/families/distilbert.py    no token types, its own names
    deberta-v2  training/families/deberta_v2.py    its own encoder: disentangled relative
                                                   attention; ContextPooler classifier
    modernbert  training/families/modernbert.py    its own encoder: rotary positions, local
                                                   and global attention, GeGLU, pre-norm
    mpnet       training/families/mpnet.py         its own encoder: shared relative position
                                                   bias; RoBERTa's positions and classifier

Every family but ELECTRA has a masked-LM head (task "fill-mask", its *ForMaskedLM class):
BERT's `cls.predictions` unless the family's module supplies its own (`Family.masked_lm`).

A new family is one new module declaring a `Family` (training/families/base.py) and one line
in FAMILY_MODULES.
"""

from __future__ import annotations

from training.families import (
    albert,
    bert,
    deberta_v2,
    distilbert,
    electra,
    modernbert,
    mpnet,
    roberta,
)
from training.families.base import ConfigError, Family, check_family

FAMILY_MODULES = (bert, albert, roberta, electra, distilbert, deberta_v2, modernbert, mpnet)

FAMILIES: dict[str, Family] = {
    family.model_type: family
    for module in FAMILY_MODULES
    for family in getattr(module, "FAMILIES", None) or (module.FAMILY,)
}
for _family in FAMILIES.values():
    check_family(_family)

MODEL_TYPES = tuple(FAMILIES)

# config.json's architectures -> our task, for every family. BertForMaskedLM and
# AlbertForMaskedLM read as "pretraining" (also_pretraining), the other *ForMaskedLM as
# "fill-mask".
TASK_OF_ARCHITECTURE = {
    architecture: task
    for family in FAMILIES.values()
    for task, architecture in family.architectures.items()
} | {f.also_pretraining: "pretraining" for f in FAMILIES.values() if f.also_pretraining}


def family_of(model_type: str) -> Family:
    """The family of config.json's `model_type`; ConfigError naming the supported ones."""
    if model_type not in FAMILIES:
        raise ConfigError(
            f"model_type {model_type!r} is not supported; supported: {', '.join(MODEL_TYPES)}"
        )
    return FAMILIES[model_type]


__all__ = ["FAMILIES", "MODEL_TYPES", "TASK_OF_ARCHITECTURE", "ConfigError", "Family", "family_of"]
