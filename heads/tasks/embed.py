"""Sentence embeddings: texts -> vectors.

    encoded = preprocess(tokenizer, ["a cat sits", "a dog runs"], 256)
    # the batcher runs encoded.sequences; stack each row's `embeddings` (H,) into (N, H)
    vectors = postprocess(embeddings, normalize=True)

The service runs the same two steps as a `Job` (see heads.tasks), one per request.

Pooling (CLS, or mask-aware mean or max) and a sentence-transformers folder's Dense modules
happen inside the ONNX graph; normalisation is a per-request choice and happens here.
Truncation is the classifier's: the same code, one place (`heads.rows.text_rows`).

Prompts (sentence-transformers' `prompts`, e.g. e5's "query: "): `prompt(package, name)` is
the text put before every input ahead of tokenization, as `SentenceTransformer.encode(...,
prompt_name=name)` does; with no name, the package's default prompt, if it has one.

Layer features (Devlin et al. 2018 §5.3): a package exported with `--hidden-states` also
outputs every layer's states pooled both ways, (L + 1, H) per input, embeddings output first;
`combine_layers` picks layers from them (-1 the last, as Python indexes) and joins them.

Long inputs by windows (`windows=True`, off by default: truncation is what TEI and
sentence-transformers do): an input longer than the package's window is embedded as windows
of it, each a full row `[CLS] prompt window [SEP]` of at most max_seq_length tokens, and their
vectors are pooled into one, as vLLM's chunked processing and OpenAI's cookbook ("embedding
texts longer than the model's maximum context length") pool chunks. Chosen here:

- weights: the mean of the window vectors weighted by the text tokens each window holds: a
  window speaks for its share of the text, so a short last window counts for its few tokens
  (weighted equally, a 3-token tail would weigh as much as a full window). With mean pooling
  and no overlap this is the mean over all the text's tokens, each seen in its own window's
  context, up to each window's own special and prompt tokens; with CLS or max pooling, or
  Dense modules in the graph, the same rule is an approximation, as in vLLM (which warns for
  non-mean pooling). Splitting each overlap between its two windows instead changed nothing
  measurable (below: MRR within 0.0012).
- overlap: consecutive windows share `window_stride(room)` text tokens, an eighth of a
  window's (WINDOW_OVERLAP), so that a sentence cut at one window's edge is whole in the next.
  Measured with all-MiniLM-L6-v2 on SQuAD articles (their first paragraphs, up to 500 tokens
  and at least 3 windows), each retrieved by its own questions (question -> article MRR; the
  whole text read at once, as the model's 512 positions allow: 0.941 / 0.936):
  windows of 128 (70 articles, 704 questions) lift MRR from 0.875 truncated to 0.941-0.945,
  windows of 64 (91, 847) from 0.855 to 0.930-0.934, for every overlap tried (0, 1/16, 1/8,
  1/4, 1/2 of the window: within noise of each other), while the windows per text grow
  (128: 4.00, 4.14, 4.37, 4.81, 6.54). So no overlap measurably helps, and an eighth is
  kept as cheap insurance for the cut sentences: 9% more windows, where a half costs 64%.
- the pooled vectors are the package's un-normalised outputs (or, with `layers` / `pooling`,
  each window's hidden-state outputs, combined after pooling: the combinations are linear);
  `dimensions` and normalisation come once, after pooling, as the request asks.
- the prompt starts every window: sentence-transformers puts it before the text, and a
  window without it would be embedded as another kind of text (e5's "query: " vs
  "passage: "). Its tokens are those the prompt alone encodes to and the input's encoding
  begins with (`prompt_tokens`): a byte-level BPE or SentencePiece tokenizer gives the
  prompt's trailing space to the text's first token, so its characters do not say where the
  prompt ends.
- an input that fits one window gets the very row it gets without the option, hence the same
  vector; `truncate` and `truncation_direction` have no effect (nothing is cut).
- `tokens` (OpenAI's usage) counts every window's tokens, special tokens and each window's
  prompt included: what the model ran, as without windows and as /rerank's windows count.
- counters: `windowed` counts the inputs split into several windows, `truncated` stays 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from tokenizers import Encoding, Tokenizer

from heads.contract import HIDDEN_STATE_OUTPUTS
from heads.package import ModelPackage
from heads.rows import (
    EncodedTexts,
    InvalidInput,
    ModelRow,
    Outputs,
    Template,
    encode_texts,
    row,
    template,
    text_rows,
    windows,
)
from heads.tasks import TaskOptions

__all__ = [
    "EPS",
    "LAYER_OUTPUTS",
    "Features",
    "Job",
    "combine_layers",
    "features",
    "hidden_states",
    "pool_windows",
    "postprocess",
    "preprocess",
    "prompt",
    "shorten",
    "window_stride",
]

# Same floor as torch.nn.functional.normalize: an all-zero vector stays zero instead of NaN.
EPS = 1e-12
# pooling -> the output holding every layer's states pooled that way (training.export writes it).
LAYER_OUTPUTS = HIDDEN_STATE_OUTPUTS
COMBINE = ("concat", "sum", "mean")
# The share of a window's text tokens that the next window repeats (the module docstring has
# the measurement behind an eighth).
WINDOW_OVERLAP = 8


def preprocess(
    tokenizer: Tokenizer, texts: list[str], max_seq_length: int, truncate: bool = True
) -> EncodedTexts:
    """One row `[CLS] text [SEP]` per text; too long -> truncated (counted) or, with
    `truncate=False`, an InvalidInput."""
    _check_texts(texts)
    return encode_texts(tokenizer, list(texts), max_seq_length, truncate)


def _check_texts(texts: list[str]) -> None:
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise InvalidInput(f"inputs[{i}]: expected a string")


def postprocess(embeddings: np.ndarray, normalize: bool) -> np.ndarray:
    """(N, H) pooled embeddings -> (N, H) float32, L2-normalised when asked."""
    x = np.asarray(embeddings, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"embeddings must be (N, H), got {x.shape}")
    if not normalize:
        return x
    # The norm in float64: fp16 graphs can hand back values whose squares overflow float16/32.
    norms = np.linalg.norm(x.astype(np.float64), axis=-1, keepdims=True)
    return (x / np.maximum(norms, EPS)).astype(np.float32)


def shorten(vectors: np.ndarray, dimensions: int | None) -> np.ndarray:
    """(N, H) -> (N, dimensions): the first `dimensions` values of each vector, as a
    Matryoshka-trained model (and OpenAI's `dimensions`) means them; normalisation comes after,
    so a shortened vector is unit length again. InvalidInput past H."""
    if dimensions is None:
        return vectors
    if not 1 <= dimensions <= vectors.shape[1]:
        raise InvalidInput(
            f"dimensions must be between 1 and {vectors.shape[1]} (the model's embedding size)"
        )
    # a copy, not a view: the answer is serialised from its buffer (orjson needs it contiguous)
    return np.ascontiguousarray(vectors[:, :dimensions])


def window_stride(room: int) -> int:
    """Text tokens consecutive windows share when each holds `room` of them: an eighth
    (WINDOW_OVERLAP), 0 for windows of fewer than 8 tokens."""
    return room // WINDOW_OVERLAP


def prompt_tokens(prompt_ids: list[int], ids: list[int]) -> int:
    """How many of an input's first tokens `ids` (its prompt and text encoded together) are
    the prompt's: the ones the prompt alone (`prompt_ids`) also begins with. A token where the
    two differ, the prompt's last characters merged into the text's first token, is text."""
    n = 0
    for mine, theirs in zip(prompt_ids, ids, strict=False):
        if mine != theirs:
            break
        n += 1
    return n


def pool_windows(rows: np.ndarray, counts: list[int], weights: list[int]) -> np.ndarray:
    """(R, ...) the rows' outputs, `counts[i]` consecutive rows for input i -> (N, ...) one per
    input: the mean of its rows weighted by `weights` (each row's text tokens), in float64; an
    input of one row keeps that row's values as they are, so that it gets the same vector as
    without windows (w * v / w can round differently)."""
    n_rows = np.asarray(counts)
    starts = np.concatenate([[0], np.cumsum(n_rows)[:-1]]).astype(np.intp)
    pooled = rows[starts].astype(np.float32)  # each input's first row: one-row inputs done
    several = n_rows > 1
    w = np.asarray(weights, dtype=np.float64).reshape(-1, *([1] * (rows.ndim - 1)))
    total = np.add.reduceat(rows.astype(np.float64) * w, starts, axis=0)[several]
    pooled[several] = total / np.add.reduceat(w, starts, axis=0)[several]
    return pooled


def embedding_width(package: ModelPackage) -> int | None:
    """H of the package's `embeddings` output, when package.json states it."""
    for output in package.outputs:
        if output["name"] == "embeddings" and isinstance(output.get("shape", [None])[-1], int):
            return int(output["shape"][-1])
    return None


def hidden_states(outputs: list[dict[str, Any]]) -> int | None:
    """How many hidden states (L + 1) a package's outputs hold per pooling; None without."""
    shapes = {o["name"]: o.get("shape", []) for o in outputs}
    if not all(name in shapes for name in LAYER_OUTPUTS.values()):
        return None
    return int(shapes[LAYER_OUTPUTS["mean"]][1])


def check_layers(layers: list[int], n_states: int) -> list[int]:
    """Request indices -> indices into the n_states states; out of range is an InvalidInput."""
    bad = [i for i in layers if not -n_states <= i < n_states]
    if bad:
        raise InvalidInput(
            f"layers {bad} out of range: this model has {n_states} hidden states "
            f"(0 the embeddings output, {n_states - 1} or -1 the last layer)"
        )
    return [i % n_states for i in layers]


def combine_layers(states: np.ndarray, layers: list[int], combine: str) -> np.ndarray:
    """states (N, L + 1, H) -> (N, k H) the k chosen layers concatenated in request order, or
    (N, H) their sum or mean."""
    chosen = states[:, check_layers(layers, states.shape[1])]  # (N, k, H)
    if combine == "concat":
        return chosen.reshape(len(chosen), -1)
    if combine == "sum":
        return chosen.sum(axis=1)
    if combine == "mean":
        return chosen.mean(axis=1)
    raise ValueError(f"combine must be one of {COMBINE}, not {combine!r}")


def prompt(package: ModelPackage, name: str | None) -> str:
    """The text to put before each input: the prompt `name`, else the package's default one,
    else none (""). An unknown name is an InvalidInput naming the package's prompts."""
    if name is None:
        default = package.default_prompt_name
        return package.prompts[default] if default is not None else ""
    if not package.prompts:
        raise InvalidInput(
            f"prompt_name {name!r}: model {package.name!r} has no prompts (its "
            "sentence-transformers folder's config_sentence_transformers.json names none)"
        )
    if name not in package.prompts:
        raise InvalidInput(
            f"prompt_name {name!r} is not one of model {package.name!r}'s prompts: "
            f"{', '.join(package.prompts)}"
        )
    return package.prompts[name]


@dataclass(frozen=True)
class Features:
    """Which hidden states make the vector (Devlin et al. §5.3) instead of the package's own
    embedding output: `output` (one of LAYER_OUTPUTS' values), `layers`, `combine`."""

    output: str
    layers: list[int]
    combine: str


def features(
    package: ModelPackage,
    layers: list[int] | None = None,
    pooling: str | None = None,
    combine: str = "concat",
) -> Features | None:
    """A request's layers / pooling, checked against what the package exports; None for the
    package's own embedding output. InvalidInput when the package cannot serve them."""
    pooling = pooling or package.pooling or "mean"  # read_package checks it is set
    if layers is None and pooling == package.pooling:
        return None
    n_states = hidden_states(package.outputs)
    if n_states is None:
        raise InvalidInput(
            f"model {package.name!r} has no hidden-state outputs, so `layers` and a `pooling` "
            f"other than its own ({package.pooling}) cannot be served; export it with "
            "`python -m training.export --task embedding --hidden-states`"
        )
    layers = layers if layers is not None else [-1]
    check_layers(layers, n_states)  # before any compute
    if combine not in COMBINE:
        raise InvalidInput(f"combine must be one of {COMBINE}, not {combine!r}")
    if pooling not in LAYER_OUTPUTS:  # e.g. "splade": the package's own output, if anything
        raise InvalidInput(
            f"pooling {pooling!r}: the hidden states are pooled {' or '.join(LAYER_OUTPUTS)}"
        )
    return Features(LAYER_OUTPUTS[pooling], layers, combine)


class TextRows:
    """The rows of a job that embeds texts (dense here, sparse in heads.tasks.sparse): one row
    per text, `prompt` before each, cut to the window as the classifier cuts (or refused with
    truncate=False); with `windows`, a text over the window is several rows instead (the
    module docstring). After rows(), `truncated` counts the inputs cut, `windowed` those split
    into several windows, and `tokens` the tokens the rows took, the prompt's included
    (OpenAI's usage); `counts` and `weights` say how `pool_windows` pools the rows back into
    one vector per input (None: one row each)."""

    def __init__(
        self,
        package: ModelPackage,
        texts: list[str],
        truncate: bool,
        prompt: str,
        truncation_direction: str,
        windows: bool = False,
    ) -> None:
        _check_texts(texts)
        self.texts = [prompt + text for text in texts] if prompt else texts
        self.prompt, self.windows = prompt, windows
        self.package, self.max_seq_length = package, package.max_seq_length
        self.truncate, self.direction = truncate, truncation_direction
        self.truncated = self.windowed = self.tokens = 0
        self.counts: list[int] | None = None  # rows per input, once some input has several
        self.weights: list[int] = []  # text tokens per row: the weights of a windowed input

    def rows(self, tokenizer: Tokenizer, encodings: list[Encoding]) -> list[ModelRow]:
        if self.windows:
            sequences = self._windows(tokenizer, encodings)
        else:
            encoded = text_rows(
                template(tokenizer),
                self.texts,
                encodings,
                self.max_seq_length,
                self.truncate,
                self.direction,
            )
            self.truncated, sequences = encoded.truncated, encoded.sequences
        self.tokens = sum(len(row) for row in sequences)
        return sequences

    def _windows(self, tokenizer: Tokenizer, encodings: list[Encoding]) -> list[ModelRow]:
        """One row per input that fits the window (the row text_rows makes of it), windows of
        the others; sets `counts`, `weights` and `windowed`."""
        layout = template(tokenizer)
        fits = self.max_seq_length - layout.single.n_special  # tokens a row holds
        sequences: list[ModelRow] = []
        counts: list[int] = []
        self.weights = []
        prompt_ids: list[int] | None = None  # the prompt alone, encoded once a text needs it
        for i, encoding in enumerate(encodings):
            ids = encoding.ids
            if len(ids) <= fits:
                sequences.append(row(layout, ids))
                counts.append(1)
                self.weights.append(len(ids))
                continue
            head = 0
            if self.prompt:
                if prompt_ids is None:
                    prompt_ids = tokenizer.encode(self.prompt, add_special_tokens=False).ids
                head = prompt_tokens(prompt_ids, ids)
            made = self._cut(layout, i, ids[:head], ids[head:], fits - head)
            sequences += [r for r, _ in made]
            self.weights += [n for _, n in made]
            counts.append(len(made))
        self.windowed = sum(n > 1 for n in counts)
        self.counts = counts if self.windowed else None
        return sequences

    def _cut(
        self, layout: Template, i: int, head: list[int], text: list[int], room: int
    ) -> list[tuple[ModelRow, int]]:
        """Input i's windows: rows `head + a slice of text`, each with its text tokens."""
        if room < 1:
            raise InvalidInput(
                f"inputs[{i}]: its prompt is {len(head)} tokens, which leaves no room for text "
                f"in model {self.package.name!r}'s window of {self.max_seq_length} tokens, so it "
                "cannot be embedded by windows; use a shorter prompt (prompt_name) or leave "
                "windows off to truncate it"
            )
        spans = windows(len(text), room, window_stride(room))
        return [(row(layout, head + text[start:stop]), stop - start) for start, stop in spans]

    def windows_of(self, n_rows: int) -> tuple[list[int], list[int]]:
        """(rows per input, weight per row) of this job's n_rows outputs, for pool_windows."""
        if self.counts is None:
            return [1] * n_rows, [1] * n_rows
        return self.counts, self.weights

    def per_input(self, rows: np.ndarray) -> np.ndarray:
        """(R, ...) this job's row outputs -> (N, ...) one per input (pool_windows)."""
        return rows if self.counts is None else pool_windows(rows, self.counts, self.weights)


@dataclass(frozen=True, kw_only=True)
class Options(TaskOptions):
    """/embed's options: normalise (None: as the package does), truncate or refuse an input
    over the window (cut from `truncation_direction`), or embed it by `windows` instead (the
    module docstring), the hidden states to pool instead of the package's own output
    (`layers`, `pooling`, `combine`: `features`), the prompt (None: the package's default
    one), and the first `dimensions` values (Matryoshka)."""

    task = "embedding"

    normalize: bool | None = None
    truncate: bool = True
    layers: list[int] | None = None
    pooling: str | None = None
    combine: str = "concat"
    prompt_name: str | None = None
    truncation_direction: str = "right"
    dimensions: int | None = None
    windows: bool = False

    def job(self, package: ModelPackage, inputs: list[Any]) -> Job:
        return Job(package, inputs, self)


class Job(TextRows):
    """One /embed or /v1/embeddings request for a model's batcher: texts -> one row each ->
    (N, H) float32 vectors ((N, F) with layer `features`)."""

    def __init__(
        self, package: ModelPackage, texts: list[str], options: Options = Options()
    ) -> None:
        o = options
        self.features = features(package, o.layers, o.pooling, o.combine)
        start = prompt(package, o.prompt_name)
        if package.sparse:
            raise InvalidInput(
                f"model {package.name!r} answers sparse embeddings (pooling {package.pooling}): "
                "ask POST /embed_sparse"
            )
        super().__init__(package, texts, o.truncate, start, o.truncation_direction, o.windows)
        self.dimensions = o.dimensions
        width = (
            embedding_width(package) if o.dimensions is not None and self.features is None else None
        )
        if width is not None:  # a bad `dimensions` is a 422 before any compute
            shorten(np.zeros((0, width), dtype=np.float32), o.dimensions)
        self.normalize = package.normalize if o.normalize is None else o.normalize

    def answer(self, outputs: list[Outputs]) -> np.ndarray:
        if self.features is None:
            vectors = self.per_input(np.stack([out["embeddings"] for out in outputs]))
        else:
            f = self.features
            states = self.per_input(np.stack([out[f.output] for out in outputs]))  # (N, L + 1, H)
            vectors = combine_layers(states, f.layers, f.combine)
        return postprocess(shorten(vectors, self.dimensions), self.normalize)

    @staticmethod
    def answer_many(jobs: list[Job], outputs: list[list[Outputs]]) -> list[np.ndarray]:
        """The answers of several jobs of one model: the package's own embeddings are pooled
        (jobs with windowed inputs) and normalised in one call over all their rows (numpy's
        per-call overhead dominated the worker thread's time for single-text requests); layer
        features one job at a time."""
        together = [j for j, job in enumerate(jobs) if job.features is None]
        answers: list[np.ndarray | None] = [None] * len(jobs)
        groups: dict[tuple[bool, int | None], list[int]] = {}
        for j in together:
            groups.setdefault((jobs[j].normalize, jobs[j].dimensions), []).append(j)
        for (normalize, dimensions), js in groups.items():
            stacked = np.stack([out["embeddings"] for j in js for out in outputs[j]])
            inputs = [len(outputs[j]) for j in js]
            if any(jobs[j].counts is not None for j in js):  # windows: rows -> one per input
                layout = [jobs[j].windows_of(len(outputs[j])) for j in js]
                counts = [n for c, _ in layout for n in c]
                stacked = pool_windows(stacked, counts, [w for _, ws in layout for w in ws])
                inputs = [len(c) for c, _ in layout]
            vectors = postprocess(shorten(stacked, dimensions), normalize)  # (N, D)
            at = 0
            for j, n in zip(js, inputs, strict=True):
                answers[j] = vectors[at : at + n]
                at += n
        for j, job in enumerate(jobs):
            if answers[j] is None:
                answers[j] = job.answer(outputs[j])
        return answers  # type: ignore[return-value]
