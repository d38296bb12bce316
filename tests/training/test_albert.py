"""ALBERT as two BertConfig options: parameter counts of factorised embeddings and shared
layers, parity with transformers' AlbertModel on random weights (fp32, eval, padded batch),
checkpoints in transformers' ALBERT layout both ways, and an exported package that ONNX
Runtime runs to the same logits."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import pytest
import torch

from benchmarks.tiny import tiny_tokenizer
from heads.contract import INPUT_NAMES
from tests.training.conftest import TINY
from training.checkpoint import load_model, save_model
from training.config import BertConfig, ConfigError
from training.export import export_package
from training.families.albert import from_albert
from training.model import (
    HEADS,
    BertForPreTraining,
    BertForSequenceClassification,
    BertModel,
    set_attention_implementation,
)

TOL = 1e-5
# transformers' AlbertModelTester shape, on our tiny BERT: E 16 under H 32.
TINY_ALBERT = dict(TINY, embedding_size=16, hidden_act="gelu_new")


def albert(share_layers: bool = True, **changes) -> BertConfig:
    return BertConfig(**TINY_ALBERT, share_layers=share_layers, **changes)


def count(config: BertConfig) -> int:
    """Parameters of the encoder with its pooler, built on the meta device (no memory)."""
    with torch.device("meta"):
        return sum(p.numel() for p in BertModel(config).parameters())


# --- parameter counts -----------------------------------------------------------------


def test_albert_base_has_about_12m_parameters_against_bert_base_110m(capsys):
    albert_base, bert_base = BertConfig.preset("albert-base"), BertConfig.preset("base")
    assert (albert_base.embedding_size, albert_base.hidden_size) == (128, 768)
    assert albert_base.share_layers and albert_base.num_hidden_layers == 12
    n_albert, n_bert = count(albert_base), count(bert_base)
    with capsys.disabled():
        print(f"\nparameters: albert-base {n_albert:,}, bert-base {n_bert:,}")
    assert 11.5e6 < n_albert < 12.5e6  # Lan et al. Table 1: 12M
    assert 109e6 < n_bert < 111e6  # 108M in Table 1 (vocabulary 30k), 110M in Devlin et al.


def test_each_option_saves_what_it_should():
    V, E, H, L = 30522, 128, 768, 12
    base = BertConfig.preset("base")
    factorised = base.replace(embedding_size=E)
    # V x H token embeddings become V x E plus the E x H (+ bias) projection; position and
    # segment embeddings and their LayerNorm shrink from H to E wide as well.
    per_width = V + base.max_position_embeddings + base.type_vocab_size + 2
    assert count(base) - count(factorised) == per_width * (H - E) - (E * H + H)
    # Sharing: the 12-layer encoder weighs exactly what a 1-layer one does.
    shared = factorised.replace(share_layers=True)
    assert count(shared) == count(shared.replace(num_hidden_layers=1))
    one_layer = count(factorised) - count(factorised.replace(num_hidden_layers=L - 1))
    assert count(factorised) - count(shared) == (L - 1) * one_layer


def test_presets_and_invalid_options():
    large = BertConfig.preset("albert-large")
    assert (large.num_hidden_layers, large.hidden_size, large.model_type) == (24, 1024, "albert")
    assert 17e6 < count(large) < 19e6  # Table 1: 18M
    assert BertConfig.preset("base").model_type == "bert"
    with pytest.raises(ConfigError, match="share_layers is an ALBERT option"):
        BertConfig(share_layers=True)


# --- config.json ------------------------------------------------------------------------


def test_config_json_is_transformers_albert_config(tmp_path):
    transformers = pytest.importorskip("transformers")
    for share in (True, False):
        ours = albert(share, id2label={0: "neg", 1: "pos"})
        ours.save(tmp_path, architecture="AlbertForSequenceClassification")
        written = json.loads((tmp_path / "config.json").read_text())
        assert written["model_type"] == "albert" and "share_layers" not in written
        theirs = transformers.AutoConfig.from_pretrained(tmp_path)
        assert type(theirs).__name__ == "AlbertConfig"
        assert (theirs.embedding_size, theirs.inner_group_num) == (16, 1)
        assert theirs.num_hidden_groups == (1 if share else 2)
        assert BertConfig.load(tmp_path) == ours


@pytest.mark.parametrize("groups, inner", [(1, 2), (3, 1)])
def test_layer_groups_we_do_not_implement_are_refused(groups, inner):
    d = {"model_type": "albert", "num_hidden_layers": 6, "hidden_size": 64,
         "num_attention_heads": 2, "num_hidden_groups": groups, "inner_group_num": inner}  # fmt: skip
    with pytest.raises(ConfigError, match="not supported"):
        BertConfig.from_dict(d)


# --- parity with transformers ---------------------------------------------------------------


def _perturbed(model: torch.nn.Module) -> torch.nn.Module:
    """Noise on every weight: zero biases and unit LayerNorms would hide a misplaced one."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)
    return model.eval()


def _their_albert(config: BertConfig, cls_name: str = "AlbertModel", **kwargs):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    hf_config = transformers.AlbertConfig(**config.to_dict(), attn_implementation="eager", **kwargs)
    return _perturbed(getattr(transformers, cls_name)(hf_config))


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("share", [True, False], ids=["shared", "unshared"])
def test_encoder_matches_transformers_albert_model(batch, parity, share, attention):
    config = albert(share)
    theirs = _their_albert(config)
    ours = BertModel(config)
    state = {
        from_albert(k).removeprefix("bert."): v
        for k, v in theirs.state_dict().items()
        if not k.endswith(("position_ids", "token_type_ids"))  # buffers, not weights
    }
    ours.load_state_dict(state)  # strict: every name maps, none is left over
    ours.eval()
    set_attention_implementation(ours, attention)
    with torch.no_grad():
        a, b = ours(**batch), theirs(**batch, output_hidden_states=True)
    name = f"tiny AlbertModel ({'shared' if share else 'unshared'}, {attention})"
    assert parity(f"{name}: last hidden state", a.last_hidden_state, b.last_hidden_state) <= TOL
    assert parity(f"{name}: pooled output", a.pooler_output, b.pooler_output) <= TOL
    assert len(a.hidden_states) == len(b.hidden_states) == 3
    for x, y in zip(a.hidden_states, b.hidden_states, strict=True):
        assert parity(f"{name}: every hidden state", x, y) <= TOL


def test_shared_layers_are_one_module_applied_l_times(batch):
    torch.manual_seed(0)
    model = BertModel(albert(share_layers=True)).eval()
    assert len(model.encoder.layer) == 1 and model.encoder.num_hidden_layers == 2
    with torch.no_grad():
        out = model(**batch)
        bias = (1.0 - batch["attention_mask"][:, None, None, :].float()) * torch.finfo().min
        again = model.encoder.layer[0](out.hidden_states[1], bias)
    torch.testing.assert_close(again, out.hidden_states[2], atol=0, rtol=0)


# --- checkpoints in transformers' ALBERT layout ---------------------------------------------

AUTO = {  # task -> (transformers class, from_pretrained arguments)
    "pretraining": ("AlbertForPreTraining", {}),
    "classification": ("AlbertForSequenceClassification", {}),
    "token-classification": ("AlbertForTokenClassification", {}),
    "question-answering": ("AlbertForQuestionAnswering", {}),
    "embedding": ("AlbertModel", {"add_pooling_layer": False}),
}


def _output(model, task: str, batch) -> torch.Tensor:
    """The head's main output as one tensor, ours or transformers' (token states for
    embedding: transformers' AlbertModel does not pool)."""
    if task == "embedding":
        return getattr(model, "bert", model)(**batch).last_hidden_state
    out = model(**batch)
    if task == "pretraining":
        sop = getattr(out, "sop_logits", None)  # transformers' name for the second head
        sop = sop if sop is not None else out.seq_relationship_logits
        return torch.cat([out.prediction_logits.flatten(), sop.flatten()])
    if task == "question-answering":
        return torch.stack([out.start_logits, out.end_logits])
    return out.logits


@pytest.mark.parametrize("task", list(AUTO))
def test_ours_saved_open_in_transformers_and_theirs_here(tmp_path, batch, parity, task):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = albert(share_layers=task != "token-classification")  # both layouts covered
    if task in ("classification", "token-classification"):
        config = config.replace(id2label={0: "a", 1: "b", 2: "c"})
    ours = _perturbed(HEADS[task](config))
    save_model(ours, tmp_path / "ours")
    cls_name, extra = AUTO[task]
    theirs, info = getattr(transformers, cls_name).from_pretrained(
        tmp_path / "ours", output_loading_info=True, **extra
    )
    assert info == {"missing_keys": [], "unexpected_keys": [], "mismatched_keys": [],
                    "error_msgs": []}  # fmt: skip
    with torch.no_grad():
        a, b = _output(ours, task, batch), _output(theirs.eval(), task, batch)
    assert parity(f"tiny ALBERT {task}: ours saved -> transformers {cls_name}", a, b) <= TOL

    theirs.save_pretrained(tmp_path / "theirs")
    back = load_model(tmp_path / "theirs")
    assert type(back) is HEADS[task]
    assert back.config.replace(problem_type=None) == config.replace(problem_type=None)
    with torch.no_grad():
        c = _output(back, task, batch)
    assert parity(f"tiny ALBERT {task}: transformers saved -> ours", c, b) <= TOL


def test_pretraining_head_ties_the_decoder_to_the_e_wide_embeddings():
    model = BertForPreTraining(albert())
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    assert model.cls.predictions.decoder.weight.shape == (TINY["vocab_size"], 16)


# --- export and ONNX Runtime -----------------------------------------------------------------


def test_exported_albert_package_gives_pytorch_logits(tmp_path, parity):
    tok = tiny_tokenizer()
    torch.manual_seed(0)
    config = BertConfig(**{**TINY_ALBERT, "vocab_size": tok.get_vocab_size()}, share_layers=True,
                        id2label={0: "negative", 1: "positive"})  # fmt: skip
    model = _perturbed(BertForSequenceClassification(config))
    save_model(model, tmp_path / "ckpt", tok)
    pkg = export_package(tmp_path / "ckpt", "classification", tmp_path / "pkg", verbose=False)
    assert pkg.labels == ["negative", "positive"] and pkg.parity["fp32"]["max_abs_diff"]
    texts = ["a wonderful film", "the worst plot of the year , and boring music"]
    encodings = [tok.encode(t) for t in texts]
    T = max(len(e.ids) for e in encodings)
    feed = {
        "input_ids": np.array([e.ids + [0] * (T - len(e.ids)) for e in encodings]),
        "attention_mask": np.array([[1] * len(e.ids) + [0] * (T - len(e.ids)) for e in encodings]),
        "token_type_ids": np.zeros((len(texts), T), dtype=np.int64),
    }
    session = ort.InferenceSession(
        str(pkg.variant_path("fp32")), providers=["CPUExecutionProvider"]
    )
    (got,) = session.run(["logits"], {n: feed[n].astype(np.int64) for n in INPUT_NAMES})
    with torch.no_grad():
        want = model(**{k: torch.from_numpy(v).long() for k, v in feed.items()}).logits
    assert (
        parity(
            "tiny ALBERT classification: ONNX Runtime package vs PyTorch",
            torch.from_numpy(got),
            want,
        )
        <= 1e-4
    )
