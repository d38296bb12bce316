"""The encoder and every head: shapes, losses, padding, and parity with transformers' BERT on
identical random weights (transformers' tiny test config, fp32, eval mode, padded batch)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from training.model import (
    HEADS,
    BertForEmbedding,
    BertForMaskedLM,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
    BertSelfAttention,
    contrastive_loss,
    set_attention_implementation,
)

TOL = 1e-5


def test_every_head_has_its_output_shape(tiny_config, batch):
    B, T, V, H = 3, 10, tiny_config.vocab_size, tiny_config.hidden_size
    torch.manual_seed(0)
    assert BertForPreTraining(tiny_config)(**batch).prediction_logits.shape == (B, T, V)
    assert BertForSequenceClassification(tiny_config, num_labels=5)(**batch).logits.shape == (B, 5)
    assert BertForTokenClassification(tiny_config, num_labels=7)(**batch).logits.shape == (B, T, 7)
    qa = BertForQuestionAnswering(tiny_config)(**batch)
    assert qa.start_logits.shape == qa.end_logits.shape == (B, T)
    assert BertForEmbedding(tiny_config)(**batch).embeddings.shape == (B, H)
    out = BertModel(tiny_config)(**batch)
    assert out.pooler_output.shape == (B, H) and len(out.hidden_states) == 3
    assert set(HEADS) == {
        "pretraining",
        "classification",
        "token-classification",
        "question-answering",
        "embedding",
        "fill-mask",
    }
    assert BertForMaskedLM(tiny_config)(**batch).logits.shape == (B, T, V)


def test_pretraining_scores_only_the_chosen_positions(tiny_config, batch):
    torch.manual_seed(0)
    model = BertForPreTraining(tiny_config).eval()
    labels = torch.full_like(batch["input_ids"], -100)
    labels[0, 3], labels[1, 1], labels[2, 2] = 7, 8, 9
    nsp = torch.tensor([0, 1, 0])
    out = model(**batch, labels=labels, next_sentence_label=nsp)
    assert out.prediction_logits.shape == (3, tiny_config.vocab_size)  # (M, V), M = 3 chosen
    full = model(**batch).prediction_logits  # (B, T, V)
    expected_mlm = F.cross_entropy(full.flatten(0, 1), labels.flatten(), ignore_index=-100)
    torch.testing.assert_close(out.mlm_loss, expected_mlm)
    torch.testing.assert_close(out.nsp_loss, F.cross_entropy(out.seq_relationship_logits, nsp))
    torch.testing.assert_close(out.loss, out.mlm_loss + out.nsp_loss)
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight


def test_the_fixed_size_mlm_slice_gives_the_chosen_positions_loss_and_gradients(tiny_config, batch):
    torch.manual_seed(0)
    model = BertForPreTraining(tiny_config).eval()
    labels = torch.full_like(batch["input_ids"], -100)
    labels[0, 3], labels[0, 7], labels[1, 1], labels[2, 2] = 7, 5, 8, 9  # row 0 holds the most
    losses, grads = [], []
    for fixed in ({}, {"max_predictions": 2}, {"max_predictions": 5}):
        model.zero_grad()
        out = model(**batch, labels=labels, **fixed)
        out.mlm_loss.backward()
        losses.append(out.mlm_loss.detach())
        grads.append(model.bert.embeddings.word_embeddings.weight.grad.clone())
    assert out.prediction_logits.shape == (3, 5, tiny_config.vocab_size)  # (B, P, V)
    for loss, grad in zip(losses[1:], grads[1:], strict=True):
        torch.testing.assert_close(loss, losses[0])
        torch.testing.assert_close(grad, grads[0])
    model.zero_grad()
    short = model(**batch, labels=labels, max_predictions=1).mlm_loss  # row 0 loses one: differs
    assert not torch.allclose(short, losses[0])


@pytest.mark.parametrize(
    "problem_type, num_labels, labels, loss_fn",
    [
        ("single_label_classification", 3, torch.tensor([0, 2, 1]), F.cross_entropy),
        (
            "multi_label_classification",
            3,
            torch.tensor([[1.0, 0, 1], [0, 0, 0], [0, 1, 0]]),
            F.binary_cross_entropy_with_logits,
        ),
        (
            "regression",
            1,
            torch.tensor([0.5, -1.0, 2.0]),
            lambda x, y: F.mse_loss(x.squeeze(-1), y),
        ),
    ],
)
def test_classification_loss_follows_problem_type(
    tiny_config, batch, problem_type, num_labels, labels, loss_fn
):
    torch.manual_seed(0)
    config = tiny_config.replace(problem_type=problem_type)
    out = BertForSequenceClassification(config, num_labels=num_labels).eval()(
        **batch, labels=labels
    )
    assert out.logits.shape == (3, num_labels)
    torch.testing.assert_close(out.loss, loss_fn(out.logits, labels))


def test_classification_problem_type_defaults(tiny_config):
    assert BertForSequenceClassification(tiny_config, num_labels=1).problem_type == "regression"
    single = BertForSequenceClassification(tiny_config, num_labels=4).problem_type
    assert single == "single_label_classification"


def test_token_classification_ignores_minus_100(tiny_config, batch):
    torch.manual_seed(0)
    model = BertForTokenClassification(tiny_config, num_labels=4).eval()
    labels = torch.randint(0, 4, batch["input_ids"].shape)
    labels[batch["attention_mask"] == 0] = -100  # padding
    labels[:, 0] = -100  # [CLS]
    out = model(**batch, labels=labels)
    keep = labels != -100
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits[keep], labels[keep]))


def test_question_answering_ignores_positions_outside_the_window(tiny_config, batch):
    torch.manual_seed(0)
    model = BertForQuestionAnswering(tiny_config).eval()
    start, end = torch.tensor([2, 0, 40]), torch.tensor([4, 0, 45])  # row 2: beyond T = 10
    out = model(**batch, start_positions=start, end_positions=end)
    inside = torch.tensor([True, True, False])
    expected = (
        F.cross_entropy(out.start_logits[inside], start[inside])
        + F.cross_entropy(out.end_logits[inside], end[inside])
    ) / 2
    torch.testing.assert_close(out.loss, expected)


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_embedding_does_not_change_with_padding(tiny_config, pooling):
    torch.manual_seed(0)
    model = BertForEmbedding(tiny_config, pooling=pooling).eval()
    ids = torch.tensor([[2, 17, 33, 41, 3]])
    alone = model(ids, torch.ones_like(ids)).embeddings
    padded = torch.cat([ids, torch.zeros(1, 6, dtype=torch.long)], dim=1)
    other = torch.randint(5, 99, (1, 11))
    both = torch.cat([padded, other])
    mask = torch.cat([(padded != 0).long(), torch.ones_like(other)])
    torch.testing.assert_close(model(both, mask).embeddings[0], alone[0], atol=1e-6, rtol=0)
    assert torch.allclose(alone.norm(dim=-1), torch.ones(1))


def test_mean_pooled_classification_reads_the_real_tokens_and_round_trips(
    tiny_config, batch, tmp_path
):
    from training.checkpoint import load_model, load_state_dict_file, save_model
    from training.config import ConfigError

    torch.manual_seed(0)
    model = BertForSequenceClassification(tiny_config, pooling="mean").eval()
    assert model.bert.pooler is None  # unused, so not built
    out = model(**batch).logits
    hidden = model.bert(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    expected = model.classifier((hidden * mask).sum(1) / mask.sum(1))
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=0)
    # padding changes nothing: the shortest row alone gives its logits
    n = int(batch["attention_mask"][2].sum())
    alone = model(**{k: v[2:, :n] for k, v in batch.items()}).logits
    torch.testing.assert_close(alone[0], out[2], atol=1e-6, rtol=0)
    cls = BertForSequenceClassification(tiny_config).eval()
    cls.load_state_dict(model.state_dict(), strict=False)
    assert not torch.allclose(cls(**batch).logits, out)  # the [CLS] pooler reads otherwise

    save_model(model, tmp_path / "m")
    assert not any(
        k.startswith(("pooler", "bert.pooler")) for k in load_state_dict_file(tmp_path / "m")
    )
    again = load_model(tmp_path / "m", task="classification")
    assert again.config.classifier_pooling == "mean"
    torch.testing.assert_close(again(**batch).logits, out, atol=0, rtol=0)
    with pytest.raises(ConfigError, match="classifier_pooling 'lasttoken'"):
        tiny_config.replace(classifier_pooling="lasttoken")


def test_embedding_rejects_unknown_pooling(tiny_config):
    with pytest.raises(ValueError, match="pooling must be"):
        BertForEmbedding(tiny_config, pooling="lasttoken")


def test_contrastive_loss_is_in_batch_cross_entropy():
    torch.manual_seed(0)
    a, p = torch.randn(4, 8), torch.randn(4, 8)
    scores = F.normalize(a, dim=-1) @ F.normalize(p, dim=-1).T * 20.0
    torch.testing.assert_close(contrastive_loss(a, p), F.cross_entropy(scores, torch.arange(4)))
    assert contrastive_loss(a, a) < contrastive_loss(a, p)  # a matching pair is easy
    a.requires_grad_(True)
    contrastive_loss(a, p).backward()
    assert a.grad is not None and a.grad.abs().sum() > 0


def test_sdpa_and_eager_agree(tiny_config, batch, parity):
    torch.manual_seed(0)
    model = BertForSequenceClassification(tiny_config, num_labels=3).eval()
    sdpa = model.bert(**batch).last_hidden_state
    set_attention_implementation(model, "eager")
    eager = model.bert(**batch).last_hidden_state
    assert parity("model: sdpa vs eager, last hidden state", sdpa, eager) <= TOL
    with pytest.raises(ValueError):
        set_attention_implementation(model, "flash")


def test_one_qkv_gemm_gives_the_same_outputs_and_gradients(tiny_config, batch, monkeypatch):
    torch.manual_seed(0)
    model = BertForSequenceClassification(tiny_config, num_labels=3).eval()
    labels = torch.tensor([0, 2, 1])

    def run() -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad()
        out = model(**batch, labels=labels)
        out.loss.backward()
        return out.logits, [p.grad.clone() for p in model.parameters()]

    monkeypatch.setattr(BertSelfAttention, "fuse_qkv", False)
    logits, grads = run()
    monkeypatch.setattr(BertSelfAttention, "fuse_qkv", True)
    fused_logits, fused_grads = run()
    torch.testing.assert_close(fused_logits, logits, atol=TOL, rtol=TOL)
    for g, f in zip(grads, fused_grads, strict=True):
        torch.testing.assert_close(f, g, atol=TOL, rtol=1e-4)


# --- parity with transformers -----------------------------------------------------------


def _perturb(model: torch.nn.Module) -> None:
    """Noise on every parameter: transformers initialises biases and LayerNorm to 0 / 1 and
    weights with std 0.02, which would hide a bias wired to the wrong place and give logits
    too small to compare meaningfully."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)


def _pair(hf_cls_name: str, ours_cls, tiny_config, **kwargs):
    """A transformers model with random weights and ours loaded with exactly those weights."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    hf_config = transformers.BertConfig(
        **tiny_config.to_dict(), attn_implementation="eager", **kwargs
    )
    theirs = getattr(transformers, hf_cls_name)(hf_config).eval()
    _perturb(theirs)
    ours = ours_cls(
        tiny_config, **({"num_labels": kwargs["num_labels"]} if "num_labels" in kwargs else {})
    )
    result = ours.load_state_dict(theirs.state_dict(), strict=False)
    assert result.missing_keys == []
    # transformers keeps the decoder bias under two names; ours has only cls.predictions.bias.
    assert set(result.unexpected_keys) <= {"cls.predictions.decoder.bias"}
    return theirs, ours.eval()


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_encoder_matches_transformers(tiny_config, batch, parity, attention):
    theirs, ours = _pair("BertModel", BertModel, tiny_config)
    set_attention_implementation(ours, attention)
    with torch.no_grad():
        a, b = ours(**batch), theirs(**batch)
    assert (
        parity(
            f"tiny BertModel ({attention}): last hidden state",
            a.last_hidden_state,
            b.last_hidden_state,
        )
        <= TOL
    )
    assert (
        parity(f"tiny BertModel ({attention}): pooled output", a.pooler_output, b.pooler_output)
        <= TOL
    )


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_pretraining_matches_transformers(tiny_config, batch, parity, attention):
    theirs, ours = _pair("BertForPreTraining", BertForPreTraining, tiny_config)
    set_attention_implementation(ours, attention)
    labels = torch.full_like(batch["input_ids"], -100)
    labels[0, 3], labels[1, 5] = 11, 12
    nsp = torch.tensor([1, 0, 1])
    with torch.no_grad():
        a, b = ours(**batch), theirs(**batch)
        la = ours(**batch, labels=labels, next_sentence_label=nsp).loss
        lb = theirs(**batch, labels=labels, next_sentence_label=nsp).loss
    name = f"tiny BertForPreTraining ({attention})"
    assert parity(f"{name}: prediction logits", a.prediction_logits, b.prediction_logits) <= TOL
    assert (
        parity(
            f"{name}: seq relationship logits", a.seq_relationship_logits, b.seq_relationship_logits
        )
        <= TOL
    )
    assert parity(f"{name}: loss", la, lb) <= TOL


@pytest.mark.parametrize(
    "problem_type", ["single_label_classification", "multi_label_classification", "regression"]
)
def test_sequence_classification_matches_transformers(tiny_config, batch, parity, problem_type):
    num_labels = 1 if problem_type == "regression" else 3
    config = tiny_config.replace(problem_type=problem_type)
    theirs, ours = _pair(
        "BertForSequenceClassification",
        BertForSequenceClassification,
        config,
        num_labels=num_labels,
    )
    labels = {
        "single_label_classification": torch.tensor([0, 2, 1]),
        "multi_label_classification": torch.tensor([[1.0, 0, 1], [0, 0, 0], [0, 1, 1]]),
        "regression": torch.tensor([0.3, -1.0, 2.5]),
    }[problem_type]
    with torch.no_grad():
        a, b = ours(**batch, labels=labels), theirs(**batch, labels=labels)
    assert (
        parity(f"tiny BertForSequenceClassification ({problem_type}): logits", a.logits, b.logits)
        <= TOL
    )
    assert (
        parity(f"tiny BertForSequenceClassification ({problem_type}): loss", a.loss, b.loss) <= TOL
    )


def test_token_classification_matches_transformers(tiny_config, batch, parity):
    theirs, ours = _pair(
        "BertForTokenClassification", BertForTokenClassification, tiny_config, num_labels=5
    )
    labels = torch.randint(0, 5, batch["input_ids"].shape)
    labels[batch["attention_mask"] == 0] = -100
    with torch.no_grad():
        a, b = ours(**batch, labels=labels), theirs(**batch, labels=labels)
    assert parity("tiny BertForTokenClassification: logits", a.logits, b.logits) <= TOL
    assert parity("tiny BertForTokenClassification: loss", a.loss, b.loss) <= TOL


def test_question_answering_matches_transformers(tiny_config, batch, parity):
    theirs, ours = _pair("BertForQuestionAnswering", BertForQuestionAnswering, tiny_config)
    start, end = torch.tensor([1, 3, 30]), torch.tensor([2, 6, 31])  # the last is out of window
    with torch.no_grad():
        a = ours(**batch, start_positions=start, end_positions=end)
        b = theirs(**batch, start_positions=start, end_positions=end)
    assert (
        parity("tiny BertForQuestionAnswering: start logits", a.start_logits, b.start_logits) <= TOL
    )
    assert parity("tiny BertForQuestionAnswering: end logits", a.end_logits, b.end_logits) <= TOL
    assert parity("tiny BertForQuestionAnswering: loss", a.loss, b.loss) <= TOL
