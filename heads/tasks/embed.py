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
    encode_texts,
    template,
    text_rows,
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
    "postprocess",
    "preprocess",
    "prompt",
    "shorten",
]

# Same floor as torch.nn.functional.normalize: an all-zero vector stays zero instead of NaN.
EPS = 1e-12
# pooling -> the output holding every layer's states pooled that way (training.export writes it).
LAYER_OUTPUTS = HIDDEN_STATE_OUTPUTS
COMBINE = ("concat", "sum", "mean")


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
    truncate=False). After rows(), `truncated` counts the inputs cut and `tokens` the tokens
    the rows took, the prompt's included (OpenAI's usage)."""

    windowed = 0

    def __init__(
        self,
        package: ModelPackage,
        texts: list[str],
        truncate: bool,
        prompt: str,
        truncation_direction: str,
    ) -> None:
        _check_texts(texts)
        self.texts = [prompt + text for text in texts] if prompt else texts
        self.max_seq_length = package.max_seq_length
        self.truncate, self.direction = truncate, truncation_direction
        self.truncated = self.tokens = 0

    def rows(self, tokenizer: Tokenizer, encodings: list[Encoding]) -> list[ModelRow]:
        encoded = text_rows(
            template(tokenizer),
            self.texts,
            encodings,
            self.max_seq_length,
            self.truncate,
            self.direction,
        )
        self.truncated = encoded.truncated
        self.tokens = sum(len(row) for row in encoded.sequences)
        return encoded.sequences


@dataclass(frozen=True, kw_only=True)
class Options(TaskOptions):
    """/embed's options: normalise (None: as the package does), truncate or refuse an input
    over the window (cut from `truncation_direction`), the hidden states to pool instead of
    the package's own output (`layers`, `pooling`, `combine`: `features`), the prompt (None:
    the package's default one), and the first `dimensions` values (Matryoshka)."""

    task = "embedding"

    normalize: bool | None = None
    truncate: bool = True
    layers: list[int] | None = None
    pooling: str | None = None
    combine: str = "concat"
    prompt_name: str | None = None
    truncation_direction: str = "right"
    dimensions: int | None = None

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
        super().__init__(package, texts, o.truncate, start, o.truncation_direction)
        self.dimensions = o.dimensions
        width = (
            embedding_width(package) if o.dimensions is not None and self.features is None else None
        )
        if width is not None:  # a bad `dimensions` is a 422 before any compute
            shorten(np.zeros((0, width), dtype=np.float32), o.dimensions)
        self.normalize = package.normalize if o.normalize is None else o.normalize

    def answer(self, outputs: list[Outputs]) -> np.ndarray:
        if self.features is None:
            vectors = np.stack([out["embeddings"] for out in outputs])
        else:
            f = self.features
            states = np.stack([out[f.output] for out in outputs])  # (N, L + 1, H)
            vectors = combine_layers(states, f.layers, f.combine)
        return postprocess(shorten(vectors, self.dimensions), self.normalize)

    @staticmethod
    def answer_many(jobs: list[Job], outputs: list[list[Outputs]]) -> list[np.ndarray]:
        """The answers of several jobs of one model: the package's own embeddings are
        normalised in one call over all their rows (numpy's per-call overhead dominated the
        worker thread's time for single-text requests); layer features one job at a time."""
        together = [j for j, job in enumerate(jobs) if job.features is None]
        answers: list[np.ndarray | None] = [None] * len(jobs)
        groups: dict[tuple[bool, int | None], list[int]] = {}
        for j in together:
            groups.setdefault((jobs[j].normalize, jobs[j].dimensions), []).append(j)
        for (normalize, dimensions), js in groups.items():
            stacked = np.stack([out["embeddings"] for j in js for out in outputs[j]])
            vectors = postprocess(shorten(stacked, dimensions), normalize)  # (N, D)
            at = 0
            for j in js:
                answers[j] = vectors[at : at + len(outputs[j])]
                at += len(outputs[j])
        for j, job in enumerate(jobs):
            if answers[j] is None:
                answers[j] = job.answer(outputs[j])
        return answers  # type: ignore[return-value]
