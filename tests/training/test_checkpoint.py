"""Checkpoints in the Hugging Face layout: our saves open in transformers and
sentence-transformers, theirs open here, all-MiniLM-L6-v2 gives the same numbers as both, and
bad folders fail with one line that names the file."""

from __future__ import annotations

import json
import logging
import string

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from tests.training.conftest import sst2_sentences
from training.checkpoint import (
    CheckpointError,
    load_model,
    load_state_dict_file,
    read_max_seq_length,
    read_sentence_transformers,
    save_model,
)
from training.model import (
    HEADS,
    BertForEmbedding,
    BertForPreTraining,
)
from training.tokenizer import encode_batch, load_tokenizer

transformers = pytest.importorskip("transformers")

MINILM_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
TOL = 1e-5

AUTO = {  # task -> (transformers auto class, extra from_pretrained arguments)
    "pretraining": ("AutoModelForPreTraining", {}),
    "classification": ("AutoModelForSequenceClassification", {}),
    "token-classification": ("AutoModelForTokenClassification", {}),
    "question-answering": ("AutoModelForQuestionAnswering", {}),
    "embedding": ("AutoModel", {"add_pooling_layer": False}),
    "fill-mask": ("AutoModelForMaskedLM", {}),
}
# config.json's BertForMaskedLM reads as pretraining (bert-base-uncased's file holds NSP too):
# a fill-mask checkpoint of ours is opened as one by name.
INFERRED_AS_PRETRAINING = ("fill-mask",)
HEAD_ARGS = {
    "classification": {"labels": ["neg", "neu", "pos"]},
    "token-classification": {"labels": ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]},
}


def _output(out) -> torch.Tensor:
    """The head's main output as one tensor, ours or transformers'."""
    for name in ("prediction_logits", "logits", "embeddings", "last_hidden_state"):
        if hasattr(out, name):
            return getattr(out, name)
    return torch.stack([out.start_logits, out.end_logits])


def _tiny_vocab(n: int = 99) -> list[str]:
    letters = list(string.ascii_lowercase)
    words = ["the", "an", "of", "and", "to", "in", "is", "it", "was", "film", "good", "bad"]
    vocab = [
        "[PAD]",
        "[UNK]",
        "[CLS]",
        "[SEP]",
        "[MASK]",
        *letters,
        *("##" + c for c in letters),
        *words,
    ]
    vocab += list(string.punctuation[: n - len(vocab)])
    assert len(vocab) == n
    return vocab


@pytest.fixture
def tiny_tokenizer(tmp_path):
    path = tmp_path / "vocab" / "vocab.txt"
    path.parent.mkdir()
    path.write_text("\n".join(_tiny_vocab()) + "\n")
    return load_tokenizer(path)


def _perturbed(model):
    """Noise on every weight, so that zero biases or unit LayerNorms cannot hide a weight
    that did not arrive."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


def _new(task, config, **head_args):
    torch.manual_seed(0)
    labels = head_args.pop("labels", None)
    if labels:
        config = config.replace(id2label=dict(enumerate(labels)))
    return _perturbed(HEADS[task](config, **head_args))


@pytest.mark.parametrize("task", list(HEADS))
def test_round_trip_and_transformers_loads_ours(
    tmp_path, tiny_config, batch, tiny_tokenizer, parity, task
):
    model = _new(task, tiny_config, **HEAD_ARGS.get(task, {}))
    save_model(model, tmp_path, tokenizer=tiny_tokenizer)
    assert (tmp_path / "tokenizer.json").is_file() and (tmp_path / "vocab.txt").is_file()

    # the task comes back from config.json's architectures
    loaded = load_model(tmp_path, task=task if task in INFERRED_AS_PRETRAINING else None)
    assert type(loaded) is type(model)
    assert loaded.config.replace(problem_type=None) == model.config  # problem_type: written out
    assert getattr(loaded, "problem_type", None) == getattr(model, "problem_type", None)
    with torch.no_grad():
        torch.testing.assert_close(
            _output(loaded(**batch)), _output(model(**batch)), atol=0, rtol=0
        )

    auto_class, extra = AUTO[task]
    theirs, info = getattr(transformers, auto_class).from_pretrained(
        tmp_path, output_loading_info=True, **extra
    )
    assert info == {
        "missing_keys": [],
        "unexpected_keys": [],
        "mismatched_keys": [],
        "error_msgs": [],
    }
    if task in HEAD_ARGS:
        assert list(theirs.config.id2label.values()) == HEAD_ARGS[task]["labels"]
    with torch.no_grad():
        a, b = _output(model(**batch)), _output(theirs.eval()(**batch))
    if task == "embedding":  # transformers gives token states; pool them as ours does
        b = F.normalize(
            (b * batch["attention_mask"][..., None]).sum(1)
            / batch["attention_mask"].sum(1, keepdim=True),
            dim=-1,
        )
    assert parity(f"tiny {task}: ours saved -> transformers {auto_class}", a, b) <= TOL


def test_classification_problem_type_is_saved(tmp_path, tiny_config):
    model = _new(
        "classification",
        tiny_config.replace(problem_type="multi_label_classification"),
        num_labels=4,
    )
    save_model(model, tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["problem_type"] == "multi_label_classification"
    assert written["id2label"] == {str(i): f"LABEL_{i}" for i in range(4)}
    assert load_model(tmp_path).problem_type == "multi_label_classification"


def test_tied_decoder_weight_is_stored_once(tmp_path, tiny_config):
    save_model(_new("pretraining", tiny_config), tmp_path)
    names = set(load_state_dict_file(tmp_path))
    assert (
        "cls.predictions.decoder.weight" not in names
        and "bert.embeddings.word_embeddings.weight" in names
    )
    loaded = load_model(tmp_path)
    assert loaded.cls.predictions.decoder.weight is loaded.bert.embeddings.word_embeddings.weight


@pytest.mark.parametrize("pooling, normalize", [("mean", True), ("cls", False)])
def test_embedding_folder_is_a_sentence_transformers_model(
    tmp_path, tiny_config, tiny_tokenizer, pooling, normalize, parity
):
    st = pytest.importorskip("sentence_transformers")
    model = _new("embedding", tiny_config, pooling=pooling, normalize=normalize)
    save_model(model, tmp_path, tokenizer=tiny_tokenizer)
    folder = read_sentence_transformers(tmp_path)
    assert folder is not None and (folder.pooling, folder.normalize) == (pooling, normalize)
    assert not any(k.startswith("bert.") for k in load_state_dict_file(tmp_path))
    loaded = load_model(tmp_path)
    assert (loaded.pooling, loaded.normalize) == (pooling, normalize)

    texts = ["the film was good", "it was bad , and the end was the worst"]
    reference = st.SentenceTransformer(str(tmp_path), device="cpu")
    assert reference[0].auto_model.pooler is None  # no random pooler, no warning about one
    theirs = reference.encode(texts, convert_to_tensor=True)
    encodings = encode_batch(tiny_tokenizer, texts)
    T = max(len(e.input_ids) for e in encodings)
    ids = torch.tensor([e.input_ids + [0] * (T - len(e.input_ids)) for e in encodings])
    with torch.no_grad():
        ours = model(ids, (ids != 0).long()).embeddings
    assert (
        parity(f"tiny embedding ({pooling}): ours saved -> SentenceTransformer", ours, theirs)
        <= TOL
    )


# --- transformers' checkpoints load here --------------------------------------------------


@pytest.mark.parametrize(
    "hf_class, task",
    [
        ("BertForPreTraining", "pretraining"),
        ("BertForSequenceClassification", "classification"),
        ("BertForTokenClassification", "token-classification"),
        ("BertForQuestionAnswering", "question-answering"),
        ("BertModel", "embedding"),
    ],
)
@pytest.mark.parametrize("safe", [True, False], ids=["safetensors", "pytorch_model.bin"])
def test_transformers_saves_load_here(
    tmp_path, tiny_config, batch, caplog, parity, hf_class, task, safe
):
    torch.manual_seed(0)
    num_labels = 2 if task == "question-answering" else 3  # transformers' QA: start and end
    hf_config = transformers.BertConfig(**tiny_config.to_dict(), num_labels=num_labels)
    theirs = _perturbed(getattr(transformers, hf_class)(hf_config))
    theirs.save_pretrained(tmp_path, safe_serialization=safe)
    with caplog.at_level(logging.INFO, logger="training.checkpoint"):
        ours = load_model(tmp_path)
    assert type(ours) is HEADS[task] and caplog.records == []
    with torch.no_grad():
        a, b = _output(ours(**batch)), _output(theirs(**batch))
    if task == "embedding":
        a = ours.bert(**batch).last_hidden_state
    assert parity(f"tiny {hf_class}: transformers saved -> ours", a, b) <= TOL


def test_sharded_checkpoint_loads(tmp_path, tiny_config, batch, parity):
    torch.manual_seed(0)
    theirs = transformers.BertForTokenClassification(
        transformers.BertConfig(**tiny_config.to_dict())
    )
    theirs.eval().save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    with torch.no_grad():
        a, b = load_model(tmp_path)(**batch).logits, theirs(**batch).logits
    assert parity("tiny BertForTokenClassification: transformers sharded -> ours", a, b) <= TOL


def test_tf_era_names_load(tmp_path, tiny_config, batch, parity):
    """The original bert-base-uncased file: LayerNorm gamma / beta, a stored decoder weight,
    a position_ids buffer, and BertForMaskedLM in config.json."""
    torch.manual_seed(0)
    theirs = _perturbed(
        transformers.BertForPreTraining(transformers.BertConfig(**tiny_config.to_dict()))
    )
    state = {
        k.replace("LayerNorm.weight", "LayerNorm.gamma").replace(
            "LayerNorm.bias", "LayerNorm.beta"
        ): v
        for k, v in theirs.state_dict().items()
        if k != "cls.predictions.decoder.bias"
    }
    state["bert.embeddings.position_ids"] = torch.arange(tiny_config.max_position_embeddings)[None]
    torch.save(state, tmp_path / "pytorch_model.bin")
    tiny_config.save(tmp_path, architecture="BertForMaskedLM")
    with torch.no_grad():
        a, b = load_model(tmp_path)(**batch), theirs(**batch)
    assert (
        parity(
            "tiny TF-era names (gamma/beta, bin) -> ours", a.prediction_logits, b.prediction_logits
        )
        <= TOL
    )
    assert (
        parity(
            "tiny TF-era names (gamma/beta, bin) -> ours",
            a.seq_relationship_logits,
            b.seq_relationship_logits,
        )
        <= TOL
    )


def _hf_save(tmp_path, hf_class, config):
    torch.manual_seed(0)
    getattr(transformers, hf_class)(transformers.BertConfig(**config.to_dict())).save_pretrained(
        tmp_path
    )
    return tmp_path


def test_base_encoder_into_a_head_reports_new_weights_in_one_line(tmp_path, tiny_config, caplog):
    _hf_save(tmp_path, "BertModel", tiny_config)
    with caplog.at_level(logging.INFO, logger="training.checkpoint"):
        model = load_model(tmp_path, task="classification", num_labels=4)
    assert [r.getMessage() for r in caplog.records] == [
        "initialised new head weights: classifier.weight, classifier.bias"
    ]
    assert model.num_labels == 4 and model.config.labels == [f"LABEL_{i}" for i in range(4)]


def test_pretraining_checkpoint_into_a_head_drops_cls_with_a_note(tmp_path, tiny_config, caplog):
    _hf_save(tmp_path, "BertForPreTraining", tiny_config)
    with caplog.at_level(logging.INFO, logger="training.checkpoint"):
        load_model(tmp_path, task="token-classification", labels=["O", "B-X", "I-X"])
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2 and messages[0].startswith("dropped pretraining head weights")
    assert messages[1] == "initialised new head weights: classifier.weight, classifier.bias"


def test_masked_lm_checkpoint_gets_a_fresh_nsp_head(tmp_path, tiny_config, caplog):
    _hf_save(tmp_path, "BertForMaskedLM", tiny_config)  # bert-base-uncased's architecture
    with caplog.at_level(logging.INFO, logger="training.checkpoint"):
        assert isinstance(load_model(tmp_path), BertForPreTraining)
    assert [r.getMessage() for r in caplog.records] == [
        "initialised new head weights: bert.pooler.dense.weight, bert.pooler.dense.bias, "
        "cls.seq_relationship.weight, cls.seq_relationship.bias"
    ]


# --- bad input: one line that names the file ----------------------------------------------


def _fails(match: str, *args, **kwargs) -> str:
    with pytest.raises(CheckpointError, match=match) as e:
        load_model(*args, **kwargs)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_folder_without_config_json(tmp_path):
    _fails(r"config.json: no config.json", tmp_path)


def test_folder_without_weights(tmp_path, tiny_config):
    tiny_config.save(tmp_path, architecture="BertModel")
    _fails(r"no model.safetensors or pytorch_model.bin", tmp_path)


def test_shapes_that_do_not_match_the_config(tmp_path, tiny_config):
    save_model(_new("classification", tiny_config), tmp_path)
    tiny_config.replace(hidden_size=64, id2label={0: "a", 1: "b"}).save(
        tmp_path, "BertForSequenceClassification"
    )
    _fails(
        r"model.safetensors: shapes do not match config.json: bert.embeddings.word_embeddings.weight \(99, 32\) \(model \(99, 64\)\)",
        tmp_path,
    )


def test_a_vocabulary_past_vocab_size_is_refused(tmp_path, tiny_config):
    save_model(_new("classification", tiny_config), tmp_path)
    (tmp_path / "vocab.txt").write_text("\n".join(_tiny_vocab() + ["extra1", "extra2"]) + "\n")
    _fails(
        r"vocab.txt produces ids up to 100 \(2 token\(s\) at or past 99\), but the model's "
        r"vocab_size is 99: the embeddings have no row for them",
        tmp_path,
    )


def test_a_vocabulary_smaller_than_vocab_size_loads(tmp_path, tiny_config):
    # As DeBERTa-v3 and ModernBERT are published: embedding rows past the last token.
    save_model(_new("classification", tiny_config), tmp_path)
    (tmp_path / "vocab.txt").write_text("\n".join(_tiny_vocab()[:90]) + "\n")
    model = load_model(tmp_path, task="classification")
    assert model.config.vocab_size == 99


def test_tensorflow_weights_alone_say_how_to_convert(tmp_path, tiny_config):
    save_model(_new("classification", tiny_config), tmp_path)
    (tmp_path / "model.safetensors").rename(tmp_path / "tf_model.h5")
    _fails(
        r"only tf_model.h5 \(TensorFlow weights\); convert it once to model.safetensors .*from_tf=True",
        tmp_path,
    )


def test_missing_and_unexpected_weights(tmp_path, tiny_config):
    save_model(_new("classification", tiny_config), tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    del state["bert.encoder.layer.1.output.dense.weight"], state["classifier.bias"]
    save_file(state, tmp_path / "model.safetensors")
    _fails(
        r"model.safetensors: missing weights for classification: bert.encoder.layer.1.output.dense.weight, classifier.bias",
        tmp_path,
    )
    # A fine-tuned head's weights do not turn into another head's; both lists in one line.
    _fails(
        r"model.safetensors: missing weights for question-answering: bert.encoder.layer.1.output.dense.weight; "
        r"unexpected weights for question-answering: classifier.weight",
        tmp_path,
        task="question-answering",
    )


def test_unreadable_weights(tmp_path, tiny_config):
    save_model(_new("embedding", tiny_config), tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"not a safetensors file")
    _fails(r"model.safetensors: cannot read", tmp_path)


def test_sha256_mismatch(tmp_path, tiny_config):
    save_model(_new("embedding", tiny_config), tmp_path)
    _fails(
        rf"model.safetensors: sha256 [0-9a-f]{{64}} does not match expected {MINILM_SHA256}",
        tmp_path,
        expected_sha256=MINILM_SHA256,
    )


@pytest.mark.parametrize(
    "change, match",
    [
        ({"architectures": ["BertForMultipleChoice"]}, r"config.json: cannot infer the task"),
        (
            {"position_embedding_type": "relative_key"},
            r"config.json: position_embedding_type 'relative_key'",
        ),
        (
            {"model_type": "funnel"},
            r"config.json: model_type 'funnel' is not supported; supported: bert, albert",
        ),
    ],
)
def test_configs_we_cannot_serve(tmp_path, tiny_config, change, match):
    save_model(_new("embedding", tiny_config), tmp_path)
    (tmp_path / "modules.json").unlink()
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config | change))
    _fails(match, tmp_path)


def test_unsupported_sentence_transformers_modules(tmp_path, tiny_config):
    save_model(_new("embedding", tiny_config), tmp_path)
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode": "lasttoken"}))
    _fails(r"1_Pooling/config.json: pooling lasttoken is not supported", tmp_path)


# --- all-MiniLM-L6-v2: the real checkpoint --------------------------------------------------


@pytest.fixture(scope="module")
def minilm(minilm_path):
    return load_model(minilm_path, expected_sha256=MINILM_SHA256)


def test_minilm_loads_as_a_mean_pooled_normalised_embedding_model(minilm, minilm_path):
    assert isinstance(minilm, BertForEmbedding)
    folder = read_sentence_transformers(minilm_path)
    assert folder is not None
    assert (
        (minilm.pooling, minilm.normalize) == ("mean", True) == (folder.pooling, folder.normalize)
    )
    assert minilm.config.num_hidden_layers == 6 and not minilm.training


def _minilm_batches(path, texts, size=16):
    """(indices, ids, mask): padded batches of similar lengths, as an inference server builds."""
    encodings = encode_batch(load_tokenizer(path), texts)
    order = sorted(range(len(texts)), key=lambda i: len(encodings[i].input_ids))
    for start in range(0, len(order), size):
        chunk = order[start : start + size]
        T = max(len(encodings[i].input_ids) for i in chunk)
        ids = torch.tensor(
            [encodings[i].input_ids + [0] * (T - len(encodings[i].input_ids)) for i in chunk]
        )
        yield chunk, ids, (ids != 0).long()


@pytest.mark.shared
def test_minilm_matches_transformers_and_sentence_transformers(
    minilm, minilm_path, shared_data, parity
):
    st = pytest.importorskip("sentence_transformers")
    texts = sst2_sentences(shared_data)[:64]
    theirs = transformers.BertModel.from_pretrained(minilm_path).eval()
    name = "MiniLM (64 SST-2 dev sentences)"
    ours = torch.zeros(len(texts), minilm.config.hidden_size)
    for chunk, ids, mask in _minilm_batches(minilm_path, texts):
        with torch.no_grad():
            ours_hidden = minilm.bert(ids, mask).last_hidden_state
            their_hidden = theirs(input_ids=ids, attention_mask=mask).last_hidden_state
            ours[chunk] = minilm(ids, mask).embeddings
        real = mask.bool()  # padding positions are not compared
        assert (
            parity(
                f"{name}: last hidden state vs transformers", ours_hidden[real], their_hidden[real]
            )
            <= TOL
        )
        pooled = (their_hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
        assert (
            parity(
                f"{name}: embeddings vs transformers + mean + L2",
                ours[chunk],
                F.normalize(pooled, dim=-1),
            )
            <= TOL
        )
    reference = st.SentenceTransformer(str(minilm_path), device="cpu").encode(
        texts, convert_to_tensor=True
    )
    assert parity(f"{name}: embeddings vs SentenceTransformer.encode", ours, reference) <= TOL


def test_minilm_saved_by_us_is_still_minilm(minilm, minilm_path, tmp_path, parity):
    assert read_max_seq_length(minilm_path) == 256
    save_model(
        minilm,
        tmp_path,
        load_tokenizer(minilm_path),
        max_seq_length=read_max_seq_length(minilm_path),
    )
    folder = read_sentence_transformers(tmp_path)
    assert folder is not None and (folder.pooling, folder.normalize) == ("mean", True)
    assert read_max_seq_length(tmp_path) == 256
    texts = ["A man is playing a guitar.", "Des chiens jouent dans le parc!", "THE END"]
    _, ids, mask = next(_minilm_batches(tmp_path, texts))
    with torch.no_grad():
        a, b = minilm(ids, mask).embeddings, load_model(tmp_path)(ids, mask).embeddings
    assert parity("MiniLM: saved by us and reloaded", a, b) == 0.0
