"""package.json `reads` (what a classifier reads: single texts or pairs) and `default_for` (the
request tasks it answers when a request names no model), as training.export and
training.finetune write them: from the training data, from what the checkpoint folder declares
(finetune's record, a sentence-transformers CrossEncoder), from NLI label names, or as asked."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from heads.package import read_package
from tests.families import family_checkpoint
from tests.training.tiny import tiny_init, tiny_tokenizer
from training.checkpoint import read_reads
from training.export import ExportError, export_package, main
from training.finetune import FinetuneArgs, finetune


def export(folder: Path, out: Path, **options) -> tuple[str, list[str]]:
    pkg = export_package(folder, "classification", out, max_seq_length=32, verbose=False, **options)
    return pkg.reads, list(pkg.default_for)


def test_export_says_what_the_checkpoint_reads(tmp_path: Path) -> None:
    plain = family_checkpoint("bert", "classification", labels=["negative", "positive"])
    nli = family_checkpoint("bert", "classification", labels=["entailment", "contradiction"])
    # nothing says: unknown (no field), not a guess either way
    assert export(plain, tmp_path / "plain") == ("unknown", [])
    assert "reads" not in json.loads((tmp_path / "plain" / "package.json").read_text())
    assert export(nli, tmp_path / "nli") == ("pairs", [])  # NLI labels: premise, hypothesis
    # the export flag beats both
    assert export(plain, tmp_path / "asked", reads="pairs") == ("pairs", [])
    assert export(nli, tmp_path / "asked", reads="single") == ("single", [])
    manifest = json.loads((tmp_path / "asked" / "package.json").read_text())
    assert manifest["reads"] == "single" and "default_for" not in manifest


@pytest.mark.parametrize("version", ["v5", "v4", "v2"])
def test_a_cross_encoder_folder_reads_pairs(tmp_path: Path, version: str) -> None:
    """sentence-transformers marks a CrossEncoder folder three ways over its versions: v5's
    config_sentence_transformers.json model_type (CrossEncoder.save, run here), v4's
    config.json "sentence_transformers" entry, v2-v3's sbert_ce_default_activation_function."""
    source = family_checkpoint("bert", "classification", labels=["score"])
    folder = tmp_path / "ce"
    if version == "v5":
        st = pytest.importorskip("sentence_transformers")
        st.CrossEncoder(str(source)).save(str(folder))
    else:
        shutil.copytree(source, folder)
        config = json.loads((folder / "config.json").read_text())
        key, value = (
            ("sentence_transformers", {"activation_fn": "torch.nn.modules.activation.Sigmoid"})
            if version == "v4"
            else ("sbert_ce_default_activation_function", "torch.nn.modules.linear.Identity")
        )
        (folder / "config.json").write_text(json.dumps({**config, key: value}))
    assert read_reads(folder) == ("pairs", "a sentence-transformers CrossEncoder folder")
    assert read_reads(source) is None
    assert export(folder, tmp_path / "reranker", default_for=["rerank"]) == ("pairs", ["rerank"])


def test_default_for_must_be_a_task_the_package_answers(tmp_path: Path) -> None:
    plain = family_checkpoint("bert", "classification", labels=["negative", "positive"])
    with pytest.raises(ExportError, match="'embedding', which a classification package"):
        export(plain, tmp_path / "a", default_for=["embedding"])
    with pytest.raises(ExportError, match="'rerank', which scores pairs, but the package reads"):
        export(plain, tmp_path / "b", reads="single", default_for=["rerank"])
    ner = family_checkpoint("bert", "token-classification")
    with pytest.raises(ExportError, match="--reads is for classification packages"):
        export_package(ner, "token-classification", tmp_path / "c", reads="pairs", verbose=False)
    assert not (tmp_path / "a").exists() and not (tmp_path / "c").exists()


def test_the_command_line_takes_reads_and_default_for(tmp_path: Path) -> None:
    plain = family_checkpoint("bert", "classification", labels=["no", "yes"])
    out = tmp_path / "models" / "reranker"
    argv = ["--checkpoint", str(plain), "--task", "classification", "--out", str(out),
            "--reads", "pairs", "--default-for", "classification", "rerank"]  # fmt: skip
    assert main(argv) == 0
    pkg = read_package(out)
    assert (pkg.reads, pkg.default_for) == ("pairs", ("classification", "rerank"))


@pytest.fixture(scope="module")
def init(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tiny")
    return tiny_init(root / "init", tiny_tokenizer(root / "vocab"))


def data(folder: Path, pairs: bool) -> Path:
    """JSON lines of a tiny two-label task: texts, or text / text_pair."""
    rows = [("good film", "a film", 1), ("bad film", "a film", 0)] * 4
    path = folder / ("pairs.jsonl" if pairs else "single.jsonl")
    lines = [
        {"text": a, **({"text_pair": b} if pairs else {}), "label": str(y)} for a, b, y in rows
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


@pytest.mark.parametrize("pairs", [True, False])
def test_finetune_records_what_its_data_reads(init: Path, tmp_path: Path, pairs: bool) -> None:
    """--export writes the data's kind into package.json, and best/ keeps it, so that a later
    export of best/ makes the same package; --default-for goes into the package."""
    want = "pairs" if pairs else "single"
    args = FinetuneArgs(
        task="classification", init=str(init), train=str(data(tmp_path, pairs)),
        out=str(tmp_path / "run"), max_seq_length=24, batch_size=8, epochs=1, export=True,
        default_for=["classification"],
    )  # fmt: skip
    result = finetune(args)
    assert result.package_dir is not None
    made = read_package(result.package_dir)
    assert (made.reads, made.default_for) == (want, ("classification",))
    recorded = json.loads((result.best_dir / "config.json").read_text())["bert_heads"]
    assert recorded == {"reads": want}
    assert read_reads(result.best_dir) == (want, f"{result.best_dir / 'config.json'} records it")
    assert export(result.best_dir, tmp_path / "later") == (want, [])
    flipped = "single" if pairs else "pairs"
    assert export(result.best_dir, tmp_path / "asked", reads=flipped)[0] == flipped


def test_finetune_refuses_default_for_without_export(init: Path, tmp_path: Path) -> None:
    args = FinetuneArgs(task="classification", init=str(init), train=str(data(tmp_path, False)),
                        out=str(tmp_path / "run"), default_for=["classification"])  # fmt: skip
    with pytest.raises(ValueError, match="--default-for .* add --export"):
        finetune(args)
