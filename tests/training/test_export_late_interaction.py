"""ColBERT checkpoints export as late-interaction packages (issue 51), and dense embedding
packages answer every token's vector too.

The reference for each layout is the library that writes it, on tiny models (hidden 32, 2
layers) built here from tests/families.py's checkpoints:

- colbert-ai 0.2.22 itself: an HF_ColBERT saved as its Checkpoint saves one, read back with its
  `Checkpoint`, whose tokenizers build the rows and whose `queryFromText` / `docFromText` give
  the vectors;
- PyLate 1.0.0's logic, reproduced from its source (tests/colbert.py says why and how it was
  checked against PyLate itself).

Each test runs the package's ONNX graph on the rows the library builds, L2-normalises every
position, and compares with the library's vectors: a query's every row position, a document's
kept ones (its real tokens less the skiplist), within 1e-5.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.families import family_checkpoint

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
ort = pytest.importorskip("onnxruntime")
from safetensors.torch import load_file  # noqa: E402

# our own modules, imported plainly: an error in them fails these tests instead of skipping them
from heads.package import PackageError, read_package  # noqa: E402
from tests.colbert import (  # noqa: E402 (the libraries' references, shared with the service's tests)
    DIMENSION,
    DOCUMENT_LENGTH,
    DOCUMENTS,
    QUERIES,
    QUERY_LENGTH,
    TOLERANCE,
    PyLate,
    bert_encoder,
    colbert_ai_folder,
    colbert_ai_modules,
    kept_by_package,
    onnx_vectors,
    pylate_folder,
    wordpiece_with_markers,
)
from training.checkpoint import CheckpointError, load_model  # noqa: E402
from training.export import ExportError, export_package, main  # noqa: E402
from training.model import BertForLateInteraction  # noqa: E402

# colbert-ai's Checkpoint asks for CUDA's mixed precision, which CPU torch switches off, saying so
pytestmark = [
    pytest.mark.filterwarnings("ignore:`torch.cuda.amp"),
    pytest.mark.filterwarnings("ignore:torch.cuda.amp.GradScaler is enabled"),
    pytest.mark.filterwarnings("ignore:CUDA is not available"),
]


@pytest.fixture
def colbert_ai(monkeypatch):
    return colbert_ai_modules(monkeypatch)


# --- the exports -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bert_with_markers(tmp_path_factory) -> Path:
    return bert_encoder(tmp_path_factory.mktemp("bert"), wordpiece_with_markers())


def export(folder: Path, out: Path, **kwargs: Any) -> Any:
    return export_package(folder, "late-interaction", out, verbose=False, **kwargs)


@pytest.mark.parametrize(
    ("prefixes", "attend"),
    [(("[Q] ", "[D] "), False), (("[unused0]", "[unused1]"), False), (("[Q] ", "[D] "), True)],
    ids=["new-marker-tokens", "unused-markers", "attend-to-expansion"],
)
def test_a_pylate_bert_package_answers_pylates_vectors(
    tmp_path, bert_with_markers, prefixes, attend, parity
) -> None:
    folder = pylate_folder(
        tmp_path / "colbert", bert_with_markers, query_prefix=prefixes[0],
        document_prefix=prefixes[1], attend_to_expansion_tokens=attend,
    )  # fmt: skip
    pkg = export(folder, tmp_path / "pkg")
    library = PyLate(folder)
    block = pkg.late_interaction
    assert block == {
        "query_prefix": prefixes[0], "query_prefix_id": library.query_prefix_id,
        "document_prefix": prefixes[1], "document_prefix_id": library.document_prefix_id,
        "query_length": QUERY_LENGTH, "document_length": DOCUMENT_LENGTH,
        "query_expansion": True, "attend_to_expansion_tokens": attend,
        "mask_id": library.tok.mask_token_id, "skiplist_ids": sorted(set(library.skiplist)),
        "source": "pylate",
    }  # fmt: skip
    if prefixes[0] == "[unused0]":  # already in the vocabulary: no token added
        assert len(library.tok) == len(wordpiece_with_markers())
    assert (pkg.task, pkg.normalize, pkg.pooling) == ("late-interaction", True, None)
    assert pkg.max_seq_length == max(QUERY_LENGTH, DOCUMENT_LENGTH)
    assert pkg.outputs == [
        {"name": "token_embeddings", "dtype": "float32", "shape": ["batch", "sequence", 16]}
    ]
    assert_matches_library(pkg, library.encode, parity, f"PyLate BERT {prefixes[0]!r}")


def assert_matches_library(pkg: Any, encode: Any, parity: Any, name: str) -> None:
    """The graph's normalised vectors at the positions the package's block keeps equal the
    library's encode, queries and documents, on the library's own rows."""
    for texts, is_query in ((QUERIES, True), (DOCUMENTS, False)):
        features, want = encode(texts, is_query)
        ids, mask = (np.asarray(features[k]) for k in ("input_ids", "attention_mask"))
        if is_query:  # expanded to query_length with the mask token, all answering
            assert ids.shape[1] == QUERY_LENGTH
            assert (ids[:, -1] == pkg.late_interaction["mask_id"]).any()
        got = onnx_vectors(pkg, ids, mask)
        keep = kept_by_package(pkg, ids, mask, is_query)
        for row, vectors in enumerate(want):
            assert keep[row].sum() == len(vectors), (is_query, row)
            which = f"{name} {'queries' if is_query else 'documents'}, unit vectors"
            diff = parity(which, torch.from_numpy(got[row][keep[row]]), torch.from_numpy(vectors))
            assert diff <= TOLERANCE, (is_query, row, diff)


def test_a_pylate_modernbert_package_answers_pylates_vectors(tmp_path, parity) -> None:
    """ModernBERT (byte-level BPE, no [unused] entries: PyLate adds [Q] / [D]). PyLate 1.0.0
    itself cannot build one (it passes add_pooling_layer to every model, which ModernBertModel
    refuses); later PyLates do, with the same tokenize and encode."""
    encoder = family_checkpoint("modernbert", "embedding", seed=3)
    folder = pylate_folder(tmp_path / "colbert", encoder)
    pkg = export(folder, tmp_path / "pkg")
    library = PyLate(folder)
    assert pkg.late_interaction["query_prefix_id"] == library.query_prefix_id
    assert pkg.late_interaction["skiplist_ids"] == sorted(set(library.skiplist))
    assert_matches_library(pkg, library.encode, parity, "PyLate ModernBERT")


@pytest.mark.parametrize("attend", [False, True], ids=["masked-expansion", "attend-to-expansion"])
def test_a_colbert_ai_package_answers_colbert_ais_vectors(
    tmp_path, colbert_ai, bert_with_markers, attend, parity
) -> None:
    folder = colbert_ai_folder(
        colbert_ai, tmp_path / "colbert", bert_with_markers, attend_to_mask_tokens=attend
    )
    pkg = export(folder, tmp_path / "pkg")
    checkpoint = colbert_ai.modeling.checkpoint.Checkpoint(
        str(folder), colbert_config=colbert_ai.infra.ColBERTConfig(checkpoint=str(folder)),
        verbose=0,
    )  # fmt: skip
    queries, documents = checkpoint.query_tokenizer, checkpoint.doc_tokenizer
    skiplist = sorted(k for k in checkpoint.skiplist if isinstance(k, int))
    assert pkg.late_interaction == {
        "query_prefix": "[unused0]", "query_prefix_id": queries.Q_marker_token_id,
        "document_prefix": "[unused1]", "document_prefix_id": documents.D_marker_token_id,
        "query_length": QUERY_LENGTH, "document_length": DOCUMENT_LENGTH,
        "query_expansion": True, "attend_to_expansion_tokens": attend,
        "mask_id": queries.mask_token_id, "skiplist_ids": skiplist, "source": "colbert-ai",
    }  # fmt: skip
    assert queries.Q_marker_token_id == wordpiece_with_markers().convert_tokens_to_ids("[unused0]")
    assert_matches_library(pkg, colbert_ai_encoder(checkpoint), parity, "colbert-ai BERT")


def colbert_ai_encoder(checkpoint: Any) -> Any:
    """encode(texts, is_query) -> (rows, vectors) by colbert-ai's Checkpoint: its tokenizers'
    rows; queryFromText's every vector, docFromText's kept ones (keep_dims=False)."""

    def encode(texts: list[str], is_query: bool) -> tuple[dict[str, Any], list[np.ndarray]]:
        if is_query:
            ids, mask = checkpoint.query_tokenizer.tensorize(texts)
            vectors = list(checkpoint.queryFromText(texts).numpy())
        else:
            ids, mask = checkpoint.doc_tokenizer.tensorize(texts)
            vectors = [d.numpy() for d in checkpoint.docFromText(texts, keep_dims=False)]
        return {"input_ids": ids, "attention_mask": mask}, vectors

    return encode


def test_a_vocabulary_without_the_markers_gets_unk_as_colbert_ai_does(
    tmp_path, colbert_ai, parity, capsys
) -> None:
    """colbert-ai looks [unused0] / [unused1] up by name; a vocabulary without them turns both
    into [UNK], and the model was trained so: the package says so, and the export notes it."""
    encoder = family_checkpoint("bert", "embedding", seed=4)  # no [unused*] entries
    folder = colbert_ai_folder(colbert_ai, tmp_path / "colbert", encoder)
    pkg = export_package(folder, "late-interaction", tmp_path / "pkg")
    unk = transformers.AutoTokenizer.from_pretrained(folder).unk_token_id
    block = pkg.late_interaction
    assert block["query_prefix_id"] == block["document_prefix_id"] == unk
    assert "query prefix '[unused0]' not in the vocabulary: [UNK] (1)" in capsys.readouterr().out
    checkpoint = colbert_ai.modeling.checkpoint.Checkpoint(
        str(folder), colbert_config=colbert_ai.infra.ColBERTConfig(checkpoint=str(folder)),
        verbose=0,
    )  # fmt: skip
    assert checkpoint.query_tokenizer.Q_marker_token_id == unk
    assert_matches_library(pkg, colbert_ai_encoder(checkpoint), parity, "colbert-ai BERT, [UNK]")


def test_the_loaded_model_is_the_encoder_and_the_projection(tmp_path, bert_with_markers) -> None:
    """load_model reads a PyLate folder as BertForLateInteraction: the Dense weights as its
    `linear`, infers the task from the folder, and names the task to use for another."""
    folder = pylate_folder(tmp_path / "colbert", bert_with_markers)
    model = load_model(folder)
    assert isinstance(model, BertForLateInteraction) and model.dimension == DIMENSION
    dense = load_file(folder / "1_Dense" / "model.safetensors")["linear.weight"]
    assert torch.equal(model.linear.weight, dense) and model.linear.bias is None
    with pytest.raises(CheckpointError, match="a pylate ColBERT folder .* task 'late-interaction'"):
        load_model(folder, task="embedding")


# --- folders and packages refused --------------------------------------------------------


def test_a_folder_that_is_not_colbert_is_refused_saying_what_is_read(tmp_path) -> None:
    plain = family_checkpoint("bert", "embedding", seed=4)
    with pytest.raises(ExportError, match="not a ColBERT folder: late-interaction reads a PyLate"):
        export(plain, tmp_path / "pkg")
    assert not (tmp_path / "pkg").exists()


def test_a_pylate_folder_without_its_projection_is_refused(tmp_path, bert_with_markers) -> None:
    folder = pylate_folder(tmp_path / "colbert", bert_with_markers)
    modules = json.loads((folder / "modules.json").read_text())
    (folder / "modules.json").write_text(json.dumps(modules[:1]))
    with pytest.raises(ExportError, match="modules Transformer; supported: Transformer -> Dense"):
        export(folder, tmp_path / "pkg")


def test_a_colbert_ai_folder_without_its_linear_weight_is_refused(tmp_path) -> None:
    folder = tmp_path / "colbert"
    encoder = family_checkpoint("bert", "embedding", seed=4)
    folder.mkdir()
    for file in encoder.iterdir():
        (folder / file.name).write_bytes(file.read_bytes())
    (folder / "artifact.metadata").write_text(json.dumps({"dim": DIMENSION}))
    with pytest.raises(ExportError, match="no linear.weight .the colbert-ai projection"):
        export(folder, tmp_path / "pkg")


def test_int8_and_unnormalised_vectors_are_refused(tmp_path, bert_with_markers) -> None:
    folder = pylate_folder(tmp_path / "colbert", bert_with_markers)
    with pytest.raises(ExportError, match="int8 is not exported for late-interaction"):
        export(folder, tmp_path / "pkg", variants=("fp32", "int8"))
    with pytest.raises(ExportError, match="always L2-normalised"):
        export(folder, tmp_path / "pkg", normalize=False)
    with pytest.raises(ExportError, match=r"max\(query_length 12, document_length 24\) = 24"):
        export(folder, tmp_path / "pkg", max_seq_length=64)


def test_the_cli_exports_a_colbert_folder(tmp_path, bert_with_markers, capsys) -> None:
    folder = pylate_folder(tmp_path / "colbert", bert_with_markers)
    out = tmp_path / "pkg"
    assert main(["--checkpoint", str(folder), "--task", "late-interaction", "--out", str(out)]) == 0
    assert read_package(out).late_interaction["source"] == "pylate"
    assert main(["--checkpoint", str(folder), "--task", "late-interaction", "--out", str(out),
                 "--variants", "fp32,int8"]) == 1  # fmt: skip
    assert "error: int8 is not exported" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"late_interaction": None}, "needs a 'late_interaction' object"),
        ({"query_length": "12"}, "query_length '12' is not int"),
        ({"query_prefix_id": None}, "query_prefix and query_prefix_id must be null together"),
        ({"document_length": 99}, r"document_length 99 is outside 2..24"),
        ({"mask_id": None}, "query_expansion needs a mask_id"),
        ({"skiplist_ids": [1, "2"]}, "skiplist_ids must be a list of token ids"),
        ({"source": "other"}, "source 'other' is not one of pylate, colbert-ai"),
        ({"attend_to_expansion_tokens": 1}, "attend_to_expansion_tokens 1 is not bool"),
    ],
)
def test_read_package_checks_the_late_interaction_block(
    tmp_path, bert_with_markers, change, message
) -> None:
    pkg = export(pylate_folder(tmp_path / "colbert", bert_with_markers), tmp_path / "pkg")
    manifest = json.loads((pkg.path / "package.json").read_text())
    if "late_interaction" in change:
        manifest.update(change)
    else:
        manifest["late_interaction"].update(change)
    (pkg.path / "package.json").write_text(json.dumps(manifest))
    with pytest.raises(PackageError, match=message):
        read_package(pkg.path)


def test_another_task_with_a_late_interaction_block_is_refused(tmp_path) -> None:
    pkg = export_package(
        family_checkpoint("bert", "embedding", seed=4), "embedding", tmp_path / "e", verbose=False
    )
    manifest = json.loads((pkg.path / "package.json").read_text())
    manifest["late_interaction"] = {"source": "pylate"}
    (pkg.path / "package.json").write_text(json.dumps(manifest))
    with pytest.raises(PackageError, match="late_interaction is for late-interaction packages"):
        read_package(pkg.path)


# --- dense embedding packages: every token's vector ---------------------------------------


@pytest.mark.parametrize("family", ["bert", "modernbert"])
def test_an_embedding_package_answers_the_last_hidden_state(tmp_path, family, parity) -> None:
    """token_embeddings (B, T, H) is transformers' last_hidden_state: no Dense, not
    normalised, at every position of padded rows (a padded position's query attends to the
    real keys in the fused graph as in transformers, so those agree too)."""
    folder = family_checkpoint(family, "embedding", seed=5)
    pkg = export_package(folder, "embedding", tmp_path / "pkg", verbose=False)
    assert [o["name"] for o in pkg.outputs] == ["embeddings", "token_embeddings"]
    assert pkg.outputs[1]["shape"] == ["batch", "sequence", 32]
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    features = tok(DOCUMENTS + QUERIES, padding=True, return_tensors="pt")
    assert not features["attention_mask"].all()  # rows of different lengths: padding
    with torch.inference_mode():
        want = transformers.AutoModel.from_pretrained(folder).eval()(**features).last_hidden_state
    session = ort.InferenceSession(
        str(pkg.variant_path("fp32")), providers=["CPUExecutionProvider"]
    )
    wanted = {i.name for i in session.get_inputs()}
    (got,) = session.run(
        ["token_embeddings"], {k: v.numpy() for k, v in features.items() if k in wanted}
    )
    name = f"{family} embedding package token_embeddings vs transformers last_hidden_state"
    assert parity(name, torch.from_numpy(got), want) <= 1e-4
    recorded = pkg.parity["fp32"]["max_abs_diff"]
    assert set(recorded) == {"embeddings", "token_embeddings"} and max(recorded.values()) <= 1e-4
