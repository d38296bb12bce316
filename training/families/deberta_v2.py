"""DeBERTa-v2 / DeBERTa-v3 encoder in plain PyTorch, numerically equal to transformers'
`DebertaV2Model` and exportable with the TorchScript ONNX exporter.

DeBERTa differs from BERT in how attention sees word order. Instead of (or as well as) adding
absolute position embeddings to the input, every layer adds two *disentangled* relative-position
terms to the content-to-content attention score of query token i and key token j:

* c2p (content -> position): query i's content against the embedding of the distance i - j,
  projected like a key;
* p2c (position -> content): key j's content against the embedding of the same distance,
  projected like a query.

The distances come from one shared table `encoder.rel_embeddings` of 2 * span rows: row
`span + d` holds distance d. DeBERTa-v3 compresses far distances into log-spaced buckets so a
table of 2 * position_buckets rows covers long inputs.

Parameter names follow transformers' `DebertaV2Model` exactly, so its `state_dict()` (or the
`deberta.*` part of a task model's) loads with `strict=True`. Its only buffer,
`embeddings.position_ids`, is non-persistent there (never in a state dict) and is not kept here:
positions are built with `arange` for the actual T at run time.

Shapes in docstrings: B batch, T tokens, H hidden size, E embedding size, nh heads,
d head size, V vocabulary size, S = 2 * span relative-distance rows.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from training.blocks import BertIntermediate, BertOutput, BertSelfOutput, activation
from training.families.base import ConfigError, Family, architectures, rename_by_prefix


def _relative_span(config: Any) -> tuple[int, int, int]:
    """(span, max_relative_positions, position_buckets) of a relative-attention config.

    `max_relative_positions < 1` means "as many as absolute positions". With buckets (> 0) the
    table has 2 * position_buckets rows, else 2 * max_relative_positions (distances clipped)."""
    max_relative = getattr(config, "max_relative_positions", -1)
    if max_relative < 1:
        max_relative = config.max_position_embeddings
    buckets = getattr(config, "position_buckets", -1)
    span = buckets if buckets > 0 else max_relative
    return span, max_relative, buckets


class RelativePositions(nn.Module):
    """The (T, T) matrix of relative distances i - j (query i, key j), log-bucketed when the
    config asks for buckets (DeBERTa-v3), built for the actual T of each call."""

    def __init__(self, max_relative_positions: int, position_buckets: int) -> None:
        super().__init__()
        self.bucketed = position_buckets > 0 and max_relative_positions > 0
        self.mid = position_buckets // 2
        if self.bucketed:
            # log((max - 1) / mid) as torch computes it in float32, so the bucket boundaries
            # (a `ceil` of a float ratio) fall exactly where transformers' do.
            self.log_range = torch.log(torch.tensor((max_relative_positions - 1) / self.mid)).item()

    def forward(self, hidden: Tensor) -> Tensor:
        """hidden (B, T, H) -> (T, T) int64 distances (bucketed or raw)."""
        positions = torch.arange(hidden.size(1), dtype=torch.long, device=hidden.device)
        distance = positions[:, None] - positions[None, :]
        if self.bucketed:
            distance = self._log_bucket(distance)
        return distance

    def reach(self, T: int) -> Tensor:
        """The largest |distance| among T tokens (T - 1, bucketed or not), a 0-dim int64 on
        the CPU: sizes computed from it cost a GPU no synchronisation."""
        farthest = torch.arange(T, dtype=torch.long)[-1]
        return self._log_bucket(farthest) if self.bucketed else farthest

    def _log_bucket(self, distance: Tensor) -> Tensor:
        """Near distances (|r| <= mid) stay exact; far ones map to
        mid + ceil(log(|r| / mid) / log((max - 1) / mid) * (mid - 1)), with r's sign: the
        resolution falls off logarithmically, so distance max - 1 lands on bucket 2 * mid - 1
        and the table stays 2 * position_buckets rows long whatever T is."""
        mid = self.mid
        # clamp keeps log() finite for the near distances; their value is discarded below.
        far = distance.abs().clamp(min=mid).to(torch.float32)
        log_bucket = torch.ceil(torch.log(far / mid) / self.log_range * (mid - 1)) + mid
        near = distance.abs() <= mid
        bucketed = torch.where(near, distance.to(torch.float32), log_bucket * torch.sign(distance))
        return bucketed.to(torch.long)


class DebertaV2Embeddings(nn.Module):
    """Word (+ absolute position) (+ token type) embeddings, optional projection E -> H,
    LayerNorm, padded positions zeroed."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        hidden = config.hidden_size
        embedding_size = getattr(config, "embedding_size", None) or hidden  # None: no projection
        pad = getattr(config, "pad_token_id", 0)
        self.word_embeddings = nn.Embedding(config.vocab_size, embedding_size, padding_idx=pad)
        # DeBERTa-v3 has no absolute positions: word order reaches the model only through
        # the relative attention terms.
        self.position_embeddings = (
            nn.Embedding(config.max_position_embeddings, embedding_size)
            if getattr(config, "position_biased_input", True)
            else None
        )
        self.token_type_embeddings = (
            nn.Embedding(config.type_vocab_size, embedding_size)
            if config.type_vocab_size > 0
            else None
        )
        self.embed_proj = (
            nn.Linear(embedding_size, hidden, bias=False) if embedding_size != hidden else None
        )
        self.LayerNorm = nn.LayerNorm(hidden, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: Tensor, mask: Tensor, token_type_ids: Tensor | None) -> Tensor:
        """input_ids (B, T), mask (B, T) 1 = real token, token_type_ids (B, T) or None
        -> (B, T, H)."""
        embeddings = self.word_embeddings(input_ids)
        if self.position_embeddings is not None:
            positions = torch.arange(input_ids.size(1), device=input_ids.device)
            embeddings = embeddings + self.position_embeddings(positions)[None]
        if self.token_type_embeddings is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(input_ids)
            embeddings = embeddings + self.token_type_embeddings(token_type_ids)
        if self.embed_proj is not None:
            embeddings = self.embed_proj(embeddings)
        embeddings = self.LayerNorm(embeddings)
        # transformers zeroes padded positions after the LayerNorm; the layers see them so.
        embeddings = embeddings * mask.unsqueeze(-1).to(embeddings.dtype)
        return self.dropout(embeddings)


class DisentangledSelfAttention(nn.Module):
    """Multi-head attention whose scores add the c2p and p2c relative-position terms.

    All three score terms are divided by sqrt(d * (1 + number of relative terms)) so their
    sum keeps the variance of a single dot product."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.heads = config.num_attention_heads
        if config.hidden_size % self.heads != 0:
            raise ValueError(
                f"hidden_size ({config.hidden_size}) is not a multiple of "
                f"num_attention_heads ({self.heads})"
            )
        head_size = getattr(config, "attention_head_size", None) or config.hidden_size // self.heads
        inner = self.heads * head_size
        self.query_proj = nn.Linear(config.hidden_size, inner)
        self.key_proj = nn.Linear(config.hidden_size, inner)
        self.value_proj = nn.Linear(config.hidden_size, inner)

        pos_att_type = list(config.pos_att_type or [])
        # transformers counts the relative terms in the scale even without relative attention.
        self.scale = math.sqrt(head_size * (1 + ("c2p" in pos_att_type) + ("p2c" in pos_att_type)))
        self.relative_attention = getattr(config, "relative_attention", False)
        self.c2p = self.relative_attention and "c2p" in pos_att_type
        self.p2c = self.relative_attention and "p2c" in pos_att_type
        # share_att_key (DeBERTa-v3): distance embeddings reuse the content query/key
        # projections; otherwise each term has its own projection.
        self.share_att_key = getattr(config, "share_att_key", False)
        if self.relative_attention:
            self.span, max_relative, buckets = _relative_span(config)
            self.distances = RelativePositions(max_relative, buckets)  # (no parameters)
            self.pos_dropout = nn.Dropout(config.hidden_dropout_prob)
            if not self.share_att_key:
                if self.c2p:
                    self.pos_key_proj = nn.Linear(config.hidden_size, inner)
                if self.p2c:
                    self.pos_query_proj = nn.Linear(config.hidden_size, inner)
        self.dropout = nn.Dropout(config.attention_probs_dropout_prob)

    def _heads(self, x: Tensor) -> Tensor:
        """(..., T, nh * d) -> (..., nh, T, d)."""
        return x.unflatten(-1, (self.heads, -1)).transpose(-2, -3)

    def forward(
        self,
        hidden: Tensor,
        pair_mask: Tensor,
        relative: Tensor | None,
        rel_embeddings: Tensor | None,
    ) -> Tensor:
        """hidden (B, T, H), pair_mask (B, 1, T, T) bool, relative (T, T) distances,
        rel_embeddings (S, H) -> context (B, T, nh * d)."""
        query = self._heads(self.query_proj(hidden))
        key = self._heads(self.key_proj(hidden))
        value = self._heads(self.value_proj(hidden))

        scores = query @ key.transpose(-1, -2) / self.scale  # (B, nh, T, T)
        # (relative attention without c2p/p2c builds the table but adds nothing)
        if (self.c2p or self.p2c) and relative is not None and rel_embeddings is not None:
            scores = scores + self._relative_scores(query, key, relative, rel_embeddings, scores)
        # Padded keys (and, as in transformers, every key of a padded query row) get the
        # smallest float: softmax gives them weight 0 (a padded row becomes uniform).
        scores = scores.masked_fill(~pair_mask, torch.finfo(scores.dtype).min)
        probs = self.dropout(torch.softmax(scores, dim=-1))
        context = probs @ value  # (B, nh, T, d)
        return context.transpose(1, 2).flatten(2)

    def _relative_scores(
        self, query: Tensor, key: Tensor, relative: Tensor, rel_embeddings: Tensor, scores: Tensor
    ) -> Tensor:
        """c2p + p2c terms (B, nh, T, T), already scaled. With r = relative[i, j] (the
        distance i - j, bucketed or not) and row span + r of the distance table (clamped to it):

        c2p[i, j] = query_i . pos_key[span + r]: does query i's content look for a token at
        this distance?  p2c[i, j] = key_j . pos_query[span + r]: does key j's content suit a
        query at this distance?

        query/key (B, nh, T, d), relative (T, T), rel_embeddings (S, H); `scores` only lends
        its (B, nh, T, T) shape so the gather indices expand to the actual run-time sizes."""
        rel_embeddings = self.pos_dropout(rel_embeddings)
        span = self.span
        # Only the rows T's distances reach are scored, 2 reach + 1 (R) of the 2 span, each
        # clamped into the table as the indices were: the others are never gathered, and
        # scoring them was most of what DeBERTa cost over BERT on CPU (v3's 256 buckets: 512
        # rows, of which T = 32 reaches 63; benchmarks/README.md, issue 46).
        reach = self.distances.reach(relative.size(0))
        # arange takes 0-dim tensors as bounds; the stubs list only Python numbers
        offsets = torch.arange(-reach, reach + 1).to(relative.device)  # type: ignore[call-overload]
        rows = torch.clamp(offsets + span, 0, 2 * span - 1)  # (R,)
        terms = []
        if self.c2p:
            proj = self.key_proj if self.share_att_key else self.pos_key_proj
            pos_key = self._heads(proj(rel_embeddings)).index_select(-2, rows)  # (nh, R, d)
            # Query i against every distance row, then pick column reach + r for key j.
            by_distance = query @ pos_key.transpose(-1, -2)  # (B, nh, T, R)
            index = relative + reach
            terms.append(torch.gather(by_distance, -1, index.expand_as(scores)))
        if self.p2c:
            proj = self.query_proj if self.share_att_key else self.pos_query_proj
            pos_query = self._heads(proj(rel_embeddings)).index_select(-2, rows)  # (nh, R, d)
            # Key j against every distance row. Gathering row j at column reach - relative[j, i]
            # = reach + r (distances are odd: relative[j, i] = -r) gives p2c[i, j] at [j, i];
            # the transpose puts the queries back on the rows.
            by_distance = key @ pos_query.transpose(-1, -2)  # (B, nh, T, R)
            index = reach - relative
            terms.append(torch.gather(by_distance, -1, index.expand_as(scores)).transpose(-1, -2))
        # Summed from the first term, not from zeros: the ONNX exporter folds a zeros_like
        # into a constant of the traced shape, which breaks other batch sizes and lengths.
        return sum(terms[1:], terms[0]) / self.scale


class DebertaV2Attention(nn.Module):
    """Disentangled self-attention plus its output block (`self` / `output` as named in
    transformers)."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.self = DisentangledSelfAttention(config)
        self.output = BertSelfOutput(config)  # post-norm, as BERT's

    def forward(
        self,
        hidden: Tensor,
        pair_mask: Tensor,
        relative: Tensor | None,
        rel_embeddings: Tensor | None,
    ) -> Tensor:
        """hidden (B, T, H) -> (B, T, H); see DisentangledSelfAttention for the rest."""
        return self.output(self.self(hidden, pair_mask, relative, rel_embeddings), hidden)


class DebertaV2Layer(nn.Module):
    """One transformer block: attention, then feed-forward, each post-norm residual."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.attention = DebertaV2Attention(config)
        self.intermediate = BertIntermediate(config)  # the feed-forward block is BERT's
        self.output = BertOutput(config)

    def forward(
        self,
        hidden: Tensor,
        pair_mask: Tensor,
        relative: Tensor | None,
        rel_embeddings: Tensor | None,
    ) -> Tensor:
        """hidden (B, T, H) -> (B, T, H)."""
        attended = self.attention(hidden, pair_mask, relative, rel_embeddings)
        return self.output(self.intermediate(attended), attended)


class DebertaV2LayerStack(nn.Module):
    """transformers' `DebertaV2Encoder` (our `encoder`): the layers plus the relative-distance
    table every layer shares, optionally LayerNorm-ed once per forward (norm_rel_ebd)."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        if getattr(config, "conv_kernel_size", 0) > 0:
            # DeBERTa-v2-xlarge/xxlarge add a convolution branch after layer 0; not built here.
            raise ValueError(
                f"conv_kernel_size={config.conv_kernel_size} (the DeBERTa-v2 convolution "
                "layer) is not supported; only conv_kernel_size <= 0 configs load"
            )
        self.layer = nn.ModuleList(DebertaV2Layer(config) for _ in range(config.num_hidden_layers))
        self.relative_attention = getattr(config, "relative_attention", False)
        norm_rel_ebd = getattr(config, "norm_rel_ebd", "none").lower().split("|")
        self.norm_rel = "layer_norm" in [part.strip() for part in norm_rel_ebd]
        if self.relative_attention:
            span, max_relative, buckets = _relative_span(config)
            self.rel_embeddings = nn.Embedding(2 * span, config.hidden_size)
            self.positions = RelativePositions(max_relative, buckets)
        if self.norm_rel:
            self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, embedded: Tensor, mask: Tensor) -> list[Tensor]:
        """embedded (B, T, H), mask (B, T) 1 = real token -> the L + 1 states (B, T, H)."""
        real = mask.bool()
        # A query-key pair counts only if both tokens are real (transformers' 2-D mask rule).
        pair_mask = real[:, None, :, None] & real[:, None, None, :]  # (B, 1, T, T)
        relative = rel_embeddings = None
        if self.relative_attention:
            relative = self.positions(embedded)
            rel_embeddings = self.rel_embeddings.weight
            if self.norm_rel:
                rel_embeddings = self.LayerNorm(rel_embeddings)
        states = [embedded]
        for layer in self.layer:
            states.append(layer(states[-1], pair_mask, relative, rel_embeddings))
        return states


class DebertaV2Encoder(nn.Module):
    """DeBERTa-v2/v3 encoder with transformers' `DebertaV2Model` parameter names
    (`embeddings.*`, `encoder.layer.N.*`, `encoder.rel_embeddings.weight`, `encoder.LayerNorm.*`).

    `config` is any object with `DebertaV2Config`'s attribute names. The DeBERTa-v2 convolution
    branch (conv_kernel_size > 0) is refused with a ValueError."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.embeddings = DebertaV2Embeddings(config)
        self.encoder = DebertaV2LayerStack(config)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
    ) -> list[Tensor]:
        """input_ids (B, T), attention_mask (B, T) 1 = real token (all real if None),
        token_type_ids (B, T) (zeros if None) -> L + 1 hidden states (B, T, H): the
        embeddings output first, the last layer's output last."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        embedded = self.embeddings(input_ids, attention_mask, token_type_ids)
        return self.encoder(embedded, attention_mask)


class DebertaV2ContextPooler(nn.Module):
    """transformers' ContextPooler: dropout, `dense` on the first token, pooler activation."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        size = getattr(config, "pooler_hidden_size", None) or config.hidden_size
        self.dense = nn.Linear(size, size)
        self.dropout = nn.Dropout(getattr(config, "pooler_dropout", 0.0))
        self.act = activation(getattr(config, "pooler_hidden_act", "gelu"))

    def forward(self, hidden: Tensor) -> Tensor:
        """hidden (B, T, H) -> (B, pooler_hidden_size)."""
        return self.act(self.dense(self.dropout(hidden[:, 0])))


class _Transform(nn.Module):
    """dense, activation, LayerNorm: the MLM heads' hidden transform."""

    def __init__(self, size_in: int, size_out: int, config: Any) -> None:
        super().__init__()
        self.dense = nn.Linear(size_in, size_out)
        self.act = activation(config.hidden_act)
        self.LayerNorm = nn.LayerNorm(size_out, eps=config.layer_norm_eps)

    def forward(self, hidden: Tensor) -> Tensor:
        """(..., size_in) -> (..., size_out)."""
        return self.LayerNorm(self.act(self.dense(hidden)))


class _LegacyLMPrediction(nn.Module):
    """transformers' legacy MLM head (`cls.predictions`): dense H -> E, activation, LayerNorm,
    a `decoder` whose weight is the word-embedding matrix, and an output bias."""

    def __init__(self, config: Any, word_embeddings: nn.Embedding) -> None:
        super().__init__()
        embedding_size = word_embeddings.embedding_dim
        self.transform = _Transform(config.hidden_size, embedding_size, config)
        self.decoder = nn.Linear(embedding_size, config.vocab_size, bias=False)
        self.decoder.weight = word_embeddings.weight  # tied: one Parameter, two names
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        self.decoder.bias = self.bias  # transformers names the bias twice as well

    def forward(self, hidden: Tensor) -> Tensor:
        """(B, T, H) -> (B, T, V)."""
        return self.decoder(self.transform(hidden))


class _LMPrediction(_Transform):
    """transformers' non-legacy MLM head (`lm_predictions.lm_head`): dense H -> H,
    activation, LayerNorm, then scores against the word embeddings plus `bias`."""

    def __init__(self, config: Any, word_embeddings: nn.Embedding) -> None:
        super().__init__(config.hidden_size, config.hidden_size, config)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        # A tuple hides the module from nn.Module's registry: the embedding belongs to the
        # encoder (its state-dict key lives there), the head only reads its weight.
        self._word_embeddings = (word_embeddings,)

    def forward(self, hidden: Tensor) -> Tensor:
        """(B, T, H) -> (B, T, V)."""
        return super().forward(hidden) @ self._word_embeddings[0].weight.t() + self.bias


class DebertaV2MaskedLMHead(nn.Module):
    """Masked-LM head of `DebertaV2ForMaskedLM`, decoder tied to `word_embeddings`.

    transformers 4.57 has two layouts, chosen by `config.legacy` (default True):
    legacy keeps `predictions.*` (their `cls.predictions.*`), the other keeps `lm_head.*`
    (their `lm_predictions.lm_head.*`). `transformers_prefix` names the part of their
    state dict that loads into this module."""

    def __init__(self, config: Any, word_embeddings: nn.Embedding) -> None:
        super().__init__()
        self.legacy = getattr(config, "legacy", True)
        if self.legacy:
            self.predictions = _LegacyLMPrediction(config, word_embeddings)
        else:
            self.lm_head = _LMPrediction(config, word_embeddings)

    @property
    def transformers_prefix(self) -> str:
        """The prefix of their keys ("cls." or "lm_predictions.") to strip to load ours."""
        return "cls." if self.legacy else "lm_predictions."

    def forward(self, hidden: Tensor) -> Tensor:
        """hidden (B, T, H) -> logits (B, T, V)."""
        return self.predictions(hidden) if self.legacy else self.lm_head(hidden)


# --- the family ---------------------------------------------------------------------------


def _read_fields(d: dict[str, Any]) -> dict[str, Any]:
    pos_att_type = d.get("pos_att_type")
    if isinstance(pos_att_type, str):  # "p2c|c2p", as DebertaV2Config accepts it
        d = d | {"pos_att_type": [x.strip() for x in pos_att_type.lower().split("|")]}
    return d


def _write_fields(d: dict[str, Any]) -> dict[str, Any]:
    # embedding_size None: no projection, which DebertaV2Config says by leaving it out
    return {k: v for k, v in d.items() if not (k == "embedding_size" and v is None)}


def _settle(config: Any) -> dict[str, Any]:
    return {"embedding_size": None} if config.embedding_size == config.hidden_size else {}


def _check(config: Any) -> None:
    if getattr(config, "conv_kernel_size", 0):
        raise ConfigError(
            f"conv_kernel_size {config.conv_kernel_size} (DeBERTa-v2-xlarge's convolution "
            "layer) is not supported"
        )
    if getattr(config, "pooler_hidden_size", None) not in (None, config.hidden_size):
        raise ConfigError(
            f"pooler_hidden_size {config.pooler_hidden_size} must equal hidden_size "
            f"{config.hidden_size} (the pooler reads the first token's hidden state)"
        )


FAMILY = Family(
    model_type="deberta-v2",
    name="DeBERTa-v2",
    prefix="deberta.",
    architectures=architectures("DebertaV2"),
    to_hf=rename_by_prefix((("bert.", "deberta."), ("cls.lm_head.", "lm_predictions.lm_head."))),
    from_hf=rename_by_prefix(
        (
            ("deberta.", "bert."),
            ("embeddings.", "bert.embeddings."),  # a bare DebertaV2Model
            ("encoder.", "bert.encoder."),
            # DebertaV2ForMaskedLM's head, our `cls` (DebertaV2MaskedLMHead): legacy
            # `cls.predictions.*` keeps its names, the other layout's `lm_predictions.lm_head.*`
            # is `cls.lm_head.*`; the other heads drop both with checkpoint.py's note
            ("lm_predictions.", "cls."),
        )
    ),
    classifier="context_pooler",
    # DebertaV2Config's defaults where they differ from BertConfig's
    defaults={"pad_token_id": 0, "type_vocab_size": 0, "layer_norm_eps": 1e-7},
    read_fields=_read_fields,
    write_fields=_write_fields,
    settle=_settle,
    check=_check,
    options=frozenset({"embedding_size"}),
    has_pooler=False,
    token_types="optional",  # v3 has none (type_vocab_size 0), v2 may
    fields={
        "relative_attention": False,
        "max_relative_positions": -1,
        "position_buckets": -1,
        "pos_att_type": None,
        "share_att_key": False,
        "norm_rel_ebd": "none",
        "position_biased_input": True,
        "attention_head_size": None,
        "pooler_hidden_size": None,
        "pooler_dropout": 0.0,
        "pooler_hidden_act": "gelu",
        "conv_kernel_size": 0,
        "legacy": True,
        # kept as the file says (None: unsaid): transformers 4.57's non-legacy masked-LM head
        # breaks when tied (tying swaps its `dense` for the word embeddings), so such
        # checkpoints say false; that head reads the word embeddings either way
        "tie_word_embeddings": None,
    },
    encoder=DebertaV2Encoder,
    pooler=DebertaV2ContextPooler,
    masked_lm=DebertaV2MaskedLMHead,
    masked_lm_names=(
        "cls.predictions.transform.dense.weight",  # legacy (config.legacy, the default)
        "cls.predictions.bias",
        "cls.lm_head.dense.weight",
        "cls.lm_head.bias",
    ),
)
