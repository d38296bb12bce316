"""MPNet (Song et al. 2020): a post-norm BERT-style encoder with RoBERTa's position ids and a
T5-style relative position bias, plus the heads transformers puts on top of it.

Module and parameter names are transformers' (`MPNetModel`, `MPNetClassificationHead`,
`MPNetLMHead`), so a Hugging Face state dict loads one to one:

    >>> encoder = MPNetEncoder(config)  # any object with MPNetConfig's attribute names
    >>> encoder.load_state_dict(hf_mpnet_model.state_dict())
    >>> hidden = encoder(input_ids, attention_mask)  # L + 1 tensors (B, T, H)

transformers' `embeddings.position_ids` buffer is non-persistent (absent from its state dict),
and this module has no such buffer: position ids are computed from input_ids every call.

What differs from BERT:
- no token type embeddings (`token_type_ids` is accepted and ignored);
- position ids count real tokens from padding_idx + 1 and leave padding at padding_idx, as in
  RoBERTa (so left and right padding embed the same);
- every layer adds one relative position bias (nh, T, T) to its attention scores.

Two transformers behaviours are kept as they are, so weights and outputs match exactly:
- the padding id is 1 whatever `config.pad_token_id` says (MPNet's vocabulary pads with 1);
- bucket ids are computed with 32 buckets whatever `config.relative_attention_num_buckets`
  says; that setting only sizes the bias table (every released checkpoint uses 32).

Shapes: B batch, T tokens, H hidden, nh heads, hs head size (H / nh), V vocabulary, C labels.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from training.blocks import BertIntermediate, BertOutput
from training.families.base import ConfigError, Family, architectures, rename_by_prefix

PADDING_IDX = 1  # transformers' MPNetEmbeddings hard-codes it
NUM_BUCKETS = 32  # the bucketing transformers applies (its compute_position_bias default)
MAX_DISTANCE = 128  # offsets this far apart or more share the last bucket of their direction


def position_ids_from_input_ids(input_ids: Tensor, padding_idx: int = PADDING_IDX) -> Tensor:
    """input_ids (B, T) -> position ids (B, T): real tokens numbered padding_idx + 1, + 2, ...
    in order, padding tokens left at padding_idx (whose position embedding is never trained)."""
    is_real = (input_ids != padding_idx).long()
    return torch.cumsum(is_real, dim=1) * is_real + padding_idx


def relative_position_bucket(
    relative_position: Tensor, num_buckets: int = NUM_BUCKETS, max_distance: int = MAX_DISTANCE
) -> Tensor:
    """Key position minus query position (any shape, int64) -> bucket ids in [0, num_buckets).

    Bidirectional: keys before the query use the lower half of the buckets, keys after it the
    upper half. Within a half, the first half of its buckets hold one exact offset each (the
    neighbouring words, whose exact distance matters); the rest are log-spaced up to
    max_distance, because far away only the rough distance matters, and a logarithm spends few
    buckets on a long range. Offsets of max_distance or more share the last bucket.
    """
    half = num_buckets // 2
    bucket = (relative_position > 0).long() * half  # the key comes after the query
    distance = relative_position.abs()
    n_exact = half // 2
    # The log branch is only used where distance >= n_exact; clamping there first keeps log(0)
    # out of the graph (its -inf cast to int64 would be undefined, even if discarded).
    far = distance.float().clamp(min=n_exact)
    # Same float expression as transformers, so bucket edges round the same way; the int64
    # cast truncates, i.e. floors these non-negative values.
    log_bucket = (
        n_exact
        + (torch.log(far / n_exact) / math.log(max_distance / n_exact) * (half - n_exact)).long()
    )
    log_bucket = torch.clamp(log_bucket, max=half - 1)
    return bucket + torch.where(distance < n_exact, distance, log_bucket)


# --- encoder ----------------------------------------------------------------------------


class MPNetEmbeddings(nn.Module):
    """Word + position embeddings, LayerNorm, dropout. No token types."""

    def __init__(self, config) -> None:
        super().__init__()
        H = config.hidden_size
        self.word_embeddings = nn.Embedding(config.vocab_size, H, padding_idx=PADDING_IDX)
        self.position_embeddings = nn.Embedding(
            config.max_position_embeddings, H, padding_idx=PADDING_IDX
        )
        self.LayerNorm = nn.LayerNorm(H, eps=getattr(config, "layer_norm_eps", 1e-12))
        self.dropout = nn.Dropout(getattr(config, "hidden_dropout_prob", 0.1))

    def forward(self, input_ids: Tensor) -> Tensor:
        """input_ids (B, T) -> (B, T, H)."""
        positions = position_ids_from_input_ids(input_ids)
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions)
        return self.dropout(self.LayerNorm(x))


class MPNetSelfAttention(nn.Module):
    """Multi-head attention whose scores get an additive bias: the relative position bias plus
    the padding mask, one tensor computed once per forward (see MPNetStack)."""

    def __init__(self, config) -> None:
        super().__init__()
        H = config.hidden_size
        if H % config.num_attention_heads:
            raise ValueError(f"hidden_size {H} is not a multiple of num_attention_heads")
        self.num_heads = config.num_attention_heads
        self.head_size = H // self.num_heads
        self.q = nn.Linear(H, H)
        self.k = nn.Linear(H, H)
        self.v = nn.Linear(H, H)
        self.o = nn.Linear(H, H)
        self.dropout = nn.Dropout(getattr(config, "attention_probs_dropout_prob", 0.1))

    def split_heads(self, x: Tensor) -> Tensor:
        """(B, T, H) -> (B, nh, T, hs)."""
        return x.view(x.size(0), -1, self.num_heads, self.head_size).transpose(1, 2)

    def forward(self, x: Tensor, attn_bias: Tensor) -> Tensor:
        """x (B, T, H); attn_bias (B, nh, T, T) or broadcastable to it. Returns (B, T, H)."""
        q = self.split_heads(self.q(x))
        k = self.split_heads(self.k(x))
        v = self.split_heads(self.v(x))
        # Matmul, then scale (transformers' order, so rounding matches), then the bias.
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_size)
        probs = self.dropout(torch.softmax(scores + attn_bias, dim=-1))  # (B, nh, T, T)
        y = torch.matmul(probs, v).transpose(1, 2)  # (B, T, nh, hs)
        return self.o(y.reshape(x.shape))


class MPNetAttention(nn.Module):
    """Self-attention, dropout, residual, LayerNorm (post-norm)."""

    def __init__(self, config) -> None:
        super().__init__()
        self.attn = MPNetSelfAttention(config)
        self.LayerNorm = nn.LayerNorm(
            config.hidden_size, eps=getattr(config, "layer_norm_eps", 1e-12)
        )
        self.dropout = nn.Dropout(getattr(config, "hidden_dropout_prob", 0.1))

    def forward(self, x: Tensor, attn_bias: Tensor) -> Tensor:
        """x (B, T, H) -> (B, T, H)."""
        return self.LayerNorm(self.dropout(self.attn(x, attn_bias)) + x)


class MPNetLayer(nn.Module):
    """One post-norm transformer layer: attention block, then feed-forward block."""

    def __init__(self, config) -> None:
        super().__init__()
        self.attention = MPNetAttention(config)
        self.intermediate = BertIntermediate(config)  # the feed-forward block is BERT's
        self.output = BertOutput(config)

    def forward(self, x: Tensor, attn_bias: Tensor) -> Tensor:
        """x (B, T, H) -> (B, T, H)."""
        x = self.attention(x, attn_bias)
        return self.output(self.intermediate(x), x)


class MPNetStack(nn.Module):
    """The layers and the relative position bias table they share (transformers' module
    `encoder`, there called MPNetEncoder)."""

    def __init__(self, config) -> None:
        super().__init__()
        self.layer = nn.ModuleList(MPNetLayer(config) for _ in range(config.num_hidden_layers))
        # One learned scalar per (bucket, head). Every layer reads the same table: MPNet
        # learns one notion of "how much to attend at this offset" per head, not per layer,
        # and the bias is computed once per forward instead of L times.
        num_buckets = getattr(config, "relative_attention_num_buckets", NUM_BUCKETS)
        self.relative_attention_bias = nn.Embedding(num_buckets, config.num_attention_heads)

    def position_bias(self, seq_len: int) -> Tensor:
        """The relative position bias for T = seq_len tokens: (1, nh, T, T).

        Built from torch.arange on the actual length at run time, so an exported graph
        computes it for whatever T it is fed, not the length it was traced with.
        """
        positions = torch.arange(seq_len, device=self.relative_attention_bias.weight.device)
        relative = positions[None, :] - positions[:, None]  # (T, T): key minus query
        buckets = relative_position_bucket(relative)
        bias = self.relative_attention_bias(buckets)  # (T, T, nh)
        return bias.permute(2, 0, 1).unsqueeze(0)

    def forward(self, x: Tensor, mask_bias: Tensor) -> list[Tensor]:
        """x (B, T, H) the embeddings; mask_bias (B, 1, 1, T), 0 at real tokens and a large
        negative at padding. Returns the embeddings and every layer's output: L + 1 (B, T, H).
        """
        # Position bias and padding mask are both added to every layer's scores: add them
        # together once. At real keys the mask adds 0, so nothing rounds differently.
        attn_bias = self.position_bias(x.shape[1]) + mask_bias  # (B, nh, T, T)
        hidden = [x]
        for layer in self.layer:
            x = layer(x, attn_bias)
            hidden.append(x)
        return hidden


class MPNetPooler(nn.Module):
    """transformers' MPNetModel pooler: dense + tanh on the first token. Not used by any head
    (classification has its own dense + tanh); kept so checkpoints that carry it load."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)

    def forward(self, hidden: Tensor) -> Tensor:
        """hidden (B, T, H) -> (B, H)."""
        return torch.tanh(self.dense(hidden[:, 0]))


class MPNetEncoder(nn.Module):
    """MPNet's encoder, transformers' `MPNetModel` parameter for parameter.

    `config`: any object with transformers' MPNetConfig attribute names. `add_pooling_layer`
    builds `pooler` (transformers' default is True; ours False, as no head uses it): call
    `encoder.pooler(hidden[-1])` for its (B, H) output.
    """

    def __init__(self, config, add_pooling_layer: bool = False) -> None:
        super().__init__()
        self.embeddings = MPNetEmbeddings(config)
        self.encoder = MPNetStack(config)
        self.pooler = MPNetPooler(config.hidden_size) if add_pooling_layer else None

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
    ) -> list[Tensor]:
        """input_ids (B, T); attention_mask (B, T), 1 at real tokens, 0 at padding (all ones if
        None); token_type_ids ignored (MPNet has none). Returns the L + 1 hidden states
        (B, T, H), embeddings first, as transformers' `output_hidden_states=True`."""
        x = self.embeddings(input_ids)
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        # (B, 1, 1, T): broadcast over heads and queries. The dtype's most negative finite
        # value rather than -inf, as transformers, so exp() gives exactly 0 without NaNs.
        keep = attention_mask[:, None, None, :].to(x.dtype)
        mask_bias = (1.0 - keep) * torch.finfo(x.dtype).min
        return self.encoder(x, mask_bias)


# --- heads ------------------------------------------------------------------------------


class MPNetClassificationHead(nn.Module):
    """transformers' MPNetClassificationHead: the first token (<s>), dropout, dense, tanh,
    dropout, out_proj.

    The same math and parameter names as RoBERTa's head. The one difference is in transformers'
    config handling: RoBERTa's dropout is `classifier_dropout` (falling back to
    hidden_dropout_prob), MPNet's always hidden_dropout_prob. Pass that here.
    """

    def __init__(self, hidden_size: int, num_labels: int, dropout: float) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.dropout = nn.Dropout(dropout)
        self.out_proj = nn.Linear(hidden_size, num_labels)

    def forward(self, hidden: Tensor) -> Tensor:
        """hidden (B, T, H), the last hidden state -> logits (B, C)."""
        x = torch.tanh(self.dense(self.dropout(hidden[:, 0])))
        return self.out_proj(self.dropout(x))


class MPNetLMHead(nn.Module):
    """transformers' MPNetLMHead (MPNetForMaskedLM's `lm_head`): dense, exact GELU,
    layer_norm, then the decoder back to the vocabulary.

    The decoder's weight is the word embedding matrix (tied, as transformers does by default)
    when `word_embeddings` is given, its own matrix otherwise. `bias` is the decoder's bias
    (one parameter under both names, as in transformers' state dict).
    """

    def __init__(
        self,
        hidden_size: int,
        vocab_size: int,
        layer_norm_eps: float = 1e-12,
        word_embeddings: nn.Embedding | None = None,
    ) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.layer_norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.decoder = nn.Linear(hidden_size, vocab_size, bias=False)
        if word_embeddings is not None:
            self.decoder.weight = word_embeddings.weight
        self.bias = nn.Parameter(torch.zeros(vocab_size))
        self.decoder.bias = self.bias

    def forward(self, hidden: Tensor) -> Tensor:
        """hidden (B, T, H) -> logits (B, T, V)."""
        return self.decoder(self.layer_norm(F.gelu(self.dense(hidden))))


# --- the family ---------------------------------------------------------------------------


def _check(config: Any) -> None:
    if config.pad_token_id != PADDING_IDX:
        raise ConfigError(
            f"pad_token_id {config.pad_token_id}: MPNet's position ids count from padding id "
            f"{PADDING_IDX} (transformers' MPNetEmbeddings fixes it)"
        )
    buckets = getattr(config, "relative_attention_num_buckets", NUM_BUCKETS)
    if buckets < NUM_BUCKETS:
        raise ConfigError(
            f"relative_attention_num_buckets {buckets}: MPNet buckets relative positions into "
            f"{NUM_BUCKETS} (transformers' compute_position_bias), so its table needs as many rows"
        )


FAMILY = Family(
    model_type="mpnet",
    name="MPNet",
    prefix="mpnet.",
    architectures=architectures("MPNet"),
    to_hf=rename_by_prefix((("bert.", "mpnet."), ("cls.", "lm_head."))),
    from_hf=rename_by_prefix(
        (
            ("mpnet.", "bert."),
            *((p, "bert." + p) for p in ("embeddings.", "encoder.", "pooler.")),  # bare MPNetModel
            # MPNetForMaskedLM's head: our `cls` (fill-mask); the other heads drop it with
            # checkpoint.py's note
            ("lm_head.", "cls."),
        )
    ),
    classifier="tanh",  # MPNetClassificationHead is RoBERTa's dense -> tanh -> out_proj
    defaults={"pad_token_id": PADDING_IDX},
    read_fields=lambda d: d | {"type_vocab_size": 0},
    write_fields=lambda d: {k: v for k, v in d.items() if k != "type_vocab_size"},
    check=_check,
    positions_after_pad=True,
    has_pooler=False,  # MPNetModel's pooler is read by no head: not built (dropped on load)
    token_types="never",
    fields={"relative_attention_num_buckets": NUM_BUCKETS},
    encoder=MPNetEncoder,
    masked_lm=lambda config, word_embeddings: MPNetLMHead(
        config.hidden_size, config.vocab_size, config.layer_norm_eps, word_embeddings
    ),
    masked_lm_names=("cls.dense.weight", "cls.layer_norm.bias", "cls.bias"),
)
