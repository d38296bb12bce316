"""BertConfig: presets have the published shapes, config.json round-trips with transformers."""

from __future__ import annotations

import json

import pytest

from training.config import PRESETS, BertConfig, ConfigError


@pytest.mark.parametrize(
    "name, layers, hidden, heads, ffn",
    [
        ("tiny", 2, 128, 2, 512),
        ("mini", 4, 256, 4, 1024),
        ("small", 4, 512, 8, 2048),
        ("medium", 8, 512, 8, 2048),
        ("base", 12, 768, 12, 3072),
        ("large", 24, 1024, 16, 4096),
    ],
)
def test_presets_have_the_published_shapes(name, layers, hidden, heads, ffn):
    cfg = BertConfig.preset(name)
    shape = (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads)
    assert shape + (cfg.intermediate_size,) == (layers, hidden, heads, ffn)
    assert cfg.vocab_size == 30522 and cfg.max_position_embeddings == 512


def test_every_preset_is_tested():
    # albert-base / albert-large: tests/training/test_albert.py
    assert set(PRESETS) == {
        "tiny",
        "mini",
        "small",
        "medium",
        "base",
        "large",
        "albert-base",
        "albert-large",
    }


def test_preset_overrides():
    cfg = BertConfig.preset("mini", vocab_size=8000, hidden_dropout_prob=0.0)
    assert (cfg.vocab_size, cfg.hidden_dropout_prob, cfg.hidden_size) == (8000, 0.0, 256)


def test_save_load_round_trip(tmp_path):
    cfg = BertConfig.preset(
        "tiny", id2label={0: "neg", 1: "pos"}, problem_type="single_label_classification"
    )
    cfg.save(tmp_path, architecture="BertForSequenceClassification")
    assert BertConfig.load(tmp_path) == cfg
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["model_type"] == "bert"
    assert written["architectures"] == ["BertForSequenceClassification"]
    assert written["id2label"] == {"0": "neg", "1": "pos"}
    assert written["label2id"] == {"neg": 0, "pos": 1}
    assert cfg.num_labels == 2 and cfg.labels == ["neg", "pos"]


def test_transformers_reads_our_config_and_we_read_theirs(tmp_path):
    transformers = pytest.importorskip("transformers")
    ours = BertConfig.preset("mini", id2label={0: "O", 1: "B-PER", 2: "I-PER"})
    ours.save(tmp_path / "ours", architecture="BertForTokenClassification")
    theirs = transformers.BertConfig.from_pretrained(tmp_path / "ours")
    for field in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"):
        assert getattr(theirs, field) == getattr(ours, field)
    assert theirs.id2label == ours.id2label and theirs.label2id == {"O": 0, "B-PER": 1, "I-PER": 2}

    theirs.save_pretrained(tmp_path / "theirs")  # full of keys we do not know: ignored
    assert BertConfig.load(tmp_path / "theirs") == ours


def test_unknown_keys_are_ignored(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "hidden_size": 64,
                "num_attention_heads": 2,
                "use_cache": True,
                "gradient_checkpointing": False,
            }
        )
    )
    assert BertConfig.load(tmp_path).hidden_size == 64


def test_minilm_config(minilm_path):
    cfg = BertConfig.load(minilm_path)
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads) == (6, 384, 12)
    assert (cfg.intermediate_size, cfg.vocab_size, cfg.id2label) == (1536, 30522, None)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(hidden_size=100, num_attention_heads=12), "not a multiple"),
        (dict(hidden_act="swish"), "hidden_act"),
        (dict(problem_type="ranking"), "problem_type"),
    ],
)
def test_invalid_configs(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        BertConfig(**kwargs)


def test_unknown_preset():
    with pytest.raises(ConfigError, match="unknown preset 'huge'"):
        BertConfig.preset("huge")


def test_missing_and_broken_config_json(tmp_path):
    with pytest.raises(ConfigError, match="no config.json"):
        BertConfig.load(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="config.json: not valid JSON"):
        BertConfig.load(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 100}))
    with pytest.raises(ConfigError, match="config.json: hidden_size 100"):
        BertConfig.load(tmp_path)
