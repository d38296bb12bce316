"""Run the service (the command line; the server itself is service.server):

    python -m service --model-dir models --port 8080
    python -m service --help          # every setting, its env variable and its trade-off

The flags are generated from `service.settings.Settings`, so they cannot drift from the
environment variables; a flag wins over its BERT_HEADS_* variable.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Literal, get_args, get_origin

from pydantic import ValidationError

from service.server import serve
from service.settings import Settings
from service.workers import run_workers

METAVARS = {"payload_limit": "BYTES", "max_wait_ms": "MS", "cors_origins": "ORIGINS"}
METAVARS |= {"otlp_endpoint": "URL", "default_model": "TASK=NAME"}
METAVARS |= {name: "SECONDS" for name in ("request_timeout", "drain_timeout")}


# --help shows the settings most runs touch first, the rest under headings (each field once).
GROUPS: dict[str, tuple[str, ...]] = {
    "common": ("model_dir", "host", "port", "workers", "variant", "device", "api_key",
               "log_level"),
    "batching and limits": ("max_batch_tokens", "max_batch_size", "max_wait_ms",
                            "max_concurrent_requests", "max_client_batch_size", "payload_limit",
                            "max_text_chars", "request_timeout"),
    "CPU threads": ("intra_op_threads", "concurrent_batches", "intra_op_spinning"),
    "models and their updates": ("model_name", "default_model", "verify_sha256",
                                 "allow_partial", "model_control", "poll_interval", "admin_key"),
    "access and operations": ("api_keys_file", "metrics_public", "docs_public",
                              "cors_origins", "drain_timeout", "otlp_endpoint"),
}  # fmt: skip
EXAMPLES = """examples:
  python -m service --model-dir models --port 8080
  BERT_HEADS_API_KEY=secret python -m service --host 0.0.0.0 --workers 2
  python -m service --model-dir models/sst2 --variant int8 --log-level debug"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m service",
        usage="python -m service [--model-dir DIR] [--port PORT] [options]",
        description="Serve BERT-head model packages over HTTP (ONNX Runtime). Every option is "
        "also an environment variable; a flag wins over it.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    group_of = {name: title for title, names in GROUPS.items() for name in names}
    groups = {title: parser.add_argument_group(title) for title in GROUPS}
    for name, field in Settings.model_fields.items():
        default = field.get_default(call_default_factory=True)
        shown = (
            "unset"
            if default is None or default == {}
            else ",".join(default)
            if isinstance(default, list)
            else default
        )
        kwargs: dict = {
            "dest": name,
            "default": argparse.SUPPRESS,  # absent flags leave the environment in charge
            "help": f"{field.description} (env BERT_HEADS_{name.upper()}; default: {shown})",
        }
        if field.annotation is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif isinstance(default, dict):  # TASK=NAME, one per flag
            kwargs.update(action="append", metavar=METAVARS[name])
        elif get_origin(field.annotation) is Literal:
            kwargs["choices"] = get_args(field.annotation)
        else:
            kwargs["metavar"] = METAVARS.get(name, name.split("_")[-1].upper())
        groups[group_of[name]].add_argument("--" + name.replace("_", "-"), **kwargs)
    return parser


def parse_settings(argv: list[str] | None = None) -> Settings:
    parser = build_parser()
    overrides = vars(parser.parse_args(argv))
    try:
        return Settings(**overrides)
    except ValidationError as e:
        problems = "; ".join(
            f"--{str(err['loc'][0]).replace('_', '-')}: {err['msg']}" for err in e.errors()
        )
        parser.error(problems)


def main(argv: list[str] | None = None) -> None:
    settings = parse_settings(argv)
    if settings.workers > 1:
        logging.basicConfig(level=settings.log_level.upper(), stream=sys.stderr)
        sys.exit(run_workers(settings))
    serve(settings)


if __name__ == "__main__":
    main()
