"""BertConfig: the encoder's shape, with Hugging Face field names so `config.json` interoperates.

>>> cfg = BertConfig.preset("mini", vocab_size=30522)
>>> cfg.save("runs/mini")                     # writes runs/mini/config.json
>>> BertConfig.load("runs/mini") == cfg
True
>>> BertConfig.preset("albert-base").model_type     # factorised embeddings, shared layers
'albert'

ALBERT (Lan et al. 2019) is two options of the same encoder: `embedding_size` E (token,
position and segment embeddings of width E, then one E -> H projection) and `share_layers`
(one layer's weights applied num_hidden_layers times). Between bert and albert, embedding_size
decides: a BERT config given one is an ALBERT config, in transformers' AlbertConfig terms.

The other BERT-family checkpoints are the same encoder too, told apart by `model_type` (the
config.json field): RoBERTa, XLM-R and CamemBERT count positions from pad_token_id + 1 over
the real tokens and usually have type_vocab_size 1; ELECTRA's discriminator projects E -> H
like ALBERT (without sharing); DistilBERT has no token-type embeddings (type_vocab_size 0) and
optionally a fixed sinusoidal position table (`sinusoidal_pos_embds`), and its config.json
uses its own names (dim, n_layers, ...). Heads differ per family: see training/model.py.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from heads.contract import HF_PROBLEM_TYPES, POOLINGS

# (layers, hidden): Turc et al. 2019, "Well-Read Students Learn Better" (tiny..medium) and
# Devlin et al. 2018 (base, large). Heads = hidden / 64, FFN = 4 * hidden, as in both papers.
PRESETS: dict[str, tuple[int, int]] = {
    "tiny": (2, 128),
    "mini": (4, 256),
    "small": (4, 512),
    "medium": (8, 512),
    "base": (12, 768),
    "large": (24, 1024),
    "albert-base": (12, 768),  # Lan et al. 2019, Table 1: 12M parameters (BERT-base: 108M)
    "albert-large": (24, 1024),  # Table 1: 18M (BERT-large: 334M)
}
# ALBERT's recipe on top of the shape (Lan et al. 2019 §3.1, §4.9; google-research/albert's
# albert_base v2 config): E = 128, every layer shared, no dropout, and the tanh-approximated
# GELU of ALBERT's modeling.py (transformers' "gelu_new").
ALBERT = dict(
    embedding_size=128,
    share_layers=True,
    hidden_act="gelu_new",
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
)
PRESET_OPTIONS: dict[str, dict[str, Any]] = {"albert-base": ALBERT, "albert-large": ALBERT}

PROBLEM_TYPES = tuple(HF_PROBLEM_TYPES)  # Hugging Face config.json spelling

# Fine-tuning and evaluation windows by task, as google-research/bert: run_classifier.py
# max_seq_length 128; run_squad.py 384 / doc_stride 128 / max_answer_length 30. Token
# classification and embeddings use 128 as well.
DEFAULT_MAX_SEQ_LENGTH = {
    "classification": 128,
    "token-classification": 128,
    "question-answering": 384,
    "embedding": 128,
}
DOC_STRIDE = 128
MAX_ANSWER_LENGTH = 30
# Feature-based token classification (Devlin et al. 2018 §5.3): which hidden states the
# classifier reads, as (indices into the L + 1 states, 0 = embeddings; how to combine them).
# Table 7, CoNLL-2003 dev F1 of frozen BERT-base features under a 2-layer BiLSTM, in comments.
FEATURES: dict[str, tuple[tuple[int, ...] | str, str]] = {
    "last": ((-1,), "concat"),  # 94.9; what fine-tuning uses
    "second-to-last": ((-2,), "concat"),  # 95.6
    "embeddings": ((0,), "concat"),  # 91.0
    "last4-concat": ((-4, -3, -2, -1), "concat"),  # 96.1, the paper's best
    "last4-sum": ((-4, -3, -2, -1), "sum"),  # 95.9 (learned weights, starting equal)
    "all-sum": ("layers", "sum"),  # 95.5: every layer's output, embeddings excluded
}


ROBERTA_FAMILY = ("roberta", "xlm-roberta", "camembert")  # one layout, three tokenizers
MODEL_TYPES = ("bert", "albert", *ROBERTA_FAMILY, "electra", "distilbert")
# Fields transformers' config classes default when config.json leaves them out (save_pretrained
# writes only what differs from PretrainedConfig's own defaults, and pad 1 does).
FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    **{t: {"pad_token_id": 1} for t in ROBERTA_FAMILY},
    "electra": {"embedding_size": 128},
}
# DistilBertConfig's names for BertConfig's fields; it has no token types and a fixed eps.
DISTILBERT_NAMES = {
    "hidden_size": "dim",
    "num_hidden_layers": "n_layers",
    "num_attention_heads": "n_heads",
    "intermediate_size": "hidden_dim",
    "hidden_act": "activation",
    "hidden_dropout_prob": "dropout",
    "attention_probs_dropout_prob": "attention_dropout",
}
DISTILBERT_LAYER_NORM_EPS = 1e-12  # hard-coded in modeling_distilbert's LayerNorms


class ConfigError(ValueError):
    """A config.json that cannot describe a BERT encoder."""


def _check_model_type(model_type: str) -> None:
    if model_type not in MODEL_TYPES:
        raise ConfigError(
            f"model_type {model_type!r} is not supported; supported: {', '.join(MODEL_TYPES)}"
        )


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    pad_token_id: int = 0
    # Heads: label names by id and how classification is scored (HF names).
    id2label: dict[int, str] | None = field(default=None, compare=True)
    problem_type: str | None = None
    # ALBERT: width of the embeddings before their projection to hidden_size (None: no
    # projection, plain BERT), and one set of layer weights for every layer.
    embedding_size: int | None = None
    share_layers: bool = False
    # The checkpoint family (MODEL_TYPES): its parameter names, position ids and heads.
    model_type: str = "bert"
    # DistilBERT: a fixed sin/cos position table (Vaswani et al. 2017 §3.5) instead of a learned one.
    sinusoidal_pos_embds: bool = False
    # Token classification: the hidden states its classifier reads (FEATURES). Not a
    # transformers field: transformers would run a non-"last" head over the last layer.
    features: str = "last"
    # Sequence classification: what the classifier reads. "cls" is BERT's (the pooler over
    # [CLS]); "mean" averages the last hidden states of the real tokens, which suits encoders
    # tuned for mean-pooled sentence embeddings (all-MiniLM-L6-v2). Not a transformers field
    # either: its BertForSequenceClassification would read the pooler whatever this says.
    classifier_pooling: str = "cls"

    def __post_init__(self) -> None:
        _check_model_type(self.model_type)
        if self.model_type in ("bert", "albert"):  # frozen: set through object.__setattr__
            bert_or_albert = "bert" if self.embedding_size is None else "albert"
            object.__setattr__(self, "model_type", bert_or_albert)
        if self.model_type == "electra" and self.embedding_size == self.hidden_size:
            object.__setattr__(self, "embedding_size", None)  # ElectraModel has no projection then
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"hidden_size {self.hidden_size} is not a multiple of "
                f"num_attention_heads {self.num_attention_heads}"
            )
        if self.hidden_act not in ("gelu", "gelu_new", "relu", "gelu_pytorch_tanh"):
            raise ConfigError(f"hidden_act {self.hidden_act!r} is not supported")
        if self.problem_type is not None and self.problem_type not in PROBLEM_TYPES:
            raise ConfigError(f"problem_type {self.problem_type!r} is not one of {PROBLEM_TYPES}")
        if self.features not in FEATURES:
            raise ConfigError(f"features {self.features!r} is not one of {', '.join(FEATURES)}")
        if self.classifier_pooling not in POOLINGS:
            raise ConfigError(
                f"classifier_pooling {self.classifier_pooling!r} is not one of {', '.join(POOLINGS)}"
            )
        if min(self.feature_layers) < 0:
            raise ConfigError(
                f"features {self.features!r} needs more than {self.num_hidden_layers} layers"
            )
        if self.share_layers and self.model_type != "albert":
            # transformers' BERT has no shared layers, so the checkpoint could not be BERT's;
            # ALBERT's always projects (embedding_size = hidden_size keeps the width).
            raise ConfigError("share_layers is an ALBERT option: set embedding_size too")
        if self.embedding_size is not None and self.model_type not in ("albert", "electra"):
            raise ConfigError(
                f"embedding_size is an ALBERT or ELECTRA option, not {self.model_type}"
            )
        if self.sinusoidal_pos_embds and self.model_type != "distilbert":
            raise ConfigError("sinusoidal_pos_embds is a DistilBERT option")
        if (self.model_type == "distilbert") != (self.type_vocab_size == 0):
            raise ConfigError(
                f"type_vocab_size {self.type_vocab_size}: DistilBERT, and only DistilBERT, "
                "has no token-type embeddings (type_vocab_size 0)"
            )
        if self.model_type == "distilbert" and self.layer_norm_eps != DISTILBERT_LAYER_NORM_EPS:
            raise ConfigError(
                f"DistilBERT's layer_norm_eps is fixed at {DISTILBERT_LAYER_NORM_EPS}"
            )

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> BertConfig:
        if name not in PRESETS:
            raise ConfigError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
        layers, hidden = PRESETS[name]
        shape = dict(
            num_hidden_layers=layers,
            hidden_size=hidden,
            num_attention_heads=hidden // 64,
            intermediate_size=4 * hidden,
        )
        return cls(**{**shape, **PRESET_OPTIONS.get(name, {}), **overrides})

    def replace(self, **changes: Any) -> BertConfig:
        return dataclasses.replace(self, **changes)

    @property
    def position_offset(self) -> int:
        """Where real tokens' position ids start. 0: BERT's 0, 1, 2... for every token. RoBERTa
        family: pad_token_id + 1, counting real tokens only, padding at pad_token_id (fairseq's
        make_positions), so only max_position_embeddings - pad_token_id - 1 tokens fit."""
        return self.pad_token_id + 1 if self.model_type in ROBERTA_FAMILY else 0

    @property
    def max_tokens(self) -> int:
        """The longest row the position table holds (RoBERTa-base: 514 - 2 = 512)."""
        return self.max_position_embeddings - self.position_offset

    @property
    def has_pooler(self) -> bool:
        """ELECTRA and DistilBERT encoders have no pooler (no NSP pretraining to train one)."""
        return self.model_type not in ("electra", "distilbert")

    @property
    def feature_layers(self) -> list[int]:
        """FEATURES[features] as non-negative indices into the L + 1 hidden states."""
        layers, _ = FEATURES[self.features]
        if layers == "layers":
            return list(range(1, self.num_hidden_layers + 1))
        n = self.num_hidden_layers + 1
        return [i + n if i < 0 else i for i in layers]  # type: ignore[union-attr]

    @property
    def num_labels(self) -> int:
        return len(self.id2label) if self.id2label else 2

    @property
    def labels(self) -> list[str] | None:
        return [self.id2label[i] for i in range(len(self.id2label))] if self.id2label else None

    # --- Hugging Face config.json -------------------------------------------------------

    def to_dict(self, architecture: str | None = None) -> dict[str, Any]:
        d: dict[str, Any] = {"model_type": self.model_type}
        if architecture:
            d["architectures"] = [architecture]
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "id2label":
                if value:
                    d["id2label"] = {str(k): v for k, v in value.items()}
                    d["label2id"] = {v: k for k, v in value.items()}
                continue
            if f.name in ("problem_type", "embedding_size") and value is None:
                continue
            if f.name == "model_type" or (f.name, value) in (
                ("features", "last"),
                ("classifier_pooling", "cls"),
                ("sinusoidal_pos_embds", False),
            ):
                continue
            if f.name == "share_layers":  # AlbertConfig's terms: groups of layers sharing weights
                if self.model_type == "albert":
                    d["num_hidden_groups"] = 1 if value else self.num_hidden_layers
                    d["inner_group_num"] = 1
                continue
            d[f.name] = value
        if self.model_type == "electra":  # ElectraConfig says embedding_size even when E = H
            d["embedding_size"] = self.embedding_size or self.hidden_size
        if self.model_type == "distilbert":
            del d["type_vocab_size"], d["layer_norm_eps"]
            d["sinusoidal_pos_embds"] = self.sinusoidal_pos_embds
            d = {DISTILBERT_NAMES.get(k, k): v for k, v in d.items()}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BertConfig:
        model_type = d.get("model_type", "bert")
        _check_model_type(model_type)
        d = {**FAMILY_DEFAULTS.get(model_type, {}), **d}
        if model_type == "distilbert":
            d = _distilbert_fields(d)
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in d.items() if k in known}  # unknown keys are ignored
        if d.get("id2label"):
            kwargs["id2label"] = {int(k): str(v) for k, v in d["id2label"].items()}
        elif "id2label" in kwargs:
            kwargs["id2label"] = None
        kwargs.pop("share_layers", None)  # not an HF field: ALBERT says num_hidden_groups
        if model_type == "albert":
            kwargs.update(_albert_fields(d))
        elif model_type != "electra":  # only ALBERT's and ELECTRA's mean a projection
            kwargs.pop("embedding_size", None)
        return cls(**kwargs)

    def save(self, directory: str | Path, architecture: str | None = None) -> Path:
        path = Path(directory) / "config.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(architecture), indent=2) + "\n")
        return path

    @classmethod
    def load(cls, directory: str | Path) -> BertConfig:
        path = Path(directory)
        path = path / "config.json" if path.is_dir() else path
        if not path.is_file():
            raise ConfigError(f"{path}: no config.json (is this a checkpoint folder?)")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}: not valid JSON ({e})") from None
        try:
            return cls.from_dict(data)
        except (TypeError, ConfigError) as e:
            raise ConfigError(f"{path}: {e}") from None


def _albert_fields(d: dict[str, Any]) -> dict[str, Any]:
    """embedding_size and share_layers from an AlbertConfig dict (its defaults where absent).
    ALBERT groups layers: num_hidden_groups groups of inner_group_num layers each, the
    groups' weights applied in turn. We implement the two layouts ALBERT's paper trains: one
    group (every layer shared) or one group per layer (none shared)."""
    layers = d.get("num_hidden_layers", 12)
    groups, inner = d.get("num_hidden_groups", 1), d.get("inner_group_num", 1)
    if inner != 1 or groups not in (1, layers):
        raise ConfigError(
            f"ALBERT with num_hidden_groups {groups} and inner_group_num {inner} is not "
            f"supported: one group (all layers shared) or {layers} (none), of one layer each"
        )
    return {
        "embedding_size": d.get("embedding_size", 128),
        "share_layers": groups == 1,
        "hidden_act": d.get("hidden_act", "gelu_new"),
    }


def _distilbert_fields(d: dict[str, Any]) -> dict[str, Any]:
    """A DistilBertConfig dict in BertConfig's names (its defaults where absent)."""
    defaults = {"dim": 768, "n_layers": 6, "n_heads": 12, "hidden_dim": 3072,
                "activation": "gelu", "dropout": 0.1, "attention_dropout": 0.1}  # fmt: skip
    out = {k: v for k, v in d.items() if k not in DISTILBERT_NAMES}  # its attribute_map aliases
    for ours, theirs in DISTILBERT_NAMES.items():
        out[ours] = d.get(theirs, defaults[theirs])
    return out | {"type_vocab_size": 0, "layer_norm_eps": DISTILBERT_LAYER_NORM_EPS}
