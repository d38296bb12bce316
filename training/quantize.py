"""int8 with a quality gate: the int8 file is written only if its answers agree with fp32's.

    pkg = export_package(checkpoint, "embedding", out, variants=("fp32", "int8"))
    pkg.parity["int8"]["agreement"]   # {"metrics", "gate", "passed", "choice", "tried", ...}

Dynamic int8 (weights int8 per channel, activations quantised per batch at run time) is 2-3x
faster than fp32 on a CPU, but what it does to answers depends on the model: on published
checkpoints it left all-mpnet-base-v2's embeddings at a worst cosine of 0.80 to fp32, changed
a SPLADE model's non-zero terms on 7 of 9 texts and flipped a topic classifier's label on 1 of
9. So the export measures each candidate int8 graph against the fp32 graph on a fixed sample
of real text the repository ships (examples/data), through the task's own pre- and
post-processing (heads.tasks), i.e. on what the service would answer, and keeps the first
candidate that meets the task's gate (heads.quality.GATES). Candidates go from the fastest
(everything quantised) to the most careful (the most sensitive MatMuls left in fp32); when none
passes within the time budget no int8 file is written, and package.json says why.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from tokenizers import Tokenizer

from heads.contract import INPUT_NAMES
from heads.quality import GATES, passes, shortfall
from heads.rows import InvalidInput, ModelRow, Outputs, pad, prepare_tokenizer
from heads.tasks import classify, embed, fill_mask, ner, qa, sparse
from training.data.classification import read_classification
from training.data.corpus import read_documents
from training.data.squad import read_squad
from training.data.token_classification import read_tagged
from training.metrics import spearman

# Text the repository ships; read at export time, never ../shared (a user's machine has none).
SAMPLE_DATA = Path(__file__).resolve().parents[1] / "examples" / "data"
BATCH = 32  # rows per session run, sorted by length (the service batches so too)
PER_TOKEN_TASKS = ("token-classification", "question-answering", "fill-mask")
SPARSE_TOP_K = 10  # a sparse vector's highest-weighted terms (recorded, not gated)
FILL_MASK_TOP_K = fill_mask.TOP_K


# --- the sample ---------------------------------------------------------------------------


def sample_sentences() -> list[str]:
    """Every sentence of examples/data: sentiment rows, corpus sentences, NER sentences."""
    out = [
        e.text for f in sorted(SAMPLE_DATA.glob("sentiment/*.tsv")) for e in read_classification(f)
    ]
    out += [
        s
        for f in sorted(SAMPLE_DATA.glob("corpus/*.txt"))
        for doc in read_documents(f)
        for s in doc
    ]
    out += [
        " ".join(s.words) for f in sorted(SAMPLE_DATA.glob("ner/*.conll")) for s in read_tagged(f)
    ]
    return out


def sample_questions() -> list[tuple[str, str]]:
    """Every (question, context) of examples/data/qa."""
    return [
        (e.question, e.context)
        for f in sorted(SAMPLE_DATA.glob("qa/*.json"))
        for e in read_squad(f)
    ]


def sample_texts() -> list[str]:
    """Single texts: the sentences, the questions and each distinct QA context (longer)."""
    pairs = sample_questions()
    return sample_sentences() + [q for q, _ in pairs] + list(dict.fromkeys(c for _, c in pairs))


def masked_sentences(mask_token: str) -> list[str]:
    """Each sentence with one word blanked: the alphabetic word nearest its middle."""
    out = []
    for sentence in sample_sentences():
        words = sentence.split()
        order = sorted(range(len(words)), key=lambda i: abs(i - len(words) // 2))
        i = next((i for i in order if words[i].isalpha()), None)
        if i is not None:
            out.append(" ".join([*words[:i], mask_token, *words[i + 1 :]]))
    return out


@dataclass
class Sample:
    """The rows one task runs and how each graph's outputs (one per row, in order) become
    answers. inputs: how many requests the sample stands for."""

    task: str
    rows: list[ModelRow]
    answers: Callable[[list[Outputs]], list[Any]]
    inputs: int
    source: list[str] = field(default_factory=list)

    def describe(self) -> dict[str, Any]:
        return {"inputs": self.inputs, "rows": len(self.rows), "source": self.source}


def build_sample(
    task: str,
    tokenizer: Tokenizer,
    max_seq_length: int,
    *,
    labels: list[str] | None = None,
    sparse_pooling: bool = False,
    mask_token: str | None = None,
) -> Sample:
    """The task's sample, encoded by heads.tasks exactly as the service encodes requests.
    FileNotFoundError when examples/data is not beside the code (an installed wheel)."""
    if not (SAMPLE_DATA / "README.md").is_file():
        raise FileNotFoundError(f"{SAMPLE_DATA}: the sample text is not here")
    tok = prepare_tokenizer(Tokenizer.from_str(tokenizer.to_str()))
    if task == "classification":
        return _classification_sample(tok, max_seq_length)
    if task == "token-classification":
        return _ner_sample(tok, max_seq_length, labels or [])
    if task == "question-answering":
        return _qa_sample(tok, max_seq_length)
    if task == "fill-mask":
        if mask_token is None:
            raise ValueError("a fill-mask sample needs the mask token")
        return _fill_mask_sample(tok, max_seq_length, mask_token)
    texts = sample_texts()
    rows = embed.preprocess(tok, texts, max_seq_length).sequences
    if sparse_pooling:
        return Sample(task, rows, _sparse_answers, len(texts), _ALL)
    return Sample(task, rows, _dense_answers, len(texts), _ALL)


_ALL = ["sentiment/*.tsv", "corpus/*.txt", "ner/*.conll", "qa/*.json"]


def _classification_sample(tok: Tokenizer, max_seq_length: int) -> Sample:
    # single texts and (question, context) pairs: a cross-encoder (reranker, NLI) reads pairs
    inputs: list[Any] = [*sample_texts(), *sample_questions()]
    rows = classify.preprocess(tok, inputs, max_seq_length).sequences
    return Sample("classification", rows, _logits, len(inputs), _ALL)


def _logits(outputs: list[Outputs]) -> list[Any]:
    return list(np.stack([o["logits"] for o in outputs]))


def _ner_sample(tok: Tokenizer, max_seq_length: int, labels: list[str]) -> Sample:
    stride = ner.default_stride(max_seq_length)
    prepared = [ner.preprocess(tok, t, max_seq_length, stride) for t in sample_texts()]

    def answers(outputs: list[Outputs]) -> list[Any]:
        out, at = [], 0
        for p in prepared:
            n = len(p.windows)
            entities = ner.postprocess(p, outputs[at : at + n], labels, "simple")
            out.append({(e["entity_group"], e["start"], e["end"]) for e in entities})
            at += n
        return out

    rows = [s for p in prepared for s in p.sequences]
    return Sample("token-classification", rows, answers, len(prepared), _ALL)


def _qa_sample(tok: Tokenizer, max_seq_length: int) -> Sample:
    window = min(384, max_seq_length)  # /qa's default max_seq_len, capped by the package's
    stride = qa.default_stride(window)
    prepared = [qa.preprocess(tok, q, c, window, stride) for q, c in sample_questions()]

    def answers(outputs: list[Outputs]) -> list[Any]:
        out, at = [], 0
        for p in prepared:
            n = len(p.windows)
            best = qa.postprocess(p, outputs[at : at + n])
            out.append((best[0]["start"], best[0]["end"]) if best else None)
            at += n
        return out

    rows = [s for p in prepared for s in p.sequences]
    return Sample("question-answering", rows, answers, len(prepared), ["qa/*.json"])


def _fill_mask_sample(tok: Tokenizer, max_seq_length: int, mask_token: str) -> Sample:
    rows = []
    for text in masked_sentences(mask_token):
        with contextlib.suppress(InvalidInput):  # longer than a tiny window: left out
            rows += fill_mask.preprocess(tok, [text], max_seq_length, mask_token)

    def answers(outputs: list[Outputs]) -> list[Any]:
        ranked = fill_mask.postprocess(
            tok, rows, [o["logits"] for o in outputs], mask_token, FILL_MASK_TOP_K
        )
        return [[c["token"] for c in candidates] for candidates in ranked]

    return Sample(
        "fill-mask", rows, answers, len(rows), ["sentiment/*.tsv", "corpus/*.txt", "ner/*.conll"]
    )


def _dense_answers(outputs: list[Outputs]) -> list[Any]:
    return list(embed.postprocess(np.stack([o["embeddings"] for o in outputs]), True))


def _sparse_answers(outputs: list[Outputs]) -> list[Any]:
    return [
        {int(e["index"]): float(e["value"]) for e in entries}
        for entries in sparse.postprocess(np.stack([o["embeddings"] for o in outputs]))
    ]


# --- running a graph on the sample ----------------------------------------------------------


def run_rows(path: Path, rows: list[ModelRow], pad_id: int, per_token: bool) -> list[Outputs]:
    """Each row's outputs from the graph at `path` (CPU), as the service's batcher hands them
    over: batches of rows of similar length, padding cut off per-token outputs."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    declared = {i.name for i in session.get_inputs()}
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
    out: list[Outputs] = [{} for _ in rows]
    for at in range(0, len(order), BATCH):
        idx = order[at : at + BATCH]
        feeds = pad([rows[i] for i in idx], pad_id)
        values = session.run(names, {n: feeds[n] for n in INPUT_NAMES if n in declared})
        for k, i in enumerate(idx):
            n = len(rows[i])
            out[i] = {
                name: (v[k, :n] if per_token else v[k]).astype(np.float32)
                for name, v in zip(names, values, strict=True)
            }
    return out


# --- agreement ------------------------------------------------------------------------------


def agreement(kind: str, ref: list[Any], got: list[Any]) -> dict[str, float]:
    """The metrics of gate `kind` (heads.quality.GATES) and their companions: int8's answers
    `got` against fp32's `ref`, one per sample input."""
    if kind in ("classification", "rank"):
        return _classification_agreement(np.stack(ref), np.stack(got))
    if kind == "token-classification":
        both = sum(len(a & b) for a, b in zip(ref, got, strict=True))
        either = sum(len(a | b) for a, b in zip(ref, got, strict=True))
        same = np.mean([a == b for a, b in zip(ref, got, strict=True)])
        return {"entity_agreement": both / either if either else 1.0, "text_agreement": float(same)}
    if kind == "question-answering":
        return {"span_agreement": float(np.mean([a == b for a, b in zip(ref, got, strict=True)]))}
    if kind == "fill-mask":
        top1 = np.mean([a[:1] == b[:1] for a, b in zip(ref, got, strict=True)])
        overlap = np.mean(
            [len(set(a) & set(b)) / max(len(a), 1) for a, b in zip(ref, got, strict=True)]
        )
        return {"top1_agreement": float(top1), f"top{FILL_MASK_TOP_K}_overlap": float(overlap)}
    if kind == "sparse":
        return _sparse_agreement(ref, got)
    cos = (np.stack(ref) * np.stack(got)).sum(-1)
    return {"cosine_mean": float(cos.mean()), "cosine_min": float(cos.min())}


def _classification_agreement(ref: np.ndarray, got: np.ndarray) -> dict[str, float]:
    if ref.shape[1] == 1:
        # One logit (a cross-encoder reranker, a regression): its answers are used to order
        # inputs, so the gate is on the order: Spearman of int8's scores with fp32's.
        rho = spearman(ref[:, 0].tolist(), got[:, 0].tolist())
        return {"rank_agreement": rho if np.isfinite(rho) else float(np.array_equal(ref, got))}
    return {"top1_agreement": float((ref.argmax(-1) == got.argmax(-1)).mean())}


def _sparse_agreement(ref: list[dict[int, float]], got: list[dict[int, float]]) -> dict[str, float]:
    jaccard, top, dot = [], [], []
    for a, b in zip(ref, got, strict=True):
        union = len(a.keys() | b.keys())
        jaccard.append(len(a.keys() & b.keys()) / union if union else 1.0)
        k = min(SPARSE_TOP_K, len(a))
        best_a = set(sorted(a, key=a.__getitem__, reverse=True)[:k])
        best_b = set(sorted(b, key=b.__getitem__, reverse=True)[:k])
        top.append(len(best_a & best_b) / k if k else float(not b))
        # the score a SPLADE search computes is a dot product: the cosine of the two vectors
        norms = np.sqrt(sum(v * v for v in a.values()) * sum(v * v for v in b.values()))
        dot.append(sum(v * b.get(i, 0.0) for i, v in a.items()) / norms if norms else 1.0)
    return {
        "cosine_mean": float(np.mean(dot)),
        "cosine_min": float(np.min(dot)),
        "support_jaccard_mean": float(np.mean(jaccard)),
        "support_jaccard_min": float(np.min(jaccard)),
        f"top{SPARSE_TOP_K}_overlap_mean": float(np.mean(top)),
        f"top{SPARSE_TOP_K}_overlap_min": float(np.min(top)),
    }


# --- the quantisation choices ---------------------------------------------------------------


@dataclass(frozen=True)
class Choice:
    """One way to make the int8 graph: dynamic int8 with `exclude` (node names) left in fp32."""

    name: str
    exclude: tuple[str, ...] = ()

    def record(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "method": "dynamic",
            "per_channel": True,
            "reduce_range": True,
            "nodes_excluded": list(self.exclude),
        }


# What dynamic int8 quantises (ORT's op types; a fused Attention becomes QAttention, the
# embedding tables of EmbedLayerNormalization / Gather become int8 weights).
# Per-channel weight scales: no speed cost, and they lifted all-MiniLM-L6-v2's worst cosine to
# fp32 over 64 SST-2 sentences from 0.94 to 0.98.
# reduce_range (7-bit weights) stays on: x86 CPUs without VNNI add u8 x s8 products in int16,
# which 8-bit weights saturate (ORT's quantization guide), so an 8-bit file answers
# differently on the CPU that serves it than on the one the gate measured it on. Measured on an
# AMD EPYC with AVX2 and no VNNI: 8-bit weights took the SPLADE model's cosine to fp32 from
# 0.993 to 0.956 (worst text) and its STS-B dev Spearman 0.42 points off fp32's (7-bit: 0.05).
# Static int8 (quantize_static, activations calibrated on the sample) is not tried: as QDQ it
# ran all-MiniLM-L6-v2 at 0.75x fp32's speed on that CPU, and as QOperator ORT 1.32's
# quantizer raised on these graphs.
INT8_OPS = ["MatMul", "Attention", "EmbedLayerNormalization", "Gather"]


def quantize(src: Path, dst: Path, choice: Choice) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with _quiet_root_logger():
        quantize_dynamic(
            src,
            dst,
            weight_type=QuantType.QInt8,
            per_channel=True,
            reduce_range=True,
            op_types_to_quantize=INT8_OPS,
            nodes_to_exclude=list(choice.exclude),
            # Outputs of fused contrib ops have no inferred type; they are all float here.
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )


@contextlib.contextmanager
def _quiet_root_logger() -> Iterator[None]:
    # quantize_* log "consider pre-processing" on the root logger; the fusion did that
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


# --- which nodes int8 hurts most ------------------------------------------------------------


def weighted_products(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """The nodes dynamic int8 turns into integer products: MatMul by a weight and the fused
    Attention (its QKV projection). ORT leaves a MatMul of two activations (an unfused
    attention's scores: MPNet's) in fp32 already."""
    weights = {i.name for i in graph.initializer}
    return [
        n for n in graph.node
        if n.op_type == "Attention" or (n.op_type == "MatMul" and n.input[1] in weights)
    ]  # fmt: skip


def activation_noise(fp32: Path, rows: list[ModelRow], pad_id: int) -> dict[str, float]:
    """Quantisable node -> how coarse dynamic int8 makes its input, relative to the input's
    size: one uint8 step over the batch's [min, max] (DynamicQuantizeLinear, per tensor) over
    the input's root mean square, averaged over the sample's batches. A node fed outliers (the
    feed-forward output after GELU, the last layers of a sentence encoder) has a coarse step
    for its ordinary values: its product loses most."""
    model = onnx.load(str(fp32))
    graph = model.graph
    inputs = {n.name: n.input[0] for n in weighted_products(graph)}
    have = {o.name for o in graph.output}
    for x in dict.fromkeys(inputs.values()):
        if x not in have:
            graph.output.append(onnx.helper.make_tensor_value_info(x, onnx.TensorProto.FLOAT, None))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    declared = {i.name for i in session.get_inputs()}
    names = list(dict.fromkeys(inputs.values()))
    noise: dict[str, list[float]] = {x: [] for x in names}
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
    for at in range(0, len(order), BATCH):
        feeds = pad([rows[i] for i in order[at : at + BATCH]], pad_id)
        for x, v in zip(
            names,
            session.run(names, {n: feeds[n] for n in INPUT_NAMES if n in declared}),
            strict=True,
        ):
            step = (max(0.0, float(v.max())) - min(0.0, float(v.min()))) / 255
            noise[x].append(
                step / max(float(np.sqrt(np.mean(np.square(v, dtype=np.float64)))), 1e-12)
            )
    return {n: float(np.mean(noise[x])) for n, x in inputs.items()}


# --- the gate -------------------------------------------------------------------------------


def candidates(fp32: Path, sample: Sample, pad_id: int) -> Iterator[Choice]:
    """The int8 graphs to try, fastest first: everything quantised (what the export wrote
    before the gate), then more and more of the graph left in fp32, each choice's fp32 nodes
    a superset of the one before. Lazy: the sensitivity ranking costs an fp32 run over the
    sample, paid only when the first two fail."""
    yield Choice("all quantised")
    graph = onnx.load(str(fp32), load_external_data=False).graph
    weights = {i.name for i in graph.initializer}
    # The embedding tables are int8 weights only: fp32 costs no speed, only size (MiniLM's
    # int8 file: 61 MiB, not 22; fp32's is 87). They stay fp32 in every later choice, so that
    # each choice keeps in fp32 all that the one before did.
    tables = tuple(
        n.name for n in graph.node
        if n.op_type == "EmbedLayerNormalization" or (n.op_type == "Gather" and n.input[0] in weights)
    )  # fmt: skip
    yield Choice("embeddings in fp32", exclude=tables)
    noise = activation_noise(fp32, sample.rows, pad_id)
    ranked = sorted(noise, key=noise.__getitem__, reverse=True)
    seen: set[int] = set()
    for share in SENSITIVE_SHARES:
        k = max(1, round(len(ranked) * share))
        if k not in seen:
            seen.add(k)
            yield Choice(
                f"embeddings and the {k} most sensitive of {len(ranked)} products in fp32",
                exclude=tables + tuple(ranked[:k]),
            )


# Shares of the ranked products left in fp32, tried in turn. all-mpnet-base-v2 passed at a
# quarter (18 of 72; an eighth left its worst cosine at 0.93) and ran 1.24x fp32 (whole: 1.85x).
# No more: with half in fp32 (demo-qa, 12 of 25) the int8 file ran 0.89x fp32, slower than
# the file it stands in for.
SENSITIVE_SHARES = (0.125, 0.25)
# At most four tries (all, tables, two shares). No new one starts past this many seconds of
# the search when the last try's time would take it there: all-mpnet-base-v2 (110M) passed at
# its fourth try, 202 s into the search (33-48 s a try) on 2 cores shared with other work
# (load 10), its export 244 s in all.
BUDGET_S = 300.0


def int8_with_gate(
    fp32: Path,
    dst: Path,
    sample: Sample,
    kind: str,
    pad_id: int,
    *,
    gate: dict[str, float] | None = None,
    budget_s: float | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Write to `dst` the first of `candidates` whose answers on `sample` meet `gate` (default
    GATES[kind]) against fp32's, trying no new candidate past `budget_s` seconds. Returns the
    agreement record (package.json parity.int8.agreement); `dst` exists iff it passed."""
    gate = GATES[kind] if gate is None else gate
    budget = BUDGET_S if budget_s is None else budget_s
    t0 = time.perf_counter()
    per_token = sample.task in PER_TOKEN_TASKS
    ref = sample.answers(run_rows(fp32, sample.rows, pad_id, per_token))
    trying = dst.with_name(f".{dst.name}.try")
    tried: list[dict[str, Any]] = []
    chosen: Choice | None = None
    last = 0.0
    for choice in candidates(fp32, sample, pad_id):
        spent = time.perf_counter() - t0
        if tried and spent + last > budget:
            log(f"int8: time budget {budget:.0f} s spent, {choice.name} not tried")
            break
        t = time.perf_counter()
        try:
            quantize(fp32, trying, choice)
            got = sample.answers(run_rows(trying, sample.rows, pad_id, per_token))
        except Exception as e:  # a quantizer bug on one choice must not end the search
            error = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
            tried.append({**choice.record(), "metrics": {}, "passed": False, "error": error})
            log(f"int8 {choice.name}: failed ({error})")
            continue
        # rounded before it is judged, so that the record reads the same to the service
        metrics = _rounded(agreement(kind, ref, got))
        ok = passes(metrics, gate)
        last = time.perf_counter() - t
        tried.append(
            {**choice.record(), "metrics": metrics, "passed": ok, "seconds": round(last, 1)}
        )
        verdict = "passes" if ok else shortfall(metrics, gate)
        log(f"int8 {choice.name}: {_show(metrics)} -> {verdict}")
        if ok:
            chosen = choice
            trying.replace(dst)
            break
    trying.unlink(missing_ok=True)
    best = tried[-1] if chosen else max(tried, key=lambda r: _margin(r["metrics"], gate))
    record: dict[str, Any] = {
        "reference": "the fp32 graph, CPUExecutionProvider",
        "kind": kind,
        "sample": sample.describe(),
        "gate": gate,
        "metrics": best["metrics"],
        "passed": chosen is not None,
        "choice": chosen.record() if chosen else None,
        "tried": tried,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    if chosen is None:
        record["reason"] = (
            f"no int8 choice met the {kind} gate in {len(tried)} tried; the closest, "
            f"{best['name']}: {shortfall(best['metrics'], gate)}"
        )
    return record


def _margin(metrics: dict[str, float], gate: dict[str, float]) -> float:
    return min(metrics.get(m, float("-inf")) - least for m, least in gate.items())


def _rounded(metrics: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 5) for k, v in metrics.items()}


def _show(metrics: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.4f}" for k, v in metrics.items())
