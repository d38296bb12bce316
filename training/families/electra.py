"""ELECTRA (Clark et al. 2020), the discriminator: BERT's encoder with ALBERT's E -> H
projection when embedding_size differs from hidden_size (`embeddings_project`, no sharing), no
pooler, and a dense -> GELU -> out_proj classifier (GELU whatever hidden_act says, as in
transformers). No masked-LM head: the discriminator predicts which tokens were replaced, and
ElectraForMaskedLM is the generator, a different (smaller) model; fill-mask refuses ELECTRA.

    electra.embeddings_project.* <-> bert.encoder.embedding_hidden_mapping_in.*
    electra.*                    <-> bert.*
"""

from __future__ import annotations

from typing import Any

from training.families.base import Family, architectures, rename_by_prefix


def _write_fields(d: dict[str, Any]) -> dict[str, Any]:
    # ElectraConfig says embedding_size even when E = H (our config then has no projection)
    return d | {"embedding_size": d.get("embedding_size") or d["hidden_size"]}


def _settle(config: Any) -> dict[str, Any]:
    # ElectraModel has no projection when E = H
    return {"embedding_size": None} if config.embedding_size == config.hidden_size else {}


FAMILY = Family(
    model_type="electra",
    name="ELECTRA",
    prefix="electra.",
    architectures=architectures("Electra", masked_lm=False),
    to_hf=rename_by_prefix(
        (
            ("bert.encoder.embedding_hidden_mapping_in.", "electra.embeddings_project."),
            ("bert.", "electra."),
        )
    ),
    from_hf=rename_by_prefix(
        (
            ("electra.embeddings_project.", "bert.encoder.embedding_hidden_mapping_in."),
            ("embeddings_project.", "bert.encoder.embedding_hidden_mapping_in."),
            ("electra.", "bert."),
            ("embeddings.", "bert.embeddings."),
            ("encoder.", "bert.encoder."),
            # ElectraForPreTraining's discriminator / ElectraForMaskedLM's generator heads
            ("discriminator_predictions.", "cls.discriminator_predictions."),
            ("generator_", "cls.generator_"),
        )
    ),
    classifier="gelu",
    also_pretraining="ElectraForPreTraining",
    defaults={"embedding_size": 128},
    write_fields=_write_fields,
    settle=_settle,
    options=frozenset({"embedding_size"}),
    has_pooler=False,
)
