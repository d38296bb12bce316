"""transformers' ALBERT parameter names <-> ours, so ALBERT checkpoints load and save in the
Hugging Face layout (`training/checkpoint.py` calls these when config.json says "albert").

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
(the only two layouts BertConfig accepts). Heads (classifier, qa_outputs) keep their names.
"""

from __future__ import annotations

import re

# task -> the transformers class an ALBERT checkpoint is saved as (config.json architectures).
ARCHITECTURES = {
    "pretraining": "AlbertForPreTraining",
    "classification": "AlbertForSequenceClassification",
    "token-classification": "AlbertForTokenClassification",
    "question-answering": "AlbertForQuestionAnswering",
    "embedding": "AlbertModel",
}
TASK_OF_ARCHITECTURE = {a: t for t, a in ARCHITECTURES.items()} | {
    "AlbertForMaskedLM": "pretraining"  # no SOP head: it is initialised fresh
}

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
OURS_LAYER = re.compile(r"bert\.encoder\.layer\.(\d+)\.(.+)\.(weight|bias)")
ALBERT_LAYER = re.compile(r"albert\.encoder\.albert_layer_groups\.(\d+)\.albert_layers\.0\.(.+)\.(weight|bias)")  # fmt: skip
# Outside the layers, by prefix, most specific first: (ours, ALBERT's).
TO_ALBERT = (
    ("bert.pooler.dense.", "albert.pooler."),
    ("bert.", "albert."),
    ("cls.predictions.transform.", "predictions."),
    ("cls.predictions.", "predictions."),
    ("cls.seq_relationship.", "sop_classifier.classifier."),
)
FROM_ALBERT = (
    ("albert.pooler.", "bert.pooler.dense."),
    ("albert.", "bert."),
    ("predictions.dense.", "cls.predictions.transform.dense."),
    ("predictions.LayerNorm.", "cls.predictions.transform.LayerNorm."),
    ("predictions.", "cls.predictions."),  # bias; decoder.weight / .bias, tied (dropped later)
    ("sop_classifier.classifier.", "cls.seq_relationship."),
)
BARE = ("embeddings.", "encoder.", "pooler.")  # an AlbertModel saved without the prefix


def _rename(name: str, table: tuple[tuple[str, str], ...]) -> str:
    for old, new in table:
        if name.startswith(old):
            return new + name[len(old) :]
    return name


def to_albert(name: str) -> str:
    """Our parameter name -> transformers' ALBERT name (with the `albert.` prefix)."""
    if m := OURS_LAYER.fullmatch(name):
        i, module, kind = m.groups()
        if module in IN_LAYER:
            return (
                f"albert.encoder.albert_layer_groups.{i}.albert_layers.0.{IN_LAYER[module]}.{kind}"
            )
    return _rename(name, TO_ALBERT)


def from_albert(name: str) -> str:
    """transformers' ALBERT name (prefixed or bare) -> ours in BERT file terms (`bert.`...).
    A name we do not know comes back unchanged, for the caller to report as unexpected."""
    if name.startswith(BARE):
        name = "albert." + name
    if m := ALBERT_LAYER.fullmatch(name):
        i, module, kind = m.groups()
        ours = {v: k for k, v in IN_LAYER.items()}.get(module)
        return f"bert.encoder.layer.{i}.{ours}.{kind}" if ours else name
    return _rename(name, FROM_ALBERT)
