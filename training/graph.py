"""The graph steps every export shares (training.export's heads, training.adapters' encoder):
the probe batches and the parity tolerance, the ONNX export mode, ORT's BERT fusion and the
CPU's split skip layer norms, the output specs package.json declares, and writing a package
folder in place of an old one."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from tokenizers import Tokenizer
from torch import nn

from heads.contract import HIDDEN_STATE_OUTPUTS, MANIFEST, OUTPUT_NAMES, TOKEN_EMBEDDINGS
from heads.rows import pad, prepare_tokenizer, row, template
from training.checkpoint import LATE_INTERACTION, read_max_seq_length
from training.families.base import FILL_MASK
from training.model import BertForMaskedLM, BertSelfAttention, set_attention_implementation
from training.special_tokens import SpecialTokens


class ExportError(Exception):
    """The export cannot produce a package that is faithful to the checkpoint."""


FP32_TOLERANCE = 1e-4  # max abs diff, ORT fp32 vs PyTorch; float32 reordering stays near 1e-6


PROBE_SHAPES = ((1, 7), (3, 7), (1, 64), (3, 64))  # (batch, sequence); sequence capped at max


FUSED_OPS = (  # what ORT's BERT optimizer can produce; counted in package.json source.fusion
    "EmbedLayerNormalization", "Attention", "MultiHeadAttention", "SkipLayerNormalization",
    "LayerNormalization", "BiasGelu", "FastGelu", "Gelu",
)  # fmt: skip


@contextlib.contextmanager
def export_mode(module: nn.Module) -> Iterator[None]:
    """eval() and eager attention for the export; each submodule's own settings restored after
    (training.finetune exports mid-run). The exporter itself restores the *top* module's mode
    recursively, so the ExportHead must be passed here, not only the model inside it."""
    training = {m: m.training for m in module.modules()}
    impls = {m: m.implementation for m in module.modules() if isinstance(m, BertSelfAttention)}
    module.eval()
    set_attention_implementation(module, "eager")
    try:
        yield
    finally:
        for attention, impl in impls.items():
            attention.implementation = impl
        for m, was_training in training.items():
            m.training = was_training


def probe_batches(
    tokenizer: Tokenizer, pad_id: int, max_seq_length: int, seed: int = 0
) -> list[dict[str, np.ndarray]]:
    """Padded batches as the service builds them: pairs in the family's own layout
    (`heads.rows.template`: [CLS] a [SEP] b [SEP] or <s> a </s></s> b </s>), rows of
    different lengths, random non-special ids of the tokenizer's vocabulary (a model may have
    more embedding rows than tokens: DeBERTa-v3, ModernBERT), padded with `pad_id`."""
    rng = np.random.default_rng(seed)
    special = {i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special}
    vocab = tokenizer.get_vocab(with_added_tokens=True).values()
    ordinary = np.array(sorted(i for i in vocab if i not in special))
    layout = template(prepare_tokenizer(tokenizer))
    n_special = layout.pair.n_special
    batches = []
    for batch, seq in PROBE_SHAPES:
        T = min(seq, max_seq_length)
        rows = []
        for r in range(batch):
            n = max(n_special + 2, T - r * T // batch)  # first row fills T; the others are padded
            text = rng.choice(ordinary, n - n_special)
            rows.append(row(layout, text[: len(text) // 2], text[len(text) // 2 :]))
        batches.append(pad(rows, pad_id))
    return batches


def fuse(
    path: Path, gpu_out: Path, cpu_out: Path, num_heads: int, hidden_size: int
) -> tuple[dict[str, int], int]:
    """ORT's BERT optimizer: the fused graph in `gpu_out`, the same with its skip layer norms
    split (`split_skip_layer_norm`) in `cpu_out`. Returns what actually fused (op type ->
    count) and how many nodes the CPU's graph split."""
    from onnxruntime.transformers.optimizer import optimize_model

    model = optimize_model(str(path), "bert", num_heads=num_heads, hidden_size=hidden_size)
    model.save_model_to_file(str(gpu_out))
    counts: dict[str, int] = {op: 0 for op in FUSED_OPS}
    for node in model.model.graph.node:
        if node.op_type in counts:
            counts[node.op_type] += 1
    split = split_skip_layer_norm(model.model)
    model.save_model_to_file(str(cpu_out))
    return counts, split


def split_skip_layer_norm(model: onnx.ModelProto) -> int:
    """Replace, in place, each SkipLayerNormalization with the ONNX ops it fuses: Add (input +
    skip), Add (+ bias, when it has one), LayerNormalization; returns how many it replaced.
    Why: ONNX Runtime's CPU kernel for it costs ~5 ns an element on one thread, 4-5x the
    three ops (ORT 1.32, AMD EPYC with AVX-512, 2 x 26 x 384: 107 against 24 us), and on
    all-MiniLM-L6-v2 its 12 nodes were 9% of a batch: the split graph ran 6-8% faster in fp32
    and 18-24% in int8 at batch 1-4, outputs within 4e-7 (benchmarks/README.md, "Issue 31:
    the CPU's skip layer norm"). On CUDA the fused kernel is the fast one: the GPU's fp16
    graph keeps it. A node whose mean / inverse-std outputs are used stays fused."""
    graph = model.graph
    nodes: list[onnx.NodeProto] = []
    split = 0
    for node in graph.node:
        outputs = list(node.output) + [""] * (4 - len(node.output))
        if (
            node.op_type != "SkipLayerNormalization"
            or node.domain != "com.microsoft"
            or any(outputs[1:3])
        ):
            nodes.append(node)
            continue
        x, skip, gamma, beta, bias = (list(node.input) + [""] * 5)[:5]
        epsilon = next((a.f for a in node.attribute if a.name == "epsilon"), 1e-12)
        name = f"{node.name or 'SkipLayerNormalization'}_split{split}"
        total = outputs[3] if not bias and outputs[3] else f"{name}_residual"
        nodes.append(onnx.helper.make_node("Add", [x, skip], [total], name=f"{name}_add"))
        if bias:
            biased = outputs[3] or f"{name}_biased"
            nodes.append(onnx.helper.make_node("Add", [total, bias], [biased], name=f"{name}_bias"))
            total = biased
        norm_inputs = [total, gamma] + ([beta] if beta else [])
        nodes.append(
            onnx.helper.make_node(
                "LayerNormalization", norm_inputs, [outputs[0]], name=f"{name}_norm",
                axis=-1, epsilon=epsilon,
            )
        )  # fmt: skip
        split += 1
    del graph.node[:]
    graph.node.extend(nodes)
    return split


def default_max_seq_length(config: Any, checkpoint: Path | None) -> int:
    """min(max_position_embeddings, 512, the window the checkpoint was trained with if it
    says: training.finetune's best/, sentence-transformers' max_seq_length)."""
    limit = min(config.max_tokens, 512)
    return min(limit, (read_max_seq_length(checkpoint) if checkpoint else None) or limit)


def pad_record(specials: SpecialTokens, pad_id: int, tok: Tokenizer) -> dict[str, Any]:
    """package.json's pad entry when no file and no name declared one: the model's
    pad_token_id, which the service then pads with (the attention mask hides it)."""
    if "pad" in specials.ids:
        return {}
    return {
        "pad": {
            "token": tok.id_to_token(pad_id) or "",
            "id": pad_id,
            "source": "the model's config",
        }
    }


def output_specs(task: str, model: Any, hidden_states: bool = False) -> list[dict[str, Any]]:
    if task == "classification":
        return [{"name": "logits", "dtype": "float32", "shape": ["batch", model.num_labels]}]
    if task == "token-classification":
        shape = ["batch", "sequence", model.num_labels]
        return [{"name": "logits", "dtype": "float32", "shape": shape}]
    if task == "question-answering":
        return [
            {"name": n, "dtype": "float32", "shape": ["batch", "sequence"]}
            for n in OUTPUT_NAMES[task]
        ]
    if task == LATE_INTERACTION:
        shape = ["batch", "sequence", model.dimension]
        return [{"name": TOKEN_EMBEDDINGS, "dtype": "float32", "shape": shape}]
    vocab = model.config.vocab_size
    if task == FILL_MASK:
        return [{"name": "logits", "dtype": "float32", "shape": ["batch", "sequence", vocab]}]
    if isinstance(model, BertForMaskedLM):  # a sparse embedding: one weight per vocabulary entry
        return [{"name": "embeddings", "dtype": "float32", "shape": ["batch", vocab]}]
    hidden = model.config.hidden_size
    specs = [
        {"name": "embeddings", "dtype": "float32", "shape": ["batch", model.dimension]},
        # the encoder's last hidden state, every token (/embed_all): no Dense, not normalised
        {"name": TOKEN_EMBEDDINGS, "dtype": "float32", "shape": ["batch", "sequence", hidden]},
    ]
    if hidden_states:  # states: the embeddings output, then every layer's (L + 1 in all)
        states = model.config.num_hidden_layers + 1
        specs += [
            {"name": name, "dtype": "float32", "shape": ["batch", states, hidden]}
            for name in HIDDEN_STATE_OUTPUTS.values()
        ]
    return specs


def check_replaceable(out_dir: Path) -> None:
    """Only ever replace a package or an empty folder: --out models/ by mistake must not
    delete every model."""
    if out_dir.exists() and any(out_dir.iterdir()) and not (out_dir / MANIFEST).is_file():
        raise ExportError(f"{out_dir}: exists and is not a model package; not overwriting it")


def replace_package(staging: Path, out_dir: Path) -> None:
    """Move the finished package into place (checked again: the export takes a while)."""
    check_replaceable(out_dir)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    staging.rename(out_dir)
