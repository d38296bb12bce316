"""training.families.deberta_v2 equals transformers' DeBERTa-v2/v3 (random tiny configs, no
downloads): every hidden state, the sequence-classification and masked-LM logits, the relative
position buckets, and the ONNX export run in ONNX Runtime at other batch sizes and lengths.

The batch is padded (rows of 7, 64 and 30 real tokens). Our attention masks exactly as
transformers does (a query-key pair counts only if both are real tokens; a padded query row
thus attends uniformly), so padded positions match as well and every position is compared."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from training.families.deberta_v2 import (
    DebertaV2ContextPooler,
    DebertaV2Encoder,
    DebertaV2MaskedLMHead,
    RelativePositions,
)

transformers = pytest.importorskip("transformers")

TOL = 1e-5
ONNX_TOL = 1e-4
TINY = dict(
    vocab_size=99,
    hidden_size=32,
    num_hidden_layers=3,
    num_attention_heads=4,
    intermediate_size=37,
    max_position_embeddings=128,
)
CONFIGS: dict[str, dict[str, Any]] = {
    # DeBERTa-v3: log buckets (mid 4, so distances past 4 are bucketed and past 31 clamped
    # within 64 tokens), shared projections, LayerNorm-ed distance table, no absolute
    # positions, no token types.
    "v3": dict(
        relative_attention=True,
        position_buckets=8,
        max_relative_positions=32,
        pos_att_type=["p2c", "c2p"],
        share_att_key=True,
        norm_rel_ebd="layer_norm",
        position_biased_input=False,
        type_vocab_size=0,
    ),
    # DeBERTa-v2 (base/large): own position projections, plain distances clipped at 16,
    # absolute positions and token types as well.
    "v2": dict(
        relative_attention=True,
        position_buckets=-1,
        max_relative_positions=16,
        pos_att_type=["c2p", "p2c"],
        share_att_key=False,
        type_vocab_size=2,
        position_biased_input=True,
    ),
    # position_buckets 0 means no buckets too; only the c2p term.
    "c2p-only": dict(
        relative_attention=True,
        position_buckets=0,
        max_relative_positions=16,
        pos_att_type=["c2p"],
        type_vocab_size=2,
    ),
    # Embeddings of 24 projected to the hidden size of 32 (embed_proj).
    "embed-proj": dict(
        embedding_size=24,
        relative_attention=True,
        position_buckets=8,
        max_relative_positions=32,
        pos_att_type=["p2c", "c2p"],
        share_att_key=True,
        norm_rel_ebd="layer_norm",
        type_vocab_size=2,
    ),
    # Relative attention without c2p/p2c: the distance table exists but adds nothing.
    "no-terms": dict(relative_attention=True, pos_att_type=None, type_vocab_size=2),
    # No relative attention: pos_att_type still enlarges the score scale, as in transformers.
    "absolute": dict(relative_attention=False, pos_att_type=["c2p", "p2c"], type_vocab_size=2),
}


def config(name: str, **extra: Any) -> Any:
    return transformers.DebertaV2Config(**TINY, **CONFIGS[name], **extra)


def padded_batch(lengths: tuple[int, ...] = (7, 64, 30)) -> tuple[torch.Tensor, ...]:
    """input_ids, attention_mask, token_type_ids (B, max(lengths)), right-padded with 0;
    segment B from position 3 on."""
    length = max(lengths)
    mask = (torch.arange(length)[None] < torch.tensor(lengths)[:, None]).long()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, TINY["vocab_size"], (len(lengths), length), generator=g) * mask
    types = (torch.arange(length)[None] >= 3).long() * mask
    return ids, mask, types


def theirs_and_ours(cls: type, cfg: Any, attn: str = "eager") -> tuple[nn.Module, nn.Module]:
    """A random transformers model of `cls` and our encoder with its `deberta` weights."""
    torch.manual_seed(0)
    theirs = cls._from_config(cfg, attn_implementation=attn).eval()
    base = theirs if isinstance(theirs, transformers.DebertaV2Model) else theirs.deberta
    ours = DebertaV2Encoder(cfg).eval()
    ours.load_state_dict(base.state_dict(), strict=True)
    return theirs, ours


def part(state: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {k.removeprefix(prefix): v for k, v in state.items() if k.startswith(prefix)}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_parameter_names_are_transformers(name: str) -> None:
    cfg = config(name)
    theirs = transformers.DebertaV2Model(cfg)
    assert set(DebertaV2Encoder(cfg).state_dict()) == set(theirs.state_dict())
    # Their one buffer, embeddings.position_ids, is non-persistent: in neither state dict.
    assert [n for n, _ in theirs.named_buffers()] == ["embeddings.position_ids"]


def test_transformers_deberta_v2_has_eager_attention_only() -> None:
    """transformers 4.57's DebertaV2 refuses attn_implementation="sdpa": eager, compared below,
    is its only attention. The day it has another, this fails: compare that one too."""
    with pytest.raises(ValueError, match="(?i)sdpa|scaled_dot_product"):
        theirs_and_ours(transformers.DebertaV2Model, config("v3"), "sdpa")


@pytest.mark.parametrize("name", list(CONFIGS))
def test_hidden_states_match_transformers(name: str, parity) -> None:
    cfg = config(name)
    attn = "eager"
    theirs, ours = theirs_and_ours(transformers.DebertaV2Model, cfg, attn)
    ids, mask, types = padded_batch()
    with torch.inference_mode():
        want = theirs(ids, attention_mask=mask, token_type_ids=types, output_hidden_states=True)
        got = ours(ids, mask, types)
    assert len(got) == cfg.num_hidden_layers + 1 == len(want.hidden_states)
    for i, (a, b) in enumerate(zip(got, want.hidden_states, strict=True)):
        assert parity(f"deberta-v2 {name} {attn} hidden {i}", a, b) <= TOL, i


def test_defaults_match_transformers(parity) -> None:
    """No mask and no token types given: all tokens real, type 0."""
    theirs, ours = theirs_and_ours(transformers.DebertaV2Model, config("v2"))
    ids = padded_batch((9, 9))[0]
    with torch.inference_mode():
        assert parity("deberta-v2 v2 no mask", ours(ids)[-1], theirs(ids)[0]) <= TOL


@pytest.mark.parametrize(
    ("buckets", "max_relative", "length"), [(8, 32, 64), (256, 512, 700), (-1, 16, 40)]
)
def test_relative_positions_match_transformers(
    buckets: int, max_relative: int, length: int
) -> None:
    from transformers.models.deberta_v2.modeling_deberta_v2 import build_relative_position

    hidden = torch.zeros(1, length, 4)
    want = build_relative_position(hidden, hidden, bucket_size=buckets, max_position=max_relative)
    assert torch.equal(RelativePositions(max_relative, buckets)(hidden), want[0])


def test_classification_matches_transformers(parity) -> None:
    cfg = config("v3", num_labels=3)
    theirs, ours = theirs_and_ours(transformers.DebertaV2ForSequenceClassification, cfg)
    pooler = DebertaV2ContextPooler(cfg).eval()
    classifier = nn.Linear(cfg.hidden_size, cfg.num_labels)
    state = theirs.state_dict()
    pooler.load_state_dict(part(state, "pooler."), strict=True)
    classifier.load_state_dict(part(state, "classifier."), strict=True)
    ids, mask, types = padded_batch()
    with torch.inference_mode():
        want = theirs(ids, attention_mask=mask).logits
        got = classifier(pooler(ours(ids, mask)[-1]))
    assert got.shape == (3, 3)
    assert parity("deberta-v2 v3 classification logits", got, want) <= TOL


@pytest.mark.parametrize("legacy", [True, False])
def test_masked_lm_matches_transformers(legacy: bool, parity) -> None:
    # transformers 4.57's non-legacy head breaks under tie_word_embeddings=True (tying swaps its
    # `dense` for the (V, H) word embeddings and its forward fails); its scores are tied to the
    # word embeddings anyway, so that layout is compared untied.
    cfg = config("v3", legacy=legacy, tie_word_embeddings=legacy)
    theirs, ours = theirs_and_ours(transformers.DebertaV2ForMaskedLM, cfg)
    head = DebertaV2MaskedLMHead(cfg, ours.embeddings.word_embeddings).eval()
    head.load_state_dict(part(theirs.state_dict(), head.transformers_prefix), strict=True)
    if legacy:
        assert head.predictions.decoder.weight is ours.embeddings.word_embeddings.weight
    ids, mask, _ = padded_batch()
    with torch.inference_mode():
        want = theirs(ids, attention_mask=mask).logits
        got = head(ours(ids, mask)[-1])
    assert got.shape == (3, 64, cfg.vocab_size)
    assert parity(f"deberta-v2 v3 masked-lm legacy={legacy}", got, want) <= TOL


class LastHidden(nn.Module):
    """The encoder with one output, the last hidden state (B, T, H), for export."""

    def __init__(self, encoder: DebertaV2Encoder) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, ids: torch.Tensor, mask: torch.Tensor, types: torch.Tensor) -> torch.Tensor:
        return self.encoder(ids, mask, types)[-1]


@pytest.mark.parametrize("name", ["v3", "v2"])
def test_onnx_export_runs_other_shapes(name: str, tmp_path: Path, parity) -> None:
    ort = pytest.importorskip("onnxruntime")
    torch.manual_seed(0)
    model = LastHidden(DebertaV2Encoder(config(name))).eval()
    names = ["input_ids", "attention_mask", "token_type_ids"]
    dynamic = {n: {0: "batch", 1: "sequence"} for n in [*names, "last_hidden_state"]}
    path = tmp_path / "deberta.onnx"
    # Traced at batch 2, length 16: neither is run below, so nothing of the shape is frozen.
    torch.onnx.export(
        model,
        padded_batch((16, 11)),
        str(path),
        dynamo=False,
        opset_version=18,
        input_names=names,
        output_names=["last_hidden_state"],
        dynamic_axes=dynamic,
    )
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    # An input the model never reads (token types with type_vocab_size 0) is not in the graph.
    graph_inputs = {i.name for i in session.get_inputs()}
    assert graph_inputs == ({"input_ids", "attention_mask"} if name == "v3" else set(names))
    for lengths in [(7,), (64,), (7, 7, 5), (7, 64, 30)]:
        batch = padded_batch(lengths)
        feeds = {n: t.numpy() for n, t in zip(names, batch, strict=True) if n in graph_inputs}
        (got,) = session.run(None, feeds)
        with torch.inference_mode():
            want = model(*batch)
        real = batch[1].bool()
        diff = parity(f"deberta-v2 {name} onnx {lengths}", torch.from_numpy(got)[real], want[real])
        assert diff <= ONNX_TOL, lengths
        assert np.isfinite(got).all()


def test_conv_layer_is_refused() -> None:
    with pytest.raises(ValueError, match="conv_kernel_size"):
        DebertaV2Encoder(config("v2", conv_kernel_size=3))
