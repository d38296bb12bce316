"""BertConfig: the encoder's shape, with Hugging Face field names so `config.json` interoperates.

>>> cfg = BertConfig.preset("mini", vocab_size=30522)
>>> cfg.save("runs/mini")                     # writes runs/mini/config.json
>>> BertConfig.load("runs/mini") == cfg
True
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# (layers, hidden): Turc et al. 2019, "Well-Read Students Learn Better" (tiny..medium) and
# Devlin et al. 2018 (base, large). Heads = hidden / 64, FFN = 4 * hidden, as in both papers.
PRESETS: dict[str, tuple[int, int]] = {
    "tiny": (2, 128),
    "mini": (4, 256),
    "small": (4, 512),
    "medium": (8, 512),
    "base": (12, 768),
    "large": (24, 1024),
}

PROBLEM_TYPES = ("single_label_classification", "multi_label_classification", "regression")


class ConfigError(ValueError):
    """A config.json that cannot describe a BERT encoder."""


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

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"hidden_size {self.hidden_size} is not a multiple of "
                f"num_attention_heads {self.num_attention_heads}"
            )
        if self.hidden_act not in ("gelu", "gelu_new", "relu", "gelu_pytorch_tanh"):
            raise ConfigError(f"hidden_act {self.hidden_act!r} is not supported")
        if self.problem_type is not None and self.problem_type not in PROBLEM_TYPES:
            raise ConfigError(f"problem_type {self.problem_type!r} is not one of {PROBLEM_TYPES}")

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
        return cls(**{**shape, **overrides})

    def replace(self, **changes: Any) -> BertConfig:
        return dataclasses.replace(self, **changes)

    @property
    def num_labels(self) -> int:
        return len(self.id2label) if self.id2label else 2

    @property
    def labels(self) -> list[str] | None:
        return [self.id2label[i] for i in range(len(self.id2label))] if self.id2label else None

    # --- Hugging Face config.json -------------------------------------------------------

    def to_dict(self, architecture: str | None = None) -> dict[str, Any]:
        d: dict[str, Any] = {"model_type": "bert"}
        if architecture:
            d["architectures"] = [architecture]
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "id2label":
                if value:
                    d["id2label"] = {str(k): v for k, v in value.items()}
                    d["label2id"] = {v: k for k, v in value.items()}
                continue
            if f.name == "problem_type" and value is None:
                continue
            d[f.name] = value
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BertConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in d.items() if k in known}  # unknown keys are ignored
        if d.get("id2label"):
            kwargs["id2label"] = {int(k): str(v) for k, v in d["id2label"].items()}
        elif "id2label" in kwargs:
            kwargs["id2label"] = None
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
