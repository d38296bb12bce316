"""training/families/mpnet.py against transformers' MPNet, on tiny random configs: every hidden
state, the relative position buckets and bias, the classification / token / QA / masked-LM
heads, and an ONNX export run in ONNX Runtime at other batch sizes and lengths than traced.

Differences are recorded with the `parity` fixture (listed at the end of the run)."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from training.families.mpnet import MPNetClassificationHead, MPNetEncoder, MPNetLMHead

transformers = pytest.importorskip("transformers")

TOL = 1e-5
ONNX_TOL = 1e-4
PAD = 1  # MPNet's padding id (transformers hard-codes it)


def tiny_config(**overrides) -> transformers.MPNetConfig:
    """transformers' tester shape; 32 buckets over 64-token rows reach the log-spaced ones."""
    settings = dict(
        vocab_size=99,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=128,
        pad_token_id=PAD,
        relative_attention_num_buckets=32,
    )
    return transformers.MPNetConfig(**(settings | overrides))


def padded_batch(lengths: tuple[int, ...], seed: int = 0) -> tuple[Tensor, Tensor]:
    """Rows of the given real lengths, right-padded with PAD to the longest:
    input_ids and attention_mask, both (B, T) int64."""
    g = torch.Generator().manual_seed(seed)
    T = max(lengths)
    mask = (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).long()
    real = torch.randint(PAD + 1, 99, (len(lengths), T), generator=g)
    return real * mask + PAD * (1 - mask), mask


BATCH = padded_batch((7, 64, 30))  # (3, 64)


def prefixed(state: dict[str, Tensor], prefix: str) -> dict[str, Tensor]:
    """The entries under `prefix`, with it removed."""
    return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}


def encoder_from(hf_model: nn.Module) -> MPNetEncoder:
    """Our encoder holding a transformers task model's `mpnet.*` weights (strict load)."""
    ours = MPNetEncoder(hf_model.config).eval()
    ours.load_state_dict(prefixed(hf_model.state_dict(), "mpnet."))
    return ours


@pytest.mark.parametrize("add_pooling_layer", [False, True])
def test_hidden_states_match_mpnet_model(parity, add_pooling_layer: bool) -> None:
    config = tiny_config()
    torch.manual_seed(0)
    hf = transformers.MPNetModel(config, add_pooling_layer=add_pooling_layer).eval()
    # MPNet has only eager attention in transformers 4.57 (no sdpa to compare against).
    assert not hf._supports_sdpa and hf.config._attn_implementation == "eager"
    ours = MPNetEncoder(config, add_pooling_layer=add_pooling_layer).eval()
    # Strict: the names match one to one (transformers' position_ids buffer is non-persistent).
    ours.load_state_dict(hf.state_dict())

    ids, mask = BATCH
    real = mask.bool()
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask, output_hidden_states=True)
        hidden = ours(ids, mask)
    assert len(hidden) == len(ref.hidden_states) == config.num_hidden_layers + 1
    for i, (a, b) in enumerate(zip(hidden, ref.hidden_states, strict=True)):
        assert parity(f"mpnet hidden state {i}", a[real], b[real]) <= TOL
    if add_pooling_layer:
        assert parity("mpnet pooler", ours.pooler(hidden[-1]), ref.pooler_output) <= TOL
    # The 64-token row alone: no mask means all tokens; token type ids are ignored.
    with torch.no_grad():
        alone = ours(ids[1:2], token_type_ids=torch.ones_like(ids[1:2]))[-1]
    assert parity("mpnet no mask, token types ignored", alone, ref.last_hidden_state[1:2]) <= TOL


def test_relative_position_bias_matches_for_long_rows(parity) -> None:
    """200 tokens: offsets past max_distance (128) reach the last, saturated bucket."""
    config = tiny_config()
    torch.manual_seed(0)
    hf = transformers.MPNetModel(config, add_pooling_layer=False).eval()
    ours = MPNetEncoder(config).eval()
    ours.load_state_dict(hf.state_dict())
    with torch.no_grad():
        ref = hf.encoder.compute_position_bias(torch.zeros(1, 200, config.hidden_size))
        bias = ours.encoder.position_bias(200)
    assert bias.shape == (1, config.num_attention_heads, 200, 200)
    assert parity("mpnet position bias (T=200)", bias, ref) == 0.0


def test_classification_head_matches(parity) -> None:
    config = tiny_config(num_labels=3)
    torch.manual_seed(1)
    hf = transformers.MPNetForSequenceClassification(config).eval()
    ours = encoder_from(hf)
    head = MPNetClassificationHead(config.hidden_size, 3, config.hidden_dropout_prob).eval()
    head.load_state_dict(prefixed(hf.state_dict(), "classifier."))
    ids, mask = BATCH
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask).logits
        logits = head(ours(ids, mask)[-1])
    assert logits.shape == (3, 3)
    assert parity("mpnet sequence classification", logits, ref) <= TOL


def test_token_classification_matches(parity) -> None:
    config = tiny_config(num_labels=5)
    torch.manual_seed(2)
    hf = transformers.MPNetForTokenClassification(config).eval()
    ours = encoder_from(hf)
    classifier = nn.Linear(config.hidden_size, 5)
    classifier.load_state_dict(prefixed(hf.state_dict(), "classifier."))
    ids, mask = BATCH
    real = mask.bool()
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask).logits
        logits = classifier(ours(ids, mask)[-1])
    assert parity("mpnet token classification", logits[real], ref[real]) <= TOL


def test_question_answering_matches(parity) -> None:
    config = tiny_config()  # num_labels 2: start and end
    torch.manual_seed(3)
    hf = transformers.MPNetForQuestionAnswering(config).eval()
    ours = encoder_from(hf)
    qa_outputs = nn.Linear(config.hidden_size, 2)
    qa_outputs.load_state_dict(prefixed(hf.state_dict(), "qa_outputs."))
    ids, mask = BATCH
    real = mask.bool()
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask)
        start, end = qa_outputs(ours(ids, mask)[-1]).unbind(dim=-1)  # (B, T) each
    assert parity("mpnet QA start", start[real], ref.start_logits[real]) <= TOL
    assert parity("mpnet QA end", end[real], ref.end_logits[real]) <= TOL


def test_masked_lm_head_matches_and_is_tied(parity) -> None:
    config = tiny_config()
    torch.manual_seed(4)
    hf = transformers.MPNetForMaskedLM(config).eval()
    with torch.no_grad():  # a non-zero bias, so the test sees whether it is applied
        hf.lm_head.bias.normal_()
    ours = encoder_from(hf)
    head = MPNetLMHead(
        config.hidden_size,
        config.vocab_size,
        config.layer_norm_eps,
        ours.embeddings.word_embeddings,
    ).eval()
    head.load_state_dict(prefixed(hf.state_dict(), "lm_head."))
    assert head.decoder.weight is ours.embeddings.word_embeddings.weight
    assert head.decoder.bias is head.bias
    ids, mask = BATCH
    real = mask.bool()
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask).logits
        logits = head(ours(ids, mask)[-1])
    assert parity("mpnet masked LM", logits[real], ref[real]) <= TOL


class LastHidden(nn.Module):
    """The encoder with one output, the last hidden state (B, T, H), for export."""

    def __init__(self, encoder: MPNetEncoder) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        return self.encoder(input_ids, attention_mask)[-1]


# F.embedding's padding_idx range check, traced: a constant either way.
@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
def test_onnx_export_runs_at_other_shapes(parity, tmp_path) -> None:
    ort = pytest.importorskip("onnxruntime")
    torch.manual_seed(5)
    model = LastHidden(MPNetEncoder(tiny_config())).eval()
    path = tmp_path / "mpnet.onnx"
    axes = {0: "batch", 1: "sequence"}
    # Traced at batch 2, length 20; run below at batch 1 and 3, lengths 7 and 64.
    torch.onnx.export(
        model,
        padded_batch((20, 11)),
        str(path),
        dynamo=False,
        opset_version=18,
        input_names=["input_ids", "attention_mask"],
        output_names=["last_hidden_state"],
        dynamic_axes={"input_ids": axes, "attention_mask": axes, "last_hidden_state": axes},
    )
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for batch in (1, 3):
        for T in (7, 64):
            ids, mask = padded_batch((T, 3, (T + 3) // 2)[:batch], seed=T)
            (out,) = session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
            with torch.no_grad():
                ref = model(ids, mask)
            real = mask.bool()
            diff = parity(
                f"mpnet ONNX batch {batch} length {T}", torch.from_numpy(out)[real], ref[real]
            )
            assert diff <= ONNX_TOL
