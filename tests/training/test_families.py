"""BERT-family checkpoints in the one encoder: RoBERTa (XLM-R, CamemBERT), ELECTRA, DistilBERT
and ALBERT, built tiny and random with transformers' own config classes. Per family: config.json
both ways, the encoder and every head equal to transformers' (fp32, eval, padded batch), ours
saved open in transformers' matching class with no missing or unexpected keys and theirs load
here with none either; unsupported model types and weights that do not fit are refused in one
line."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.training.conftest import TINY
from training import families
from training.checkpoint import CheckpointError, load_model, save_model
from training.config import BertConfig, ConfigError
from training.families import MODEL_TYPES
from training.model import HEADS, BertModel, encoder_model, set_attention_implementation

transformers = pytest.importorskip("transformers")

TOL = 1e-5
SHAPE = dict(TINY, hidden_act="gelu")  # hidden 32, 2 layers, 4 heads, FFN 37, vocab 99
# RoBERTa's real checkpoints: pad 1, one token type, two position rows before the first token.
ROBERTA = dict(SHAPE, pad_token_id=1, type_vocab_size=1, max_position_embeddings=66)
DISTILBERT = dict(vocab_size=99, dim=32, n_layers=2, n_heads=4, hidden_dim=37,
                  max_position_embeddings=64)  # fmt: skip

DEBERTA_V3 = dict(SHAPE, relative_attention=True, position_buckets=4, max_relative_positions=16,
                  pos_att_type=["p2c", "c2p"], share_att_key=True, norm_rel_ebd="layer_norm",
                  position_biased_input=False, type_vocab_size=0, max_position_embeddings=64)  # fmt: skip
DEBERTA_V2 = dict(SHAPE, relative_attention=True, max_relative_positions=8,
                  pos_att_type=["c2p", "p2c"], share_att_key=False, type_vocab_size=2,
                  max_position_embeddings=64)  # fmt: skip
MODERNBERT = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=37, max_position_embeddings=64, pad_token_id=0,
                  global_attn_every_n_layers=2, local_attention=4)  # fmt: skip

MODERNBERT_BIASED = dict(MODERNBERT, classifier_pooling="mean", norm_bias=True, mlp_bias=True,
                         attention_bias=True, classifier_bias=True)  # fmt: skip

# case -> (transformers config class, class-name prefix, its config arguments)
FAMILIES = {
    "roberta": ("RobertaConfig", "Roberta", ROBERTA),
    "xlm-roberta": ("XLMRobertaConfig", "XLMRoberta", ROBERTA),
    "camembert": ("CamembertConfig", "Camembert", ROBERTA),
    "electra": ("ElectraConfig", "Electra", dict(SHAPE, embedding_size=16)),  # E 16 -> H 32
    "electra-unprojected": ("ElectraConfig", "Electra", dict(SHAPE, embedding_size=32)),
    "distilbert": ("DistilBertConfig", "DistilBert", DISTILBERT),
    "distilbert-sinusoidal": (
        "DistilBertConfig",
        "DistilBert",
        dict(DISTILBERT, sinusoidal_pos_embds=True),
    ),
    "albert": ("AlbertConfig", "Albert", dict(SHAPE, embedding_size=16, hidden_act="gelu_new")),
    # Families with encoders of their own, configured so that the 10-token batch reaches what
    # sets them apart: DeBERTa-v3's log buckets (4 buckets: distances past 2 are bucketed),
    # ModernBERT's local layer (a window of 4 in rows of 10), MPNet's relative bias.
    "deberta-v3": ("DebertaV2Config", "DebertaV2", DEBERTA_V3),
    "deberta-v2": ("DebertaV2Config", "DebertaV2", DEBERTA_V2),
    "deberta-v2-projected": ("DebertaV2Config", "DebertaV2", dict(DEBERTA_V2, embedding_size=16)),
    "modernbert": ("ModernBertConfig", "ModernBert", MODERNBERT),
    "modernbert-mean": ("ModernBertConfig", "ModernBert", MODERNBERT_BIASED),
    "mpnet": ("MPNetConfig", "MPNet", dict(SHAPE, pad_token_id=1, max_position_embeddings=66)),
}
# Families whose forward takes no token_type_ids (their encoders have no segment embeddings).
NO_TOKEN_TYPES = ("distilbert", "modernbert", "mpnet")
CLASSES = {  # task -> transformers class-name suffix, its Auto class
    "classification": ("ForSequenceClassification", "AutoModelForSequenceClassification"),
    "token-classification": ("ForTokenClassification", "AutoModelForTokenClassification"),
    "question-answering": ("ForQuestionAnswering", "AutoModelForQuestionAnswering"),
    "embedding": ("Model", "AutoModel"),
}
LABELS = {0: "a", 1: "b", 2: "c"}


def their_config(case: str, **changes):
    config_class, _, args = FAMILIES[case]
    return getattr(transformers, config_class)(**args, attn_implementation="eager", **changes)


def our_config(case: str, tmp_path) -> BertConfig:
    """Ours as read from transformers' config.json (the way every checkpoint reaches us)."""
    their_config(case).save_pretrained(tmp_path / "config")
    return BertConfig.load(tmp_path / "config")


def perturbed(model: torch.nn.Module) -> torch.nn.Module:
    """Noise on every weight: zero biases and unit LayerNorms would hide a misplaced one. A
    fixed sinusoidal table stays as it is (noise there would be a different model)."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn(p.shape, generator=g) * 0.1)
    return model.eval()


def padded_batch(config: BertConfig) -> dict[str, torch.Tensor]:
    """Three sequences of 10, 7 and 4 real tokens, right-padded with the family's pad id (1 for
    RoBERTa: its position ids are read from it); segment B from position 5 where the family
    has two token types."""
    g = torch.Generator().manual_seed(0)
    mask = (torch.arange(10)[None, :] < torch.tensor([10, 7, 4])[:, None]).long()  # (3, 10)
    ids = torch.randint(5, config.vocab_size, (3, 10), generator=g)
    ids = torch.where(mask.bool(), ids, config.pad_token_id)
    types = (torch.arange(10)[None, :] >= 5).long() * mask * (config.type_vocab_size > 1)
    return dict(input_ids=ids, attention_mask=mask, token_type_ids=types)


def their_inputs(case: str, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    # DistilBERT's, ModernBERT's and MPNet's forward take no token_type_ids; ours ignores them.
    no_types = case.startswith(NO_TOKEN_TYPES)
    return {k: v for k, v in batch.items() if not (no_types and k == "token_type_ids")}


def output(model, task: str, inputs) -> torch.Tensor:
    """The head's main output as one tensor, ours or transformers' (token states for embedding:
    transformers' base models do not pool)."""
    with torch.no_grad():
        if task == "embedding":
            return getattr(model, "bert", model)(**inputs).last_hidden_state
        out = model(**inputs)
    if task == "question-answering":
        return torch.stack([out.start_logits, out.end_logits])
    return out.logits


# --- config.json ------------------------------------------------------------------------


@pytest.mark.parametrize("case", FAMILIES)
def test_config_json_both_ways(tmp_path, case):
    ours = our_config(case, tmp_path)
    theirs = their_config(case)
    assert ours.model_type == theirs.model_type
    assert (ours.hidden_size, ours.num_hidden_layers, ours.num_attention_heads) == (32, 2, 4)
    assert (ours.intermediate_size, ours.pad_token_id) == (37, theirs.pad_token_id)
    ours.save(tmp_path / "ours", architecture="SomeArchitecture")
    back = transformers.AutoConfig.from_pretrained(tmp_path / "ours")
    assert type(back) is type(theirs)
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size",
                "max_position_embeddings", "pad_token_id", "embedding_size", "type_vocab_size",
                "sinusoidal_pos_embds", "hidden_dim", "num_hidden_groups"):  # fmt: skip
        assert getattr(back, key, None) == getattr(theirs, key, None), key
    assert BertConfig.load(tmp_path / "ours") == ours


def test_what_each_family_sets(tmp_path):
    roberta = our_config("roberta", tmp_path / "r")
    assert (roberta.position_offset, roberta.type_vocab_size, roberta.has_pooler) == (2, 1, True)
    electra = our_config("electra", tmp_path / "e")
    assert (electra.embedding_size, electra.has_pooler, electra.position_offset) == (16, False, 0)
    assert our_config("electra-unprojected", tmp_path / "u").embedding_size is None
    distilbert = our_config("distilbert-sinusoidal", tmp_path / "d")
    assert (distilbert.type_vocab_size, distilbert.sinusoidal_pos_embds) == (0, True)
    assert BertModel(distilbert).embeddings.token_type_embeddings is None


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            dict(model_type="gpt2"),
            r"model_type 'gpt2' is not supported; supported: bert, albert, roberta",
        ),
        (
            dict(model_type="electra", embedding_size=16, share_layers=True),
            "share_layers is an ALBERT option",
        ),
        (
            dict(model_type="roberta", embedding_size=16),
            "embedding_size is an ALBERT, ELECTRA or DeBERTa-v2 option",
        ),
        (dict(sinusoidal_pos_embds=True), "sinusoidal_pos_embds is a DistilBERT option"),
        (dict(model_type="distilbert"), "DistilBERT has no token-type embeddings"),
        (dict(type_vocab_size=0), "BERT has token-type embeddings; only DistilBERT"),
    ],
)
def test_options_that_do_not_belong_to_the_family(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        BertConfig(**kwargs)


# --- the encoder ------------------------------------------------------------------------


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("case", FAMILIES)
def test_encoder_matches_transformers(tmp_path, parity, case, attention):
    config = our_config(case, tmp_path)
    torch.manual_seed(0)
    theirs = perturbed(getattr(transformers, FAMILIES[case][1] + "Model")(their_config(case)))
    layout = families.FAMILIES[config.model_type]
    state = {
        layout.from_hf(k).removeprefix("bert."): v
        for k, v in theirs.state_dict().items()
        if not k.endswith(("position_ids", "token_type_ids"))  # buffers, not weights
        and not (case == "mpnet" and k.startswith("pooler."))  # read by no head: not built
    }
    ours = encoder_model(config)
    ours.load_state_dict(state)  # strict: every name maps, none is left over
    set_attention_implementation(ours.eval(), attention)
    batch = padded_batch(config)
    with torch.no_grad():
        a = ours(**batch)
        b = theirs(**their_inputs(case, batch), output_hidden_states=True)
    name = f"tiny {case} encoder ({attention})"
    assert parity(f"{name}: last hidden state", a.last_hidden_state, b.last_hidden_state) <= TOL
    assert len(a.hidden_states) == len(b.hidden_states) == 3
    theirs_hidden = list(b.hidden_states)
    if case.startswith("modernbert"):  # its hidden states stop before the final norm; ours not
        theirs_hidden[-1] = b.last_hidden_state
    for x, y in zip(a.hidden_states, theirs_hidden, strict=True):
        assert parity(f"{name}: every hidden state", x, y) <= TOL
    if config.has_pooler:
        assert parity(f"{name}: pooled output", a.pooler_output, b.pooler_output) <= TOL
    else:  # MPNetModel has a pooler that no head of its reads: ours is not built
        assert a.pooler_output is None and (not hasattr(theirs, "pooler") or case == "mpnet")


def test_roberta_positions_count_real_tokens_from_pad_plus_one(tmp_path):
    config = our_config("roberta", tmp_path)
    model = BertModel(config).eval()
    seen = []
    model.embeddings.position_embeddings.register_forward_hook(lambda m, i, o: seen.append(i[0]))
    batch = padded_batch(config)
    model(**batch)
    # pad 1: real tokens at 2, 3, ...; padding at 1 (the table's padding row).
    assert seen[0][2].tolist() == [2, 3, 4, 5, 1, 1, 1, 1, 1, 1]
    assert seen[0][0].tolist() == list(range(2, 12))


def test_distilbert_sinusoidal_table_is_transformers_and_stays_fixed():
    torch.manual_seed(0)
    theirs = transformers.DistilBertModel(their_config("distilbert-sinusoidal"))
    ours = HEADS["embedding"](BertConfig.from_dict(their_config("distilbert-sinusoidal").to_dict()))
    a = ours.bert.embeddings.position_embeddings.weight
    b = theirs.embeddings.position_embeddings.weight
    assert (a - b).abs().max() <= 1e-6 and not a.requires_grad
    assert a[0, 0::2].abs().max() == 0 and a[0, 1::2].eq(1).all()  # sin 0, cos 0 at position 0


# --- heads, both ways ---------------------------------------------------------------------


@pytest.mark.parametrize("task", list(CLASSES))
@pytest.mark.parametrize("case", FAMILIES)
def test_theirs_load_here_and_ours_open_in_transformers(tmp_path, caplog, parity, case, task):
    suffix, auto = CLASSES[task]
    cls_name = FAMILIES[case][1] + suffix
    labelled = task in ("classification", "token-classification")
    extra = dict(id2label=LABELS) if labelled else {}
    batch = padded_batch(our_config(case, tmp_path))

    # transformers' head saved -> ours: no weight left fresh (no warning), none left over.
    torch.manual_seed(0)
    theirs = perturbed(getattr(transformers, cls_name)(their_config(case, **extra)))
    theirs.save_pretrained(tmp_path / "theirs")
    with caplog.at_level(logging.WARNING, logger="training.checkpoint"):
        back = load_model(tmp_path / "theirs")
    assert not caplog.records, [r.getMessage() for r in caplog.records]
    assert type(back) is HEADS[task]
    want = output(theirs, task, their_inputs(case, batch))
    got = output(back, task, batch)
    assert parity(f"tiny {case} {task}: transformers {cls_name} -> ours", got, want) <= TOL

    # ours saved -> transformers' Auto class picks the family's class, every key matching.
    config = back.config.replace(id2label=LABELS if labelled else None, problem_type=None)
    torch.manual_seed(1)
    ours = perturbed(HEADS[task](config))
    save_model(ours, tmp_path / "ours")
    pooled = config.has_pooler or case == "mpnet"  # their base model has a pooler; ours none
    kwargs = {"add_pooling_layer": False} if task == "embedding" and pooled else {}
    reopened, info = getattr(transformers, auto).from_pretrained(
        tmp_path / "ours", output_loading_info=True, **kwargs
    )
    assert type(reopened).__name__ == cls_name
    assert info == {"missing_keys": [], "unexpected_keys": [], "mismatched_keys": [],
                    "error_msgs": []}  # fmt: skip
    a, b = output(ours, task, batch), output(reopened.eval(), task, their_inputs(case, batch))
    assert parity(f"tiny {case} {task}: ours -> transformers {cls_name}", a, b) <= TOL


@pytest.mark.parametrize("case", ["roberta", "electra", "distilbert"])
def test_mean_pooled_classifier_feeds_the_family_head(tmp_path, case):
    """classifier_pooling "mean" swaps what the family head reads, not the head itself."""
    config = our_config(case, tmp_path)
    model = perturbed(HEADS["classification"](config, num_labels=3, pooling="mean"))
    assert model.bert.pooler is None
    batch = padded_batch(config)
    with torch.no_grad():
        hidden = model.bert(**batch).last_hidden_state
        mask = batch["attention_mask"][..., None].float()
        mean = (hidden * mask).sum(1) / mask.sum(1)
        if model.pre_classifier is not None:
            mean = torch.relu(model.pre_classifier(mean))
        want = model.classifier(mean)
        got = model(**batch).logits
    torch.testing.assert_close(got, want)


def test_a_family_mlm_checkpoint_fine_tunes_but_does_not_pretrain(tmp_path, caplog):
    torch.manual_seed(0)
    transformers.RobertaForMaskedLM(their_config("roberta")).save_pretrained(tmp_path)
    # config.json says RobertaForMaskedLM: its own head (tests/training/test_masked_lm.py)
    assert type(load_model(tmp_path)) is HEADS["fill-mask"]
    with pytest.raises(CheckpointError, match="roberta has no pretraining head here") as e:
        load_model(tmp_path, task="pretraining")
    assert "\n" not in str(e.value)
    with caplog.at_level(logging.INFO, logger="training.checkpoint"):
        model = load_model(tmp_path, task="classification", labels=["neg", "pos"])
    notes = [r.getMessage() for r in caplog.records]
    assert notes[0].startswith("dropped pretraining head weights not used by classification")
    assert notes[1] == ("initialised new head weights: classifier.dense.weight, "
                        "classifier.dense.bias, classifier.out_proj.weight, classifier.out_proj.bias")  # fmt: skip
    assert model.num_labels == 2


# --- bad input: one line --------------------------------------------------------------------


@pytest.mark.parametrize("model_type", ["funnel", "gpt2"])
def test_unsupported_model_type_names_it_and_the_supported_ones(tmp_path, model_type):
    torch.manual_seed(0)
    transformers.RobertaModel(their_config("roberta")).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config | {"model_type": model_type}))
    with pytest.raises(CheckpointError) as e:
        load_model(tmp_path)
    supported = ", ".join(MODEL_TYPES)
    assert str(e.value).endswith(
        f"config.json: model_type {model_type!r} is not supported; supported: {supported}"
    )
    assert "\n" not in str(e.value)


def test_weights_that_do_not_fit_name_the_missing_and_unexpected_keys(tmp_path):
    torch.manual_seed(0)
    theirs = transformers.RobertaForSequenceClassification(their_config("roberta"))
    theirs.save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    state["roberta.encoder.layer.1.output.dense_v2.weight"] = state.pop(
        "roberta.encoder.layer.1.output.dense.weight"
    )
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError) as e:
        load_model(tmp_path)
    assert str(e.value).endswith(
        "model.safetensors: missing weights for classification: "
        "roberta.encoder.layer.1.output.dense.weight; unexpected weights for classification: "
        "roberta.encoder.layer.1.output.dense_v2.weight"
    )


def test_a_checkpoint_of_another_family_is_refused(tmp_path):
    """Weights named for another family under a config.json that says roberta: RoBERTa's names
    missing, the others unexpected; BERT's own names (ours) are no exception."""
    torch.manual_seed(0)
    transformers.DistilBertForSequenceClassification(their_config("distilbert")).save_pretrained(
        tmp_path / "distilbert"
    )
    transformers.BertForSequenceClassification(transformers.BertConfig(**SHAPE)).save_pretrained(
        tmp_path / "bert"
    )
    for other in ("distilbert", "bert"):
        their_config("roberta", architectures=["RobertaForSequenceClassification"]).save_pretrained(
            tmp_path / other
        )
        with pytest.raises(CheckpointError) as e:
            load_model(tmp_path / other)
        missing, unexpected = str(e.value).split("; unexpected weights for classification: ")
        assert "missing weights for classification: roberta.embeddings.word_embeddings" in missing
        # a linear classifier.weight is not RoBERTa's dense + out_proj either
        assert unexpected.startswith("classifier.bias, classifier.weight, ")
        assert f"{other}.embeddings.word_embeddings.weight" in unexpected
