"""RoBERTa (Liu et al. 2019), and XLM-R and CamemBERT, which are RoBERTa's modules under their
own class names (three families, one layout, three tokenizers).

BERT's encoder with two differences of option: position ids count the real tokens from
pad_token_id + 1 with padding at pad_token_id (fairseq's make_positions), and one token type.
Its classifier is dense -> tanh -> out_proj on <s>. Names: `roberta.*` <-> `bert.*`; the
masked-LM head (`lm_head.*`: dense, exact GELU whatever hidden_act says, layer_norm, decoder
tied to the word embeddings, bias) is our `cls.*` (fill-mask); the other heads drop it with
checkpoint.py's one-line note.

    roberta.encoder.layer.0.attention.self.query.weight <-> bert.encoder.layer.0...
    lm_head.dense.* / lm_head.layer_norm.* / lm_head.bias <-> cls.dense.* / ... / cls.bias
"""

from __future__ import annotations

from typing import Any

from training.families.base import Family, architectures, rename_by_prefix
from training.families.mpnet import MPNetLMHead

_to_hf = rename_by_prefix((("bert.", "roberta."), ("cls.", "lm_head.")))
_from_hf = rename_by_prefix(
    (
        ("roberta.", "bert."),
        *((p, "bert." + p) for p in ("embeddings.", "encoder.", "pooler.")),  # bare RobertaModel
        ("lm_head.", "cls."),
    )
)


def masked_lm(config: Any, word_embeddings: Any) -> Any:
    """transformers' RobertaLMHead, which is MPNet's LM head module for module (MPNet took
    RoBERTa's): dense, exact GELU, layer_norm, decoder tied to the word embeddings, bias."""
    return MPNetLMHead(
        config.hidden_size, config.vocab_size, config.layer_norm_eps, word_embeddings
    )


def _family(model_type: str, name: str, class_prefix: str) -> Family:
    return Family(
        model_type=model_type,
        name=name,
        prefix="roberta.",
        architectures=architectures(class_prefix),
        to_hf=_to_hf,
        from_hf=_from_hf,
        classifier="tanh",
        # save_pretrained writes only what differs from PretrainedConfig's defaults, and the
        # family's pad 1 does not appear in every file.
        defaults={"pad_token_id": 1},
        positions_after_pad=True,
        masked_lm=masked_lm,
        masked_lm_names=("cls.dense.weight", "cls.layer_norm.bias", "cls.bias"),
    )


FAMILIES = (
    _family("roberta", "RoBERTa", "Roberta"),
    _family("xlm-roberta", "XLM-R", "XLMRoberta"),
    _family("camembert", "CamemBERT", "Camembert"),
)
