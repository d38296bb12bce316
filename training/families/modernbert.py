"""ModernBERT (Warner et al. 2024): the encoder and its heads, equal to transformers' padded path.

What differs from BERT, and where it lives here:

* no position table and no token types: rotary position embeddings (RoPE) rotate queries and
  keys inside attention (`RotaryEmbedding`), with a long-range theta on global layers and a
  short-range one on local layers;
* alternating attention: every `global_attn_every_n_layers`-th layer (layer index % n == 0)
  attends to the whole row, the others only to a sliding window of `local_attention` tokens
  centred on the query (`attention_biases`);
* pre-norm layers (LayerNorm before attention and before the MLP, residual added after), with
  no norm before the first layer's attention (the embeddings were just normed), and one final
  LayerNorm after the last layer;
* a GeGLU MLP: `Wi` makes two halves, one activated, the other a linear gate multiplying it;
* LayerNorms and Linears without biases by default (`norm_bias`, `attention_bias`, `mlp_bias`).

Module and parameter names are transformers' `ModernBertModel` ones (`embeddings.tok_embeddings`,
`layers.{i}.attn.Wqkv`, `layers.{i}.mlp.Wi`, `final_norm`, ...), so its state dict loads one to
one. This is the padded path transformers takes with `attn_implementation="eager"` or "sdpa"
(not the unpadded flash-attention one): every row keeps its T positions, padding is masked out
of the keys, and positions count 0..T-1 from the left of the row (rows are right-padded).

Everything that depends on T (rotary cos/sin, the window mask) is built at run time from
`torch.arange` on the input's shape, so one ONNX export (TorchScript exporter) serves any batch
size and any length, including rows longer than the local window.

`config` is any object with transformers' `ModernBertConfig` attribute names; optional ones are
read with transformers' defaults.

Shapes: B batch, T tokens, H hidden, nh heads, hs head size (H / nh), I intermediate size,
V vocabulary, C labels.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from training.blocks import ACTIVATIONS, activation
from training.families.base import ConfigError, Family, architectures, rename_by_prefix

POOLINGS = ("cls", "mean")


def _layer_norm(config: Any) -> nn.LayerNorm:
    return nn.LayerNorm(
        config.hidden_size,
        eps=getattr(config, "norm_eps", 1e-5),
        bias=getattr(config, "norm_bias", False),
    )


def is_global_layer(config: Any, layer_id: int) -> bool:
    """Layer 0, n, 2n, ... attend globally; the others through the sliding window."""
    return layer_id % getattr(config, "global_attn_every_n_layers", 3) == 0


# --- attention masks --------------------------------------------------------------------


def attention_biases(
    attention_mask: Tensor, window: int, dtype: torch.dtype
) -> tuple[Tensor, Tensor]:
    """Additive attention biases for global and local layers, 0 where a query may attend a
    key and the dtype's minimum where it may not.

    attention_mask (B, T) 1 for real tokens, 0 for padding -> global (B, 1, 1, T) (padding
    keys masked, broadcast over heads and queries) and local (B, 1, T, T) (padding keys and
    keys more than window // 2 positions from the query masked).

    The window is `local_attention` tokens centred on the query: window // 2 to each side
    (ModernBERT's flash path passes window_size=(w // 2, w // 2)), the query included.

    The minimum, not -inf: a padding query far past its row's end has every key masked, and
    a row of -inf would softmax to NaN, which padding keys would then carry into real tokens
    of the next layer (0 weight x NaN value = NaN). With the finite minimum such a row just
    averages, as transformers' does; real tokens never read it.
    """
    T = attention_mask.shape[1]
    key_real = attention_mask.bool()[:, None, None, :]  # (B, 1, 1, T)
    # Built from arange on the run-time T, so an exported graph works at any length.
    position = torch.arange(T, device=attention_mask.device)
    distance = (position[:, None] - position[None, :]).abs()  # (T, T) |query - key|
    near = distance <= window // 2
    local_allowed = key_real & near[None, None]  # (B, 1, T, T)
    return _bias(key_real, dtype), _bias(local_allowed, dtype)


def _bias(allowed: Tensor, dtype: torch.dtype) -> Tensor:
    """bool -> 0 where True, the dtype's minimum where False."""
    return torch.zeros_like(allowed, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)


# --- rotary position embeddings ---------------------------------------------------------


class RotaryEmbedding(nn.Module):
    """RoPE (Su et al. 2021) in the rotate-half layout: head dimension i and i + hs/2 form a
    pair rotated by angle position * theta^(-2i/hs). No parameters: `inv_freq` is a
    non-persistent buffer (not in the state dict, as in transformers)."""

    inv_freq: Tensor

    def __init__(self, head_size: int, theta: float) -> None:
        super().__init__()
        exponent = torch.arange(0, head_size, 2, dtype=torch.int64).float() / head_size
        self.register_buffer("inv_freq", 1.0 / (theta**exponent), persistent=False)  # (hs/2,)

    def forward(self, T: int, device: torch.device) -> tuple[Tensor, Tensor]:
        """cos, sin (T, hs) for positions 0..T-1, in float32 (RoPE angles need it)."""
        position = torch.arange(T, device=device).float()
        angles = position[:, None] * self.inv_freq[None, :]  # (T, hs/2)
        angles = torch.cat((angles, angles), dim=-1)  # both halves of a pair share an angle
        return angles.cos(), angles.sin()

    @staticmethod
    def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """x (B, nh, T, hs) rotated: each pair (a, b) -> (a cos - b sin, b cos + a sin)."""
        a, b = x.chunk(2, dim=-1)
        rotated_half = torch.cat((-b, a), dim=-1)
        return x * cos.to(x.dtype) + rotated_half * sin.to(x.dtype)


# --- encoder ----------------------------------------------------------------------------


class ModernBertEmbeddings(nn.Module):
    """Token embeddings, LayerNorm, dropout: (B, T) ids -> (B, T, H). Positions enter later,
    through RoPE in every attention layer."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        pad = getattr(config, "pad_token_id", 50283)
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=pad)
        self.norm = _layer_norm(config)
        self.drop = nn.Dropout(getattr(config, "embedding_dropout", 0.0))

    def forward(self, input_ids: Tensor) -> Tensor:
        return self.drop(self.norm(self.tok_embeddings(input_ids)))


class ModernBertAttention(nn.Module):
    """Multi-head self-attention with one fused Q/K/V projection and RoPE on queries and keys.
    Global or local (sliding window) by layer index; the caller passes the matching bias."""

    def __init__(self, config: Any, layer_id: int) -> None:
        super().__init__()
        H, nh = config.hidden_size, config.num_attention_heads
        if H % nh:
            raise ValueError(f"hidden_size {H} is not a multiple of num_attention_heads {nh}")
        self.num_heads, self.head_size = nh, H // nh
        self.is_global = is_global_layer(config, layer_id)
        global_theta = getattr(config, "global_rope_theta", 160000.0)
        local_theta = getattr(config, "local_rope_theta", 10000.0)
        # Local layers only ever see nearby tokens, so they use a smaller theta (faster
        # rotations, finer resolution at short range); None means "same as global".
        theta = global_theta if self.is_global or local_theta is None else local_theta
        bias = getattr(config, "attention_bias", False)
        self.dropout_p = getattr(config, "attention_dropout", 0.0)
        self.Wqkv = nn.Linear(H, 3 * H, bias=bias)
        self.rotary_emb = RotaryEmbedding(self.head_size, theta)
        self.Wo = nn.Linear(H, H, bias=bias)
        self.out_drop = nn.Dropout(self.dropout_p)

    def forward(self, x: Tensor, bias: Tensor) -> Tensor:
        """x (B, T, H), bias broadcastable to (B, nh, T, T) -> (B, T, H)."""
        B, T, H = x.shape
        # Wqkv's output columns are [Q | K | V], each H wide and split into nh heads of hs.
        qkv = self.Wqkv(x).view(B, T, 3, self.num_heads, self.head_size)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # 3 x (B, nh, T, hs)
        cos, sin = self.rotary_emb(T, x.device)
        q, k = RotaryEmbedding.rotate(q, cos, sin), RotaryEmbedding.rotate(k, cos, sin)
        dropout_p = self.dropout_p if self.training else 0.0
        # softmax(q k^T / sqrt(hs) + bias) v
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p)
        out = out.transpose(1, 2).reshape(B, T, H)  # heads back side by side
        return self.out_drop(self.Wo(out))


class ModernBertMLP(nn.Module):
    """GeGLU: Wi (H -> 2 I) gives an input half and a gate half; act(input) * gate (I), so
    the gate, a plain linear map, scales each activated unit per token; Wo (I -> H)."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        H, intermediate = config.hidden_size, int(config.intermediate_size)
        bias = getattr(config, "mlp_bias", False)
        self.Wi = nn.Linear(H, 2 * intermediate, bias=bias)
        self.act = activation(getattr(config, "hidden_activation", "gelu"))
        self.drop = nn.Dropout(getattr(config, "mlp_dropout", 0.0))
        self.Wo = nn.Linear(intermediate, H, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        """x (B, T, H) -> (B, T, H)."""
        value, gate = self.Wi(x).chunk(2, dim=-1)  # 2 x (B, T, I): first half, second half
        return self.Wo(self.drop(self.act(value) * gate))


class ModernBertEncoderLayer(nn.Module):
    """Pre-norm block: x + attn(attn_norm(x)), then x + mlp(mlp_norm(x)). Layer 0 has no
    attn_norm (Identity): its input is the embeddings, already LayerNormed."""

    def __init__(self, config: Any, layer_id: int) -> None:
        super().__init__()
        self.attn_norm: nn.Module = nn.Identity() if layer_id == 0 else _layer_norm(config)
        self.attn = ModernBertAttention(config, layer_id)
        self.mlp_norm = _layer_norm(config)
        self.mlp = ModernBertMLP(config)

    def forward(self, x: Tensor, global_bias: Tensor, local_bias: Tensor) -> Tensor:
        """x (B, T, H) -> (B, T, H); the attention reads the bias of its kind."""
        bias = global_bias if self.attn.is_global else local_bias
        x = x + self.attn(self.attn_norm(x), bias)
        return x + self.mlp(self.mlp_norm(x))


class ModernBertEncoder(nn.Module):
    """transformers' `ModernBertModel` (same state dict keys): embeddings, L layers, final
    LayerNorm.

    forward returns L + 1 hidden states (B, T, H), embeddings first, like the BERT encoder's
    list. Against transformers' `output_hidden_states=True` tuple `hs` (also L + 1 long, whose
    last entry is the last layer's output *before* final_norm):

        ours[i] == hs[i]                                   for i in 0..L-1
        ours[L] == final_norm(hs[L]) == last_hidden_state  (the last layer, final-normed)

    so `ours[-1]` is what heads read. The last layer's un-normed output is not returned.
    """

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.local_attention = getattr(config, "local_attention", 128)
        self.embeddings = ModernBertEmbeddings(config)
        self.layers = nn.ModuleList(
            ModernBertEncoderLayer(config, i) for i in range(config.num_hidden_layers)
        )
        self.final_norm = _layer_norm(config)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
    ) -> list[Tensor]:
        """input_ids, attention_mask (B, T) (1 real token, 0 padding; None: all real).
        token_type_ids is accepted for the BERT call signature and ignored: ModernBERT has
        none. Returns L + 1 tensors (B, T, H), the last one final-normed (see the class)."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        x = self.embeddings(input_ids)
        global_bias, local_bias = attention_biases(attention_mask, self.local_attention, x.dtype)
        hidden = [x]
        for layer in self.layers:
            x = layer(x, global_bias, local_bias)
            hidden.append(x)
        hidden[-1] = self.final_norm(x)
        return hidden


# --- heads ------------------------------------------------------------------------------


class ModernBertPredictionHead(nn.Module):
    """dense (H -> H, bias if classifier_bias) -> classifier_activation -> LayerNorm: the
    transform every ModernBERT head (classification, tokens, QA, masked LM) applies first.
    (..., H) -> (..., H)."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        H = config.hidden_size
        self.dense = nn.Linear(H, H, bias=getattr(config, "classifier_bias", False))
        self.act = activation(getattr(config, "classifier_activation", "gelu"))
        self.norm = _layer_norm(config)

    def forward(self, hidden: Tensor) -> Tensor:
        return self.norm(self.act(self.dense(hidden)))


def _tied_decoder(config: Any, tok_embeddings: nn.Embedding) -> nn.Linear:
    """H -> V, bias if decoder_bias, whose weight is the token embedding matrix (tied: the
    same Parameter)."""
    bias = getattr(config, "decoder_bias", True)
    decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=bias)
    decoder.weight = tok_embeddings.weight
    return decoder


class ModernBertMaskedLMHead(nn.Module):
    """transformers' `ModernBertForMaskedLM` minus its `model`: `head` (the prediction head)
    then `decoder` (H -> V, bias if decoder_bias) whose weight is the token embedding matrix
    (tied: the same Parameter). hidden (B, T, H) -> logits (B, T, V)."""

    def __init__(self, config: Any, tok_embeddings: nn.Embedding) -> None:
        super().__init__()
        self.head = ModernBertPredictionHead(config)
        self.decoder = _tied_decoder(config, tok_embeddings)

    def forward(self, hidden: Tensor) -> Tensor:
        return self.decoder(self.head(hidden))


class ModernBertDecoder(nn.Module):
    """The masked-LM head's second half, as training.model's fill-mask head holds it: the
    family's `head` (ModernBertPredictionHead) sits where every task head has it, named `head`
    as in transformers, and this module, `cls`, holds `decoder` (transformers' top-level
    `decoder`). (B, T, H) after the head -> logits (B, T, V)."""

    def __init__(self, config: Any, tok_embeddings: nn.Embedding) -> None:
        super().__init__()
        self.decoder = _tied_decoder(config, tok_embeddings)

    def forward(self, hidden: Tensor) -> Tensor:
        return self.decoder(hidden)


# --- the family ---------------------------------------------------------------------------

# BertConfig's fields that ModernBertConfig names otherwise: ours <- theirs. Our heads read
# hidden_dropout_prob before their linear layer (theirs: classifier_dropout).
_AS_OURS = {
    "hidden_act": "hidden_activation",
    "layer_norm_eps": "norm_eps",
    "hidden_dropout_prob": "classifier_dropout",
    "attention_probs_dropout_prob": "attention_dropout",
}
FIELDS: dict[str, Any] = {
    "hidden_activation": "gelu",
    "norm_eps": 1e-5,
    "norm_bias": False,
    "global_rope_theta": 160000.0,
    "local_rope_theta": 10000.0,
    "global_attn_every_n_layers": 3,
    "local_attention": 128,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "embedding_dropout": 0.0,
    "mlp_bias": False,
    "mlp_dropout": 0.0,
    "decoder_bias": True,
    "classifier_bias": False,
    "classifier_activation": "gelu",
    "classifier_dropout": 0.0,
    # the tokenizer's ids, which the encoder never reads; kept so that config.json round-trips
    "cls_token_id": 50281,
    "sep_token_id": 50282,
    "bos_token_id": 50281,
    "eos_token_id": 50282,
}


def _read_fields(d: dict[str, Any]) -> dict[str, Any]:
    theirs = FIELDS | d
    return d | {ours: theirs[name] for ours, name in _AS_OURS.items()} | {"type_vocab_size": 0}


def _write_fields(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if k not in _AS_OURS and k != "type_vocab_size"}


def _check(config: Any) -> None:
    for name in ("hidden_activation", "classifier_activation"):
        if (value := getattr(config, name, "gelu")) not in ACTIVATIONS:
            raise ConfigError(f"{name} {value!r} is not one of {', '.join(ACTIVATIONS)}")
    if getattr(config, "global_attn_every_n_layers", 3) < 1:
        raise ConfigError("global_attn_every_n_layers must be at least 1")
    if config.classifier_pooling not in POOLINGS:
        raise ConfigError(
            f"classifier_pooling {config.classifier_pooling!r}: ModernBERT's classifier pools "
            f"{' or '.join(POOLINGS)}"
        )


FAMILY = Family(
    model_type="modernbert",
    name="ModernBERT",
    prefix="model.",
    architectures=architectures("ModernBert"),
    to_hf=rename_by_prefix((("bert.", "model."), ("cls.decoder.", "decoder."))),
    from_hf=rename_by_prefix(
        (
            ("model.", "bert."),
            *((p, "bert." + p) for p in ("embeddings.", "layers.", "final_norm.")),  # bare
            # ModernBertForMaskedLM's decoder, our `cls` (fill-mask; its `head` is the task
            # heads' `head` too, as in transformers); the other heads drop it with
            # checkpoint.py's note
            ("decoder.", "cls.decoder."),
        )
    ),
    classifier="head",
    qa_outputs="classifier",  # ModernBertForQuestionAnswering's span layer
    defaults={"pad_token_id": 50283, "max_position_embeddings": 8192},
    read_fields=_read_fields,
    write_fields=_write_fields,
    check=_check,
    has_pooler=False,
    token_types="never",
    fields=FIELDS,
    encoder=ModernBertEncoder,
    head=ModernBertPredictionHead,
    masked_lm=ModernBertDecoder,
    masked_lm_names=("cls.decoder.bias",),
)
