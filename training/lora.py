"""LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models") on our BERT
encoder, and the adapter files that let many fine-tuned heads share one encoder (issue 52).

A wrapped linear map keeps its pretrained weight W frozen and learns a rank-r update:
y = W x + b + (alpha / r) B A dropout(x), with A (r, in) and B (out, r). B starts at zero, so
training starts from the pretrained model exactly. Initialisation and scaling are peft's
(`peft.tuners.lora.LoraLayer`), which tests/training/test_lora.py checks against.

    >>> model = load_model(MINILM, task="classification", labels=["negative", "positive"])
    >>> add_lora(model, rank=8, alpha=16, dropout=0.1, targets=["query", "value"])
    ['bert.encoder.layer.0.attention.self.query', 'bert.encoder.layer.0.attention.self.value', ...]
    >>> ...train: only the LoRA matrices and the head have requires_grad...
    >>> save_adapter(model, "runs/sst2/best", {"task": "classification",
    ...                                        "base": {"checkpoint": MINILM}})
    >>> merge_lora(model)            # plain nn.Linear again, W + (alpha / r) B A: save_model it

`python -m training.finetune --lora-rank 8` does all of this. An adapter folder holds
adapter.json (what was adapted, the encoder's digest, the head's tensor names) and
adapter.safetensors ("<module>.lora_A" (r, in), "<module>.lora_B" (out, r), and the head's
parameters under their own names); a --freeze-encoder run writes the same files with the head
alone (kind "frozen", rank 0).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from training.checkpoint import CheckpointError
from training.model import BertModel, BertSelfAttention

# short name -> the nn.Linear inside each encoder layer (training.model's BertLayer names)
TARGETS = {
    "query": "attention.self.query",
    "key": "attention.self.key",
    "value": "attention.self.value",
    "attention-output": "attention.output.dense",
    "intermediate": "intermediate.dense",
    "output": "output.dense",
}
ADAPTER_CONFIG = "adapter.json"
ADAPTER_WEIGHTS = "adapter.safetensors"
FORMAT = 1
# fine-tuning's task -> adapter.json's name for it (issue 52's adapter format says "qa")
ADAPTER_TASKS = {
    "classification": "classification",
    "token-classification": "token-classification",
    "question-answering": "qa",
}
ENCODER = "bert."  # the encoder's parameter names start here; its pooler belongs to the head
POOLER = "bert.pooler."
_LAYER = re.compile(r"\.layer\.\d+\.(.+)$")


class LoraLinear(nn.Module):
    """`base` (frozen) plus a rank-`rank` update scaled by alpha / rank. x (..., in) ->
    (..., out)."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float) -> None:
        super().__init__()
        self.base = base.requires_grad_(False)
        self.rank, self.alpha, self.dropout_p = rank, alpha, dropout
        self.scale = alpha / rank
        device, dtype = base.weight.device, base.weight.dtype
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features, device=device, dtype=dtype))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, device=device, dtype=dtype))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))  # peft's, as nn.Linear's own
        self.dropout = nn.Dropout(dropout) if dropout else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        update = F.linear(F.linear(self.dropout(x), self.lora_A), self.lora_B)  # (..., out)
        return self.base(x) + update * self.scale

    def merged(self) -> nn.Linear:
        """`base` with the update added to its weight, in the order peft's merge computes it
        ((B @ A) * scale, then added), so merged weights equal peft's to the last bit or two."""
        with torch.no_grad():
            self.base.weight += (self.lora_B @ self.lora_A) * self.scale
        return self.base

    def extra_repr(self) -> str:
        return f"rank={self.rank}, alpha={self.alpha:g}, dropout={self.dropout_p:g}"


def parse_targets(text: str) -> list[str]:
    """The short names of a comma list ("query,value"); an unknown one is a ValueError."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [t for t in names if t not in TARGETS]
    if unknown or not names:
        raise ValueError(
            f"LoRA targets {', '.join(unknown) or '(none)'}: choose from {', '.join(TARGETS)}"
        )
    return list(dict.fromkeys(names))


def lora_modules(model: nn.Module) -> dict[str, LoraLinear]:
    """The wrapped modules by the model's own names, in module order."""
    return {n: m for n, m in model.named_modules() if isinstance(m, LoraLinear)}


def _in_encoder(name: str) -> bool:
    return name.startswith(ENCODER) and not name.startswith(POOLER)


def add_lora(
    model: nn.Module, rank: int, alpha: float, dropout: float, targets: list[str]
) -> list[str]:
    """Wrap the `targets` (TARGETS' short names) of every encoder layer in LoraLinear, freeze
    the rest of the encoder; the head (pooler included) stays trainable. Returns the wrapped
    modules' names. Families whose encoder names its layers otherwise are a ValueError."""
    encoder = getattr(model, "bert", None)
    if not isinstance(encoder, BertModel):
        family = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
        raise ValueError(
            f"LoRA adapts the BERT layer's {', '.join(TARGETS.values())}; the {family} "
            "encoder has its own modules (training/families/): use full fine-tuning or "
            "--freeze-encoder"
        )
    if rank < 1:
        raise ValueError(f"LoRA rank must be at least 1, not {rank}")
    if lora_modules(model):
        raise ValueError("the model already has LoRA layers")
    paths = [TARGETS[t] for t in parse_targets(",".join(targets))]
    for name, p in model.named_parameters():
        if _in_encoder(name):
            p.requires_grad_(False)
    for layer in encoder.encoder.layer:
        for path in paths:
            parent_path, _, attr = path.rpartition(".")
            parent = layer.get_submodule(parent_path)
            setattr(parent, attr, LoraLinear(getattr(parent, attr), rank, alpha, dropout))
    for m in encoder.modules():
        if isinstance(m, BertSelfAttention) and any(
            isinstance(getattr(m, n), LoraLinear) for n in ("query", "key", "value")
        ):
            # Its fused path concatenates the three `.weight`s into one GEMM and would skip
            # the update; the three-GEMM path calls each module (the fusion saved ~2% of
            # BERT-base's step on an H200, BertSelfAttention.fuse_qkv).
            m.fuse_qkv = False
    return list(lora_modules(model))


def merge_lora(model: nn.Module) -> nn.Module:
    """Replace each LoraLinear by its base nn.Linear with W + (alpha / r) B A, in place; the
    attention fuses Q, K and V again. Returns `model`."""
    for name, module in lora_modules(model).items():
        parent_path, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent_path), attr, module.merged())
    for m in model.modules():
        if isinstance(m, BertSelfAttention):
            vars(m).pop("fuse_qkv", None)  # back to the class's setting
    return model


def _encoder_weights(model: nn.Module) -> dict[str, Tensor]:
    """The encoder's pretrained parameters under their names without LoRA wrappers."""
    wrapped = tuple(f"{n}.base." for n in lora_modules(model))
    out: dict[str, Tensor] = {}
    for name, p in model.named_parameters():
        if not _in_encoder(name) or name.endswith((".lora_A", ".lora_B")):
            continue
        for prefix in wrapped:
            if name.startswith(prefix):
                name = prefix.removesuffix("base.") + name.removeprefix(prefix)
        out[name] = p
    return out


def encoder_digest(model: nn.Module) -> str:
    """sha256 (hex) over the encoder's pretrained weights: for each parameter in name order,
    "name\\0dtype\\0shape\\0" then its values as float32 bytes. The pooler is the head's, so
    every head on one encoder has the same digest; add_lora does not change it."""
    h = hashlib.sha256()
    for name, p in sorted(_encoder_weights(model).items()):
        h.update(f"{name}\0{p.dtype}\0{tuple(p.shape)}\0".encode())
        h.update(p.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


def head_names(model: nn.Module) -> list[str]:
    """The parameters outside the encoder: pooler, classifier, pre_classifier,
    features.layer_weights, qa_outputs..."""
    return [n for n, _ in model.named_parameters() if not _in_encoder(n)]


def save_adapter(model: nn.Module, folder: str | Path, meta: dict[str, Any]) -> Path:
    """Write adapter.json and adapter.safetensors into `folder`. meta gives what the model
    cannot: {"task": fine-tuning's task, "base": {"checkpoint": --init as given}} (and
    optionally "digest", encoder_digest(model) computed once for a run's many saves); the rest
    is read from the model (no LoRA layers: kind "frozen", the head alone)."""
    if meta["task"] not in ADAPTER_TASKS:
        raise ValueError(f"adapters are for {', '.join(ADAPTER_TASKS)}, not {meta['task']!r}")
    modules = lora_modules(model)
    params = dict(model.named_parameters())
    head = head_names(model)
    tensors = {f"{n}.{p}": getattr(m, p) for n, m in modules.items() for p in ("lora_A", "lora_B")}
    tensors |= {n: params[n] for n in head}
    first = next(iter(modules.values()), None)
    record = {
        "format": FORMAT,
        "kind": "lora" if first else "frozen",
        "task": ADAPTER_TASKS[meta["task"]],
        "rank": first.rank if first else 0,
        "alpha": first.alpha if first else 0,
        "dropout": first.dropout_p if first else 0.0,
        "targets": [t for t, path in TARGETS.items() if any(_layer_path(n) == path for n in modules)],
        "modules": list(modules),
        "base": {
            "digest": meta["base"].get("digest") or encoder_digest(model),
            "checkpoint": meta["base"]["checkpoint"],
        },
        "head": head,
    }  # fmt: skip
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    weights = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    save_file(weights, folder / ADAPTER_WEIGHTS, metadata={"format": "pt"})
    (folder / ADAPTER_CONFIG).write_text(json.dumps(record, indent=2) + "\n")
    return folder


def _layer_path(name: str) -> str | None:
    """A module's path inside its layer: bert.encoder.layer.3.attention.self.query ->
    attention.self.query (None outside the layers)."""
    found = _LAYER.search(name)
    return found.group(1) if found else None


def load_adapter(folder: str | Path) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """adapter.json and the tensors of adapter.safetensors (on the CPU)."""
    folder = Path(folder)
    path = folder / ADAPTER_CONFIG
    if not path.is_file():
        raise CheckpointError(f"{folder}: no {ADAPTER_CONFIG} (not a LoRA or frozen-encoder run)")
    meta = json.loads(path.read_text())
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{path}: format {meta.get('format')!r}; this reads {FORMAT}")
    return meta, load_file(folder / ADAPTER_WEIGHTS)


def load_adapter_into(model: nn.Module, folder: str | Path) -> dict[str, Any]:
    """Load `folder`'s adapter into `model` (its base encoder, LoRA layers already added as the
    adapter says); checks the encoder's digest, the modules and every tensor's shape. Returns
    adapter.json."""
    folder = Path(folder)
    meta, tensors = load_adapter(folder)
    if meta["base"]["digest"] != encoder_digest(model):
        raise CheckpointError(
            f"{folder}: adapts another encoder than this model's; it was trained from "
            f"{meta['base']['checkpoint']}"
        )
    if meta["modules"] != list(lora_modules(model)):
        raise CheckpointError(
            f"{folder}: LoRA on {len(meta['modules'])} modules ({', '.join(meta['targets'])}), "
            f"rank {meta['rank']}; this model has {len(lora_modules(model))}"
        )
    expected = model.state_dict()
    wanted = {f"{n}.{p}" for n in meta["modules"] for p in ("lora_A", "lora_B")}
    wanted |= set(head_names(model))
    wrong = [
        f"{k} {tuple(v.shape)} (model {tuple(expected[k].shape)})"
        for k, v in tensors.items()
        if k in expected and v.shape != expected[k].shape
    ]
    if set(tensors) != wanted or wrong:
        missing, extra = sorted(wanted - set(tensors)), sorted(set(tensors) - wanted)
        raise CheckpointError(
            f"{folder / ADAPTER_WEIGHTS}: missing {missing}, unexpected {extra}, shapes {wrong}"
        )
    model.load_state_dict(tensors, strict=False)
    return meta
