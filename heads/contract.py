"""The names of the model-package contract, owned here and imported everywhere else.

`training.export` writes packages with these names, the service reads them, `training.evaluate`
scores through them. Dependency-free on purpose: importing it pulls in nothing.
"""

from __future__ import annotations

TASKS = (
    "classification", "token-classification", "question-answering", "embedding", "fill-mask",
    "late-interaction", "encoder",
)  # fmt: skip

# The graph's inputs, in the order the exporter declares them; every package takes all three.
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")

# The outputs each head's graph answers and its post-processing reads: logits (B, C) or
# (B, T, C), start_logits / end_logits (B, T), embeddings (B, H) (or (B, V) for a sparse
# pooling), the masked-LM logits (B, T, V) over the vocabulary.
OUTPUT_NAMES: dict[str, tuple[str, ...]] = {
    "classification": ("logits",),
    "token-classification": ("logits",),
    "question-answering": ("start_logits", "end_logits"),
    "embedding": ("embeddings",),
    "fill-mask": ("logits",),
    "late-interaction": ("token_embeddings",),
    # the shared encoder adapter packages run over (heads.adapters): its states, no head
    "encoder": ("last_hidden_state",),
}

# Every token's vector (B, T, D): a dense embedding package's last hidden state (POST /embed_all),
# a late-interaction (ColBERT) package's projected one. The service L2-normalises it.
TOKEN_EMBEDDINGS = "token_embeddings"

# Embedding packages exported with --hidden-states also answer every layer's states pooled
# both ways, (B, L + 1, H) each (Devlin et al. §5.3 feature-based use: /embed `layers`).
HIDDEN_STATE_OUTPUTS: dict[str, str] = {"cls": "hidden_states_cls", "mean": "hidden_states_mean"}

# Classification problem types: the package says the short name; a Hugging Face config.json
# says the long one. One map between them.
PROBLEM_TYPES = ("single_label", "multi_label", "regression")
HF_PROBLEM_TYPES: dict[str, str] = {
    "single_label_classification": "single_label",
    "multi_label_classification": "multi_label",
    "regression": "regression",
}

# How a sequence becomes one vector. Dense: the hidden states pooled, for the embedding head
# and the classifier, in sentence-transformers' Pooling mode names (training.model.pool
# computes each). Sparse, embedding packages only: the masked-LM logits (B, T, V) become one
# vocabulary-wide vector (B, V) of mostly zeros; "splade" is max over the real tokens of
# log(1 + relu(logits)) (sentence-transformers' SpladePooling "max", TEI's /embed_sparse).
# package.json's `pooling` says which, so a reader knows a package is sparse.
DENSE_POOLINGS = ("mean", "cls", "max", "mean_sqrt_len_tokens")
SPARSE_POOLINGS = ("splade",)
POOLINGS = DENSE_POOLINGS + SPARSE_POOLINGS  # what an embedding package's pooling may be
POOLED_TASKS = ("embedding", "classification")  # the heads a dense pooling choice applies to

# What a request asks for when it names no model, and the package task that serves it: each
# task, and the uses of some packages of a task (/embed_sparse: a sparse embedding; /rerank: a
# cross-encoder; /zero-shot: an NLI model). `--default-model TASK=NAME` and package.json's
# `default_for` name these (service.selection).
REQUEST_TASKS: dict[str, str] = {
    **{task: task for task in TASKS},
    "sparse-embedding": "embedding",
    "token-embedding": "embedding",  # /embed_all: every token's vector
    "rerank": "classification",
    "zero-shot": "classification",
}
# Request tasks that packages of other tasks answer too: a late-interaction (ColBERT) package
# reranks by MaxSim and answers /embed_all with its token vectors.
ALSO_ANSWERED_BY: dict[str, tuple[str, ...]] = {
    "rerank": ("late-interaction",),
    "token-embedding": ("late-interaction",),
}


def answering_tasks(use: str) -> tuple[str, ...]:
    """The package tasks that answer request task `use` (a KeyError for an unknown one)."""
    return (REQUEST_TASKS[use], *ALSO_ANSWERED_BY.get(use, ()))


# What a classification package reads (package.json `reads`): one text per row, or a pair of
# texts (NLI, paraphrase, a cross-encoder's query and document). A package written before the
# field existed reads "unknown" (heads.package).
READS = ("single", "pairs")

VARIANTS = ("fp32", "int8", "fp16")
VARIANT_FILES: dict[str, str] = {
    "fp32": "model.onnx",
    "int8": "model.int8.onnx",
    "fp16": "model.fp16.onnx",
}
MANIFEST = "package.json"
TOKENIZER = "tokenizer.json"
