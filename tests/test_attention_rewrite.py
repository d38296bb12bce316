"""benchmarks/attention_rewrite.py: the attention ORT's BERT fusion leaves unfused (MPNet's
relative position bias, DeBERTa-v2's disentangled c2p + p2c terms, ModernBERT's rotary SDPA)
rewritten into ORT's contrib attention ops, on graphs training.export wrote from tiny random
transformers checkpoints with every weight and bias random: the ops counted in the rewritten
graphs, and their answers against transformers and the graph before, on padded batches.
(benchmarks.family_speed times them; training.export does not apply the rewrite.)"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from benchmarks.attention_rewrite import rewrite
from tests.families import CLASS_PREFIX, family_checkpoint
from training.export import convert_fp16, export_package, probe_batches
from training.quantize import INT8_OPS
from training.tokenizer import load_tokenizer

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

TOL = 1e-4
HEADS = 4
LAYERS = {"mpnet": 2, "deberta-v2": 2, "modernbert": 3}  # tests/families.py's tiny configs


def random_checkpoint(family: str, folder: Path) -> Path:
    """tests/families.py's token-classification checkpoint with every parameter drawn at
    random, biases and norms included (transformers initialises biases to zero, which would
    hide a bias the rewrite dropped), saved with its tokenizer into `folder`."""
    source = family_checkpoint(family, "token-classification")
    shutil.copytree(source, folder)
    model_class = getattr(transformers, f"{CLASS_PREFIX[family]}ForTokenClassification")
    model = model_class.from_pretrained(source).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=generator))
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def graphs(tmp_path_factory) -> dict[tuple[str, str], Path]:
    """(family, "before" | "mha" | "packed") -> the exported token-classification package's
    model.onnx, and that graph rewritten (MultiHeadAttention, or MPNet's packed Attention)."""
    root = tmp_path_factory.mktemp("attention_rewrite")
    out = {}
    for family in LAYERS:
        folder = random_checkpoint(family, root / f"{family}-checkpoint")
        package = export_package(folder, "token-classification", root / family, verbose=False)
        out[family, "before"] = package.path / "model.onnx"
        for kind in ("mha", "packed") if family == "mpnet" else ("mha",):
            model = onnx.load(str(out[family, "before"]))
            rewrite(model, HEADS, packed=kind == "packed")
            onnx.save(model, str(root / f"{family}-{kind}.onnx"))
            out[family, kind] = root / f"{family}-{kind}.onnx"
    return out


def op_counts(path: Path) -> Counter:
    return Counter(n.op_type for n in onnx.load(str(path)).graph.node)


@pytest.mark.parametrize(
    "family, kind, op",
    [
        ("mpnet", "mha", "MultiHeadAttention"),
        ("mpnet", "packed", "Attention"),
        ("deberta-v2", "mha", "MultiHeadAttention"),
        ("modernbert", "mha", "MultiHeadAttention"),
    ],
)
def test_every_layer_becomes_one_attention_node(graphs, family, kind, op) -> None:
    """Counted in the graphs: the export's has one Softmax per layer and no contrib attention
    (ORT's optimizer fused none); the rewritten one has one attention node per layer and no
    Softmax left."""
    before, after = op_counts(graphs[family, "before"]), op_counts(graphs[family, kind])
    assert before["Softmax"] == LAYERS[family]
    assert before["Attention"] == before["MultiHeadAttention"] == 0
    assert after[op] == LAYERS[family] and after["Softmax"] == 0
    if kind == "packed":  # one QKV weight per layer instead of three
        assert after["MatMul"] == before["MatMul"] - 3 * LAYERS[family] - 2 * LAYERS[family]
    if family == "mpnet" and kind == "mha":  # the projections stay; their bias adds go
        assert after["MatMul"] == before["MatMul"] - 2 * LAYERS[family]


@pytest.mark.parametrize("family, kind", [("mpnet", "mha"), ("mpnet", "packed"),
                                          ("deberta-v2", "mha"), ("modernbert", "mha")])  # fmt: skip
def test_rewritten_graph_answers_as_transformers(graphs, family, kind) -> None:
    """Padded batches (1 and 3 rows, 7 and 64 tokens: ModernBERT's window of 16 and DeBERTa's
    log buckets reached): every real token's logits within 1e-4 of transformers', every
    position (padding too) within 1e-4 of the graph before the rewrite."""
    package = graphs[family, "before"].parent
    manifest = json.loads((package / "package.json").read_text())
    folder = Path(manifest["source"]["checkpoint"])
    model_class = getattr(transformers, f"{CLASS_PREFIX[family]}ForTokenClassification")
    model = model_class.from_pretrained(folder, attn_implementation="eager").eval()
    before, after = (
        ort.InferenceSession(str(graphs[family, k]), providers=["CPUExecutionProvider"])
        for k in ("before", kind)
    )
    names = [i.name for i in after.get_inputs()]
    tokenizer = load_tokenizer(package / "tokenizer.json")
    pad_id = manifest["special_tokens"]["pad"]["id"]
    for batch in probe_batches(tokenizer, pad_id, manifest["max_seq_length"], seed=1):
        feeds = {n: batch[n] for n in names}
        ours = after.run(None, feeds)[0]
        with torch.inference_mode():
            theirs = model(**{n: torch.from_numpy(v) for n, v in feeds.items()}).logits.numpy()
        real = batch["attention_mask"].astype(bool)
        assert np.abs(ours[real] - theirs[real]).max() <= TOL, batch["input_ids"].shape
        assert np.abs(ours - before.run(None, feeds)[0]).max() <= TOL


def test_a_graph_without_unfused_attention_is_unchanged() -> None:
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 3])
    graph = onnx.helper.make_graph([onnx.helper.make_node("Softmax", ["x"], ["y"])], "g", [x], [y])
    model = onnx.helper.make_model(graph)
    before = model.SerializeToString()
    assert rewrite(model, num_heads=1) == {"Attention": 0, "MultiHeadAttention": 0}
    assert model.SerializeToString() == before


def test_int8_keeps_the_bias_of_multi_head_attention_only(graphs, tmp_path) -> None:
    """Dynamic int8 as training.quantize does it (its op types) of MPNet's graph before and
    after the rewrite. MultiHeadAttention stays whole: its int8 answers are the int8 answers
    before. The packed Attention becomes a QAttention, which has no attention_bias input:
    MPNet's position bias and padding mask are gone, and its answers with them."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    package = graphs["mpnet", "before"].parent
    manifest = json.loads((package / "package.json").read_text())
    tokenizer = load_tokenizer(package / "tokenizer.json")
    batch = probe_batches(tokenizer, manifest["special_tokens"]["pad"]["id"], 64)[-1]
    real = batch["attention_mask"].astype(bool)
    answers, ops = {}, {}
    for kind in ("before", "mha", "packed"):
        int8 = tmp_path / f"{kind}.int8.onnx"
        quantize_dynamic(graphs["mpnet", kind], int8, weight_type=QuantType.QInt8,
                         per_channel=True, reduce_range=True, op_types_to_quantize=INT8_OPS,
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})  # fmt: skip
        session = ort.InferenceSession(str(int8), providers=["CPUExecutionProvider"])
        answers[kind] = session.run(None, {i.name: batch[i.name] for i in session.get_inputs()})
        ops[kind] = op_counts(int8)
    assert ops["mha"]["MultiHeadAttention"] == ops["packed"]["QAttention"] == LAYERS["mpnet"]
    before, mha, packed = (answers[k][0][real] for k in ("before", "mha", "packed"))
    assert np.abs(mha - before).max() <= 1e-3
    assert np.abs(packed - before).max() > 10 * np.abs(mha - before).max() + 0.1


@pytest.mark.parametrize("family", LAYERS)
def test_the_rewritten_graph_converts_to_fp16(graphs, family, tmp_path) -> None:
    """training.export's fp16 conversion (the GPU's file) takes the rewritten graph and keeps
    its attention nodes (whether CPU ORT has fp16 kernels for them is not asked here)."""
    fp16 = tmp_path / "model.fp16.onnx"
    convert_fp16(graphs[family, "mha"], fp16)
    model = onnx.load(str(fp16))
    onnx.checker.check_model(model)
    assert Counter(n.op_type for n in model.graph.node)["MultiHeadAttention"] == LAYERS[family]
