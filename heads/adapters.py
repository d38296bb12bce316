"""Many heads on one encoder: an encoder package (task "encoder") runs the shared forward pass,
and adapter packages hold only what differs per model, a LoRA update of some of the encoder's
linear layers and a head, or a head alone (trained on the frozen encoder).

    adapter = read_adapter(package)                    # an adapter package, beside its base
    feeds = stack_lora(base.encoder["lora"], [adapter])  # the encoder graph's LoRA inputs
    logits = adapter.head(last_hidden_state)           # one row: (T, H) -> {"logits": (C,)}

The encoder graph (training.adapters) takes every loaded adapter's LoRA matrices stacked,
(N + 1, in, r) and (N + 1, r, out) per adapted layer, slot 0 all zeros, and one slot number per
row (`adapter`): each row gathers its own, so one batch mixes rows of any adapters and of the
frozen heads (slot 0), and traffic spread over fifty adapter names still forms the batches one
model's would. A rank below the largest loaded is padded with zero columns, which add nothing.
The heads run here in numpy on the rows' hidden states: a pooler (dense + tanh) and a linear
layer, or a linear layer over one or several layers' states (Devlin et al. §5.3's features).

Plain numpy: the service and training.export (its parity check) run this same code.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ADAPTER_FILE = "adapter.npz"
ENCODER = "encoder"  # the base package's task
LAST_HIDDEN_STATE = "last_hidden_state"  # (B, T, H): every encoder package answers it
# (B, T, L + 1, H): every layer's states, fetched only for a head that reads other layers
ALL_HIDDEN_STATES = "hidden_states"
ADAPTER_INPUT = "adapter"  # (B,) int64: each row's slot in the stacked LoRA inputs
KINDS = ("lora", "frozen")
HEAD_KINDS = ("pooler", "cls", "mean", "tokens", "span")
COMBINES = ("concat", "sum")


class AdapterError(Exception):
    """An adapter package that cannot run over the encoder it names."""


def lora_inputs(k: int) -> tuple[str, str]:
    """The encoder graph's inputs for its k-th adapted layer: A (N, in, r), B (N, r, out)."""
    return f"lora_A.{k}", f"lora_B.{k}"


@dataclass(frozen=True, eq=False)
class Head:
    """What turns a row's hidden states into the task's outputs, as the trained model did.

    kind: "pooler" (classification: tanh(W h_[CLS] + b), then the classifier), "cls" (the
    first token's state), "mean" (the mean of the row's states), "tokens" (token
    classification: a state per token), "span" (question answering: start and end logits).
    layers: the hidden states a token or span head reads (indices into the L + 1 states; -1
    the last), combined by `combine` ("concat", or "sum" with `layer_weights`)."""

    kind: str
    weight: np.ndarray  # (C, F)
    bias: np.ndarray  # (C,)
    pooler_weight: np.ndarray | None = None  # (H, H)
    pooler_bias: np.ndarray | None = None
    layers: tuple[int, ...] = (-1,)
    combine: str = "concat"
    layer_weights: np.ndarray | None = None  # (len(layers),) for "sum"

    @property
    def wants(self) -> frozenset[str]:
        """The encoder outputs it reads beyond the last hidden state."""
        return frozenset() if self.layers == (-1,) else frozenset({ALL_HIDDEN_STATES})

    def features(self, row: Mapping[str, np.ndarray]) -> np.ndarray:
        """(T, F): the states the head reads, per token."""
        if self.layers == (-1,):
            return row[LAST_HIDDEN_STATE]
        states = row[ALL_HIDDEN_STATES]  # (T, L + 1, H)
        chosen = [states[:, i] for i in self.layers]
        if self.combine == "sum":
            assert self.layer_weights is not None
            return np.einsum("k,kth->th", self.layer_weights, np.stack(chosen))
        return np.concatenate(chosen, axis=-1)

    def __call__(self, row: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One row's outputs, named as the task's graph names them (heads.contract)."""
        x = self.features(row)
        if self.kind in ("pooler", "cls", "mean"):
            v = x.mean(axis=0) if self.kind == "mean" else x[0]
            if self.kind == "pooler":
                assert self.pooler_weight is not None and self.pooler_bias is not None
                v = np.tanh(self.pooler_weight @ v + self.pooler_bias)
            return {"logits": (self.weight @ v + self.bias).astype(np.float32)}
        logits = (x @ self.weight.T + self.bias).astype(np.float32)  # (T, C)
        if self.kind == "span":
            return {"start_logits": logits[:, 0], "end_logits": logits[:, 1]}
        return {"logits": logits}


@dataclass(frozen=True, eq=False)
class Adapter:
    """An adapter package's weights: its LoRA matrices per adapted layer of the encoder (scale
    alpha / r folded into B) and its head. Compared by identity: the encoder backend keeps
    each loaded one's slot."""

    name: str
    kind: str  # "lora" or "frozen" (no LoRA: the encoder's own states)
    rank: int
    base_digest: str  # the encoder weights it was trained on (training.lora.encoder_digest)
    lora: dict[str, tuple[np.ndarray, np.ndarray]]  # module -> A (in, r), B (r, out)
    head: Head

    @property
    def nbytes(self) -> int:
        arrays = [a for pair in self.lora.values() for a in pair]
        head = self.head
        arrays += [head.weight, head.bias]
        arrays += [
            a for a in (head.pooler_weight, head.pooler_bias, head.layer_weights) if a is not None
        ]
        return sum(a.nbytes for a in arrays)


def read_adapter(folder: Path, name: str, block: Mapping[str, Any]) -> Adapter:
    """The adapter of the package in `folder` (its package.json `adapter` block, checked by
    heads.package): adapter.npz's arrays, checked against the block."""
    with np.load(folder / ADAPTER_FILE) as npz:
        arrays = {key: npz[key].astype(np.float32) for key in npz.files}

    def need(key: str) -> np.ndarray:
        if key not in arrays:
            raise AdapterError(f"{folder / ADAPTER_FILE}: no array {key!r}")
        return arrays[key]

    spec = block["head"]
    head = Head(
        kind=spec["kind"],
        weight=need("head.weight"),
        bias=need("head.bias"),
        pooler_weight=arrays.get("head.pooler_weight"),
        pooler_bias=arrays.get("head.pooler_bias"),
        layers=tuple(spec.get("layers", (-1,))),
        combine=spec.get("combine", "concat"),
        layer_weights=arrays.get("head.layer_weights"),
    )
    if head.kind == "pooler" and (head.pooler_weight is None or head.pooler_bias is None):
        raise AdapterError(f"{folder / ADAPTER_FILE}: a pooler head needs head.pooler_weight/bias")
    if head.combine == "sum" and head.layers != (-1,) and head.layer_weights is None:
        raise AdapterError(f"{folder / ADAPTER_FILE}: a summed head needs head.layer_weights")
    lora: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for module in block.get("modules", []):
        a, b = need(f"lora.{module}.A"), need(f"lora.{module}.B")
        if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
            raise AdapterError(
                f"{folder / ADAPTER_FILE}: {module}: A {a.shape} and B {b.shape} do not chain"
            )
        lora[module] = (a, b)
    return Adapter(name, block["kind"], int(block["rank"]), block["base"]["digest"], lora, head)


def check_fits(adapter: Adapter, encoder: Mapping[str, Any]) -> str | None:
    """Why `adapter` cannot run over the encoder package whose `encoder` block this is; None
    when it can."""
    if adapter.base_digest != encoder["digest"]:
        return (
            f"it was trained on encoder weights {adapter.base_digest[:12]}, this encoder holds "
            f"{encoder['digest'][:12]}"
        )
    slots = {s["module"]: s for s in encoder["lora"]}
    if missing := sorted(set(adapter.lora) - set(slots)):
        return (
            f"it adapts {', '.join(missing)}, which the encoder graph has no LoRA input for "
            f"(export the encoder with --lora-targets {','.join(encoder.get('targets', []))} "
            "and the adapter's)"
        )
    for module, (a, b) in adapter.lora.items():
        if (a.shape[0], b.shape[1]) != (slots[module]["in"], slots[module]["out"]):
            return f"{module}: its matrices are {a.shape} x {b.shape}, the layer's {slots[module]}"
    hidden = encoder["hidden_size"]
    width = hidden * (len(adapter.head.layers) if adapter.head.combine == "concat" else 1)
    if adapter.head.weight.shape[1] != width:
        return f"its head reads {adapter.head.weight.shape[1]} values a token, the encoder gives {width}"
    return None


def stack_lora(
    slots: Sequence[Mapping[str, Any]], adapters: Sequence[Adapter]
) -> dict[str, np.ndarray]:
    """The encoder graph's LoRA inputs for `adapters` in slots 1..N (slot 0: zeros, for rows of
    frozen heads and of the encoder itself): per adapted layer k, lora_A.k (N + 1, in, r) and
    lora_B.k (N + 1, r, out), r the largest rank (at least 1), smaller ones zero-padded."""
    rank = max([1, *(a.rank for a in adapters)])
    feeds: dict[str, np.ndarray] = {}
    for k, slot in enumerate(slots):
        module = slot["module"]
        A = np.zeros((len(adapters) + 1, slot["in"], rank), dtype=np.float32)
        B = np.zeros((len(adapters) + 1, rank, slot["out"]), dtype=np.float32)
        for n, adapter in enumerate(adapters, start=1):
            if module in adapter.lora:
                a, b = adapter.lora[module]
                A[n, :, : a.shape[1]] = a
                B[n, : b.shape[0]] = b
        name_a, name_b = lora_inputs(k)
        feeds[name_a], feeds[name_b] = A, B
    return feeds
