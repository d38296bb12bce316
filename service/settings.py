"""Every knob of the service: `Settings`, one pydantic-settings class, whose engine part is
`EngineSettings` (what service.engine reads; no HTTP, no environment).

Each field is an environment variable `BERT_HEADS_<FIELD>` and a flag of `python -m service`
(`--max-batch-tokens`, generated from this class by `service.__main__`); a flag wins over the
environment. Each description says what the knob trades off.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Annotated, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from service.keys import parse_keys
from service.selection import check_defaults, parse_defaults

# What tracing (service.tracing) imports; checked with the setting, so that a missing package
# stops the start with the command that installs it.
OTEL_MODULES = ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http")

Variant = Literal["auto", "fp32", "int8", "fp16"]
Device = Literal["auto", "cpu", "cuda"]
LogLevel = Literal["critical", "error", "warning", "info", "debug"]


class EngineSettings(BaseModel):
    """What the engine reads (service.engine: models, batching, limits, ONNX Runtime, loading):
    no HTTP, no environment. `Settings`, the server's, is one with the HTTP knobs added and
    read from flags and BERT_HEADS_*; `Settings.engine()` is its engine part alone. The batch
    command and the Ray stage build one the same way."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Where and what to serve
    model_dir: Path = Field(
        default=Path("./models"),
        description="Folder of model packages (one sub-folder each, served under its name), "
        "or one package folder itself (KServe's /mnt/models); all are loaded at start-up.",
    )
    model_name: str | None = Field(
        default=None,
        description="When model_dir is one package folder: the name it is served under "
        "(KServe passes the InferenceService's); default the folder's name.",
    )
    default_model: Annotated[dict[str, str], NoDecode] = Field(
        default_factory=dict,
        description="TASK=NAME (repeat the flag, or comma-separate in the variable): the model "
        "a request that names none gets when several could answer it (tasks: classification, "
        "rerank, zero-shot, embedding, ...); beats a package's own default_for. Checked at "
        "start: NAME must be a package of model_dir that answers TASK.",
    )

    # Batching: throughput against latency and memory
    max_batch_tokens: int = Field(
        default=16384,
        ge=1,
        description="Token budget of one batch (rows x padded length): higher = more "
        "throughput per forward pass, more activation memory and a longer wait for the "
        "rows behind it.",
    )
    max_batch_size: int = Field(
        default=64,
        ge=1,
        description="Most rows in one batch, whatever their length: bounds the padded "
        "tensors when rows are short.",
    )
    max_wait_ms: float = Field(
        default=0.0,
        ge=0,
        description="How long a non-full batch waits for more rows; 0 starts it as soon as "
        "the runtime is free (lowest latency; batches still form under load).",
    )

    # Admission and request limits: protect the process from a single client
    max_concurrent_requests: int = Field(
        default=512,
        ge=1,
        description="Requests in flight before new ones get 429: higher absorbs bursts, "
        "lower keeps the queue (and so latency) short.",
    )
    max_client_batch_size: int = Field(
        default=64,
        ge=1,
        description="Most inputs in one request (more gets 413): bounds one client's share "
        "of a batch.",
    )
    max_text_chars: int = Field(
        default=20_000,
        ge=1,
        description="Longest text in characters (more gets 413): long texts are windowed "
        "(NER, QA) and each window costs a forward pass.",
    )
    request_timeout: float = Field(
        default=30.0,
        gt=0,
        description="Seconds a request may take end to end before it gets 503 timeout; "
        "its rows still queued are dropped before they cost compute.",
    )

    # Runtime
    intra_op_threads: int = Field(
        default=0,
        ge=0,
        description="ONNX Runtime threads per forward pass; 0 = its default (one per "
        "physical core). Lower it when several models or replicas share the cores.",
    )
    concurrent_batches: int = Field(
        default=0,
        ge=0,
        description="Batches one model may run at once on CPU, each on its share of the "
        "intra-op threads; 0 = one per thread (one per core unless intra_op_threads is set). "
        "A batch that runs alone still gets every thread. Above 1 the model is opened twice "
        "(memory x2): 1 runs one batch at a time in one session. Ignored on a GPU.",
    )
    intra_op_spinning: bool = Field(
        default=True,
        description="Let ONNX Runtime's threads busy-wait for the next parallel section "
        "while a batch runs (never between batches): on cores the server has to itself "
        "MiniLM answers ~1 ms sooner and serves 1.08-1.18x as much; turn it off when other "
        "processes share the cores (with one core taken, it served 0.77-0.89x as much).",
    )
    variant: Variant = Field(
        default="auto",
        description="Model file to run: auto = the package's preference for the provider in "
        "use; int8 is faster on CPU at a small accuracy cost, fp16 halves GPU memory.",
    )
    device: Device = Field(
        default="auto",
        description="Execution provider: auto uses CUDA when a GPU is really there, else CPU; "
        "cuda fails the package instead of falling back.",
    )

    # Loading and model control
    verify_sha256: bool = Field(
        default=True,
        description="Check every package file against its recorded sha256 at start-up: "
        "catches corrupt or tampered files, costs a read of each file.",
    )
    allow_partial: bool = Field(
        default=False,
        description="Report ready when some packages failed to load (the others serve); off "
        "keeps a half-broken replica out of the load balancer.",
    )
    model_control: Literal["none", "poll", "explicit"] = Field(
        default="none",
        description="none: the packages found at start; poll: follow model_dir (new, changed, "
        "removed folders); explicit: load/unload by POST with the admin key (Triton's modes).",
    )
    poll_interval: float = Field(
        default=5.0,
        gt=0,
        description="model_control poll: seconds between looks at model_dir; a folder loads "
        "once unchanged for one interval.",
    )
    drain_timeout: float = Field(
        default=30.0,
        ge=0,
        description="Seconds in-flight requests get to finish at shutdown; keep it below the "
        "orchestrator's grace period (Kubernetes: 30 s).",
    )

    @model_validator(mode="after")
    def _polling_verifies(self) -> Self:
        if self.model_control == "poll" and not self.verify_sha256:
            raise ValueError(
                "model_control poll needs verify_sha256: the hashes are what keep a "
                "half-copied package from loading"
            )
        return self

    @field_validator("default_model", mode="before")
    @classmethod
    def _parse_default_model(cls, value: object) -> object:
        return parse_defaults(value)

    @field_validator("default_model")
    @classmethod
    def _default_model_is_served(cls, value: dict[str, str], info: ValidationInfo) -> object:
        if value and "model_dir" in info.data:  # else model_dir's own error is the one to fix
            check_defaults(value, info.data["model_dir"], info.data.get("model_name"))
        return value


class Settings(BaseSettings, EngineSettings):
    model_config = SettingsConfigDict(env_prefix="BERT_HEADS_", extra="ignore", frozen=True)

    # Where to listen
    host: str = Field(
        default="127.0.0.1",
        description="Address to bind; 0.0.0.0 exposes the service beyond this machine.",
    )
    port: int = Field(default=8080, ge=0, le=65535, description="TCP port to listen on.")
    workers: int = Field(
        default=1,
        ge=1,
        description="Server processes sharing the port, each with its own event loop and "
        "sessions and, unless intra_op_threads is set, its share of the cores: more use a "
        "many-core host when one event loop is the limit; each holds every model again "
        "(memory x workers). /metrics sums them all. A worker that dies is replaced; 5 deaths "
        "of one within a minute stop the server.",
    )

    # Request bodies
    payload_limit: int = Field(
        default=2_000_000,
        ge=1,
        description="Largest request body in bytes (more gets 413 before it is read): "
        "bounds the memory one request can take.",
    )

    # Access and operations
    api_key: SecretStr | None = Field(
        default=None,
        description="When set, every route except the probes (/health, /ready, /v2/health/*, "
        "/v2) needs 'Authorization: Bearer <key>', /metrics and the docs too unless "
        "metrics_public / docs_public; several keys separated by commas are each accepted "
        "(rotation); unset or empty = open (put it behind a trusted network).",
    )
    api_keys_file: Path | None = Field(
        default=None,
        description="A file of inference keys, one per line (# comments), accepted beside "
        "api_key and read again within a second of a change: rotate keys without a restart.",
    )
    admin_key: SecretStr | None = Field(
        default=None,
        description="The key of POST /models/{name}/load and /unload (model_control explicit); "
        "never accepted for inference, nor an inference key here.",
    )
    metrics_public: bool = Field(
        default=False,
        description="Serve /metrics without the API key when one is set: a Prometheus that "
        "cannot send the key (pod annotations) scrapes it, and so can anyone who reaches the "
        "port (model names, traffic, latencies; no request content). Off: send the key "
        "(Prometheus authorization.credentials_file).",
    )
    docs_public: bool = Field(
        default=False,
        description="Serve /docs, /redoc and /openapi.json without the API key when one is "
        "set: a browser, which cannot send the key, opens the docs, and so can anyone who "
        "reaches the port (every endpoint and its limits). Off: clients that hold the key "
        "fetch /openapi.json with it.",
    )
    cors_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated origins allowed by CORS; empty = CORS off (browsers "
        "cannot call the API from another origin).",
    )
    log_level: LogLevel = Field(
        default="info", description="Log verbosity; debug logs every batch (noisy under load)."
    )
    otlp_endpoint: str | None = Field(
        default=None,
        description="OpenTelemetry collector's OTLP/HTTP URL (http://localhost:4318): a span "
        "per inference request, its stages as children, sent in batches off the event loop "
        "(event-loop CPU per request); unset = off, at no cost. Needs pip install "
        "'bert-heads[otel]'.",
    )

    def engine(self) -> EngineSettings:
        """The engine's part of these settings (already checked: not validated again)."""
        return EngineSettings.model_construct(
            **{n: getattr(self, n) for n in EngineSettings.model_fields}
        )

    @field_validator("api_key", "admin_key", mode="before")
    @classmethod
    def _empty_key_is_no_key(cls, value: object) -> object:
        # Compose and Kubernetes pass an unset variable as "": that must not become a key
        # nobody can send (every request would get 401).
        if value is None or (isinstance(value, str) and not value.strip()):
            return None
        return value

    @field_validator("api_keys_file")
    @classmethod
    def _keys_file_is_readable(cls, value: Path | None) -> Path | None:
        if value is not None and not os.access(value, os.R_OK):
            raise ValueError(f"{value}: no such file, or not readable")
        return value

    @field_validator("otlp_endpoint", mode="before")
    @classmethod
    def _otlp_endpoint(cls, value: object) -> object:
        if value is None or (isinstance(value, str) and not value.strip()):
            return None  # an unset variable passed as "" (see _empty_key_is_no_key)
        if isinstance(value, str) and not value.startswith(("http://", "https://")):
            raise ValueError("give the collector's http:// or https:// URL")
        missing = [m for m in OTEL_MODULES if not _installed(m)]
        if missing:
            raise ValueError(
                f"tracing needs the OpenTelemetry SDK ({', '.join(missing)} not installed): "
                "pip install 'bert-heads[otel]'"
            )
        return value

    @model_validator(mode="after")
    def _model_control_is_safe(self) -> Settings:
        if self.model_control == "explicit" and self.admin_key is None:
            raise ValueError("model_control explicit needs an admin_key (BERT_HEADS_ADMIN_KEY)")
        admin = parse_keys(self.admin_key.get_secret_value(), ",") if self.admin_key else set()
        keys = parse_keys(self.api_key.get_secret_value(), ",") if self.api_key else set()
        if admin & keys:
            raise ValueError("admin_key must not also be an inference key (api_key)")
        return self

    @field_validator("cors_origins", mode="before")
    @classmethod
    def _split_origins(cls, value: object) -> object:
        if isinstance(value, str):
            return [origin.strip() for origin in value.split(",") if origin.strip()]
        return value


def _installed(module: str) -> bool:
    """`module` can be imported (found without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False
