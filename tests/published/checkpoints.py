"""Tiny checkpoints made from the published files of tests/published/ (issue 46): each folder's
tokenizer files as they are, its config.json as published with the model made tiny (hidden 32,
2 layers, 4 heads), random weights from transformers' own class of the task's head.

    >>> folder = published_checkpoint("deberta-v3-base", "question-answering")
    >>> package = published_package("all-mpnet-base-v2", "embedding")

What stays as published: the tokenizer files, the vocabulary size (the fixtures' own, shrunk
with their tokenizers: README.md), every special-token id, the max positions and the family's
options (DeBERTa-v3's `"pos_att_type": "p2c|c2p"` string, ModernBERT's local attention, ...).
config.json is the published file with only the size fields changed and, for a head, its
`architectures` and labels added: a user's fine-tune keeps the published values the same way.
sentence-transformers' 1_Pooling/config.json gets the tiny width. Folders and packages are made
once per session (cached by arguments); treat them as read-only.
"""

from __future__ import annotations

import atexit
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from tests.families import CLASS_PREFIX, NER_LABELS

HERE = Path(__file__).resolve().parent
TASK_CLASSES = {  # our task -> transformers class-name suffix
    "classification": "ForSequenceClassification",
    "token-classification": "ForTokenClassification",
    "question-answering": "ForQuestionAnswering",
    "embedding": "Model",
    "fill-mask": "ForMaskedLM",
}
ALL_TASKS = tuple(TASK_CLASSES)
# checkpoint -> the tasks it is served for: every head its family has for the published base
# models; the fine-tunes (their own head) and the sentence-transformers model for what they are.
# electra-base-discriminator is a replaced-token detector (ElectraForPreTraining): it has no
# masked-LM head to fill masks with.
MATRIX: dict[str, tuple[str, ...]] = {
    "bert-base-uncased": ALL_TASKS,
    "bert-base-cased": ("token-classification", "question-answering", "fill-mask"),
    "bert-base-uncased-30500": ("classification",),
    "distilbert-base-uncased": ALL_TASKS,
    "distilbert-base-uncased-finetuned-sst-2-english": ("classification",),
    "electra-base-discriminator": ALL_TASKS[:4],
    "roberta-base": ALL_TASKS,
    "xlm-roberta-base": ALL_TASKS,
    "camembert-base": ALL_TASKS,
    "albert-base-v2": ALL_TASKS,
    "deberta-v3-base": ALL_TASKS,
    "ModernBERT-base": ALL_TASKS,
    "mpnet-base": ALL_TASKS,
    "all-mpnet-base-v2": ("embedding",),
}
CHECKPOINTS = tuple(MATRIX)
TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
        "intermediate_size": 37}  # fmt: skip
TINY_BY_TYPE: dict[str, dict[str, Any]] = {
    "distilbert": {"dim": 32, "n_layers": 2, "n_heads": 4, "hidden_dim": 37},
    "albert": {**TINY, "embedding_size": 16},  # published 128 under 768: a projection
    "electra": {**TINY, "embedding_size": 32},  # the base model's equal sizes: no projection
    "modernbert": {**TINY, "num_hidden_layers": 3},  # layer 0 global, 1 and 2 local
}
INITIALIZER_RANGE = 0.2  # wide random weights: answers differ by input (tests/families.py)

_root = Path(tempfile.mkdtemp(prefix="bert-heads-published-"))
atexit.register(shutil.rmtree, _root, True)
_folders: dict[tuple[Any, ...], Path] = {}
_packages: dict[tuple[Any, ...], Path] = {}


def fixture(name: str) -> Path:
    """The committed folder of published files."""
    return HERE / name


def published_config(name: str) -> dict[str, Any]:
    return json.loads((fixture(name) / "config.json").read_text(encoding="utf-8"))


def model_type(name: str) -> str:
    return published_config(name)["model_type"]


def labels_of(name: str, task: str) -> list[str] | None:
    """The head's labels: the published id2label where the checkpoint is a fine-tune, else
    SST-2's for classification and CoNLL-2003's for token classification."""
    published = published_config(name).get("id2label")
    if published and task == "classification":
        return [published[str(i)] for i in range(len(published))]
    return {"classification": ["negative", "positive"], "token-classification": NER_LABELS}.get(
        task
    )


def published_checkpoint(name: str, task: str, *, seed: int = 3) -> Path:
    """A checkpoint folder: `name`'s published files with tiny random weights of `task`'s
    head (fill-mask: the family's *ForMaskedLM), cached for the session."""
    key = (name, task, seed)
    if key in _folders:
        return _folders[key]
    import torch
    import transformers

    raw = published_config(name)
    kind = raw["model_type"]
    prefix = CLASS_PREFIX[kind]
    changes: dict[str, Any] = {**TINY_BY_TYPE.get(kind, TINY)}
    changes["initializer_range"] = INITIALIZER_RANGE
    changes["architectures"] = [prefix + TASK_CLASSES[task]]
    labels = labels_of(name, task)
    if labels is not None:
        changes["id2label"] = {str(i): label for i, label in enumerate(labels)}
        changes["label2id"] = {label: i for i, label in enumerate(labels)}
    config = transformers.AutoConfig.for_model(**{**raw, **changes})
    model_class = getattr(transformers, prefix + TASK_CLASSES[task])
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = model_class(config).eval()
    folder = _root / f"{name}-{task}-{seed}"
    shutil.copytree(fixture(name), folder)
    model.save_pretrained(folder)
    # the published config.json, with only what a fine-tune of it changes
    (folder / "config.json").write_text(json.dumps({**raw, **changes}, indent=2) + "\n")
    pooling = folder / "1_Pooling" / "config.json"
    if pooling.is_file():
        width = json.loads(pooling.read_text())
        width["word_embedding_dimension"] = changes.get("hidden_size", changes.get("dim"))
        pooling.write_text(json.dumps(width, indent=2) + "\n")
    _folders[key] = folder
    return folder


def published_package(
    name: str, task: str, *, seed: int = 3, max_seq_length: int | None = None
) -> Path:
    """`published_checkpoint(name, task)` exported by training.export (fp32), cached for the
    session; its folder name, `<name>--<task>`, is the model name requests use."""
    key = (name, task, seed, max_seq_length)
    if key not in _packages:
        from training.export import export_package

        out = _root / "packages" / f"{name}--{task}"
        if max_seq_length is not None:
            out = out.with_name(f"{out.name}--{max_seq_length}")
        folder = published_checkpoint(name, task, seed=seed)
        _packages[key] = export_package(
            folder, task, out, max_seq_length=max_seq_length, verbose=False
        ).path
    return _packages[key]
