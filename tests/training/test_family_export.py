"""Every family's checkpoint a user saved with `save_pretrained` exports and runs in ONNX
Runtime equal to transformers: RoBERTa, XLM-R, CamemBERT, DistilBERT, ELECTRA, ALBERT, BERT,
DeBERTa-v2 (v3's options), ModernBERT and MPNet, each with the four heads, on padded batches in the family's own row layout (batch 1 and 3,
sequence 7 and 64). Also: the slow RoBERTa tokenizer files, and what export refuses.

Each family's largest difference from transformers per head and the fused operator counts of
its graphs are printed (`-s` shows them)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from tests.families import FAMILIES, TASK_CLASSES, family_checkpoint, family_package
from training.export import ExportError, export_package, main, probe_batches
from training.tokenizer import TokenizerError, load_tokenizer

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

TOL = 1e-4
SEED = 3  # the seed tests/service/test_family_parity_http.py serves: one export each
TASKS = tuple(t for t in TASK_CLASSES if t != "masked-lm")  # fill-mask: test_masked_lm.py
# Families with encoders of their own -> the fewest SkipLayerNormalization their graphs have
# (DeBERTa and MPNet: 2 per layer; ModernBERT's pre-norm: 2 per layer, but layer 0's first
# norm is absent).
OWN_ENCODERS = {"deberta-v2": 4, "modernbert": 5, "mpnet": 4}
TEXTS = [
    "Hello  world, café naïve!",
    " São Paulo 🙂 <mask> and\ttabs",
    "New-York's  mayor (2024): 3.5%",
]


@pytest.fixture(scope="module")
def exported() -> dict[tuple[str, str], Path]:
    """(family, task) -> its exported package, fp32 (shared with the served-parity tests)."""
    return {(f, t): family_package(f, t, seed=SEED) for f in FAMILIES for t in TASKS}


def their_outputs(
    folder: Path, task: str, batch: dict[str, np.ndarray], manifest: dict
) -> list[np.ndarray]:
    """transformers' model of the same folder on one padded batch, as our graph answers it
    (embeddings pooled as the package says, then the token states)."""
    auto = {
        "classification": transformers.AutoModelForSequenceClassification,
        "token-classification": transformers.AutoModelForTokenClassification,
        "question-answering": transformers.AutoModelForQuestionAnswering,
        "embedding": transformers.AutoModel,
    }[task]
    model = auto.from_pretrained(folder, attn_implementation="eager").eval()
    feeds = {k: torch.from_numpy(v) for k, v in batch.items()}
    if model.config.model_type in ("distilbert", "modernbert", "mpnet"):
        del feeds["token_type_ids"]  # their forward takes none
    with torch.inference_mode():
        out = model(**feeds)
    if task == "question-answering":
        return [out.start_logits.numpy(), out.end_logits.numpy()]
    if task == "embedding":
        assert manifest["pooling"] == "mean"  # a plain AutoModel folder: the default
        mask = feeds["attention_mask"].unsqueeze(-1).float()
        # pooled in the graph; the service normalises per request (`normalize`); then every
        # token's last hidden state (token_embeddings, /embed_all)
        pooled = (out.last_hidden_state * mask).sum(1) / mask.sum(1)
        return [pooled.numpy(), out.last_hidden_state.numpy()]
    return [out.logits.numpy()]


@pytest.mark.parametrize("family", FAMILIES)
def test_onnx_equals_transformers_for_every_head(exported, family):
    fusion, worst = {}, {}
    for task in TASKS:
        folder, package = family_checkpoint(family, task, seed=SEED), exported[family, task]
        manifest = json.loads((package / "package.json").read_text())
        session = ort.InferenceSession(
            str(package / "model.onnx"), providers=["CPUExecutionProvider"]
        )
        inputs = [i.name for i in session.get_inputs()]
        assert [i["name"] for i in manifest["inputs"]] == inputs
        tokenizer = load_tokenizer(package / "tokenizer.json")
        pad_id = manifest["special_tokens"]["pad"]["id"]
        assert pad_id == json.loads((folder / "config.json").read_text())["pad_token_id"]
        batches = probe_batches(tokenizer, pad_id, manifest["max_seq_length"])
        assert {b["input_ids"].shape for b in batches} == {(1, 7), (3, 7), (1, 64), (3, 64)}
        for batch in batches:
            assert (batch["attention_mask"] == 0).any() or batch["input_ids"].shape[0] == 1
            ours = session.run(None, {n: batch[n] for n in inputs})
            theirs = their_outputs(folder, task, batch, manifest)
            mask = batch["attention_mask"].astype(bool)
            for o, t in zip(ours, theirs, strict=True):
                if o.ndim >= 2 and o.shape[1] == mask.shape[1]:  # per token: real tokens only
                    o, t = o[mask], t[mask]
                diff = float(np.abs(o - t).max())
                worst[task] = max(diff, worst.get(task, 0.0))
                assert diff <= TOL, (family, task, batch["input_ids"].shape)
        assert max(manifest["parity"]["fp32"]["max_abs_diff"].values()) <= TOL
        fusion[task] = {k: v for k, v in manifest["source"]["fusion"]["ops"].items() if v}
    print(f"\n{family}: ONNX vs transformers, max abs diff per head:", end=" ")
    print(", ".join(f"{task} {diff:.1e}" for task, diff in worst.items()))
    print(f"{family}: fused operators per head: {fusion}")
    for task, ops in fusion.items():
        if family in OWN_ENCODERS:
            # ORT's BERT fusion does not recognise their attention (relative positions,
            # rotary, a position bias) nor their embeddings; it still fuses every residual
            # add + LayerNorm (two per layer) and the GELUs.
            assert "Attention" not in ops and "EmbedLayerNormalization" not in ops, (family, ops)
            assert ops.get("SkipLayerNormalization", 0) >= OWN_ENCODERS[family], (family, ops)
        else:  # the BERT fusion fires: one embedding block, one Attention per layer
            assert ops.get("EmbedLayerNormalization") == 1, (family, task, ops)
            assert ops.get("Attention") == 2, (family, task, ops)


def test_the_distilbert_graph_declares_no_token_types(exported):
    manifest = json.loads((exported["distilbert", "classification"] / "package.json").read_text())
    assert [i["name"] for i in manifest["inputs"]] == ["input_ids", "attention_mask"]


def test_roberta_windows_leave_room_for_the_position_offset(exported):
    manifest = json.loads((exported["roberta", "question-answering"] / "package.json").read_text())
    config = json.loads(
        (family_checkpoint("roberta", "question-answering", seed=SEED) / "config.json").read_text()
    )
    assert manifest["max_seq_length"] == config["max_position_embeddings"] - 2


# -- tokenizers --------------------------------------------------------------------------------


def test_the_slow_roberta_files_tokenize_as_transformers():
    slow = family_checkpoint("roberta", "classification", slow_tokenizer=True)
    assert not (slow / "tokenizer.json").exists() and (slow / "merges.txt").is_file()
    ours, fast = (
        load_tokenizer(slow),
        load_tokenizer(family_checkpoint("roberta", "classification", seed=SEED)),
    )
    hf = transformers.AutoTokenizer.from_pretrained(slow)
    for text in TEXTS:
        theirs = hf(text, return_offsets_mapping=True)
        for enc in (ours.encode(text), fast.encode(text)):
            assert enc.ids == theirs["input_ids"], text
            assert enc.offsets == [tuple(o) for o in theirs["offset_mapping"]], text
    assert ours.encode(*TEXTS[:2]).ids == hf(*TEXTS[:2])["input_ids"]


def test_a_slow_roberta_folder_exports_and_matches(tmp_path):
    package = export_package(
        family_checkpoint("roberta", "classification", slow_tokenizer=True),
        "classification",
        tmp_path / "pkg",
        verbose=False,
    )
    assert max(package.parity["fp32"]["max_abs_diff"].values()) <= TOL


def test_a_sentencepiece_only_folder_says_how_to_fix_it(tmp_path):
    (tmp_path / "sentencepiece.bpe.model").write_bytes(b"\x00")
    with pytest.raises(
        TokenizerError, match=r"sentencepiece\.bpe\.model is a SentencePiece model.*save_pretrained"
    ):
        load_tokenizer(tmp_path)


# -- what export refuses ---------------------------------------------------------------------------


@pytest.mark.parametrize("model_type", ["funnel", "gpt2"])
def test_an_unsupported_model_type_is_named_with_the_supported_list(tmp_path, capsys, model_type):
    folder = tmp_path / "ckpt"
    shutil.copytree(family_checkpoint("bert", "classification", seed=SEED), folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"model_type": model_type}))
    code = main(
        ["--checkpoint", str(folder), "--task", "classification", "--out", str(tmp_path / "out")]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0
    assert len(err) == 1, err
    assert f"model_type {model_type!r} is not supported" in err[0]
    assert "roberta" in err[0] and "distilbert" in err[0]


def test_a_tokenizer_of_another_model_is_refused(tmp_path):
    roberta = family_checkpoint("roberta", "classification", seed=SEED)
    bigger = load_tokenizer(roberta)
    bigger.add_tokens([f"extra{i}" for i in range(5)])
    with pytest.raises(ExportError, match="produces ids up to .* but the model's vocab_size"):
        export_package(roberta, "classification", tmp_path / "a", tokenizer=bigger, verbose=False)
    # a WordPiece vocabulary pads with [PAD] = 0, not where RoBERTa counts positions from
    bert_vocab = load_tokenizer(family_checkpoint("bert", "classification", seed=SEED))
    with pytest.raises(
        ExportError, match=r"pads with \[PAD\] \(0, by name\) but the model's pad_token_id is 1"
    ):
        export_package(
            roberta, "classification", tmp_path / "b", tokenizer=bert_vocab, verbose=False
        )
