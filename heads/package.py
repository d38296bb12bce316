"""The model package: one folder per model, the contract between `training.export` (writer)
and the service (reader).

    models/sst2/
      package.json       what the model is (task, labels, inputs, outputs, variants, sha256, ...)
      model.onnx         fp32 graph (ORT-fused); model.int8.onnx / model.fp16.onnx when exported
      tokenizer.json     `tokenizers` tokenizer, padding and truncation disabled

    >>> pkg = read_package(Path("models/sst2"))    # verifies every sha256
    >>> pkg.task, pkg.labels, pkg.variant_path(pkg.prefer["cpu"])

Every failure is a `PackageError` whose message names the file and what is wrong with it, so
the service can refuse a package at start-up with a line an operator can act on.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from heads.adapters import ADAPTER_FILE, COMBINES, ENCODER, HEAD_KINDS, KINDS
from heads.contract import (
    MANIFEST,
    POOLINGS,
    PROBLEM_TYPES,
    READS,
    REQUEST_TASKS,
    SPARSE_POOLINGS,
    TASKS,
    TOKENIZER,
    VARIANTS,
    answering_tasks,
)

FORMAT_VERSION = 1
REQUIRED = (
    "format",
    "name",
    "task",
    "max_seq_length",
    "do_lower_case",
    "inputs",
    "outputs",
    "variants",
    "prefer",
    "sha256",
)


# the heads an adapter package can be (heads.adapters.Head)
ADAPTER_HEADS = ("classification", "token-classification", "question-answering")


class PackageError(Exception):
    """A package the service must not load. The message names the file and the problem."""


@dataclass(frozen=True)
class ModelPackage:
    path: Path
    name: str
    task: str
    labels: list[str] | None  # id -> label (classification, token-classification)
    problem_type: str | None  # single_label | multi_label | regression (classification)
    pooling: str | None  # one of POOLINGS (embedding; applied inside the graph); see `sparse`
    normalize: bool  # embedding: L2-normalise by default (the service does it, not the graph)
    max_seq_length: int
    do_lower_case: bool
    inputs: list[dict[str, Any]]  # [{"name", "dtype", "shape"}], shape like ["batch", "sequence"]
    outputs: list[dict[str, Any]]
    variants: dict[str, str]  # {"fp32": "model.onnx", ...}: only the files present
    prefer: dict[str, str]  # {"cpu": variant, "gpu": variant}
    sha256: dict[str, str]  # every file but package.json
    # per variant: max abs diff vs PyTorch on the export probes; a lossy variant's answers'
    # agreement with fp32 on real text under "agreement" (heads.quality, `agreement()`)
    parity: dict[str, Any]
    source: dict[str, Any]  # checkpoint, arguments, metrics, export time, versions, fusion
    # embedding: a sentence-transformers folder's prompts (name -> text put before each input,
    # /embed `prompt_name`) and the one used when a request names none; older packages: none
    prompts: dict[str, str]
    default_prompt_name: str | None
    # fill-mask: the token texts mark their blanks with ([MASK], <mask>; None: the package
    # cannot fill any), and whether transformers' decode removes spaces before punctuation
    # (its tokenizer_config.json's clean_up_tokenization_spaces), for the answer's sequences
    mask_token: str | None = None
    clean_up_tokenization_spaces: bool = False
    # role (pad, cls, sep, mask, unk, bos, eos) -> {token, id, source}: what the checkpoint
    # declared, resolved at export (training.special_tokens); empty for older packages
    special_tokens: dict[str, Any] = dataclasses.field(default_factory=dict)
    # classification: "single" texts or "pairs" (READS), as recorded at export; "unknown" for
    # a package written before the export recorded it
    reads: str = "unknown"
    # the request tasks (REQUEST_TASKS) this package answers when several loaded packages
    # could and the request names none (service.selection); () declares nothing
    default_for: tuple[str, ...] = ()
    # late-interaction (ColBERT): how rows are built and which vectors answer (query/document
    # prefix and its id, lengths, query expansion, mask_id, skiplist_ids, source; see
    # LATE_INTERACTION_FIELDS); None for every other task
    late_interaction: dict[str, Any] | None = None
    # an adapter package (heads.adapters): its kind, rank, LoRA modules, head and the encoder
    # package it runs over (`base`: name, digest); its weights are adapter.npz, it has no graph
    adapter: dict[str, Any] | None = None
    # an encoder package (task "encoder"): its weights' digest, hidden size, layers and LoRA
    # inputs (`lora`: [{module, in, out}]) adapters fill
    encoder: dict[str, Any] | None = None

    @property
    def pad_token_id(self) -> int | None:
        """The id rows are padded with (the RoBERTa and MPNet families count position ids from
        it); None for a package exported before the export recorded it."""
        pad = self.special_tokens.get("pad")
        return pad["id"] if pad else None

    def agreement(self, variant: str) -> dict[str, Any] | None:
        """`variant`'s recorded agreement with fp32 ({"kind", "metrics", "gate", "passed",
        "sample", "choice", ...}, see heads.quality); None when the export measured none."""
        entry = self.parity.get(variant)
        record = entry.get("agreement") if isinstance(entry, dict) else None
        return record if isinstance(record, dict) else None

    @property
    def sparse(self) -> bool:
        """An embedding package whose vectors are vocabulary-wide and mostly zeros (pooling
        "splade"): (V,) per text, answered as its non-zero entries (heads.tasks.sparse)."""
        return self.pooling in SPARSE_POOLINGS

    def variant_path(self, variant: str) -> Path:
        if variant not in self.variants:
            raise PackageError(
                f"{self.path / MANIFEST}: no {variant!r} variant "
                f"(this package has {', '.join(self.variants)})"
            )
        return self.path / self.variants[variant]

    @property
    def tokenizer_path(self) -> Path:
        return self.path / TOKENIZER


def file_sha256(path: Path, chunk: int = 1 << 20) -> str:
    """Hex sha256, read 1 MiB at a time: model files reach gigabytes."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def read_package(path: Path, verify: bool = True) -> ModelPackage:
    """Read and check `path/package.json`. `verify=False` skips hashing, not the existence
    checks (for tools that only want to list packages quickly)."""
    path = Path(path)
    manifest_path = path / MANIFEST
    m = _load_manifest(manifest_path)

    def bad(what: str, file: str = MANIFEST) -> PackageError:
        return PackageError(f"{path / file}: {what}")

    if m["format"] != FORMAT_VERSION:
        raise bad(
            f"format {m['format']} is not supported (this service reads format {FORMAT_VERSION})"
        )
    if m["task"] not in TASKS:
        raise bad(f"task {m['task']!r} is not one of {', '.join(TASKS)}")
    labels = m.get("labels")
    if m["task"] in ("classification", "token-classification"):
        if (
            not isinstance(labels, list)
            or not labels
            or not all(isinstance(x, str) for x in labels)
        ):
            raise bad(f"a {m['task']} package needs 'labels', a non-empty list of strings")
        if m["task"] == "classification" and m.get("problem_type") not in PROBLEM_TYPES:
            raise bad(
                f"problem_type {m.get('problem_type')!r} is not one of {', '.join(PROBLEM_TYPES)}"
            )
    if m["task"] == "embedding" and m.get("pooling") not in POOLINGS:
        raise bad(f"pooling {m.get('pooling')!r} is not one of {', '.join(POOLINGS)}")
    prompts, default_prompt = m.get("prompts") or {}, m.get("default_prompt_name")
    if not isinstance(prompts, dict) or not all(isinstance(v, str) for v in prompts.values()):
        raise bad("prompts must map names to texts")
    if default_prompt is not None and default_prompt not in prompts:
        raise bad(f"default_prompt_name {default_prompt!r} is not one of the prompts")
    mask_token = m.get("mask_token")
    if mask_token is not None and (not isinstance(mask_token, str) or not mask_token):
        raise bad(f"mask_token {mask_token!r} is not a token")
    special_tokens = m.get("special_tokens") or {}
    if not isinstance(special_tokens, dict) or not all(
        isinstance(v, dict) and isinstance(v.get("id"), int) and isinstance(v.get("token"), str)
        for k, v in special_tokens.items()
        if k != "notes"
    ):
        raise bad("special_tokens must map roles to {token, id, source}")
    if problem := _agreement_problem(m.get("parity", {})):
        raise bad(problem)
    reads = m.get("reads", "unknown")
    if reads != "unknown" and (m["task"] != "classification" or reads not in READS):
        raise bad(f"reads {reads!r}: a classification package reads one of {', '.join(READS)}")
    default_for = m.get("default_for") or []
    if problem := default_for_problem(default_for, m["task"], m.get("pooling"), reads):
        raise bad(problem)
    if not isinstance(m["max_seq_length"], int) or m["max_seq_length"] < 2:
        raise bad(f"max_seq_length {m['max_seq_length']!r} is not an integer >= 2")
    late_interaction = m.get("late_interaction")
    if problem := late_interaction_problem(late_interaction, m["task"], m["max_seq_length"]):
        raise bad(problem)

    variants, sha256, prefer = m["variants"], m["sha256"], m["prefer"]
    for field in ("sha256", "prefer"):
        if not isinstance(m[field], dict):
            raise bad(f"{field} must be an object")
    for field in ("inputs", "outputs"):
        if not isinstance(m[field], list) or not all(
            isinstance(x, dict) and "name" in x for x in m[field]
        ):
            raise bad(f"{field} must be a list of {{name, dtype, shape}}")
    adapter, encoder = m.get("adapter"), m.get("encoder")
    if problem := adapter_problem(adapter, encoder, m["task"], path):
        raise bad(problem)
    graphless = adapter is not None  # an adapter's weights run in its encoder's graph
    if (
        not isinstance(variants, dict)
        or (not variants and not graphless)
        or set(variants) - set(VARIANTS)
    ):
        raise bad(f"variants {variants!r} must map some of {', '.join(VARIANTS)} to files")
    for device, variant in prefer.items():
        if variant not in variants:
            raise bad(f"prefer[{device!r}] is {variant!r}, which is not among the variants")
    for file in [*variants.values(), TOKENIZER]:
        if file not in sha256:
            raise bad(f"{file} has no sha256 entry")
    for file, digest in sha256.items():
        if Path(file).is_absolute() or ".." in Path(file).parts:
            raise bad(f"sha256 names {file!r}, which is outside the package")
        if not (path / file).is_file():
            raise bad(f"file is missing (listed in {MANIFEST})", file)
        if verify and file_sha256(path / file) != digest:
            raise bad("sha256 mismatch (truncated or modified?)", file)

    return ModelPackage(
        path=path,
        name=str(m["name"]),
        task=m["task"],
        labels=labels if m["task"] in ("classification", "token-classification") else None,
        problem_type=m.get("problem_type") if m["task"] == "classification" else None,
        pooling=m.get("pooling") if m["task"] == "embedding" else None,
        normalize=bool(m.get("normalize", m["task"] == "embedding")),
        max_seq_length=m["max_seq_length"],
        do_lower_case=bool(m["do_lower_case"]),
        inputs=m["inputs"],
        outputs=m["outputs"],
        variants=dict(variants),
        prefer=dict(prefer),
        sha256=dict(sha256),
        parity=m.get("parity", {}),
        source=m.get("source", {}),
        prompts=dict(prompts),
        default_prompt_name=default_prompt,
        mask_token=mask_token if m["task"] == "fill-mask" else None,
        clean_up_tokenization_spaces=bool(m.get("clean_up_tokenization_spaces", False)),
        special_tokens=dict(special_tokens),
        reads=reads,
        default_for=tuple(default_for),
        late_interaction=dict(late_interaction) if late_interaction is not None else None,
        adapter=dict(adapter) if adapter is not None else None,
        encoder=dict(encoder) if encoder is not None else None,
    )


def adapter_problem(adapter: Any, encoder: Any, task: str, path: Path) -> str | None:
    """What is wrong with a package's `adapter` or `encoder` block (None: nothing): an encoder
    package has `encoder` (digest, hidden_size, layers, lora slots); an adapter package of a
    classification, token-classification or question-answering head has `adapter` (kind,
    rank, modules, head, base) and its adapter.npz."""
    if (encoder is not None) != (task == ENCODER):
        return "an encoder package, and only one, has an 'encoder' block"
    if encoder is not None:
        if not isinstance(encoder, dict) or not isinstance(encoder.get("digest"), str):
            return "encoder must be an object with a digest"
        slots = encoder.get("lora")
        if not isinstance(slots, list) or not all(
            isinstance(s, dict) and isinstance(s.get("module"), str)
            and isinstance(s.get("in"), int) and isinstance(s.get("out"), int)
            for s in slots
        ):  # fmt: skip
            return "encoder.lora must be a list of {module, in, out}"
        if not isinstance(encoder.get("hidden_size"), int):
            return "encoder.hidden_size must be an integer"
    if adapter is None:
        return None
    if task not in ADAPTER_HEADS:
        return f"adapter packages serve {', '.join(ADAPTER_HEADS)}, not {task}"
    if not isinstance(adapter, dict):
        return "adapter must be an object"
    if adapter.get("kind") not in KINDS:
        return f"adapter.kind must be one of {', '.join(KINDS)}"
    base = adapter.get("base")
    if not isinstance(base, dict) or not isinstance(base.get("digest"), str):
        return "adapter.base must name the encoder's digest"
    head = adapter.get("head")
    if not isinstance(head, dict) or head.get("kind") not in HEAD_KINDS:
        return f"adapter.head.kind must be one of {', '.join(HEAD_KINDS)}"
    if head.get("combine", "concat") not in COMBINES:
        return f"adapter.head.combine must be one of {', '.join(COMBINES)}"
    modules = adapter.get("modules", [])
    if not isinstance(modules, list) or not all(isinstance(x, str) for x in modules):
        return "adapter.modules must be a list of module names"
    if not isinstance(adapter.get("rank"), int) or adapter["rank"] < 0:
        return "adapter.rank must be a non-negative integer"
    if not (path / ADAPTER_FILE).is_file():
        return f"an adapter package needs {ADAPTER_FILE}"
    return None


def default_for_problem(
    default_for: Any, task: str, pooling: str | None, reads: str = "unknown"
) -> str | None:
    """What is wrong with a package's `default_for` (None: nothing): a list of request tasks
    (REQUEST_TASKS) that a package of `task` (`pooling`, `reads`) serves."""
    if not isinstance(default_for, list) or not all(isinstance(x, str) for x in default_for):
        return "default_for must be a list of request tasks"
    sparse = pooling in SPARSE_POOLINGS
    for use in default_for:
        wrong_kind = task == "embedding" and (
            (use == "sparse-embedding") != sparse or (use == "token-embedding" and sparse)
        )
        if use not in REQUEST_TASKS or task not in answering_tasks(use) or wrong_kind:
            fits = [u for u in REQUEST_TASKS if task in answering_tasks(u)]
            return (
                f"default_for names {use!r}, which a {task} package does not answer "
                f"(one of {', '.join(fits)})"
            )
        if use in ("rerank", "zero-shot") and reads == "single":
            return (
                f"default_for names {use!r}, which scores pairs, but the package reads single texts"
            )
    return None


# A late-interaction package's `late_interaction` block: field -> the types it may hold (a
# prefix and its id are null together: no marker token). training.late_interaction writes it.
LATE_INTERACTION_FIELDS: dict[str, tuple[type, ...]] = {
    "query_prefix": (str, type(None)),
    "query_prefix_id": (int, type(None)),
    "document_prefix": (str, type(None)),
    "document_prefix_id": (int, type(None)),
    "query_length": (int,),
    "document_length": (int,),
    "query_expansion": (bool,),
    "attend_to_expansion_tokens": (bool,),
    "mask_id": (int, type(None)),
    "skiplist_ids": (list,),
    "source": (str,),
}
LATE_INTERACTION_SOURCES = ("pylate", "colbert-ai")


def late_interaction_problem(block: Any, task: str, max_seq_length: Any) -> str | None:
    """What is wrong with a package's `late_interaction` block (None: nothing): present, with
    every field of its type, exactly when the task is late-interaction; lengths that fit the
    graph's window; a mask id when queries are expanded."""
    if task != "late-interaction":
        if block is not None:
            return f"late_interaction is for late-interaction packages, not {task}"
        return None
    if not isinstance(block, dict):
        return "a late-interaction package needs a 'late_interaction' object"
    for name, types in LATE_INTERACTION_FIELDS.items():
        value = block.get(name)
        if name not in block or isinstance(value, bool) and bool not in types:
            return f"late_interaction.{name} is missing or not {_type_names(types)}"
        if not isinstance(value, types):
            return f"late_interaction.{name} {value!r} is not {_type_names(types)}"
    for side in ("query", "document"):
        if (block[f"{side}_prefix"] is None) != (block[f"{side}_prefix_id"] is None):
            return f"late_interaction.{side}_prefix and {side}_prefix_id must be null together"
        length = block[f"{side}_length"]
        if not 2 <= length <= max_seq_length:
            return (
                f"late_interaction.{side}_length {length} is outside 2..{max_seq_length} "
                "(max_seq_length)"
            )
    if block["query_expansion"] and block["mask_id"] is None:
        return "late_interaction.query_expansion needs a mask_id to expand queries with"
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in block["skiplist_ids"]):
        return "late_interaction.skiplist_ids must be a list of token ids"
    if block["source"] not in LATE_INTERACTION_SOURCES:
        return (
            f"late_interaction.source {block['source']!r} is not one of "
            f"{', '.join(LATE_INTERACTION_SOURCES)}"
        )
    return None


def _type_names(types: tuple[type, ...]) -> str:
    return " or ".join("null" if t is type(None) else t.__name__ for t in types)


def _agreement_problem(parity: Any) -> str | None:
    """What is wrong with parity's agreement records (None: nothing): each one, where present,
    holds numeric metrics and gate and a boolean passed, so that a reader can judge it."""
    if not isinstance(parity, dict):
        return "parity must be an object"
    for variant, entry in parity.items():
        record = entry.get("agreement") if isinstance(entry, dict) else None
        if record is None:
            continue
        fields = [record.get(k) for k in ("metrics", "gate")] if isinstance(record, dict) else []
        numbers = [v for d in fields if isinstance(d, dict) for v in d.values()]
        if not (
            len(fields) == 2
            and all(isinstance(d, dict) for d in fields)
            and all(isinstance(v, int | float) for v in numbers)
            and isinstance(record.get("passed"), bool)
        ):
            return (
                f"parity.{variant}.agreement must hold numeric metrics and gate and a passed flag"
            )
    return None


def json_object(path: Path, error: type[Exception] = PackageError) -> dict[str, Any]:
    """The JSON object in the file at `path`; `error` naming the file when it is not valid JSON
    or not an object (package.json here; a checkpoint's settings files in training)."""
    try:
        found = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise error(f"{path}: not valid JSON ({e})") from None
    if not isinstance(found, dict):
        raise error(f"{path}: expected a JSON object")
    return found


def _load_manifest(manifest_path: Path) -> dict[str, Any]:
    if not manifest_path.is_file():
        raise PackageError(f"{manifest_path}: no such file (is this a model package folder?)")
    m = json_object(manifest_path)
    missing = [k for k in REQUIRED if k not in m]
    if missing:
        raise PackageError(f"{manifest_path}: missing field(s) {', '.join(missing)}")
    return m


def write_package(out_dir: Path, manifest: dict[str, Any]) -> ModelPackage:
    """Hash every file under `out_dir` (package.json aside), add `format` and `sha256`, write
    package.json, and read the result back through the same checks the service applies."""
    out_dir = Path(out_dir)
    files = sorted(p for p in out_dir.rglob("*") if p.is_file() and p.name != MANIFEST)
    sha256 = {p.relative_to(out_dir).as_posix(): file_sha256(p) for p in files}
    manifest = {**manifest, "format": FORMAT_VERSION, "sha256": sha256}
    text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    (out_dir / MANIFEST).write_text(text)
    return read_package(out_dir)


def find_packages(model_dir: Path) -> list[Path]:
    """Immediate subfolders of `model_dir` that hold a package.json, sorted by name."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        return []
    return sorted(p for p in model_dir.iterdir() if (p / MANIFEST).is_file())
