"""Feature-based use (Devlin et al. 2018, §5.3): a token head reads chosen hidden layers, and
`--freeze-encoder` trains the head alone, leaving every encoder weight bit-identical."""

from __future__ import annotations

import json

import pytest
import torch

from tests.training.tiny import tiny_init, tiny_tokenizer
from training import finetune as ft
from training.checkpoint import load_model, load_state_dict_file, save_model
from training.config import BertConfig, ConfigError
from training.export import export_package
from training.finetune import FinetuneArgs, finetune
from training.model import BertForSequenceClassification, BertForTokenClassification
from training.plots import read_log


def _states(config: BertConfig, batch) -> tuple[BertForTokenClassification, list[torch.Tensor]]:
    torch.manual_seed(0)
    model = BertForTokenClassification(config, num_labels=3).eval()
    with torch.no_grad():
        return model, model.bert(**batch).hidden_states


@pytest.mark.parametrize(
    "features, layers, concat",
    [
        ("last", [2], True),
        ("second-to-last", [1], True),
        ("embeddings", [0], True),
        ("all-sum", [1, 2], False),
    ],
)
def test_each_feature_set_reads_its_layers(tiny_config, batch, features, layers, concat):
    model, hidden = _states(tiny_config.replace(features=features), batch)
    if concat:
        expected = torch.cat([hidden[i] for i in layers], dim=-1)
    else:
        expected = sum(hidden[i] for i in layers)  # learned weights start at 1: a plain sum
    with torch.no_grad():
        got = model.features(hidden)
        logits = model(**batch).logits
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(logits, model.classifier(expected), atol=1e-6, rtol=0)


def test_last_four_concatenated_is_four_times_as_wide(tiny_config, batch):
    config = tiny_config.replace(num_hidden_layers=4, features="last4-concat")
    model, hidden = _states(config, batch)
    assert model.classifier.in_features == 4 * config.hidden_size
    assert config.feature_layers == [1, 2, 3, 4]
    with torch.no_grad():
        torch.testing.assert_close(model.features(hidden), torch.cat(hidden[1:], dim=-1))
    summed = BertForTokenClassification(config.replace(features="last4-sum"), num_labels=3)
    assert summed.features.layer_weights.shape == (4,)
    with pytest.raises(ConfigError, match="needs more than 2 layers"):
        tiny_config.replace(features="last4-concat")
    with pytest.raises(ConfigError, match="features 'middle'"):
        tiny_config.replace(features="middle")


def test_features_are_saved_in_config_json(tmp_path, tiny_config, batch):
    torch.manual_seed(0)
    model = BertForTokenClassification(tiny_config, num_labels=3, features="all-sum").eval()
    with torch.no_grad():
        model.features.layer_weights.copy_(torch.tensor([0.3, 1.7]))
    save_model(model, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["features"] == "all-sum"
    loaded = load_model(tmp_path)
    assert loaded.config.features == "all-sum"
    with torch.no_grad():
        torch.testing.assert_close(loaded(**batch).logits, model(**batch).logits, atol=0, rtol=0)
    # the plain "last" head writes no such key: its config.json is transformers' BERT one
    save_model(BertForTokenClassification(tiny_config, num_labels=3), tmp_path / "last")
    assert "features" not in json.loads((tmp_path / "last" / "config.json").read_text())


def test_a_frozen_encoder_stays_in_eval_mode_and_gets_no_gradient(tiny_config, batch):
    model = BertForSequenceClassification(tiny_config, num_labels=2)
    model.freeze_encoder()
    model.train()
    assert model.training and model.dropout.training and not model.bert.training
    model(**batch, labels=torch.tensor([0, 1, 1])).loss.backward()
    assert all(p.grad is None for p in model.bert.parameters())
    assert model.classifier.weight.grad is not None


# --- --freeze-encoder end to end ------------------------------------------------------------

CONLL = [
    ("john smith lives in paris", "B-PER I-PER O O B-LOC"),
    ("mary was in france", "B-PER O O B-LOC"),
    ("the film is good", "O O O O"),
    ("anna lives in rome", "B-PER O O B-LOC"),
]


@pytest.fixture(scope="module")
def conll(tmp_path_factory):
    path = tmp_path_factory.mktemp("conll") / "train.txt"
    lines = []
    for words, tags in CONLL * 2:
        lines += [f"{w} {t}" for w, t in zip(words.split(), tags.split(), strict=True)] + [""]
    path.write_text("\n".join(lines))
    return path


@pytest.fixture(scope="module")
def init(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    return tiny_init(root / "init", tiny_tokenizer(root / "vocab"))


@pytest.mark.parametrize("features", ["second-to-last", "all-sum"])
def test_freeze_encoder_trains_the_head_and_leaves_the_encoder_bit_identical(
    init, conll, tmp_path, monkeypatch, features
):
    initial = {}
    build_model = ft.build_model

    def keep_initial_weights(*args, **kwargs):
        model = build_model(*args, **kwargs)
        initial.update({k: v.clone() for k, v in model.state_dict().items()})
        return model

    monkeypatch.setattr(ft, "build_model", keep_initial_weights)
    args = FinetuneArgs(
        task="token-classification",
        init=str(init),
        train=str(conll),
        eval=str(conll),
        out=str(tmp_path / "run"),
        freeze_encoder=True,
        features=features,
        batch_size=4,
        epochs=3,
        lr=1e-2,
        log_every=1,
    )
    result = finetune(args)
    after = load_state_dict_file(result.out / "last")
    encoder = [k for k in after if k.startswith("bert.")]
    # every encoder weight, as in the init checkpoint (sentence-transformers: no `bert.`)
    before = load_state_dict_file(init)
    assert {k.removeprefix("bert.") for k in encoder} == set(before)
    assert all(torch.equal(after[k], before[k.removeprefix("bert.")]) for k in encoder)
    changed = {k for k in after if not torch.equal(after[k], initial[k])}
    trained = {"classifier.weight", "classifier.bias"}
    if features == "all-sum":
        trained.add("features.layer_weights")  # the weighted sum learned its weights
    assert changed == trained
    losses = [r["loss"] for r in read_log(result.out / "log.jsonl") if r["split"] == "train"]
    assert losses[-1] < losses[0]
    best = load_model(result.best_dir)
    assert best.config.features == features

    # The exported graph computes the feature head too.
    package = export_package(
        result.best_dir, "token-classification", tmp_path / "pkg", verbose=False
    )
    assert max(package.parity["fp32"]["max_abs_diff"].values()) <= 1e-4


def test_features_only_for_token_classification(init, conll, tmp_path):
    args = FinetuneArgs(
        task="classification", init=str(init), train=str(conll), out=str(tmp_path), features="last"
    )
    with pytest.raises(ValueError, match="--features is for token-classification"):
        finetune(args)
