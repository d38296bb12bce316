"""BERT (Devlin et al. 2018) and every head we serve, in one file you can read top to bottom.

Module and parameter names follow transformers' `modeling_bert.py`, so state dicts map one to
one onto Hugging Face checkpoints (see `training/checkpoint.py`).

ALBERT (Lan et al. 2019) is the same encoder with two config options: `embedding_size` E
(embeddings of width E, projected to H by `encoder.embedding_hidden_mapping_in`) and
`share_layers` (`encoder.layer` holds one layer, applied num_hidden_layers times).

RoBERTa (XLM-R, CamemBERT), ELECTRA and DistilBERT are this encoder too, with options their
family sets (training/families/): RoBERTa's position ids, ELECTRA's E -> H projection
(ALBERT's module), DistilBERT's missing token types and sinusoidal positions. Their heads are
transformers' own per family (classification differs, `Family.classifier`; token and QA heads
do not; the masked-LM head of fill-mask does, `Family.masked_lm`), and each family module maps
its parameter names.

    >>> from training.config import BertConfig
    >>> from training.model import BertForSequenceClassification
    >>> model = BertForSequenceClassification(BertConfig.preset("tiny"), num_labels=2)
    >>> out = model(input_ids, attention_mask, token_type_ids, labels=labels)
    >>> out.loss.backward()

Shapes: B batch, T tokens, H hidden, nh heads, hs head size (H / nh), V vocabulary, C labels,
E embedding width (H, or ALBERT's embedding_size).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from heads.contract import DENSE_POOLINGS, SPARSE_POOLINGS
from training.blocks import BertIntermediate, BertOutput, BertSelfOutput, activation
from training.config import FEATURES, BertConfig
from training.families import FAMILIES

# --- encoder ----------------------------------------------------------------------------


class BertEmbeddings(nn.Module):
    """token + learned absolute position + segment embeddings, then LayerNorm and dropout.
    Width E: hidden_size, or ALBERT's / ELECTRA's embedding_size (V x E instead of V x H).
    DistilBERT has no segment embeddings (type_vocab_size 0) and may fix its position table
    to sinusoids; the RoBERTa family numbers positions from pad_token_id + 1."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        E = config.embedding_size or config.hidden_size
        self.pad_token_id = config.pad_token_id
        self.position_offset = config.position_offset
        self.word_embeddings = nn.Embedding(config.vocab_size, E, padding_idx=config.pad_token_id)
        # RoBERTa's position table has a padding row too (the position padding tokens get).
        pad_position = config.pad_token_id if self.position_offset else None
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, E, pad_position)
        self.sinusoidal = config.sinusoidal_pos_embds
        if self.sinusoidal:  # fixed, as in DistilBERT: fine-tuning must not move it
            self.position_embeddings.weight.requires_grad_(False)
        self.token_type_embeddings: nn.Embedding | None = None
        if config.type_vocab_size:
            self.token_type_embeddings = nn.Embedding(config.type_vocab_size, E)
        self.LayerNorm = nn.LayerNorm(E, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: Tensor, token_type_ids: Tensor) -> Tensor:
        T = input_ids.shape[1]
        if self.position_offset:
            # fairseq's make_positions: real tokens count up from pad_token_id + 1, padding
            # stays at pad_token_id. Read from input_ids (not the mask), as transformers does.
            real = (input_ids != self.pad_token_id).long()  # (B, T)
            positions = torch.cumsum(real, dim=1) * real + self.pad_token_id
        else:
            positions = torch.arange(T, device=input_ids.device).unsqueeze(0)  # (1, T)
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions)  # (B, T, E)
        if self.token_type_embeddings is not None:
            x = x + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.LayerNorm(x))


def sinusoids(n_positions: int, dim: int) -> Tensor:
    """(n_positions, dim) table of Vaswani et al. 2017 §3.5: sin(pos / 10000^(2i/dim)) in
    column 2i, cos of the same angle in column 2i + 1. Computed in float64, then rounded."""
    pos = torch.arange(n_positions, dtype=torch.float64)[:, None]
    i = torch.arange(0, dim, 2, dtype=torch.float64)  # 2i
    angle = pos / 10000 ** (i / dim)  # (n_positions, ceil(dim / 2))
    table = torch.zeros(n_positions, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle[:, : dim // 2])
    return table.float()


class BertSelfAttention(nn.Module):
    # "sdpa" trains fast (flash / memory-efficient kernels); "eager" spells the attention out
    # as matmul-softmax-matmul, the graph shape ONNX Runtime's BERT optimizer fuses into one
    # Attention op. `set_attention_implementation` switches a whole model.
    implementation = "sdpa"
    # The sdpa path projects Q, K and V in one (H, 3H) GEMM over the three weights
    # concatenated (the parameters stay three, under their checkpoint names): BERT-base's
    # compiled bf16 pretraining step on an H200, 100.0 -> 97.7 ms at batch 512 (MFU 35.3% ->
    # 36.1%), 52.9 -> 51.1 ms at 256; on 2 CPU cores (BERT-mini) within noise.
    fuse_qkv = True

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_size = config.hidden_size // config.num_attention_heads
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout_p = config.attention_probs_dropout_prob
        self.dropout = nn.Dropout(config.attention_probs_dropout_prob)

    def split_heads(self, x: Tensor) -> Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.num_heads, self.head_size).transpose(1, 2)  # (B, nh, T, hs)

    def forward(self, x: Tensor, mask_bias: Tensor | None) -> Tensor:
        """x (B, T, H); mask_bias (B, 1, 1, T): 0 where attended, a large negative at padding;
        None: every position attended."""
        B, T, H = x.shape
        if self.implementation == "sdpa" and self.fuse_qkv:
            w = torch.cat([self.query.weight, self.key.weight, self.value.weight])
            b = torch.cat([self.query.bias, self.key.bias, self.value.bias])
            qkv = F.linear(x, w, b).view(B, T, 3, self.num_heads, self.head_size)
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # 3 x (B, nh, T, hs)
        else:
            q = self.split_heads(self.query(x))
            k = self.split_heads(self.key(x))
            v = self.split_heads(self.value(x))
        if self.implementation == "sdpa":
            p = self.dropout_p if self.training else 0.0
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask_bias, dropout_p=p)
        else:
            scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_size)
            if mask_bias is not None:
                scores = scores + mask_bias
            probs = self.dropout(torch.softmax(scores, dim=-1))  # (B, nh, T, T)
            y = torch.matmul(probs, v)  # (B, nh, T, hs)
        return y.transpose(1, 2).reshape(B, T, H)


class BertAttention(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertSelfOutput(config)

    def forward(self, x: Tensor, mask_bias: Tensor | None) -> Tensor:
        return self.output(self.self(x, mask_bias), x)


class BertLayer(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def forward(self, x: Tensor, mask_bias: Tensor | None) -> Tensor:
        x = self.attention(x, mask_bias)
        return self.output(self.intermediate(x), x)


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.num_hidden_layers = config.num_hidden_layers
        self.embedding_hidden_mapping_in = None
        if config.embedding_size is not None:  # ALBERT: the E -> H half of the factorisation
            self.embedding_hidden_mapping_in = nn.Linear(config.embedding_size, config.hidden_size)
        # ALBERT's cross-layer sharing: one layer's weights, num_hidden_layers applications.
        distinct = 1 if config.share_layers else config.num_hidden_layers
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(distinct))

    def forward(self, x: Tensor, mask_bias: Tensor | None) -> list[Tensor]:
        """x (B, T, E). Returns the (projected) embeddings and every layer's output: L + 1
        tensors (B, T, H)."""
        if self.embedding_hidden_mapping_in is not None:
            x = self.embedding_hidden_mapping_in(x)  # (B, T, E) -> (B, T, H)
        hidden = [x]
        for i in range(self.num_hidden_layers):
            x = self.layer[i % len(self.layer)](x, mask_bias)
            hidden.append(x)
        return hidden


class BertPooler(nn.Module):
    """tanh(W h_[CLS] + b): the sentence representation NSP and classification read."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = nn.Tanh()

    def forward(self, hidden: Tensor) -> Tensor:
        return self.activation(self.dense(hidden[:, 0]))


@dataclass
class BertOutputs:
    last_hidden_state: Tensor  # (B, T, H)
    pooler_output: Tensor | None  # (B, H)
    hidden_states: list[Tensor]  # L + 1 tensors (B, T, H), embeddings first


class BertModel(nn.Module):
    def __init__(self, config: BertConfig, add_pooling_layer: bool = True) -> None:
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        # ELECTRA and DistilBERT have no pooler whatever the head (config.has_pooler).
        self.pooler = BertPooler(config) if add_pooling_layer and config.has_pooler else None

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
    ) -> BertOutputs:
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        x = self.embeddings(input_ids, token_type_ids)
        # (B, T) 1/0 -> (B, 1, 1, T) additive bias, broadcast over heads and query positions.
        # No mask, no bias (SDPA may then take flash; on an H200 it kept cuDNN's, as fast).
        mask_bias = None
        if attention_mask is not None:
            keep = attention_mask[:, None, None, :].to(x.dtype)
            mask_bias = (1.0 - keep) * torch.finfo(x.dtype).min
        hidden = self.encoder(x, mask_bias)
        last = hidden[-1]
        pooled = self.pooler(last) if self.pooler is not None else None
        return BertOutputs(last, pooled, hidden)


class _HiddenStates:
    """Mixin for a family's own encoder (Family.encoder), whose forward gives the L + 1 hidden
    states: the heads read BertOutputs, as from BertModel."""

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
    ) -> BertOutputs:
        hidden = super().forward(input_ids, attention_mask, token_type_ids)  # type: ignore[misc]
        return BertOutputs(hidden[-1], None, hidden)


def encoder_model(config: BertConfig, add_pooling_layer: bool = True) -> nn.Module:
    """The encoder of config's family: BertModel (BERT and the families that are BERT with
    options), or the family's own module (DeBERTa-v2, ModernBERT, MPNet), under the same
    attribute names transformers gives it, so the layout renames only the prefix."""
    family = config.family
    if family.encoder is None:
        return BertModel(config, add_pooling_layer=add_pooling_layer)
    cls = family.encoder
    with_outputs = type(cls.__name__, (_HiddenStates, cls), {"__module__": cls.__module__})
    return with_outputs(config)


def _pretrainable() -> str:
    return " and ".join(t for t, f in FAMILIES.items() if f.pretraining)


def no_masked_lm(model_type: str) -> str:
    """The one line that refuses a masked-LM head to a family without one (ELECTRA: its
    discriminator scores replaced tokens; ElectraForMaskedLM is a separate generator model)."""
    with_head = ", ".join(t for t, f in FAMILIES.items() if f.fill_mask)
    return (
        f"{model_type} has no masked-LM head here; fill-mask and splade pooling are "
        f"implemented for {with_head}"
    )


def init_weights(module: nn.Module, std: float) -> None:
    """BERT's initialisation: truncated-normal-like N(0, 0.02) weights, zero biases, unit LN."""
    # A decoder tied to the word embeddings is drawn once, as the embedding (padding row zero).
    tables = {id(m.weight) for m in module.modules() if isinstance(m, nn.Embedding)}
    for m in module.modules():
        if isinstance(m, nn.Linear):
            if id(m.weight) not in tables:
                nn.init.normal_(m.weight, std=std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=std)
            if m.padding_idx is not None:
                m.weight.data[m.padding_idx].zero_()
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            if m.bias is not None:  # ModernBERT's norms have none
                nn.init.zeros_(m.bias)
    for m in module.modules():  # after the loop above, which drew every table at random
        if isinstance(m, BertEmbeddings) and m.sinusoidal:
            table = m.position_embeddings.weight
            table.data.copy_(sinusoids(*table.shape))


def set_attention_implementation(model: nn.Module, implementation: str) -> None:
    """'sdpa' for training, 'eager' for ONNX export (the graph ORT fuses)."""
    if implementation not in ("sdpa", "eager"):
        raise ValueError(f"attention implementation must be sdpa or eager, not {implementation!r}")
    for m in model.modules():
        if isinstance(m, BertSelfAttention):
            m.implementation = implementation


def set_dropout(model: nn.Module, p: float) -> None:
    """Every dropout in `model` at rate `p` (its config keeps its own rates): pretraining
    without dropout, as Cramming (Geiping and Goldstein 2022) does for short budgets, saved
    7% of BERT-base's step on an H200 (benchmarks/results/pretrain_step_gpu.md)."""
    if not 0 <= p < 1:
        raise ValueError(f"dropout must be in [0, 1), not {p}")
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.p = p
        if hasattr(m, "dropout_p"):  # an attention that hands SDPA its rate (BERT, ModernBERT)
            # Module.__setattr__'s stub takes only a Tensor or Module; a float is fine
            m.dropout_p = p  # type: ignore[assignment]


# --- heads ------------------------------------------------------------------------------


class BertPreTrainedHead(nn.Module):
    """Shared base: builds `self.bert`, initialises every weight, counts parameters."""

    encoder_frozen = False

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True) -> None:
        super().__init__()
        self.config = config
        self.bert = encoder_model(config, add_pooling_layer=add_pooling_layer)

    def post_init(self) -> None:
        init_weights(self, self.config.initializer_range)

    def family_head(self, hidden: Tensor) -> Tensor:
        """`hidden` through the family's prediction head where the head has one (ModernBERT's
        `head`, before every task's linear layer), else unchanged."""
        head = getattr(self, "head", None)
        return hidden if head is None else head(hidden)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def freeze_encoder(self) -> None:
        """Feature-based use (Devlin et al. §5.3): the encoder's weights get no gradient and it
        stays in eval mode (no dropout), so the head learns on the pretrained model's own
        features. Only the head's weights train."""
        self.bert.requires_grad_(False)
        self.encoder_frozen = True
        self.bert.eval()

    def train(self, mode: bool = True) -> BertPreTrainedHead:
        super().train(mode)
        if self.encoder_frozen:
            self.bert.eval()
        return self


@dataclass
class PreTrainingOutput:
    loss: Tensor | None
    # (B, T, V); (M, V) at the M chosen positions when labelled; (B, P, V) with max_predictions
    prediction_logits: Tensor
    seq_relationship_logits: Tensor  # (B, 2)
    mlm_loss: Tensor | None = None
    nsp_loss: Tensor | None = None


class BertPredictionHeadTransform(nn.Module):
    """H -> E, so that the decoder can share the (V, E) word embeddings (ALBERT: E < H)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        E = config.embedding_size or config.hidden_size
        self.dense = nn.Linear(config.hidden_size, E)
        self.transform_act_fn = activation(config.hidden_act)
        self.LayerNorm = nn.LayerNorm(E, eps=config.layer_norm_eps)

    def forward(self, x: Tensor) -> Tensor:
        return self.LayerNorm(self.transform_act_fn(self.dense(x)))


class BertLMPredictionHead(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.transform = BertPredictionHeadTransform(config)
        # The decoder's weight is tied to the word embeddings (set by the owner); its own bias.
        E = config.embedding_size or config.hidden_size
        self.decoder = nn.Linear(E, config.vocab_size, bias=False)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, x: Tensor) -> Tensor:
        return self.decoder(self.transform(x)) + self.bias


class BertPreTrainingHeads(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.predictions = BertLMPredictionHead(config)
        self.seq_relationship = nn.Linear(config.hidden_size, 2)


class BertForPreTraining(BertPreTrainedHead):
    """Masked LM + next-sentence (or sentence-order) prediction; loss = MLM + NSP."""

    def __init__(self, config: BertConfig) -> None:
        if not config.family.pretraining:
            # RoBERTa pretrains MLM only, ELECTRA a replaced-token discriminator, DistilBERT by
            # distillation: none has the NSP/SOP head this class trains.
            raise ValueError(
                f"pretraining heads are implemented for {_pretrainable()}, not {config.model_type}"
            )
        super().__init__(config)
        self.cls = BertPreTrainingHeads(config)
        self.post_init()
        self.tie_weights()

    def tie_weights(self) -> None:
        # Module's __getattr__ types every submodule as Tensor | Module.
        embeddings = cast(nn.Module, self.bert.embeddings)
        self.cls.predictions.decoder.weight = cast(nn.Embedding, embeddings.word_embeddings).weight

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        labels: Tensor | None = None,
        next_sentence_label: Tensor | None = None,
        max_predictions: int | None = None,
    ) -> PreTrainingOutput:
        """labels (B, T): the original token at chosen positions, -100 elsewhere.
        next_sentence_label (B,): 0 = B follows A, 1 = B is random (or swapped, for SOP).
        max_predictions: at most this many chosen positions a row (the masker's bound): the
        head then runs on a fixed (B, max_predictions) slice, the same loss."""
        out = self.bert(input_ids, attention_mask, token_type_ids)
        seq_logits = self.cls.seq_relationship(out.pooler_output)  # (B, 2)
        hidden = out.last_hidden_state
        mlm_loss = nsp_loss = None
        if labels is not None and max_predictions is not None:
            # Each row's chosen positions first, then unchosen ones (label -100, no loss) to
            # fill max_predictions: one shape and no host sync, where hidden[chosen] waits for
            # the GPU to count them and gives torch.compile a data-dependent shape.
            chosen = (labels != -100).to(torch.int8)
            positions = chosen.argsort(dim=1, descending=True, stable=True)[:, :max_predictions]
            picked = hidden.gather(1, positions[..., None].expand(-1, -1, hidden.shape[-1]))
            logits = self.cls.predictions(picked)  # (B, P, V)
            targets = labels.gather(1, positions)
            mlm_loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
        elif labels is not None:
            # Project only the ~15% chosen positions onto the vocabulary: the V-wide matmul is
            # the most expensive op of pretraining, and the other positions carry no loss.
            chosen = labels != -100  # (B, T)
            logits = self.cls.predictions(hidden[chosen])  # (M, V)
            mlm_loss = F.cross_entropy(logits.float(), labels[chosen])
        else:
            logits = self.cls.predictions(hidden)  # (B, T, V)
        if next_sentence_label is not None:
            nsp_loss = F.cross_entropy(seq_logits.float(), next_sentence_label)
        parts = [x for x in (mlm_loss, nsp_loss) if x is not None]
        loss = sum(parts) if parts else None
        return PreTrainingOutput(loss, logits, seq_logits, mlm_loss, nsp_loss)  # type: ignore[arg-type]


# --- masked LM --------------------------------------------------------------------------


@dataclass
class MaskedLMOutput:
    loss: Tensor | None
    logits: Tensor  # (B, T, V)


class BertOnlyMLMHead(nn.Module):
    """BERT's masked-LM head under transformers' names (`cls.predictions`): transform (H -> E,
    activation, LayerNorm), the decoder (E -> V) tied to the word embeddings, bias. ALBERT's is
    the same module, which its family renames."""

    def __init__(self, config: BertConfig, word_embeddings: nn.Embedding) -> None:
        super().__init__()
        self.predictions = BertLMPredictionHead(config)
        self.predictions.decoder.weight = word_embeddings.weight

    def forward(self, x: Tensor) -> Tensor:
        """(B, T, H) -> (B, T, V)."""
        return self.predictions(x)


def word_embeddings(encoder: nn.Module) -> nn.Embedding:
    """The encoder's (V, E) token table, which a masked-LM decoder shares: `word_embeddings`,
    or ModernBERT's `tok_embeddings`."""
    embeddings = cast(nn.Module, encoder.embeddings)  # submodules read as Tensor | Module
    table = getattr(embeddings, "word_embeddings", None) or embeddings.tok_embeddings
    assert isinstance(table, nn.Embedding)
    return table


class BertForMaskedLM(BertPreTrainedHead):
    """The masked-LM head alone (transformers' *ForMaskedLM, task "fill-mask"): every token's
    scores over the vocabulary. BERT's `cls.predictions`, or the family's own module
    (Family.masked_lm), as `cls`; after the family's `head` where it has one (ModernBERT's
    head -> decoder). The decoder shares the word embeddings. ELECTRA has none (ValueError).
    Loss: cross-entropy at the labelled positions."""

    def __init__(self, config: BertConfig) -> None:
        if not config.family.fill_mask:
            raise ValueError(no_masked_lm(config.model_type))
        super().__init__(config, add_pooling_layer=False)
        self.head = _family_head(config, config.hidden_size)
        build = config.family.masked_lm or BertOnlyMLMHead
        self.cls = build(config, word_embeddings(self.bert))
        self.post_init()

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        labels: Tensor | None = None,
    ) -> MaskedLMOutput:
        """labels (B, T): the original token at masked positions, -100 elsewhere."""
        hidden = self.bert(input_ids, attention_mask, token_type_ids).last_hidden_state
        logits = self.cls(self.family_head(hidden))  # (B, T, V)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
        return MaskedLMOutput(loss, logits)


def splade(logits: Tensor, attention_mask: Tensor | None) -> Tensor:
    """(B, T, V) masked-LM logits -> (B, V) sparse embeddings: the maximum over the real tokens
    of log(1 + relu(logits)) (SPLADE v2, Formal et al. 2021; sentence-transformers'
    SpladePooling "max", TEI's /embed_sparse). Every term is >= 0, so padding is zeroed
    rather than excluded: the maximum is the same, and a row with no positive logit for a word
    gets exactly 0 there."""
    weights = torch.log1p(torch.relu(logits))
    if attention_mask is not None:
        weights = weights * attention_mask.unsqueeze(-1).to(weights.dtype)
    return weights.max(dim=1).values


@dataclass
class SequenceClassifierOutput:
    loss: Tensor | None
    logits: Tensor  # (B, C)


class ClassificationHead(nn.Module):
    """RoBERTa's and ELECTRA's classifier (transformers' RobertaClassificationHead and
    ElectraClassificationHead): dense -> tanh (RoBERTa) or GELU (ELECTRA) -> dropout ->
    out_proj, on the first token's state; the caller applies the dropout before it."""

    def __init__(self, config: BertConfig, num_labels: int, act: nn.Module) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = act
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.out_proj = nn.Linear(config.hidden_size, num_labels)

    def forward(self, x: Tensor) -> Tensor:
        return self.out_proj(self.dropout(self.act(self.dense(x))))


class BertForSequenceClassification(BertPreTrainedHead):
    """[CLS] pooled output (or, with `pooling` / config.classifier_pooling "mean", "max"...,
    the real tokens' last hidden states pooled that way) -> dropout -> linear; other families
    put their own head (their Family's `classifier`) on the first token (or the pooled
    states). Loss by problem_type: cross-entropy (single label), BCE-with-logits (multi label,
    float multi-hot labels), MSE (regression)."""

    def __init__(
        self, config: BertConfig, num_labels: int | None = None, pooling: str | None = None
    ) -> None:
        if pooling is not None:
            config = config.replace(classifier_pooling=pooling)
        family = config.family
        kind = family.classifier  # training.families.base.CLASSIFIERS
        # mean pooling leaves the pooler unused: none is built (DDP refuses unused weights);
        # the other families' classifiers read hidden states, not the pooler.
        use_pooler = kind == "pooler" and config.classifier_pooling == "cls"
        super().__init__(config, add_pooling_layer=use_pooler)
        self.num_labels = num_labels or config.num_labels
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.pre_classifier: nn.Linear | None = None
        self.pooler: nn.Module | None = None  # DeBERTa's ContextPooler, named as theirs
        self.head: nn.Module | None = None  # ModernBERT's prediction head, named as theirs
        width = config.hidden_size
        if kind == "pre_classifier":
            self.pre_classifier = nn.Linear(width, width)
        elif kind == "context_pooler":
            self.pooler = family.pooler(config)  # type: ignore[misc]
            width = getattr(config, "pooler_hidden_size", None) or width
        elif kind == "head":
            self.head = family.head(config)  # type: ignore[misc]
        if kind in ("tanh", "gelu"):
            self.classifier: nn.Module = ClassificationHead(
                config, self.num_labels, activation(kind)
            )
        else:
            self.classifier = nn.Linear(width, self.num_labels)
        self.post_init()

    @property
    def problem_type(self) -> str:
        if self.config.problem_type:
            return self.config.problem_type
        return "regression" if self.num_labels == 1 else "single_label_classification"

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        labels: Tensor | None = None,
    ) -> SequenceClassifierOutput:
        out = self.bert(input_ids, attention_mask, token_type_ids)
        if self.config.classifier_pooling != "cls":
            pooled = pool(out.last_hidden_state, attention_mask, self.config.classifier_pooling)
        elif out.pooler_output is not None:
            pooled = out.pooler_output
        else:
            pooled = out.last_hidden_state[:, 0]  # <s> / [CLS], no pooler
        if self.pre_classifier is not None:
            pooled = F.relu(self.pre_classifier(pooled))
        elif self.pooler is not None:  # it reads the first position of a (B, T, H) input
            pooled = self.pooler(pooled[:, None])
        else:
            pooled = self.family_head(pooled)
        logits = self.classifier(self.dropout(pooled))  # (B, C)
        loss = None
        if labels is not None:
            if self.problem_type == "regression":
                loss = F.mse_loss(logits.squeeze(-1).float(), labels.float())
            elif self.problem_type == "multi_label_classification":
                loss = F.binary_cross_entropy_with_logits(logits.float(), labels.float())
            else:
                loss = F.cross_entropy(logits.float(), labels)
        return SequenceClassifierOutput(loss, logits)


@dataclass
class TokenClassifierOutput:
    loss: Tensor | None
    logits: Tensor  # (B, T, C)


class LayerFeatures(nn.Module):
    """The hidden states a token head reads (config.features; Devlin et al. §5.3): one layer's,
    several concatenated, or a learned weighted sum. hidden_states (L + 1) x (B, T, H) ->
    (B, T, size)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.layers = config.feature_layers
        self.combine = FEATURES[config.features][1]
        k = len(self.layers)
        self.size = config.hidden_size * (k if self.combine == "concat" else 1)
        self.layer_weights = None
        if self.combine == "sum":  # one scalar per layer, starting as the plain sum
            self.layer_weights = nn.Parameter(torch.ones(k))

    def forward(self, hidden_states: list[Tensor]) -> Tensor:
        chosen = [hidden_states[i] for i in self.layers]
        if self.layer_weights is not None:
            return torch.einsum("k,kbth->bth", self.layer_weights, torch.stack(chosen))
        return chosen[0] if len(chosen) == 1 else torch.cat(chosen, dim=-1)  # (B, T, k H)


def _family_head(config: BertConfig, width: int) -> nn.Module | None:
    """The family's prediction head that its token and QA heads put before their linear layer
    (ModernBERT's dense -> activation -> norm), named `head` as theirs; None for the others."""
    if config.family.head is None:
        return None
    if width != config.hidden_size:
        raise ValueError(
            f"features {config.features!r} give {width} values per token; the {config.family.name}"
            f" head reads {config.hidden_size}: use features 'last', 'second-to-last' or a sum"
        )
    return config.family.head(config)


class BertForTokenClassification(BertPreTrainedHead):
    """Per-token linear layer over the last hidden state (no pooler, as in transformers), or
    over other layers' states (`features`, default config.features: "last")."""

    def __init__(
        self, config: BertConfig, num_labels: int | None = None, features: str | None = None
    ) -> None:
        if features is not None:
            config = config.replace(features=features)
        super().__init__(config, add_pooling_layer=False)
        self.num_labels = num_labels or config.num_labels
        self.features = LayerFeatures(config)
        self.head = _family_head(config, self.features.size)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.classifier = nn.Linear(self.features.size, self.num_labels)
        self.post_init()

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        labels: Tensor | None = None,
    ) -> TokenClassifierOutput:
        """labels (B, T): tag ids, -100 where no loss (special tokens, later word pieces)."""
        hidden = self.features(self.bert(input_ids, attention_mask, token_type_ids).hidden_states)
        hidden = self.family_head(hidden)
        logits = self.classifier(self.dropout(hidden))  # (B, T, C)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
        return TokenClassifierOutput(loss, logits)


@dataclass
class QuestionAnsweringOutput:
    loss: Tensor | None
    start_logits: Tensor  # (B, T)
    end_logits: Tensor  # (B, T)


class BertForQuestionAnswering(BertPreTrainedHead):
    """Span extraction: one linear layer gives a start and an end logit per token."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config, add_pooling_layer=False)
        self.head = _family_head(config, config.hidden_size)
        # ModernBERT names this layer `classifier`, the others `qa_outputs`: ours is theirs.
        self.outputs_name = config.family.qa_outputs
        self.add_module(self.outputs_name, nn.Linear(config.hidden_size, 2))
        self.post_init()

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        start_positions: Tensor | None = None,
        end_positions: Tensor | None = None,
    ) -> QuestionAnsweringOutput:
        """start_positions, end_positions (B,): token indices; 0 ([CLS]) for no answer."""
        hidden = self.bert(input_ids, attention_mask, token_type_ids).last_hidden_state
        hidden = self.family_head(hidden)
        start, end = getattr(self, self.outputs_name)(hidden).unbind(-1)  # (B, T) each
        loss = None
        if start_positions is not None and end_positions is not None:
            T = start.shape[1]
            # Positions outside the window are ignored, as in the original run_squad.
            s = start_positions.clamp(0, T)
            e = end_positions.clamp(0, T)
            loss = (
                F.cross_entropy(start.float(), s, ignore_index=T)
                + F.cross_entropy(end.float(), e, ignore_index=T)
            ) / 2
        return QuestionAnsweringOutput(loss, start, end)


@dataclass
class EmbeddingOutput:
    embeddings: Tensor  # (B, H)
    loss: Tensor | None = None


def pool(hidden: Tensor, attention_mask: Tensor | None, pooling: str) -> Tensor:
    """(B, T, H) -> (B, H) over the real tokens (padding masked out; no mask: every token is
    real), as sentence-transformers' Pooling modes: 'cls' the first token, 'mean' the average,
    'max' the element-wise maximum, 'mean_sqrt_len_tokens' the sum over sqrt(length)."""
    if pooling == "cls":
        return hidden[:, 0]
    if attention_mask is None:
        attention_mask = torch.ones(hidden.shape[:2], dtype=torch.long, device=hidden.device)
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
    if pooling == "max":
        return hidden.masked_fill(mask == 0, float("-inf")).max(1).values
    total, length = (hidden * mask).sum(1), mask.sum(1).clamp(min=1e-9)
    if pooling == "mean":
        return total / length
    if pooling == "mean_sqrt_len_tokens":
        return total / length.sqrt()
    if pooling in SPARSE_POOLINGS:
        raise ValueError(
            f"pooling {pooling!r} reads masked-LM logits, not hidden states: export a "
            f"*ForMaskedLM checkpoint with --task embedding --pooling {pooling}"
        )
    raise ValueError(f"pooling must be one of {', '.join(DENSE_POOLINGS)}, not {pooling!r}")


# The activations a sentence-transformers Dense module may name (its activation_function: the
# torch class's full name, built without arguments as sentence-transformers builds it).
DENSE_ACTIVATIONS: dict[str, type[nn.Module]] = {
    f"{cls.__module__}.{cls.__name__}": cls
    for cls in (nn.Identity, nn.Tanh, nn.ReLU, nn.GELU, nn.Sigmoid)
}


class Dense(nn.Module):
    """sentence-transformers' Dense module on the pooled vector: linear, then the activation
    (`activation`, a key of DENSE_ACTIVATIONS; their default is Tanh)."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        activation: str = "torch.nn.modules.activation.Tanh",
    ) -> None:
        super().__init__()
        if activation not in DENSE_ACTIVATIONS:
            raise ValueError(
                f"Dense activation {activation} is not supported ({', '.join(DENSE_ACTIVATIONS)})"
            )
        self.activation = activation
        self.linear = nn.Linear(in_features, out_features, bias=bias)
        self.act = DENSE_ACTIVATIONS[activation]()

    def forward(self, x: Tensor) -> Tensor:
        return self.act(self.linear(x))


class BertForEmbedding(BertPreTrainedHead):
    """Sentence embeddings, sentence-transformers style: pooled last hidden state, then any
    Dense modules, optionally L2-normalised. Trained with in-batch negatives
    (`contrastive_loss`)."""

    def __init__(
        self,
        config: BertConfig,
        pooling: str = "mean",
        normalize: bool = True,
        dense: list[Dense] | None = None,
    ) -> None:
        super().__init__(config, add_pooling_layer=False)
        pool(torch.zeros(1, 1, 1), torch.ones(1, 1), pooling)  # validate the name early
        self.pooling = pooling
        self.normalize = normalize
        self.dense = nn.Sequential(*(dense or []))  # empty: no parameters, no graph nodes
        self.post_init()

    @property
    def dimension(self) -> int:
        """The embedding's width: the last Dense module's, else hidden_size."""
        # Sequential's [] types its items as Module; these are Dense modules.
        return (
            cast(Dense, self.dense[-1]).linear.out_features
            if self.dense
            else self.config.hidden_size
        )

    def sentence(self, hidden: Tensor, attention_mask: Tensor | None, pooling: str) -> Tensor:
        """(B, T, H) last hidden states -> (B, D) embeddings, before normalisation."""
        return self.dense(pool(hidden, attention_mask, pooling))

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
    ) -> EmbeddingOutput:
        hidden = self.bert(input_ids, attention_mask, token_type_ids).last_hidden_state
        emb = self.sentence(hidden, attention_mask, self.pooling)
        if self.normalize:
            emb = F.normalize(emb, p=2, dim=-1)
        return EmbeddingOutput(emb)


@dataclass
class LateInteractionOutput:
    token_embeddings: Tensor  # (B, T, D): every position, projected, NOT normalised


class BertForLateInteraction(BertPreTrainedHead):
    """ColBERT (Khattab and Zaharia 2020): every token's last hidden state put through one
    linear projection H -> D, as PyLate's Dense module and colbert-ai's `linear` compute it
    (no activation: PyLate's Dense applies none whatever its config names). Vectors are not
    normalised here: both libraries L2-normalise each kept vector after dropping the ones
    they do not score, so the service does that per row (heads.tasks.late_interaction).
    Not in HEADS: it is loaded from a PyLate or colbert-ai folder (training.checkpoint
    .load_model with task "late-interaction"), never trained or saved here."""

    def __init__(self, config: BertConfig, dimension: int = 128, bias: bool = False) -> None:
        super().__init__(config, add_pooling_layer=False)
        self.linear = nn.Linear(config.hidden_size, dimension, bias=bias)
        self.post_init()

    @property
    def dimension(self) -> int:
        """D, the width of each token's vector."""
        return self.linear.out_features

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
    ) -> LateInteractionOutput:
        hidden = self.bert(input_ids, attention_mask, token_type_ids).last_hidden_state
        return LateInteractionOutput(self.linear(hidden))


def contrastive_loss(anchor: Tensor, positive: Tensor, scale: float = 20.0) -> Tensor:
    """In-batch negatives (Henderson et al. 2017; sentence-transformers'
    MultipleNegativesRankingLoss): row i's positive is column i, every other row a negative.
    anchor, positive (B, H); scale 20 is the usual inverse temperature on cosine scores."""
    scores = F.normalize(anchor, dim=-1) @ F.normalize(positive, dim=-1).T * scale  # (B, B)
    return F.cross_entropy(scores.float(), torch.arange(len(scores), device=scores.device))


HEADS: dict[str, type[BertPreTrainedHead]] = {
    "pretraining": BertForPreTraining,
    "classification": BertForSequenceClassification,
    "token-classification": BertForTokenClassification,
    "question-answering": BertForQuestionAnswering,
    "embedding": BertForEmbedding,
    "fill-mask": BertForMaskedLM,
}
