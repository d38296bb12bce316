"""RoBERTa (Liu et al. 2019), and XLM-R and CamemBERT, which are RoBERTa's modules under their
own class names (three families, one layout, three tokenizers).

BERT's encoder with two differences of option: position ids count the real tokens from
pad_token_id + 1 with padding at pad_token_id (fairseq's make_positions), and one token type.
Its classifier is dense -> tanh -> out_proj on <s>. Names: `roberta.*` <-> `bert.*`; the
masked-LM head (`lm_head.*`) is BERT's MLM head by other names and comes in under `cls.`, where
checkpoint.py drops it with its one-line note.

    roberta.encoder.layer.0.attention.self.query.weight <-> bert.encoder.layer.0...
    lm_head.dense.* / lm_head.layer_norm.*              <-> cls.predictions.transform.dense / LayerNorm
"""

from __future__ import annotations

from training.families.base import Family, architectures, rename_by_prefix

_to_hf = rename_by_prefix((("bert.", "roberta."),))
_from_hf = rename_by_prefix(
    (
        ("roberta.", "bert."),
        *((p, "bert." + p) for p in ("embeddings.", "encoder.", "pooler.")),  # bare RobertaModel
        # RobertaLMHead: dense, GELU, LayerNorm, tied decoder: BERT's MLM head by other names.
        ("lm_head.layer_norm.", "cls.predictions.transform.LayerNorm."),
        ("lm_head.dense.", "cls.predictions.transform.dense."),
        ("lm_head.", "cls.predictions."),
    )
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
        also_pretraining=f"{class_prefix}ForMaskedLM",
        # save_pretrained writes only what differs from PretrainedConfig's defaults, and the
        # family's pad 1 does not appear in every file.
        defaults={"pad_token_id": 1},
        positions_after_pad=True,
    )


FAMILIES = (
    _family("roberta", "RoBERTa", "Roberta"),
    _family("xlm-roberta", "XLM-R", "XLMRoberta"),
    _family("camembert", "CamemBERT", "Camembert"),
)
