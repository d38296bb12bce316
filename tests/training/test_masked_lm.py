"""The masked-LM head (task "fill-mask") of every family that has one, and the two package kinds
it exports: fill-mask (`logits` (B, T, V)) and SPLADE sparse embeddings (`embeddings` (B, V),
`--pooling splade`).

Per family (tiny random `*ForMaskedLM` folders saved by transformers, tests/families.py): the
logits equal transformers' on a padded batch, theirs load here and ours open in
`AutoModelForMaskedLM` with no missing or unexpected weights; ELECTRA is refused in one line;
our own pretraining checkpoints (BertForPreTraining, NSP / SOP) load as fill-mask; the exported
graphs equal transformers, and the SPLADE vectors sentence-transformers' SparseEncoder. The
figures are listed at the end of the run (`parity: max abs diff`)."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from heads.package import read_package
from tests.families import FAMILIES, family_checkpoint, family_package, hf_tokenizer
from training.checkpoint import CheckpointError, load_model, save_model
from training.config import BertConfig, ConfigError
from training.export import ExportError, export_package, main, onnx_run
from training.families import FAMILIES as FAMILY_RECORDS
from training.families import TASK_OF_ARCHITECTURE
from training.model import HEADS, BertForEmbedding, BertForMaskedLM, pool, splade
from training.tokenizer import load_tokenizer

transformers = pytest.importorskip("transformers")

TOL = 1e-5  # PyTorch against PyTorch
EXPORT_TOL = 1e-4  # ONNX Runtime against PyTorch, as the exporter's parity
SEED = 5
MASKED_LM = tuple(f for f in FAMILIES if f != "electra")
# case -> (family, config changes): every family with a head, and DeBERTa's other layout
# (transformers 4.57's non-legacy head only runs untied: its tying swaps `dense` for the
# word embeddings, tests/training/test_family_deberta_v2.py)
CASES: dict[str, tuple[str, dict[str, Any]]] = {f: (f, {}) for f in MASKED_LM} | {
    "deberta-v2-lm-head": ("deberta-v2", {"legacy": False, "tie_word_embeddings": False}),
}
NO_TOKEN_TYPES = ("distilbert", "modernbert", "mpnet")  # their forward takes none
SPLADE_FAMILIES = ("bert", "roberta", "distilbert")


def texts(family: str) -> list[str]:
    """Texts with the family's mask token: one, two and none, of different lengths."""
    mask = hf_tokenizer(family).mask_token
    return [
        f"The capital of France is {mask}.",
        f"{mask} visited Paris in June with two {mask} friends, and it rained all week long.",
        "No blank in this one",
    ]


def padded(family: str) -> dict[str, torch.Tensor]:
    """The texts as transformers' tokenizer pads them; token types zero where it gives none."""
    batch = dict(hf_tokenizer(family)(texts(family), padding=True, return_tensors="pt"))
    batch.setdefault("token_type_ids", torch.zeros_like(batch["input_ids"]))
    return batch


def their_logits(model: Any, family: str, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    feeds = {
        k: v for k, v in batch.items() if k != "token_type_ids" or family not in NO_TOKEN_TYPES
    }
    with torch.inference_mode():
        return model(**feeds).logits


def ours(model: BertForMaskedLM, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.inference_mode():
        return model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).logits


def real(x: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Per-token outputs at the real tokens only (padding rows differ by family, unread)."""
    return x[batch["attention_mask"].bool()]


def perturbed(model: torch.nn.Module) -> torch.nn.Module:
    """Noise on every weight, so that a weight that did not arrive cannot hide."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


# --- the head against transformers --------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_transformers_masked_lm_loads_here_and_matches(case, caplog, parity):
    family, changes = CASES[case]
    folder = family_checkpoint(family, "masked-lm", seed=SEED, **changes)
    with caplog.at_level(logging.INFO, logger="training.checkpoint"):
        model = load_model(folder, task="fill-mask")
    assert type(model) is BertForMaskedLM
    assert caplog.records == []  # nothing missing, unexpected, dropped or drawn fresh
    theirs = transformers.AutoModelForMaskedLM.from_pretrained(folder, attn_implementation="eager")
    batch = padded(family)
    a, b = ours(model, batch), their_logits(theirs.eval(), family, batch)
    assert a.shape == b.shape == (*batch["input_ids"].shape, model.config.vocab_size)
    assert (
        parity(f"tiny {case} fill-mask: transformers -> ours", real(a, batch), real(b, batch))
        <= TOL
    )


@pytest.mark.parametrize("case", CASES)
def test_ours_open_in_transformers_with_no_missing_keys(tmp_path, case, parity):
    family, changes = CASES[case]
    torch.manual_seed(0)
    model = perturbed(
        load_model(family_checkpoint(family, "masked-lm", seed=SEED, **changes), task="fill-mask")
    )
    save_model(model, tmp_path)
    theirs, info = transformers.AutoModelForMaskedLM.from_pretrained(
        tmp_path, output_loading_info=True, attn_implementation="eager"
    )
    assert type(theirs).__name__ == FAMILY_RECORDS[family].architectures["fill-mask"]
    assert info == {"missing_keys": [], "unexpected_keys": [], "mismatched_keys": [],
                    "error_msgs": []}  # fmt: skip
    batch = padded(family)
    a, b = ours(model, batch), their_logits(theirs.eval(), family, batch)
    assert (
        parity(f"tiny {case} fill-mask: ours -> transformers", real(a, batch), real(b, batch))
        <= TOL
    )
    again = load_model(tmp_path, task="fill-mask")
    torch.testing.assert_close(ours(again, batch), a, atol=0, rtol=0)


def test_a_masked_lm_architecture_reads_as_its_task():
    """RobertaForMaskedLM... load as fill-mask; BertForMaskedLM and AlbertForMaskedLM as
    pretraining, as before (bert-base-uncased's file holds the NSP head too)."""
    for family in MASKED_LM:
        architecture = FAMILY_RECORDS[family].architectures["fill-mask"]
        pretrains = FAMILY_RECORDS[family].pretraining
        assert TASK_OF_ARCHITECTURE[architecture] == ("pretraining" if pretrains else "fill-mask")
    assert type(load_model(family_checkpoint("mpnet", "masked-lm", seed=SEED))) is BertForMaskedLM


def test_the_decoder_is_the_word_embeddings():
    for family in ("bert", "roberta", "distilbert", "modernbert"):
        model = load_model(family_checkpoint(family, "masked-lm", seed=SEED), task="fill-mask")
        table = model.bert.embeddings
        table = getattr(table, "word_embeddings", None) or table.tok_embeddings
        assert any(p is table.weight for p in model.cls.parameters()), family


# --- what is refused ------------------------------------------------------------------------


def test_electra_has_no_masked_lm_head(tmp_path, capsys):
    with_head = ", ".join(t for t, f in FAMILY_RECORDS.items() if f.fill_mask)
    folder = family_checkpoint("electra", "masked-lm", seed=SEED)  # the generator's class
    with pytest.raises(CheckpointError) as e:
        load_model(folder, task="fill-mask")
    message = str(e.value)
    assert "\n" not in message and "electra has no masked-LM head here" in message
    assert message.endswith(f"implemented for {with_head}") and "electra," not in with_head
    with pytest.raises(ValueError, match="electra has no masked-LM head"):
        BertForMaskedLM(load_model(family_checkpoint("electra", "embedding"), "embedding").config)
    for argv in (["--task", "fill-mask"], ["--task", "embedding", "--pooling", "splade"]):
        out = tmp_path / argv[-1]
        assert main(["--checkpoint", str(folder), *argv, "--out", str(out)]) == 1
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and "\n" not in err and with_head in err
        assert not out.exists()


def test_an_encoder_without_the_head_is_not_given_a_random_one(caplog):
    """A random vocabulary projection fills masks with noise: missing, not drawn fresh."""
    with pytest.raises(
        CheckpointError, match="missing weights for fill-mask: lm_head.bias, lm_head.dense.weight"
    ):
        load_model(family_checkpoint("roberta", "embedding"), task="fill-mask")


def test_an_untied_decoder_is_refused(tmp_path):
    shutil.copytree(family_checkpoint("bert", "masked-lm", seed=SEED), tmp_path, dirs_exist_ok=True)
    state = load_file(tmp_path / "model.safetensors")
    table = state["bert.embeddings.word_embeddings.weight"]
    save_file(state | {"cls.predictions.decoder.weight": table + 1}, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match="cls.predictions.decoder.weight differs from "
                       "bert.embeddings.word_embeddings.weight"):  # fmt: skip
        load_model(tmp_path, task="fill-mask")
    # the same values under both names (the original bert-base-uncased file) load
    save_file(
        state | {"cls.predictions.decoder.weight": table.clone()}, tmp_path / "model.safetensors"
    )
    load_model(tmp_path, task="fill-mask")


def test_dense_poolings_refuse_splade(tmp_path):
    config = BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=37)  # fmt: skip
    with pytest.raises(ValueError, match="'splade' reads masked-LM logits, not hidden states"):
        pool(torch.zeros(1, 2, 32), None, "splade")
    with pytest.raises(ValueError, match="--task embedding --pooling splade"):
        BertForEmbedding(config, pooling="splade")
    with pytest.raises(ConfigError, match="classifier_pooling 'splade' is not one of"):
        config.replace(classifier_pooling="splade")
    tok = hf_tokenizer("bert").backend_tokenizer
    with pytest.raises(ExportError, match="masked LM \\(BertForMaskedLM\\), not BertForEmbedding"):
        export_package(BertForEmbedding(config), "embedding", tmp_path / "a", tokenizer=tok,
                       pooling="splade", verbose=False)  # fmt: skip
    folder = family_checkpoint("bert", "masked-lm", seed=SEED)
    with pytest.raises(ExportError, match="hidden states are exported by dense embeddings"):
        export_package(folder, "embedding", tmp_path / "b", pooling="splade", hidden_states=True)


# --- our own pretraining checkpoints ----------------------------------------------------------


@pytest.mark.parametrize("family", ["bert", "albert"])
def test_our_pretraining_checkpoint_loads_as_fill_mask(tmp_path, family, caplog, parity):
    """What training.pretrain saves (save_model of BertForPreTraining: the MLM head plus NSP,
    or ALBERT's SOP) loads as fill-mask, the sentence head dropped with the usual note, and
    exports as a fill-mask package."""
    torch.manual_seed(0)
    folder = family_checkpoint(family, "masked-lm", seed=SEED)
    pretrained = perturbed(load_model(folder, task="pretraining"))
    save_model(pretrained, tmp_path / "ckpt", tokenizer=load_tokenizer(folder))
    written = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert written["architectures"] == [FAMILY_RECORDS[family].architectures["pretraining"]]
    caplog.clear()  # loading the folder as pretraining drew a fresh NSP / SOP head
    with caplog.at_level(logging.INFO, logger="training.checkpoint"):
        model = load_model(tmp_path / "ckpt", task="fill-mask")
    # the pooler (the sentence head's input) goes silently, as for every head without one
    [note] = [r.getMessage() for r in caplog.records]
    dropped = "dropped pretraining head weights not used by fill-mask: "
    assert note.startswith(dropped)
    assert sorted(note.removeprefix(dropped).split(", ")) == [
        "cls.seq_relationship.bias",
        "cls.seq_relationship.weight",
    ]
    batch = padded(family)
    with torch.inference_mode():
        want = pretrained(**batch).prediction_logits
    assert (
        parity(f"tiny {family} pretraining checkpoint -> fill-mask", ours(model, batch), want)
        <= TOL
    )
    package = export_package(tmp_path / "ckpt", "fill-mask", tmp_path / "pkg", verbose=False)
    assert max(package.parity["fp32"]["max_abs_diff"].values()) <= EXPORT_TOL
    assert package.mask_token == "[MASK]"


# --- fill-mask packages -------------------------------------------------------------------------


def onnx_logits(package: Path, batch: dict[str, torch.Tensor], name: str) -> np.ndarray:
    run = onnx_run(package / "model.onnx")
    return run({k: v.numpy() for k, v in batch.items()})[name]


@pytest.mark.parametrize("family", MASKED_LM)
def test_fill_mask_package_equals_transformers(family, parity):
    package = family_package(family, "fill-mask", seed=SEED)
    pkg = read_package(package)
    folder = family_checkpoint(family, "masked-lm", seed=SEED)
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    assert pkg.task == "fill-mask" and pkg.mask_token == hf_tokenizer(family).mask_token
    assert pkg.outputs == [
        {"name": "logits", "dtype": "float32", "shape": ["batch", "sequence", vocab]}
    ]
    assert max(pkg.parity["fp32"]["max_abs_diff"].values()) <= EXPORT_TOL
    recorded = torch.tensor(max(pkg.parity["fp32"]["max_abs_diff"].values()))
    parity(f"tiny {family} fill-mask package: recorded at export", recorded, torch.tensor(0.0))
    theirs = transformers.AutoModelForMaskedLM.from_pretrained(folder, attn_implementation="eager")
    batch = padded(family)
    got = torch.from_numpy(onnx_logits(package, batch, "logits"))
    want = their_logits(theirs.eval(), family, batch)
    assert (
        parity(
            f"tiny {family} fill-mask package: ONNX vs transformers",
            real(got, batch),
            real(want, batch),
        )
        <= EXPORT_TOL
    )


def test_help_lists_the_new_task_and_pooling(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    shown = capsys.readouterr().out
    assert "fill-mask" in shown.split("--task {")[1].split("}")[0]
    assert "splade" in shown.split("--pooling {")[1].split("}")[0]


# --- SPLADE packages ----------------------------------------------------------------------------


def sparse_encoder(folder: Path) -> Any:
    """sentence-transformers' SparseEncoder on the masked-LM folder: MLMTransformer ->
    SpladePooling("max")."""
    st = pytest.importorskip("sentence_transformers")
    from sentence_transformers.sparse_encoder import modules

    return st.SparseEncoder(
        modules=[modules.MLMTransformer(str(folder)), modules.SpladePooling("max")], device="cpu"
    )


def same_support(a: np.ndarray, b: np.ndarray) -> bool:
    return bool(np.array_equal(a != 0, b != 0))


@pytest.mark.parametrize("family", SPLADE_FAMILIES)
def test_splade_package_equals_the_formula_and_sentence_transformers(family, parity):
    package = family_package(family, "embedding", seed=SEED, pooling="splade")
    pkg = read_package(package)
    folder = family_checkpoint(family, "masked-lm", seed=SEED)
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    assert (pkg.pooling, pkg.normalize, pkg.sparse) == ("splade", False, True)
    assert pkg.outputs == [{"name": "embeddings", "dtype": "float32", "shape": ["batch", vocab]}]
    assert max(pkg.parity["fp32"]["max_abs_diff"].values()) <= EXPORT_TOL
    batch = padded(family)
    got = onnx_logits(package, batch, "embeddings")  # (B, V)
    assert got.shape == (3, vocab) and (got >= 0).all() and (got == 0).any()

    theirs = transformers.AutoModelForMaskedLM.from_pretrained(folder, attn_implementation="eager")
    logits = their_logits(theirs.eval(), family, batch)
    mask = batch["attention_mask"][..., None].float()
    formula = (torch.log1p(torch.relu(logits)) * mask).max(dim=1).values.numpy()
    assert (
        parity(
            f"tiny {family} splade package: ONNX vs formula on transformers",
            torch.from_numpy(got),
            torch.from_numpy(formula),
        )
        <= EXPORT_TOL
    )
    assert same_support(got, formula)
    torch.testing.assert_close(splade(logits, batch["attention_mask"]), torch.from_numpy(formula))

    with torch.inference_mode():
        st = sparse_encoder(folder).encode(texts(family), convert_to_tensor=True,
                                           convert_to_sparse_tensor=False).numpy()  # fmt: skip
    assert (
        parity(
            f"tiny {family} splade package: ONNX vs SparseEncoder",
            torch.from_numpy(got),
            torch.from_numpy(st),
        )
        <= EXPORT_TOL
    )
    assert same_support(got, st)


def test_a_sparse_encoder_folder_exports_as_splade_by_default(tmp_path):
    folder = family_checkpoint("bert", "masked-lm", seed=SEED)
    sparse_encoder(folder).save(str(tmp_path / "st"))
    package = export_package(tmp_path / "st", "embedding", tmp_path / "pkg", verbose=False)
    assert (package.pooling, package.normalize) == ("splade", False)
    config = tmp_path / "st" / "1_SpladePooling" / "config.json"
    config.write_text(json.dumps(json.loads(config.read_text()) | {"pooling_strategy": "sum"}))
    with pytest.raises(ExportError, match="SpladePooling .*'sum'.* is not supported"):
        export_package(tmp_path / "st", "embedding", tmp_path / "pkg2", verbose=False)
    with pytest.raises(CheckpointError, match="a SparseEncoder .*--pooling splade"):
        load_model(tmp_path / "st", task="embedding")


def test_the_heads_table_has_fill_mask():
    assert HEADS["fill-mask"] is BertForMaskedLM
