"""BERT (Devlin et al. 2018): our own parameter names (training/model.py follows transformers'
modeling_bert.py), the pooler, and the NSP pretraining head. A bare BertModel (as
sentence-transformers saves it) gets the `bert.` prefix on the way in."""

from __future__ import annotations

from training.families.base import Family, architectures, rename_by_prefix, same

FAMILY = Family(
    model_type="bert",
    name="BERT",
    prefix="bert.",
    architectures=architectures("Bert", pretraining=True),
    to_hf=same,
    from_hf=rename_by_prefix(
        tuple((p, "bert." + p) for p in ("embeddings.", "encoder.", "pooler."))
    ),
    classifier="pooler",
    also_pretraining="BertForMaskedLM",
    # A BERT config given an embedding_size is an ALBERT config (transformers' AlbertConfig).
    settle=lambda config: {"model_type": "albert"} if config.embedding_size is not None else {},
)
