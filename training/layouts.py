"""Each checkpoint family's parameter names <-> ours, so that `training/checkpoint.py` loads and
saves every family in transformers' own layout. Ours are BERT's (`bert.encoder.layer.0...`,
see training/model.py); a family's layout renames them, and nothing else changes.

    RoBERTa, XLM-R, CamemBERT  roberta.*                        <-> bert.*
    ELECTRA                    electra.embeddings_project.*     <-> bert.encoder.embedding_hidden_mapping_in.*
                               electra.*                        <-> bert.*
    DistilBERT                 distilbert.transformer.layer.{i}.attention.q_lin.*
                                   <-> bert.encoder.layer.{i}.attention.self.query.*  (and so on)
                               distilbert.embeddings.*          <-> bert.embeddings.*
    ALBERT                     training/albert_layout.py

Heads keep their names in every family (`classifier.*`, `classifier.dense/out_proj.*`,
`pre_classifier.*`, `qa_outputs.*`). Masked-LM and discriminator heads, which we do not
implement for these families, come in under `cls.` so that checkpoint.py drops them with its
one-line note, as it drops BERT's pretraining heads under a fine-tuning head.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from training import albert_layout
from training.config import MODEL_TYPES


@dataclass(frozen=True)
class Layout:
    prefix: str  # the encoder's module name in transformers' heads: "roberta."
    architectures: dict[str, str]  # task -> the transformers class saved as (config.json)
    to_hf: Callable[[str], str]  # our parameter name -> the family's
    from_hf: Callable[[str], str]  # the family's (prefixed or bare) -> ours; unknown unchanged
    # Another class of the family that config.json may name, read as task "pretraining"
    # (bert-base-uncased says BertForMaskedLM, yet its file has the NSP head too).
    also_pretraining: str | None = None


def _renamer(table: tuple[tuple[str, str], ...]) -> Callable[[str], str]:
    """Rename by prefix, the first (most specific) match winning."""

    def rename(name: str) -> str:
        for old, new in table:
            if name.startswith(old):
                return new + name[len(old) :]
        return name

    return rename


def _architectures(family: str, with_pretraining: bool = False) -> dict[str, str]:
    names = {
        "classification": f"{family}ForSequenceClassification",
        "token-classification": f"{family}ForTokenClassification",
        "question-answering": f"{family}ForQuestionAnswering",
        "embedding": f"{family}Model",
    }
    return ({"pretraining": f"{family}ForPreTraining"} if with_pretraining else {}) | names


# --- BERT: our own names; a bare BertModel (sentence-transformers has them) gets the prefix ---

_bert_from = _renamer(tuple((p, "bert." + p) for p in ("embeddings.", "encoder.", "pooler.")))

# --- RoBERTa family ---------------------------------------------------------------------

_roberta_to = _renamer((("bert.", "roberta."),))
_roberta_from = _renamer(
    (
        ("roberta.", "bert."),
        *((p, "bert." + p) for p in ("embeddings.", "encoder.", "pooler.")),  # bare RobertaModel
        # RobertaLMHead: dense, GELU, LayerNorm, tied decoder: BERT's MLM head by other names.
        ("lm_head.layer_norm.", "cls.predictions.transform.LayerNorm."),
        ("lm_head.dense.", "cls.predictions.transform.dense."),
        ("lm_head.", "cls.predictions."),
    )
)

# --- ELECTRA (the discriminator) --------------------------------------------------------

_electra_to = _renamer(
    (
        ("bert.encoder.embedding_hidden_mapping_in.", "electra.embeddings_project."),
        ("bert.", "electra."),
    )
)
_electra_from = _renamer(
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
)

# --- DistilBERT -------------------------------------------------------------------------

# Inside one layer: our module path -> DistilBERT's (TransformerBlock).
DISTILBERT_IN_LAYER = {
    "attention.self.query": "attention.q_lin",
    "attention.self.key": "attention.k_lin",
    "attention.self.value": "attention.v_lin",
    "attention.output.dense": "attention.out_lin",
    "attention.output.LayerNorm": "sa_layer_norm",
    "intermediate.dense": "ffn.lin1",
    "output.dense": "ffn.lin2",
    "output.LayerNorm": "output_layer_norm",
}
_OURS_LAYER = re.compile(r"bert\.encoder\.layer\.(\d+)\.(.+)\.(weight|bias)")
_DISTILBERT_LAYER = re.compile(r"distilbert\.transformer\.layer\.(\d+)\.(.+)\.(weight|bias)")


def _distilbert_to(name: str) -> str:
    if (m := _OURS_LAYER.fullmatch(name)) and m[2] in DISTILBERT_IN_LAYER:
        return f"distilbert.transformer.layer.{m[1]}.{DISTILBERT_IN_LAYER[m[2]]}.{m[3]}"
    return _renamer((("bert.", "distilbert."),))(name)


def _distilbert_from(name: str) -> str:
    if name.startswith(("embeddings.", "transformer.")):  # a bare DistilBertModel
        name = "distilbert." + name
    if m := _DISTILBERT_LAYER.fullmatch(name):
        ours = {v: k for k, v in DISTILBERT_IN_LAYER.items()}.get(m[2])
        return f"bert.encoder.layer.{m[1]}.{ours}.{m[3]}" if ours else name
    # DistilBertForMaskedLM's vocab_transform, vocab_layer_norm, vocab_projector
    return _renamer((("distilbert.", "bert."), ("vocab_", "cls.vocab_")))(name)


def _same(name: str) -> str:
    return name


def _roberta(family: str) -> Layout:
    # XLM-R and CamemBERT are RoBERTa's modules under their own class names
    return Layout(
        "roberta.", _architectures(family), _roberta_to, _roberta_from, f"{family}ForMaskedLM"
    )


LAYOUTS: dict[str, Layout] = {
    "bert": Layout("bert.", _architectures("Bert", True), _same, _bert_from, "BertForMaskedLM"),
    "albert": Layout(
        "albert.",
        albert_layout.ARCHITECTURES,
        albert_layout.to_albert,
        albert_layout.from_albert,
        "AlbertForMaskedLM",
    ),
    "roberta": _roberta("Roberta"),
    "xlm-roberta": _roberta("XLMRoberta"),
    "camembert": _roberta("Camembert"),
    "electra": Layout(
        "electra.", _architectures("Electra"), _electra_to, _electra_from, "ElectraForPreTraining"
    ),
    "distilbert": Layout(
        "distilbert.",
        _architectures("DistilBert"),
        _distilbert_to,
        _distilbert_from,
        "DistilBertForMaskedLM",
    ),
}
assert set(LAYOUTS) == set(MODEL_TYPES), "a model_type without a layout"

# config.json's architectures -> our task, for every family.
TASK_OF_ARCHITECTURE = {
    architecture: task
    for layout in LAYOUTS.values()
    for task, architecture in layout.architectures.items()
} | {
    layout.also_pretraining: "pretraining" for layout in LAYOUTS.values() if layout.also_pretraining
}
