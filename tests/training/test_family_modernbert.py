"""ModernBERT (training/families/modernbert.py) equal to transformers' on tiny random configs:
every hidden state and last_hidden_state against `ModernBertModel` (eager and sdpa), the
classification (cls and mean pooling), token classification and masked-LM heads, state dict
keys one to one, and one ONNX export (TorchScript exporter) that runs at other batch sizes and
lengths, past the local window, equal to PyTorch. Max diffs are listed at the end of the run
(the `parity` summary)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from training.families.modernbert import (
    ModernBertEncoder,
    ModernBertMaskedLMHead,
    ModernBertPredictionHead,
    attention_biases,
)
from training.model import pool

transformers = pytest.importorskip("transformers")

TOL = 1e-5
ONNX_TOL = 1e-4
LAYERS = 4
# transformers' ModernBertModelTester-like shape. 4 layers with a global layer every 2nd
# (0 and 2 global, 1 and 3 local); rows of 64 tokens exceed the 16-token window.
# intermediate_size need not be even: Wi makes 2 I columns, split into two halves of I.
SHAPE = dict(
    vocab_size=99,
    hidden_size=32,
    num_attention_heads=4,
    num_hidden_layers=LAYERS,
    global_attn_every_n_layers=2,
    local_attention=16,
    max_position_embeddings=128,
    pad_token_id=0,
)
CONFIGS = {
    "plain": dict(SHAPE, intermediate_size=37),
    "biased": dict(
        SHAPE,
        intermediate_size=38,
        norm_bias=True,
        mlp_bias=True,
        attention_bias=True,
        classifier_bias=True,
    ),
}
IMPLEMENTATIONS = ("eager", "sdpa")
LENGTHS = (7, 64, 30)  # one row shorter than the window, one of 64 tokens, one between


def their_config(name: str, **extra) -> transformers.ModernBertConfig:
    return transformers.ModernBertConfig(**{**CONFIGS[name], **extra})


def randomize(model: nn.Module, seed: int = 0) -> None:
    """Larger weights than transformers' init (std 0.02, which leaves attention almost
    uniform): Q/K/V large enough for peaked attention, so that rotary angles, thetas and the
    window change the outputs, the rest moderate so hidden states stay O(1) (an absolute TOL
    on values of 40 would only test float32 rounding)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * noise)
            else:
                p.copy_((0.3 if "Wqkv" in name else 0.1) * noise)


def build(cls_name: str, config: transformers.ModernBertConfig, implementation: str) -> nn.Module:
    torch.manual_seed(0)
    cls = getattr(transformers, cls_name)
    model = cls._from_config(config, attn_implementation=implementation).eval()
    randomize(model)
    return model


def ours_from(theirs: nn.Module, config: transformers.ModernBertConfig) -> ModernBertEncoder:
    """Our encoder with the weights of theirs (a ModernBertModel, or a head model's `model`)."""
    base = theirs if isinstance(theirs, transformers.ModernBertModel) else theirs.model
    ours = ModernBertEncoder(config).eval()
    ours.load_state_dict(base.state_dict())  # strict: no missing or unexpected keys
    return ours


def padded_batch(lengths: tuple[int, ...], seed: int = 0) -> tuple[Tensor, Tensor]:
    """Right-padded rows of these real lengths, pad id 0: input_ids, attention_mask (B, T)."""
    g = torch.Generator().manual_seed(seed)
    T = max(lengths)
    mask = (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).long()
    ids = torch.randint(1, SHAPE["vocab_size"], (len(lengths), T), generator=g) * mask
    return ids, mask


def real(x: Tensor, mask: Tensor) -> Tensor:
    """The real-token positions of (B, T, ...) -> (N, ...)."""
    return x[mask.bool()]


# --- encoder ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", CONFIGS)
def test_state_dict_is_transformers(name):
    config = their_config(name)
    theirs = transformers.ModernBertModel(config)
    ours = ModernBertEncoder(config)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    for key, value in theirs.state_dict().items():
        assert ours.state_dict()[key].shape == value.shape, key
    assert isinstance(ours.layers[0].attn_norm, nn.Identity)
    assert ours.layers[0].mlp.Wi.out_features == 2 * config.intermediate_size
    assert (ours.layers[0].attn.Wqkv.bias is not None) == config.attention_bias
    assert [layer.attn.is_global for layer in ours.layers] == [True, False, True, False]


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("name", CONFIGS)
def test_hidden_states_match_transformers(name, implementation, parity):
    """ours[i] == hs[i] for i < L, ours[L] == last_hidden_state == final_norm(hs[L])."""
    config = their_config(name)
    theirs = build("ModernBertModel", config, implementation)
    ours = ours_from(theirs, config)
    ids, mask = padded_batch(LENGTHS)
    with torch.no_grad():
        out = theirs(ids, attention_mask=mask, output_hidden_states=True)
        hidden = ours(ids, mask, token_type_ids=torch.zeros_like(ids))
    assert len(hidden) == len(out.hidden_states) == LAYERS + 1
    for i in range(LAYERS):
        diff = parity(
            f"modernbert {name} {implementation} hidden[{i}]",
            real(hidden[i], mask),
            real(out.hidden_states[i], mask),
        )
        assert diff <= TOL, i
    diff = parity(
        f"modernbert {name} {implementation} last_hidden_state",
        real(hidden[-1], mask),
        real(out.last_hidden_state, mask),
    )
    assert diff <= TOL
    # hs[L] is the last layer before final_norm; ours[L] is after it.
    final = theirs.final_norm(out.hidden_states[LAYERS])
    diff = parity(
        f"modernbert {name} {implementation} final_norm(hs[L])",
        real(hidden[-1], mask),
        real(final, mask),
    )
    assert diff <= TOL


def test_no_mask_means_all_real():
    config = their_config("plain")
    ours = ModernBertEncoder(config).eval()
    ids, mask = padded_batch((20, 20))
    with torch.no_grad():
        assert torch.equal(ours(ids)[-1], ours(ids, mask)[-1])


@pytest.mark.parametrize(
    "change",
    [
        dict(local_attention=1024),
        dict(local_rope_theta=160000.0),
        dict(global_attn_every_n_layers=1),
    ],
    ids=["no window", "local theta = global", "all layers global"],
)
def test_the_comparison_sees_window_and_theta(change):
    """The parity above is not vacuous: an encoder without the window, with the wrong local
    theta or with no local layers differs from transformers' by far more than TOL."""
    config = their_config("plain")
    theirs = build("ModernBertModel", config, "eager")
    wrong = ModernBertEncoder(their_config("plain", **change)).eval()
    wrong.load_state_dict(theirs.state_dict())
    ids, mask = padded_batch(LENGTHS)
    with torch.no_grad():
        diff = (real(wrong(ids, mask)[-1] - theirs(ids, mask).last_hidden_state, mask)).abs()
    assert diff.max().item() > 1e-2


def test_attention_biases_window_and_padding():
    """Query q may attend key k of its row iff k is real and |q - k| <= window // 2, for rows
    far longer than the window; global layers mask padding keys only."""
    window, lengths = 16, (7, 100, 41)
    _, mask = padded_batch(lengths)
    global_bias, local_bias = attention_biases(mask, window, torch.float32)
    assert global_bias.shape == (3, 1, 1, 100) and local_bias.shape == (3, 1, 100, 100)
    low = torch.finfo(torch.float32).min
    for b, n in enumerate(lengths):
        q, k = torch.meshgrid(torch.arange(100), torch.arange(100), indexing="ij")
        allowed = (k < n) & ((q - k).abs() <= window // 2)
        assert torch.equal(local_bias[b, 0], torch.where(allowed, 0.0, low))
        assert torch.equal(global_bias[b, 0, 0], torch.where(torch.arange(100) < n, 0.0, low))


# --- heads ------------------------------------------------------------------------------


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("pooling", ["cls", "mean"])
@pytest.mark.parametrize("name", CONFIGS)
def test_sequence_classification_matches(name, pooling, implementation, parity):
    """pool -> head -> drop -> classifier == ModernBertForSequenceClassification's logits."""
    config = their_config(name, classifier_pooling=pooling, num_labels=3)
    theirs = build("ModernBertForSequenceClassification", config, implementation)
    encoder = ours_from(theirs, config)
    head = ModernBertPredictionHead(config).eval()
    head.load_state_dict(theirs.head.state_dict())
    classifier = nn.Linear(config.hidden_size, 3)
    classifier.load_state_dict(theirs.classifier.state_dict())
    drop = nn.Dropout(config.classifier_dropout).eval()
    ids, mask = padded_batch(LENGTHS)
    with torch.no_grad():
        expected = theirs(ids, attention_mask=mask).logits
        logits = classifier(drop(head(pool(encoder(ids, mask)[-1], mask, pooling))))
    assert parity(f"modernbert {name} {implementation} {pooling} logits", logits, expected) <= TOL


@pytest.mark.parametrize("name", CONFIGS)
def test_token_classification_matches(name, parity):
    """head -> drop -> classifier on every token == ModernBertForTokenClassification."""
    config = their_config(name, num_labels=5)
    theirs = build("ModernBertForTokenClassification", config, "sdpa")
    encoder = ours_from(theirs, config)
    head = ModernBertPredictionHead(config).eval()
    head.load_state_dict(theirs.head.state_dict())
    classifier = nn.Linear(config.hidden_size, 5)
    classifier.load_state_dict(theirs.classifier.state_dict())
    ids, mask = padded_batch(LENGTHS)
    with torch.no_grad():
        expected = theirs(ids, attention_mask=mask).logits
        logits = classifier(head(encoder(ids, mask)[-1]))
    diff = parity(f"modernbert {name} token logits", real(logits, mask), real(expected, mask))
    assert diff <= TOL


@pytest.mark.parametrize("name", CONFIGS)
def test_masked_lm_matches(name, parity):
    """head -> decoder tied to tok_embeddings == ModernBertForMaskedLM's logits."""
    config = their_config(name)
    theirs = build("ModernBertForMaskedLM", config, "sdpa")
    encoder = ours_from(theirs, config)
    lm = ModernBertMaskedLMHead(config, encoder.embeddings.tok_embeddings).eval()
    assert lm.decoder.weight is encoder.embeddings.tok_embeddings.weight
    lm.load_state_dict({k: v for k, v in theirs.state_dict().items() if not k.startswith("model.")})
    ids, mask = padded_batch(LENGTHS)
    with torch.no_grad():
        expected = theirs(ids, attention_mask=mask).logits
        logits = lm(encoder(ids, mask)[-1])
    diff = parity(f"modernbert {name} masked-LM logits", real(logits, mask), real(expected, mask))
    assert diff <= TOL


# --- ONNX -------------------------------------------------------------------------------


class LastHidden(nn.Module):
    """The encoder with one output, the final-normed last hidden state, for export."""

    def __init__(self, encoder: ModernBertEncoder) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        return self.encoder(input_ids, attention_mask)[-1]


def test_onnx_export_runs_at_any_batch_and_length(tmp_path, parity):
    """Exported at batch 2 x 20 tokens, run at batch 1 and 3 and lengths 7, 64 and 100: cos,
    sin and the window mask follow the run-time T (100 is past the window and the export
    length), equal to PyTorch on real tokens."""
    ort = pytest.importorskip("onnxruntime")
    config = their_config("biased")
    model = LastHidden(ours_from(build("ModernBertModel", config, "eager"), config)).eval()
    path = tmp_path / "modernbert.onnx"
    ids, mask = padded_batch((20, 13))
    axes = {0: "batch", 1: "sequence"}
    torch.onnx.export(
        model,
        (ids, mask),
        str(path),
        dynamo=False,
        opset_version=18,
        input_names=["input_ids", "attention_mask"],
        output_names=["last_hidden_state"],
        dynamic_axes={"input_ids": axes, "attention_mask": axes, "last_hidden_state": axes},
    )
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for lengths in [(7,), (64,), (100,), (7, 64, 30), (64, 5, 64), (100, 7, 55)]:
        ids, mask = padded_batch(lengths, seed=len(lengths) + max(lengths))
        feeds = {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}
        (got,) = session.run(None, feeds)
        with torch.no_grad():
            expected = model(ids, mask)
        assert np.isfinite(got).all()
        diff = parity(
            f"modernbert ONNX batch {len(lengths)} T {max(lengths)}",
            real(torch.from_numpy(got), mask),
            real(expected, mask),
        )
        assert diff <= ONNX_TOL, lengths
