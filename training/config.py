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

The other checkpoint families are the same encoder too, told apart by `model_type` (the
config.json field). What each family's config.json names differently, which options it may
set and what it checks is its module's (training/families/); this class applies them.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from heads.contract import DENSE_POOLINGS, HF_PROBLEM_TYPES
from training.families import FAMILIES, ConfigError, Family, albert, family_of
from training.families.base import OPTIONS

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
PRESET_OPTIONS: dict[str, dict[str, Any]] = {
    "albert-base": albert.RECIPE,
    "albert-large": albert.RECIPE,
}

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
    # The family's own config.json fields (Family.fields: DeBERTa's position_buckets,
    # ModernBERT's local_attention...), read as attributes: config.position_buckets.
    extra: dict[str, Any] | None = None

    def __getattr__(self, name: str) -> Any:
        # Only called when the dataclass has no such field; __dict__ because unpickling asks
        # before `extra` exists.
        extra = self.__dict__.get("extra") or {}
        if name in extra:
            return extra[name]
        raise AttributeError(f"{type(self).__name__} has no field {name!r}")

    def __post_init__(self) -> None:
        family = family_of(self.model_type)
        for name, value in family.settle(self).items():  # frozen: set through __setattr__
            object.__setattr__(self, name, value)
        family = self.family
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
        if self.classifier_pooling not in DENSE_POOLINGS:
            raise ConfigError(
                f"classifier_pooling {self.classifier_pooling!r} is not one of "
                f"{', '.join(DENSE_POOLINGS)}"
            )
        if min(self.feature_layers) < 0:
            raise ConfigError(
                f"features {self.features!r} needs more than {self.num_hidden_layers} layers"
            )
        for option in OPTIONS:
            if getattr(self, option) not in (None, False) and option not in family.options:
                raise ConfigError(f"{option} is {_owners(option)} option, not {family.name}'s")
        if family.token_types == "never" and self.type_vocab_size != 0:
            raise ConfigError(
                f"type_vocab_size {self.type_vocab_size}: {family.name} has no token-type "
                "embeddings (type_vocab_size 0)"
            )
        if family.token_types == "always" and self.type_vocab_size == 0:
            without = ", ".join(f.name for f in FAMILIES.values() if f.token_types != "always")
            raise ConfigError(
                f"type_vocab_size 0: {family.name} has token-type embeddings; only {without} "
                "may have none"
            )
        if unknown := set(self.extra or {}) - set(family.fields):
            raise ConfigError(f"{family.name} has no fields {', '.join(sorted(unknown))}")
        family.check(self)

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
    def family(self) -> Family:
        """The checkpoint family (training/families/) of model_type."""
        return family_of(self.model_type)

    @property
    def position_offset(self) -> int:
        """Where real tokens' position ids start. 0: BERT's 0, 1, 2... for every token. RoBERTa
        family: pad_token_id + 1, counting real tokens only, padding at pad_token_id (fairseq's
        make_positions), so only max_position_embeddings - pad_token_id - 1 tokens fit."""
        return self.pad_token_id + 1 if self.family.positions_after_pad else 0

    @property
    def max_tokens(self) -> int:
        """The longest row the position table holds (RoBERTa-base: 514 - 2 = 512)."""
        return self.max_position_embeddings - self.position_offset

    @property
    def has_pooler(self) -> bool:
        """BERT's pooler (trained by NSP / SOP); ELECTRA's and DistilBERT's encoders have none."""
        return self.family.has_pooler

    @property
    def feature_layers(self) -> list[int]:
        """FEATURES[features] as non-negative indices into the L + 1 hidden states."""
        layers, _ = FEATURES[self.features]
        if layers == "layers":
            return list(range(1, self.num_hidden_layers + 1))
        assert isinstance(layers, tuple)  # every other FEATURES entry is a tuple of indices
        n = self.num_hidden_layers + 1
        return [i + n if i < 0 else i for i in layers]

    @property
    def num_labels(self) -> int:
        return len(self.id2label) if self.id2label else 2

    @property
    def labels(self) -> list[str] | None:
        return [self.id2label[i] for i in range(len(self.id2label))] if self.id2label else None

    # --- Hugging Face config.json -------------------------------------------------------

    def to_dict(self, architecture: str | None = None) -> dict[str, Any]:
        family = self.family
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
            if f.name in OPTIONS:  # written by the families that have them, in their terms
                if f.name in family.options:
                    d[f.name] = value
                continue
            if f.name == "problem_type" and value is None:
                continue
            if f.name == "extra":  # None: transformers' default (pooler_hidden_size = hidden)
                d.update({k: v for k, v in (value or {}).items() if v is not None})
                continue
            if f.name == "model_type" or (f.name, value) in (
                ("features", "last"),
                ("classifier_pooling", "cls"),
            ):
                continue
            d[f.name] = value
        return family.write_fields(d)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BertConfig:
        family = family_of(d.get("model_type", "bert"))
        d = family.read_fields({**family.defaults, **d})
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in d.items() if k in known}  # unknown keys are ignored
        if d.get("id2label"):
            kwargs["id2label"] = {int(k): str(v) for k, v in d["id2label"].items()}
        elif "id2label" in kwargs:
            kwargs["id2label"] = None
        # config.json's own fields of these names mean something else in other families
        # (BertConfig's embedding_size is not a projection); the family reads its own.
        for option in OPTIONS:
            if option not in family.options or option not in d:
                kwargs.pop(option, None)
        if family.fields:
            kwargs["extra"] = {k: d.get(k, default) for k, default in family.fields.items()}
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


def _owners(option: str) -> str:
    """'an ALBERT, ELECTRA or DeBERTa-v2': the families that may set `option`, with the article."""
    owners = [f.name for f in FAMILIES.values() if option in f.options]
    names = " or ".join(filter(None, [", ".join(owners[:-1]), owners[-1]]))
    return ("an " if names[0] in "AEIOU" else "a ") + names
