"""Offline batch inference from the command line:

    python -m service.batch embed --model minilm-embedding --input examples/data/sentiment/train.tsv \\
        --text-column sentence --output out/embeddings
    python -m service.batch ner --model demo-ner --input news.jsonl --output out/ner --aggregation-strategy first
    python -m service.batch TASK --help     # the task's columns and the endpoint's options

Each task's options are its endpoint's body fields (service.schemas), checked by that body, so
a flag means what the field means over HTTP; the engine flags are the server's settings (and
their BERT_HEADS_* variables). Run the same command again after a stop: it continues from the
last part written.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from service.batch.flags import flag_kind, metavar, parse_flag, short
from service.batch.output import OutputError
from service.batch.read import FORMATS
from service.batch.read import InputError as ReadError
from service.batch.run import Plan, RunError, release_memory, run
from service.batch.tasks import TASKS, Task
from service.settings import Settings

EXAMPLES = """examples (after `make models`; the input files are the repository's examples/data):
  python -m service.batch embed --model minilm-embedding --input examples/data/sentiment/train.tsv --text-column sentence --output out/embeddings
  python -m service.batch classify --model demo-sentiment --input examples/data/sentiment/dev.tsv --text-column sentence --keep label --top-k null --output out/sentiment
  python -m service.batch embed --model minilm-embedding --input examples/data/topics/train.csv --output out/topics --ray --ray-actors 2
  python -m service.batch ner --help     # a task's columns, and its endpoint's options as flags"""

COLUMN_HELP = {
    "text": "the texts",
    "pair": "second texts: classify (a, b) pairs (NLI, paraphrase)",
    "question": "the questions",
    "context": "the contexts",
    "query": "the queries",
    "documents": "a document, or a list of them, per query",
}
# The engine: Settings fields a batch run uses, with a short help each (the full trade-off is
# in `python -m service --help`).
ENGINE = {
    "model_dir": "folder of model packages, or one package",
    "variant": "model file: auto, fp32, int8, fp16",
    "device": "auto (CUDA when there), cpu, cuda",
    "intra_op_threads": "ONNX Runtime threads per batch; 0: one per core",
    "concurrent_batches": "batches run at once on CPU; 0: one per thread",
    "intra_op_spinning": "threads busy-wait inside a batch; off on shared cores",
    "max_batch_tokens": "token budget of one batch (rows x padded length)",
    "max_batch_size": "most rows in one batch",
    "max_text_chars": "longest text; a longer one is a bad row (as a 413)",
    "verify_sha256": "check the package files' hashes at start",
}


class Formatter(argparse.RawDescriptionHelpFormatter):
    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=36, width=110)


def _task_parser(sub: Any, task: Task) -> None:
    p = sub.add_parser(
        task.name,
        help=f"as POST {task.endpoint}",
        description=f"Answer every row as POST {task.endpoint} answers it; write Parquet.",
        formatter_class=Formatter,
        epilog=EXAMPLES,
    )
    _files(p.add_argument_group("input and output"), task)
    _body(p.add_argument_group(f"options of POST {task.endpoint} (as its JSON body)"), task)
    _engine(p.add_argument_group("model and engine (as python -m service; env BERT_HEADS_*)"))
    _ray(p.add_argument_group("Ray (pip install 'bert-heads[ray]')"))
    p.set_defaults(task=task)


def _files(group: Any, task: Task) -> None:
    add = group.add_argument
    add(
        "--input",
        type=Path,
        required=True,
        metavar="FILE",
        help="Parquet, JSON Lines or CSV / TSV file (by its extension)",
    )
    add(
        "--output",
        type=Path,
        required=True,
        metavar="DIR",
        help="folder of Parquet parts; a stopped run continues in it",
    )
    add(
        "--format",
        choices=sorted(set(FORMATS.values())),
        help="the input's format, when its extension does not say",
    )
    for c in task.columns:
        add(
            f"--{c.role}-column",
            dest=f"column_{c.role}",
            metavar="NAME",
            default=c.default,
            help=f"column of {COLUMN_HELP[c.role]}"
            + (f" (default: {c.default})" if c.default else ""),
        )
    add("--output-column", metavar="NAME", help=f"the answer's column (default: {task.output})")
    add(
        "--keep",
        metavar="COL,...",
        default="",
        help="input columns copied beside the answer (an id)",
    )
    add(
        "--part-rows",
        type=int,
        default=10_000,
        metavar="N",
        help="rows per part: memory, and what a restart redoes (10000)",
    )
    add("--overwrite", action="store_true", help="start again when --output holds another run")
    add("--quiet", action="store_true", help="no progress line")  # fmt: skip


def _body(group: Any, task: Task) -> None:
    """A flag per body field the engine takes, its help from the field's description."""
    for name in task.option_fields():
        field = task.request.model_fields[name]
        default = field.get_default()
        shown = (
            "null"
            if default is None
            else str(default).lower()
            if isinstance(default, bool)
            else default
        )
        text = short(task.name, name, field.description)
        kwargs: dict[str, Any] = {
            "dest": f"option_{name}",
            "default": argparse.SUPPRESS,
            "help": text + (" (required)" if field.is_required() else f" (default: {shown})"),
        }
        if flag_kind(field.annotation)[0] == {bool}:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs |= {"metavar": metavar(field.annotation), "required": field.is_required()}
        group.add_argument("--" + name.replace("_", "-"), **kwargs)


def _engine(group: Any) -> None:
    group.add_argument(
        "--model", metavar="NAME", help="the package to use (model-dir/NAME only is loaded)"
    )
    for name, text in ENGINE.items():
        spec: dict[str, Any] = {
            "dest": f"setting_{name}",
            "default": argparse.SUPPRESS,
            "help": text,
        }
        if Settings.model_fields[name].annotation is bool:
            spec["action"] = argparse.BooleanOptionalAction
        else:
            spec["metavar"] = {"model_dir": "DIR", "variant": "NAME", "device": "NAME"}.get(
                name, "N"
            )
        group.add_argument("--" + name.replace("_", "-"), **spec)


def _ray(group: Any) -> None:
    group.add_argument(
        "--ray", action="store_true", help="run as a Ray Data job: actors on ray.init()'s cluster"
    )
    group.add_argument(
        "--ray-address", metavar="ADDR", help="the cluster (default: a local Ray on this machine)"
    )
    group.add_argument("--ray-actors", type=int, default=2, metavar="N",
                       help="actors, each with the model loaded once (2)")  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m service.batch",
        description="Offline batch inference: a Parquet / JSON Lines / CSV file in, Parquet "
        "out, with the HTTP server's engine, answers and options.",
        formatter_class=Formatter,
        epilog=EXAMPLES,
    )
    sub = parser.add_subparsers(title="tasks", metavar="TASK", required=True)
    for task in TASKS.values():
        _task_parser(sub, task)
    return parser


def _problems(e: ValidationError) -> str:
    """A validation error as the flags it is about: "--top-k: Input should be ..."."""
    return "; ".join(
        f"--{str(err['loc'][0]).replace('_', '-')}: {err['msg']}" for err in e.errors()
    )


def plan_and_settings(argv: list[str] | None = None) -> tuple[Plan, Settings, argparse.Namespace]:
    """The run the command line asks for, its options checked by the endpoint's body and its
    engine settings by Settings (a bad one: argparse's usage error, exit 2)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    task: Task = args.task
    given = {k.removeprefix("option_"): v for k, v in vars(args).items() if k.startswith("option_")}
    given = {
        name: parse_flag(task.request.model_fields[name].annotation, v) if isinstance(v, str) else v
        for name, v in given.items()
    }
    overrides = {
        k.removeprefix("setting_"): v for k, v in vars(args).items() if k.startswith("setting_")
    }
    try:
        options = task.options(given)
        settings = Settings(**overrides)
    except ValidationError as e:
        parser.error(_problems(e))
    columns = {c.role: getattr(args, f"column_{c.role}") for c in task.columns}
    keep = tuple(c for c in args.keep.split(",") if c)
    if clash := {"row", args.output_column or task.output} & set(keep):
        parser.error(f"--keep {sorted(clash)[0]}: the output has its own column of that name")
    if args.part_rows < 1:
        parser.error("--part-rows must be at least 1")
    plan = Plan(task, options, args.input, args.output,
                {role: name for role, name in columns.items() if name is not None}, keep,
                args.output_column, args.part_rows, args.format, args.model, args.overwrite,
                not args.quiet)  # fmt: skip
    return plan, settings, args


def main(argv: list[str] | None = None) -> int:
    plan, settings, args = plan_and_settings(argv)
    release_memory()
    logging.basicConfig(
        level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(message)s"
    )
    try:
        if args.ray:
            from service.batch.ray_stage import run_on_ray  # Ray only when asked for

            summary = run_on_ray(plan, settings, args.ray_address, args.ray_actors)
        else:
            summary = asyncio.run(run(plan, settings.engine()))
    except (ReadError, OutputError, RunError) as e:
        print(f"error: {e}", file=sys.stderr)  # noqa: T201
        return 2
    except KeyboardInterrupt:
        print("stopped: the parts written stay; run the same command to continue", file=sys.stderr)  # noqa: T201
        return 130
    print(summary.line(), file=sys.stderr)  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main())
