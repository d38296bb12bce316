"""The Open Inference Protocol (KServe v2, Triton's HTTP/REST API) for every package: server and
model health, model metadata, and `POST /v2/models/{name}/infer`, through the same engine,
batcher, limits and API key as the native routes. Errors are the protocol's `{"error": "..."}`
with the native routes' status codes.

Tensors per task (text travels as BYTES, one element per input; answers with a structure as
JSON text in BYTES elements). `parameters` of the request take the native options:

| task | inputs | outputs | parameters |
|---|---|---|---|
| classification | `text` BYTES [N], optional `text_pair` BYTES [N] | `label` BYTES [N], `score` FP32 [N], `scores` FP32 [N, L] (labels in the metadata's order) | function_to_apply, truncate, truncation_direction |
| token-classification | `text` BYTES [N] | `entities` BYTES [N]: each a JSON list of /ner's entities | aggregation_strategy, ignore_labels, stride |
| question-answering | `question` BYTES [N], `context` BYTES [N] | `answer` BYTES [N], `score` FP32 [N], `start` INT64 [N], `end` INT64 [N] (no answer: "", 0, -1, -1) | max_answer_len, max_seq_len, doc_stride, handle_impossible_answer |
| embedding | `text` BYTES [N] | `embedding` FP32 [N, D] | normalize, truncate, truncation_direction, prompt_name, dimensions |
| embedding (SPLADE) | `text` BYTES [N] | `sparse` BYTES [N]: each a JSON list of {index, value} | truncate, truncation_direction, prompt_name |
| fill-mask | `text` BYTES [N] | `predictions` BYTES [N]: each the JSON of /fill-mask's answer | top_k, targets |

Inputs are BYTES of shape [N]; their `data` may be flat, or nested one level ([N, 1]
row-major); answers are flat. A request's `outputs` picks which outputs come back (all by
default). Not supported: the binary tensor data extension (`binary_data_size`) and shared
memory. The body is read by the native routes' parser (NaN, a key twice, bytes that are not
UTF-8: a 400 that says so) and its errors are counted in the same metrics.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from heads.package import ModelPackage
from service.engine import Call, Engine
from service.errors import ServiceError
from service.http import describe_validation, error_type_of
from service.lifecycle import RequestRecord
from service.registry import Entry, LoadedModel, Registry
from service.routes.deps import ApiKey, require_api_key
from service.routes.inference import parse
from service.schemas import (
    QA_TEXT,
    ClassifyRequest,
    EmbedAllRequest,
    EmbedRequest,
    FillMaskRequest,
    JsonInt,
    NerRequest,
    QaRequest,
    SparseEmbedRequest,
    TaskBody,
)

router = APIRouter(prefix="/v2", tags=["open inference protocol (v2)"])
open_router = APIRouter(prefix="/v2", tags=["open inference protocol (v2)"])


class _Strict(BaseModel):
    # JSON types as the schema says (no "3" for 3); fields the protocol may add are ignored
    model_config = ConfigDict(strict=True)


class Tensor(_Strict):
    name: str
    shape: list[JsonInt]
    datatype: str
    parameters: dict[str, Any] | None = None
    data: list[Any]  # checked with the model's inputs (_texts): its datatype first


class RequestedOutput(_Strict):
    name: str
    parameters: dict[str, Any] | None = None


class InferRequest(_Strict):
    id: str | None = None
    parameters: dict[str, Any] = Field(default_factory=dict)
    inputs: list[Tensor]
    outputs: list[RequestedOutput] | None = None


class V2ErrorBody(BaseModel):
    error: str


def _documented(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {status: {"model": V2ErrorBody, "description": WHY[status]} for status in statuses}


WHY = {
    400: "a request the protocol refuses: tensor names, shapes, datatypes, parameters",
    401: "missing or wrong API key",
    404: "no such model or version",
    413: "inputs or characters over the limits",
    422: "inputs the model cannot take (the native routes' 422)",
    429: "too many requests in flight; retry after Retry-After seconds",
    503: "not ready, shutting down, timed out, or the backend failed this batch",
}


def _inline(schema: dict[str, Any]) -> dict[str, Any]:
    """A pydantic JSON schema with its $defs put in place (the OpenAPI page shows it whole)."""
    defs = schema.pop("$defs", {})

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                return walk(defs[node["$ref"].rsplit("/", 1)[-1]])
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    return walk(schema)


class V2Error(ServiceError):
    """An error the protocol names by its status alone; its error_type, what the failure
    metrics count it as, is the native routes' name for that status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = V2_ERROR_TYPES.get(status) or error_type_of(status)


# The error_type of a V2Error (the native routes' names)
V2_ERROR_TYPES = {400: "bad_request", 404: "model_not_found", 503: "not_ready"}


# -- the mapping: one Task per package kind ----------------------------------------------------

Tensors = dict[str, tuple[str, list[int], list[Any]]]  # name -> (datatype, shape, flat data)


class Task:
    """How one kind of package speaks v2: its tensors, and its inference through the engine.
    The request's `parameters` are checked by the native route's schema (the same names, types
    and limits), as the `body` `infer` gets."""

    inputs: dict[str, bool]  # input name -> required
    outputs: dict[str, str]  # output name -> datatype
    parameters: tuple[str, ...]
    schema: type[TaskBody]  # the native body: the parameters' checks, and the task options

    def shapes(self, package: ModelPackage) -> dict[str, list[int]]:
        return {name: [-1] for name in self.outputs}

    def native(self, texts: dict[str, list[str]]) -> dict[str, Any]:
        """The native body's inputs for these tensors."""
        return {"inputs": texts["text"]}

    async def infer(self, engine: Engine, model: LoadedModel, body: Any, call: Call) -> Tensors:
        raise NotImplementedError


def _json(items: list[Any]) -> list[str]:
    # numpy arrays (a ColBERT model's token vectors) as lists
    return [json.dumps(item, ensure_ascii=False, default=lambda a: a.tolist()) for item in items]


class Classify(Task):
    inputs = {"text": True, "text_pair": False}
    outputs = {"label": "BYTES", "score": "FP32", "scores": "FP32"}
    parameters = ("function_to_apply", "truncate", "truncation_direction")
    schema = ClassifyRequest

    def shapes(self, package: ModelPackage) -> dict[str, list[int]]:
        return {"label": [-1], "score": [-1], "scores": [-1, len(package.labels or [])]}

    def native(self, texts: dict[str, list[str]]) -> dict[str, Any]:
        pairs = texts.get("text_pair")
        if pairs is None:
            return {"inputs": texts["text"]}
        return {"inputs": [[a, b] for a, b in zip(texts["text"], pairs, strict=True)]}

    async def infer(self, engine: Engine, model: LoadedModel, body: Any, call: Call) -> Tensors:
        inputs = [tuple(x) if isinstance(x, list) else x for x in body.inputs]
        options = body.options(top_k=None)  # every label's score
        ranked = await engine.answer(options, inputs, model=model.name, call=call)
        labels = model.package.labels or []
        order = {label: i for i, label in enumerate(labels)}
        scores = np.zeros((len(ranked), len(labels)), dtype=np.float32)
        for row, answer in zip(scores, ranked, strict=True):
            for item in answer:
                row[order[item["label"]]] = item["score"]
        n = len(ranked)
        return {
            "label": ("BYTES", [n], [a[0]["label"] for a in ranked]),
            "score": ("FP32", [n], [float(a[0]["score"]) for a in ranked]),
            "scores": ("FP32", [n, len(labels)], scores.ravel().tolist()),
        }


class Qa(Task):
    inputs = {"question": True, "context": True}
    outputs = {"answer": "BYTES", "score": "FP32", "start": "INT64", "end": "INT64"}
    parameters = ("max_answer_len", "max_seq_len", "doc_stride", "handle_impossible_answer")
    schema = QaRequest

    def native(self, texts: dict[str, list[str]]) -> dict[str, Any]:
        pairs = zip(texts["question"], texts["context"], strict=True)
        return {"inputs": [{"question": q, "context": c} for q, c in pairs]}

    async def infer(self, engine: Engine, model: LoadedModel, body: Any, call: Call) -> Tensors:
        pairs = [(x.question, x.context) for x in body.inputs]
        spans = await engine.answer(body.options(), pairs, model=model.name, call=call)
        best = [s or {"answer": "", "score": 0.0, "start": -1, "end": -1} for s in spans]
        n = len(best)
        return {
            "answer": ("BYTES", [n], [b["answer"] for b in best]),
            "score": ("FP32", [n], [float(b["score"]) for b in best]),
            "start": ("INT64", [n], [int(b["start"]) for b in best]),
            "end": ("INT64", [n], [int(b["end"]) for b in best]),
        }


class Embed(Task):
    inputs = {"text": True}
    outputs = {"embedding": "FP32"}
    parameters = ("normalize", "truncate", "truncation_direction", "prompt_name", "dimensions")
    schema = EmbedRequest

    def shapes(self, package: ModelPackage) -> dict[str, list[int]]:
        return {"embedding": [-1, -1]}

    async def infer(self, engine: Engine, model: LoadedModel, body: Any, call: Call) -> Tensors:
        found = await engine.answer(body.options(), body.inputs, model=model.name, call=call)
        vectors = np.asarray(found, np.float32)
        return {"embedding": ("FP32", list(vectors.shape), vectors.ravel().tolist())}


class JsonPerText(Task):
    """Texts in, per text the native route's answer as JSON text in one BYTES element (NER,
    SPLADE, fill-mask): the body's task options (its `parameters`, the rest their defaults)."""

    inputs = {"text": True}

    def __init__(self, output: str, parameters: tuple[str, ...], schema: type[TaskBody]) -> None:
        self.output = output
        self.outputs, self.parameters, self.schema = {output: "BYTES"}, parameters, schema

    async def infer(self, engine: Engine, model: LoadedModel, body: Any, call: Call) -> Tensors:
        found = await engine.answer(body.options(), body.inputs, model=model.name, call=call)
        return {self.output: ("BYTES", [len(found)], _json(found))}


# One Task per kind of package (they hold no state: the same one serves every request)
NER = JsonPerText("entities", ("aggregation_strategy", "ignore_labels", "stride"), NerRequest)
FILL_MASK = JsonPerText("predictions", ("top_k", "targets"), FillMaskRequest)
SPARSE = JsonPerText(
    "sparse", ("truncate", "truncation_direction", "prompt_name"), SparseEmbedRequest
)
TOKEN_VECTORS = JsonPerText(  # a ColBERT model's: a query's or a document's token vectors
    "token_embeddings", ("is_query", "return_tokens", "truncate"), EmbedAllRequest
)
TASKS: dict[str, Task] = {
    "classification": Classify(),
    "token-classification": NER,
    "question-answering": Qa(),
    "embedding": Embed(),
    "fill-mask": FILL_MASK,
    "late-interaction": TOKEN_VECTORS,
}


def task_of(package: ModelPackage) -> Task:
    if package.task == "embedding" and package.sparse:
        return SPARSE
    if package.task not in TASKS:  # an encoder: its adapters answer (heads.adapters)
        raise V2Error(400, f"model {package.name!r} is an encoder; infer with its adapters")
    return TASKS[package.task]


def infer_schema() -> dict[str, Any]:
    """InferRequest's JSON schema narrowed to what some model takes (a generated client or a
    fuzzer then sends those): the input and output names of every task, BYTES inputs of one
    dimension, and each parameter typed as its native route types it. Which of them one model
    takes is in its metadata (GET /v2/models/{name})."""
    schema = _inline(InferRequest.model_json_schema())
    tasks = [*TASKS.values(), SPARSE]
    inputs = schema["properties"]["inputs"]
    inputs["minItems"] = 1
    tensor = inputs["items"]["properties"]
    tensor["name"]["enum"] = sorted({name for t in tasks for name in t.inputs})
    tensor["datatype"]["enum"] = ["BYTES"]
    tensor["shape"].update(minItems=1, maxItems=1, description="[N]: N elements in data")
    tensor["shape"]["items"]["minimum"] = 1
    text = {"type": "string"}
    rows = {"type": "array", "items": text, "minItems": 1}
    tensor["data"] |= {"minItems": 1, "items": {"anyOf": [text, rows]}}
    qa_text = {"type": "string", **QA_TEXT}  # a question or context has a token to read
    inputs["items"] |= {
        "if": {"properties": {"name": {"enum": list(Qa.inputs)}}},
        "then": {"properties": {"data": {"items": {"anyOf": [qa_text, {"items": qa_text}]}}}},
    }
    [outputs, _] = schema["properties"]["outputs"]["anyOf"]  # a list, or null
    outputs["items"]["properties"]["name"]["enum"] = sorted({n for t in tasks for n in t.outputs})
    parameters = {name: {"type": "boolean"} for name in PROTOCOL_PARAMETERS}
    for t in tasks:
        native = _inline(t.schema.model_json_schema())["properties"]
        parameters |= {p: native[p] for p in t.parameters if p not in parameters}
    schema["properties"]["parameters"].update(properties=parameters, additionalProperties=False)
    return schema


# -- the routes --------------------------------------------------------------------------------


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _entry(registry: Registry, name: str, version: str | None) -> Entry:
    entry = registry.entry(name)
    if entry is None:
        raise V2Error(404, f"no model named {name!r}; GET /models lists the loaded ones")
    if version is not None and (entry.model is None or version != entry.model.version):
        raise V2Error(404, f"model {name!r} has no version {version!r}")
    return entry


@open_router.get("", summary="Server metadata")
async def server_metadata() -> JSONResponse:
    try:
        v = version("bert-heads")
    except PackageNotFoundError:
        v = "unknown"
    return JSONResponse({"name": "bert-heads", "version": v, "extensions": []})


@open_router.get("/health/live", summary="Server live")
async def server_live() -> JSONResponse:
    return JSONResponse({"live": True})


@open_router.get(
    "/health/ready",
    summary="Server ready (200), or not (503)",
    responses={503: {"description": "not ready"}},
)
async def server_ready(request: Request) -> JSONResponse:
    ok, _ = request.app.state.registry.readiness()
    return JSONResponse({"ready": ok}, status_code=200 if ok else 503)


def _both(path: str) -> list[str]:
    return [f"/models/{{name}}{path}", f"/models/{{name}}/versions/{{version}}{path}"]


async def _model_ready(request: Request, name: str, version: str | None = None) -> JSONResponse:
    try:
        entry = _entry(request.app.state.registry, name, version)
    except V2Error as e:
        return _error(e.status, e.message)
    ok = entry.state == "ready"
    return JSONResponse({"name": name, "ready": ok}, status_code=200 if ok else 503)


async def _model_metadata(request: Request, name: str, version: str | None = None) -> JSONResponse:
    try:
        entry = _entry(request.app.state.registry, name, version)
    except V2Error as e:
        return _error(e.status, e.message)
    if entry.model is None:
        return _error(503 if entry.state == "loading" else 404, f"model {name!r} is {entry.state}")
    package = entry.model.package
    try:
        task = task_of(package)
    except V2Error as e:
        return _error(e.status, e.message)
    shapes = task.shapes(package)
    return JSONResponse(
        {
            "name": name,
            "versions": [entry.model.version],
            "platform": "onnxruntime_onnx",
            "inputs": [{"name": n, "datatype": "BYTES", "shape": [-1]} for n in task.inputs],
            "outputs": [
                {"name": n, "datatype": dt, "shape": shapes[n]} for n, dt in task.outputs.items()
            ],
            "parameters": {
                "task": package.task,
                "labels": package.labels,
                "max_seq_length": package.max_seq_length,
                "optional_inputs": [n for n, required in task.inputs.items() if not required],
                "accepted_parameters": list(task.parameters),
            },
        }
    )


ROUTE = "/v2/models/{name}/infer"
# Request parameters of the protocol's extensions, not the model's: binary_data_output (Triton's
# client sends it true when no output is named) asks for binary outputs; they come as JSON.
PROTOCOL_PARAMETERS = frozenset({"binary_data_output"})
BINARY_UNSUPPORTED = (
    "the binary tensor data extension is not supported: send JSON data "
    "(tritonclient: set_data_from_numpy(..., binary_data=False))"
)


async def _infer(request: Request, name: str, version: str | None = None) -> JSONResponse:
    """The protocol's body and answer (`_answer`) in the lifecycle every inference request has
    (service.lifecycle): the native routes' timing headers, metrics (the model label: a
    registered model's name only) and spans, named after the route's template."""
    engine: Engine = request.app.state.engine
    record = RequestRecord(request.scope, ROUTE)
    call = record.call = engine.call(f"/v2/models/{name}/infer")
    try:
        try:
            response = await _answer(request, engine, call, record, name, version)
        except Exception as exc:  # the native routes' mapping: 4xx for what the caller can fix
            status, message, _, headers = record.fail(exc)
            response = _error(status, message)
            if headers:
                response.headers.update(headers)
        response.raw_headers.extend(record.answer_built(response.status_code))
    finally:
        record.finish(engine.metrics, request.app.state.tracing)
    return response


async def _answer(
    request: Request,
    engine: Engine,
    call: Call,
    record: RequestRecord,
    name: str,
    version: str | None,
) -> JSONResponse:
    """The answer to an infer request: its body read as the protocol says, the model's task
    through the engine with `call`, its outputs as tensors. The model it names is the one
    `record` counts the request under."""
    registry = engine.registry
    require_api_key(request)
    entry = _entry(registry, name, version)
    record.counted_as = entry.name, entry.task or ""
    if "inference-header-content-length" in request.headers:  # JSON, then binary tensors
        raise V2Error(400, BINARY_UNSUPPORTED)
    body = _parse(await request.body())
    model = registry.select(None, name, call.where)
    task = task_of(model.package)
    native = _native(task, _texts(body, task), body.parameters, model.package.task)
    outputs = await task.infer(engine, model, native, call)
    wanted = [o.name for o in body.outputs] if body.outputs else list(outputs)
    if unknown := [w for w in wanted if w not in outputs]:
        raise V2Error(400, f"no output {unknown[0]!r}; this model has {list(outputs)}")
    answer: dict[str, Any] = {"model_name": name, "model_version": model.version}
    if body.id is not None:
        answer["id"] = body.id
    answer["outputs"] = [
        {"name": w, "datatype": outputs[w][0], "shape": outputs[w][1], "data": outputs[w][2]}
        for w in wanted
    ]
    return JSONResponse(answer)


def _parse(raw: bytes) -> InferRequest:
    """The body, by the native routes' parser (service.routes.inference.parse: not UTF-8, not
    JSON, nested too deeply, NaN, a key twice, the fields' types), with the protocol's 400."""
    try:
        body: InferRequest = parse(InferRequest, raw, None)
    except ServiceError as exc:
        raise V2Error(400, exc.message) from None
    return body


def _texts(body: InferRequest, task: Task) -> dict[str, list[str]]:
    """Each input tensor's texts, checked against the model's inputs."""
    names = [t.name for t in body.inputs]
    twice = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if twice is not None:
        raise V2Error(400, f"input {twice!r} is given twice; send each input once")
    given = {t.name: t for t in body.inputs}
    if unknown := [n for n in given if n not in task.inputs]:
        raise V2Error(400, f"unexpected input {unknown[0]!r}; this model takes {list(task.inputs)}")
    if missing := [n for n, required in task.inputs.items() if required and n not in given]:
        raise V2Error(400, f"missing input {missing[0]!r}; this model takes {list(task.inputs)}")
    texts: dict[str, list[str]] = {}
    sizes: set[int] = set()
    for name, tensor in given.items():
        if tensor.datatype != "BYTES":
            raise V2Error(400, f"input {name!r} must be BYTES (text), not {tensor.datatype}")
        if (tensor.parameters or {}).get("binary_data_size") is not None:
            raise V2Error(400, BINARY_UNSUPPORTED)
        bad = next((i for i, x in enumerate(tensor.data) if not _text(x)), None)
        if bad is not None:
            raise V2Error(
                400,
                f"input {name!r}: element {bad} is not text: send strings (BYTES), or "
                "lists of strings for [N, 1]",
            )
        flat = _flatten(tensor.data)
        if int(np.prod(tensor.shape)) != len(flat) or len(tensor.shape) != 1:
            raise V2Error(
                400, f"input {name!r}: shape {tensor.shape} but {len(flat)} elements; send [N]"
            )
        for i, text in enumerate(flat):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:  # JSON "\ud800" without its pair: not Unicode text
                raise V2Error(
                    400,
                    f"input {name!r}: element {i} holds a lone UTF-16 surrogate; send "
                    "valid Unicode",
                ) from None
        texts[name] = flat
        sizes.add(len(flat))
    if len(sizes) > 1:
        raise V2Error(400, f"inputs {list(given)} must have the same number of elements")
    return texts


def _text(x: Any) -> bool:
    """A text element: a string, or strings nested one level ([N, 1] row-major)."""
    return (
        isinstance(x, str) or isinstance(x, list) and bool(x) and all(isinstance(y, str) for y in x)
    )


def _flatten(data: list[str | list[str]]) -> list[str]:
    return [y for x in data for y in (x if isinstance(x, list) else [x])]


def _native(task: Task, texts: dict[str, list[str]], params: dict[str, Any], kind: str) -> Any:
    """The native route's body for this request: its schema checks the parameters (the
    protocol's own, PROTOCOL_PARAMETERS, are not the model's)."""
    params = {k: v for k, v in params.items() if k not in PROTOCOL_PARAMETERS}
    if unknown := [p for p in params if p not in task.parameters]:
        raise V2Error(
            400,
            f"parameter {unknown[0]!r} is not one a {kind} model takes; these are: "
            f"{', '.join(task.parameters)}",
        )
    try:
        # as JSON, as the native routes parse theirs (strict: no "3" for 3)
        return task.schema.model_validate_json(json.dumps({**task.native(texts), **params}))
    except ValidationError as exc:
        errors = [dict(err) for err in exc.errors(include_url=False)]
        raise V2Error(400, describe_validation(errors)) from None


def _route(
    handler: Callable[..., Awaitable[JSONResponse]],
    method: str,
    suffix: str,
    summary: str,
    statuses: tuple[int, ...],
    body: dict[str, Any] | None = None,
) -> None:
    extra = None
    if body is not None:  # read by the handler itself, to answer the protocol's 400s
        extra = {
            "requestBody": {"required": True, "content": {"application/json": {"schema": body}}}
        }
    for path in _both(suffix):
        router.add_api_route(
            path, handler, methods=[method], summary=summary, responses=_documented(*statuses),
            # infer checks the key itself, so that a 401 is counted as its other errors are
            dependencies=[] if handler is _infer else [ApiKey], openapi_extra=extra,
        )  # fmt: skip


_route(_model_metadata, "GET", "", "Model metadata: inputs, outputs, versions", (401, 404, 503))
_route(_model_ready, "GET", "/ready", "Model ready (200), or not (503)", (401, 404, 503))
_route(
    _infer,
    "POST",
    "/infer",
    "Inference (docs/api.md, 'The Open Inference Protocol (v2)': each task's tensors)",
    (400, 401, 404, 413, 422, 429, 503),
    infer_schema(),
)
