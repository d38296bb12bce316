"""One way to declare a command line: a dataclass whose fields are its options.

    @dataclass
    class Args:
        out: Path = option(None, "output folder", required=True)
        lr: float = option(5e-5, "peak learning rate")

    args = parse(Args, argv, prog="python -m training.x", summary="Train x.",
                 examples=["python -m training.x --out runs/x"])

A field `max_seq_length` is the flag --max-seq-length, typed by its annotation (int, float, str,
Path; bool: a switch; list[T]: one or more values), its default shown after its one-line help;
option() passes any argparse keyword on (choices, required, metavar, type), `group` (or
in_group) sorts it under a heading, and `positional=True` makes it an argument without a flag. `--help` reads: the summary, one line per option, example commands.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import re
import types
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def duration(text: str) -> float:
    """'90' or '90s', '30m', '2h', '1h30m' -> seconds."""
    parts = re.fullmatch(
        r"\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*(?:(\d+(?:\.\d+)?)s?)?\s*", text
    )
    if not text.strip() or not parts or not any(parts.groups()):
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 90s, 30m, 2h or 1h30m")
    h, m, s = (float(g) if g else 0.0 for g in parts.groups())
    return 3600 * h + 60 * m + s


def option(default: Any, help: str, *, group: str | None = None, **argparse_kwargs: Any) -> Any:
    """A dataclass field that is also a --flag (see the module docstring)."""
    return dataclasses.field(
        default=default, metadata={"help": help, "group": group, **argparse_kwargs}
    )


def in_group(group: str) -> Callable[..., Any]:
    """option() with its heading set: `data = in_group("data")`, then `x: int = data(1, "...")`."""
    return functools.partial(option, group=group)


def _flag_kwargs(f: dataclasses.Field, annotation: Any) -> dict[str, Any]:
    meta = {k: v for k, v in f.metadata.items() if k not in ("group", "positional")}
    shown = f" (default {f.default})" if f.default is not None and f.default is not False else ""
    kwargs: dict[str, Any] = {"help": meta.pop("help") + shown, "default": f.default}
    # `int | None` -> int; `list[str] | None` -> list[str]
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    if annotation is bool:
        kwargs["action"] = "store_true"
    elif typing.get_origin(annotation) is list:
        kwargs.update(nargs="+", type=typing.get_args(annotation)[0])
    else:
        kwargs["type"] = annotation if annotation in (int, float, str, Path) else str
    return kwargs | meta


def make_parser(
    cls: type,
    *,
    prog: str,
    summary: str,
    examples: Sequence[str],
    skip: Sequence[str] = (),
    first: Sequence[str] = (),
) -> argparse.ArgumentParser:
    """The parser for dataclass `cls`: fields named in `first` lead, those in `skip` are left
    out; options with a `group` go under that heading, in order of first appearance."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=summary,
        epilog="example:\n" + "\n".join(f"  {e}" for e in examples),
        formatter_class=lambda prog: argparse.RawDescriptionHelpFormatter(
            prog, max_help_position=34
        ),
    )
    hints = typing.get_type_hints(cls)
    fields = [f for f in dataclasses.fields(cls) if f.name not in skip]
    fields.sort(key=lambda f: f.name not in first)
    groups: dict[str | None, Any] = {None: parser}
    for f in fields:
        name = f.metadata.get("group")
        if name not in groups:
            groups[name] = parser.add_argument_group(name)
        kwargs = _flag_kwargs(f, hints[f.name])
        if f.metadata.get("positional"):
            groups[name].add_argument(f.name, **kwargs)
        else:
            flag = "--" + f.name.replace("_", "-")
            groups[name].add_argument(flag, dest=f.name, **kwargs)
    return parser


def parse(cls: type[T], argv: Sequence[str] | None = None, **parser_kwargs: Any) -> T:
    """argv (default sys.argv) parsed into an instance of `cls`."""
    namespace = make_parser(cls, **parser_kwargs).parse_args(argv)
    return cls(**vars(namespace))


def as_args(cls: type[T], value: Any) -> T:
    """A dataclass instance (copied), an argparse.Namespace or a dict -> an instance of `cls`;
    an unknown name is a TypeError naming it."""
    if isinstance(value, cls):
        return dataclasses.replace(value)  # type: ignore[type-var]
    values = vars(value) if isinstance(value, argparse.Namespace) else dict(value)
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    if unknown := set(values) - known:
        raise TypeError(f"unknown arguments: {', '.join(sorted(unknown))}")
    return cls(**values)
