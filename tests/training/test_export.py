"""training.export: every head becomes a package whose ONNX graphs compute what PyTorch does.

Tiny random models (benchmarks/tiny.py) for every task and variant; the real
all-MiniLM-L6-v2 against sentence-transformers on SST-2 sentences.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from benchmarks.tiny import build_tiny_package, tiny_model, tiny_tokenizer
from heads.contract import OUTPUT_NAMES
from heads.package import ModelPackage, read_package
from training import export
from training.export import ExportError, export_package, main
from training.model import BertSelfAttention, set_attention_implementation

TASKS = list(OUTPUT_NAMES)
VARIANTS = ("fp32", "int8", "fp16")
LAYERS = 2  # the tiny model's depth (benchmarks/tiny.py)
# all-MiniLM-L6-v2 int8 (training.export.INT8_OPS) against fp32, measured on AVX-512 VNNI:
# worst cosine 0.982 on these 64 SST-2 dev sentences (0.970 over all 872), mean 0.990.
MINILM_INT8_MIN_COSINE = 0.97


def session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def padded_batch(batch: int, seq: int, vocab: int, seed: int) -> dict[str, np.ndarray]:
    """Right-padded rows of decreasing length, [CLS]=2 / [SEP]=3, second segment type 1."""
    rng = np.random.default_rng(seed)
    ids = np.zeros((batch, seq), dtype=np.int64)
    mask = np.zeros_like(ids)
    types = np.zeros_like(ids)
    for row in range(batch):
        n = max(3, seq - row * seq // (batch + 1))
        ids[row, :n] = rng.integers(5, vocab, n)
        ids[row, [0, n // 2, n - 1]] = [2, 3, 3]
        mask[row, :n] = 1
        types[row, n // 2 + 1 : n] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def pytorch(model: torch.nn.Module, task: str, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    head = export.ExportHead(model, task, getattr(model, "pooling", "mean")).eval()
    with torch.inference_mode():
        args = [torch.from_numpy(feed[n]) for n in export.INPUT_NAMES]
        return [t.numpy() for t in head(*args)]


@pytest.fixture(scope="module", params=TASKS)
def exported(request, tmp_path_factory) -> tuple[str, ModelPackage, torch.nn.Module]:
    task = request.param
    out = tmp_path_factory.mktemp("packages") / task
    pkg = build_tiny_package(out, task, variants=VARIANTS)
    labels = pkg.labels
    model = tiny_model(task, labels, seed=0, max_seq_length=pkg.max_seq_length)
    return task, pkg, model


# --- what the graphs compute ----------------------------------------------------------


@pytest.mark.parametrize(("batch", "seq"), [(1, 7), (3, 7), (1, 64), (3, 64)])
def test_fp32_matches_pytorch_with_padding(exported, batch: int, seq: int) -> None:
    task, pkg, model = exported
    feed = padded_batch(batch, seq, model.config.vocab_size, seed=batch * 100 + seq)
    got = session(pkg.variant_path("fp32")).run(list(OUTPUT_NAMES[task]), feed)
    for g, want in zip(got, pytorch(model, task, feed), strict=True):
        assert g.shape == want.shape
        assert np.abs(g - want).max() <= 1e-4


def test_dynamic_axes_take_any_batch_and_length(exported) -> None:
    task, pkg, model = exported
    feed = padded_batch(5, 100, model.config.vocab_size, seed=5)
    got = session(pkg.variant_path("fp32")).run(None, feed)
    want = pytorch(model, task, feed)
    assert [g.shape for g in got] == [w.shape for w in want]
    assert max(np.abs(g - w).max() for g, w in zip(got, want, strict=True)) <= 1e-4


def test_int8_runs_and_its_difference_is_recorded(exported) -> None:
    task, pkg, model = exported
    feed = padded_batch(3, 64, model.config.vocab_size, seed=1)
    got = session(pkg.variant_path("int8")).run(None, feed)
    want = pytorch(model, task, feed)
    assert [g.shape for g in got] == [w.shape for w in want]
    recorded = pkg.parity["int8"]["max_abs_diff"]
    assert set(recorded) == set(OUTPUT_NAMES[task])
    assert all(0 < d < 1.0 for d in recorded.values())  # lossy, but not broken
    if task == "embedding":
        assert pkg.parity["int8"]["min_cosine"] > 0.99


def test_fp16_keeps_fp32_inputs_and_outputs(exported) -> None:
    task, pkg, _ = exported
    graph = onnx.load(str(pkg.variant_path("fp16"))).graph
    assert {i.type.tensor_type.elem_type for i in graph.input} == {onnx.TensorProto.INT64}
    assert {o.type.tensor_type.elem_type for o in graph.output} == {onnx.TensorProto.FLOAT}
    assert any(t.data_type == onnx.TensorProto.FLOAT16 for t in graph.initializer)
    fp16 = pkg.parity["fp16"]
    # Measured when CPU ORT has the fp16 kernels; otherwise says why not.
    assert "max_abs_diff" in fp16 or (fp16["measured"] is False and fp16["reason"])


# --- the graph file -------------------------------------------------------------------


def test_fp32_graph_is_fused(exported) -> None:
    task, pkg, _ = exported
    ops = pkg.source["fusion"]["ops"]
    assert pkg.source["export"]["graph"] == "fused"
    assert ops["Attention"] == LAYERS
    assert ops["SkipLayerNormalization"] == 2 * LAYERS
    assert ops["EmbedLayerNormalization"] == 1
    # one per layer's feed-forward block; the masked-LM head's transform has one more
    assert ops["BiasGelu"] == LAYERS + (task == "fill-mask")
    assert pkg.source["fusion"]["cpu_split"] == {"SkipLayerNormalization": 2 * LAYERS}


def op_counts(path: Path) -> dict[str, int]:
    nodes = onnx.load(str(path), load_external_data=False).graph.node
    return {op: sum(n.op_type == op for n in nodes) for op in {n.op_type for n in nodes}}


def test_cpu_graphs_split_skip_layer_norms_and_the_gpu_graph_keeps_them(exported) -> None:
    task, pkg, _ = exported
    still_fused = {"fp32": {"Attention", "EmbedLayerNormalization"}, "int8": {"QAttention"}}
    for variant, fused in still_fused.items():  # the CPU's
        ops = op_counts(pkg.variant_path(variant))
        assert "SkipLayerNormalization" not in ops, variant
        # two a layer; the masked-LM head's transform has its own (never a skip layer norm)
        assert ops["LayerNormalization"] == 2 * LAYERS + (task == "fill-mask"), variant
        assert fused | {"BiasGelu"} <= set(ops), variant
    ops = op_counts(pkg.variant_path("fp16"))  # the GPU's
    assert ops["SkipLayerNormalization"] == 2 * LAYERS
    assert {"Attention", "EmbedLayerNormalization"} <= set(ops)


def skip_layer_norm_graph(inputs: list[str], outputs: list[str]) -> onnx.ModelProto:
    """One SkipLayerNormalization (hidden 8) feeding a Relu, so a graph can name its outputs."""
    h = onnx.helper
    hidden = 8
    rng = np.random.default_rng(0)
    weights = {
        name: h.make_tensor(name, onnx.TensorProto.FLOAT, [hidden], rng.normal(size=hidden))
        for name in ("gamma", "beta", "bias")
    }
    node = h.make_node(
        "SkipLayerNormalization", inputs, outputs, domain="com.microsoft", epsilon=1e-5,
        name="sln",
    )  # fmt: skip
    nodes = [node] + [h.make_node("Relu", [o], [f"{o}_out"]) for o in outputs if o]
    value = onnx.TensorProto.FLOAT
    graph = h.make_graph(
        nodes,
        "g",
        [h.make_tensor_value_info(n, value, ["B", "T", hidden]) for n in ("x", "skip")],
        [
            h.make_tensor_value_info(f"{o}_out", value, ["B", "T", 1 if o == "mean" else hidden])
            for o in outputs
            if o
        ],
        [weights[n] for n in inputs[2:] if n],
    )
    return h.make_model(
        graph, opset_imports=[h.make_opsetid("", 18), h.make_opsetid("com.microsoft", 1)]
    )


@pytest.mark.parametrize(
    ("inputs", "outputs", "splits"),
    [
        (["x", "skip", "gamma", "beta", "bias"], ["y"], 1),
        (["x", "skip", "gamma", "beta"], ["y"], 1),
        (["x", "skip", "gamma"], ["y"], 1),  # no beta (ModernBERT's norms have no bias)
        (["x", "skip", "gamma", "beta", "bias"], ["y", "", "", "sum"], 1),  # the sum used
        (["x", "skip", "gamma", "", "bias"], ["y", "", "", "sum"], 1),
        (["x", "skip", "gamma", "beta", "bias"], ["y", "mean"], 0),  # its statistics: kept
    ],
)
def test_split_skip_layer_norm_computes_what_ort_fused_did(inputs, outputs, splits) -> None:
    fused = skip_layer_norm_graph(inputs, outputs)
    split = skip_layer_norm_graph(inputs, outputs)
    assert export.split_skip_layer_norm(split) == splits
    ops = {n.op_type for n in split.graph.node}
    assert ("SkipLayerNormalization" in ops) == (splits == 0)
    onnx.checker.check_model(split, full_check=True)
    rng = np.random.default_rng(1)
    feed = {n: rng.normal(size=(2, 5, 8)).astype(np.float32) for n in ("x", "skip")}
    want = session_of(fused).run(None, feed)
    got = session_of(split).run(None, feed)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-5)


def session_of(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def test_graph_is_one_file_with_the_contract_io(exported) -> None:
    task, pkg, _ = exported
    model = onnx.load(str(pkg.variant_path("fp32")), load_external_data=False)
    assert not any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)
    assert max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) >= 18
    inputs = {
        i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim]
        for i in model.graph.input
    }
    assert inputs == {n: ["batch", "sequence"] for n in export.INPUT_NAMES}
    assert [o.name for o in model.graph.output] == list(OUTPUT_NAMES[task])
    assert [o["name"] for o in pkg.outputs] == list(OUTPUT_NAMES[task])


# --- package.json -----------------------------------------------------------------------


def test_manifest_describes_the_head(exported) -> None:
    task, pkg, model = exported
    assert pkg.variants == {
        "fp32": "model.onnx",
        "int8": "model.int8.onnx",
        "fp16": "model.fp16.onnx",
    }
    assert pkg.prefer == {"cpu": "fp32", "gpu": "fp16"}
    assert pkg.max_seq_length == 128 and pkg.do_lower_case is True
    assert pkg.parity["probes"] == [[1, 7], [3, 7], [1, 64], [3, 64]]
    assert max(pkg.parity["fp32"]["max_abs_diff"].values()) <= 1e-4
    shapes = {o["name"]: o["shape"] for o in pkg.outputs}
    if task == "classification":
        assert pkg.labels == ["negative", "positive"] and pkg.problem_type == "single_label"
        assert shapes == {"logits": ["batch", 2]}
    elif task == "token-classification":
        assert pkg.labels[:2] == ["O", "B-PER"]
        assert shapes == {"logits": ["batch", "sequence", len(pkg.labels)]}
    elif task == "question-answering":
        assert shapes == {n: ["batch", "sequence"] for n in ("start_logits", "end_logits")}
    elif task == "fill-mask":
        assert (pkg.mask_token, pkg.clean_up_tokenization_spaces) == ("[MASK]", False)
        assert shapes == {"logits": ["batch", "sequence", model.config.vocab_size]}
    else:
        assert (pkg.pooling, pkg.normalize) == ("mean", True)
        assert shapes == {"embeddings": ["batch", model.config.hidden_size]}


def test_embeddings_are_pooled_not_normalised(tmp_path: Path) -> None:
    pkg = build_tiny_package(tmp_path / "cls", "embedding", pooling="cls", normalize=False)
    model = tiny_model("embedding", None, 0, 128, pooling="cls", normalize=False)
    feed = padded_batch(3, 20, model.config.vocab_size, seed=3)
    (got,) = session(pkg.variant_path("fp32")).run(None, feed)
    hidden = model.bert(*(torch.from_numpy(feed[n]) for n in export.INPUT_NAMES)).last_hidden_state
    np.testing.assert_allclose(got, hidden[:, 0].detach().numpy(), atol=1e-4)
    assert (pkg.pooling, pkg.normalize) == ("cls", False)
    assert not np.allclose(np.linalg.norm(got, axis=-1), 1.0)


def test_a_mean_pooled_classifier_exports_with_parity(tmp_path: Path) -> None:
    model = tiny_model("classification", ["neg", "pos"], 0, 128)
    model = type(model)(model.config, pooling="mean").eval()
    pkg = export_package(
        model, "classification", tmp_path / "p", tokenizer=tiny_tokenizer(), verbose=False
    )
    feed = padded_batch(3, 20, model.config.vocab_size, seed=4)
    (got,) = session(pkg.variant_path("fp32")).run(None, feed)
    np.testing.assert_allclose(got, pytorch(model, "classification", feed)[0], atol=1e-5)
    n = int(feed["attention_mask"][2].sum())  # padding changes nothing in the graph either
    (alone,) = session(pkg.variant_path("fp32")).run(None, {k: v[2:, :n] for k, v in feed.items()})
    np.testing.assert_allclose(alone[0], got[2], atol=1e-5)


@pytest.mark.parametrize(("ours", "size"), [("multi_label", 3), ("regression", 1)])
def test_problem_type_and_label_count(tmp_path: Path, ours: str, size: int) -> None:
    labels = ["toxic", "obscene", "insult"] if size == 3 else None
    pkg = build_tiny_package(tmp_path / ours, "classification", labels=labels, problem_type=ours)
    assert pkg.problem_type == ours and len(pkg.labels) == size
    assert pkg.outputs[0]["shape"] == ["batch", size]


def test_export_leaves_the_model_as_it_found_it(tmp_path: Path) -> None:
    model = tiny_model("classification", ["a", "b"], 0, 32).train()
    set_attention_implementation(model, "sdpa")
    export_package(
        model, "classification", tmp_path / "p", tokenizer=tiny_tokenizer(), verbose=False
    )
    assert model.training
    assert {m.implementation for m in model.modules() if isinstance(m, BertSelfAttention)} == {
        "sdpa"
    }


def test_a_bfloat16_model_is_exported_from_a_float32_copy(tmp_path: Path) -> None:
    model = tiny_model("question-answering", None, 0, 32).to(torch.bfloat16)
    pkg = export_package(
        model, "question-answering", tmp_path / "p", tokenizer=tiny_tokenizer(), verbose=False
    )
    assert max(pkg.parity["fp32"]["max_abs_diff"].values()) <= 1e-4
    assert next(model.parameters()).dtype == torch.bfloat16


def test_parity_failure_is_loud_and_leaves_nothing(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(export, "FP32_TOLERANCE", 0.0)  # no float graph is exact
    model = tiny_model("classification", ["a", "b"], 0, 32)
    with pytest.raises(ExportError, match="differs from PyTorch"):
        export_package(
            model, "classification", tmp_path / "p", tokenizer=tiny_tokenizer(), verbose=False
        )
    assert list(tmp_path.iterdir()) == []


def test_refuses_to_replace_a_folder_that_is_not_a_package(tmp_path: Path) -> None:
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "notes.txt").write_text("mine")
    model = tiny_model("classification", ["a", "b"], 0, 32)
    with pytest.raises(ExportError, match="is not a model package"):
        export_package(
            model, "classification", tmp_path / "p", tokenizer=tiny_tokenizer(), verbose=False
        )
    assert (tmp_path / "p" / "notes.txt").read_text() == "mine"


# --- checkpoints and the command line -------------------------------------------------


def test_cli_exports_a_saved_checkpoint(tmp_path: Path, capsys) -> None:
    build_tiny_package(
        tmp_path / "unused", "token-classification", checkpoint_dir=tmp_path / "ckpt"
    )
    out = tmp_path / "models" / "ner"
    rc = main(
        [
            "--checkpoint",
            str(tmp_path / "ckpt"),
            "--task",
            "token-classification",
            "--out",
            str(out),
            "--max-seq-length",
            "64",
            "--variants",
            "fp32,int8",
        ]
    )
    assert rc == 0
    pkg = read_package(out)
    assert (pkg.name, pkg.max_seq_length, sorted(pkg.variants)) == ("ner", 64, ["fp32", "int8"])
    assert pkg.source["checkpoint"] == str(tmp_path / "ckpt")
    assert pkg.source["arguments"]["variants"] == "fp32,int8"
    # the labels are the checkpoint's id2label, in id order
    config = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    id2label = {int(i): label for i, label in config["id2label"].items()}
    assert pkg.labels == [id2label[i] for i in range(len(id2label))]
    assert "fused ops: EmbedLayerNormalization 1, Attention 2" in capsys.readouterr().out


def test_package_matches_transformers_loading_the_same_checkpoint(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    pkg = build_tiny_package(
        tmp_path / "qa", "question-answering", checkpoint_dir=tmp_path / "ckpt"
    )
    hf = transformers.BertForQuestionAnswering.from_pretrained(tmp_path / "ckpt").eval()
    feed = padded_batch(3, 40, hf.config.vocab_size, seed=7)
    with torch.inference_mode():
        want = hf(**{k: torch.from_numpy(v) for k, v in feed.items()})
    start, end = session(pkg.variant_path("fp32")).run(["start_logits", "end_logits"], feed)
    assert np.abs(start - want.start_logits.numpy()).max() <= 1e-4
    assert np.abs(end - want.end_logits.numpy()).max() <= 1e-4


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--checkpoint", "/nonexistent", "--task", "classification"], "no such checkpoint folder"),
        (["--task", "classification", "--variants", "fp32,bf16"], "unknown variant(s) bf16"),
        (["--task", "question-answering", "--max-seq-length", "4096"], "max_seq_length 4096"),
    ],
)
def test_cli_bad_input_is_one_line_and_nonzero(tmp_path: Path, capsys, argv, message) -> None:
    build_tiny_package(tmp_path / "unused", "question-answering", checkpoint_dir=tmp_path / "ckpt")
    if "--checkpoint" not in argv:
        argv = ["--checkpoint", str(tmp_path / "ckpt"), *argv]
    assert main([*argv, "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and "\n" not in err
    assert not (tmp_path / "out").exists()


def test_cli_unknown_task_is_a_usage_error(capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--checkpoint", ".", "--task", "summarization", "--out", "x"])
    assert e.value.code == 2 and "invalid choice: 'summarization'" in capsys.readouterr().err


# --- a real model -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def minilm_package(minilm_path: Path, tmp_path_factory) -> ModelPackage:
    out = tmp_path_factory.mktemp("minilm") / "minilm"
    return export_package(minilm_path, "embedding", out, variants=("fp32", "int8"))


@pytest.mark.shared
def test_minilm_package_matches_sentence_transformers(
    minilm_package: ModelPackage, minilm_path: Path, shared_data: Path
) -> None:
    st = pytest.importorskip("sentence_transformers")
    from heads.rows import load_package_tokenizer, pad
    from heads.tasks import embed

    pkg = minilm_package
    assert (pkg.pooling, pkg.normalize, pkg.max_seq_length, pkg.do_lower_case) == (
        "mean",
        True,
        256,
        True,
    )
    assert pkg.source["fusion"]["ops"]["Attention"] == 6
    lines = (shared_data / "sst2" / "dev.tsv").read_text().splitlines()[1:65]
    sentences = [line.split("\t")[0] for line in lines]

    rows = embed.preprocess(
        load_package_tokenizer(pkg.tokenizer_path), sentences, pkg.max_seq_length
    )
    feed = pad(rows.sequences)
    fp32 = embed.postprocess(session(pkg.variant_path("fp32")).run(None, feed)[0], normalize=True)
    int8 = embed.postprocess(session(pkg.variant_path("int8")).run(None, feed)[0], normalize=True)
    reference = st.SentenceTransformer(str(minilm_path), device="cpu").encode(
        sentences, batch_size=64, normalize_embeddings=True
    )
    assert (fp32 * reference).sum(-1).min() >= 0.99999
    int8_cosine = (int8 * fp32).sum(-1)
    assert int8_cosine.min() >= MINILM_INT8_MIN_COSINE, int8_cosine.min()
    assert (
        json.loads((pkg.path / "package.json").read_text())["parity"]["int8"]["min_cosine"] > 0.95
    )
