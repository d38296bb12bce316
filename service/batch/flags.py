"""Command-line values read as the endpoint's body field types, and each field's one line of
--help, from the body itself (service.schemas): a new field of a body is a new flag, typed and
described, with nothing to add here.

    parse_flag(EmbedRequest.model_fields["layers"].annotation, "-1,-2")   # [-1, -2]
    parse_flag(ClassifyRequest.model_fields["top_k"].annotation, "null")  # None
"""

from __future__ import annotations

import re
import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin


def flag_kind(annotation: Any) -> tuple[set[type], bool, bool]:
    """(the scalar types a field takes, whether it takes a list, whether it takes null), for
    reading a command-line value as the field's type."""
    scalars: set[type] = set()
    takes_list = takes_none = False

    def walk(t: Any) -> None:
        nonlocal takes_list, takes_none
        origin = get_origin(t)
        if origin is Annotated:
            walk(get_args(t)[0])
        elif origin in (Union, types.UnionType):
            for arg in get_args(t):
                walk(arg)
        elif origin is list:
            takes_list = True
            walk(get_args(t)[0])
        elif origin is Literal:
            scalars.update(type(v) for v in get_args(t))
        elif t is type(None):
            takes_none = True
        else:
            scalars.add(t)

    walk(annotation)
    return scalars, takes_list, takes_none


def parse_flag(annotation: Any, text: str) -> Any:
    """A command-line value as the field's type: "null" for None, a comma-separated list
    where the field takes a list, numbers where it takes numbers, else the text itself."""
    scalars, takes_list, takes_none = flag_kind(annotation)
    if takes_none and text == "null":
        return None

    def scalar(item: str) -> Any:
        if str not in scalars:
            for kind in (int, float):
                if kind in scalars:
                    try:
                        return kind(item)
                    except ValueError:
                        pass
        return item

    if takes_list and ("," in text or str not in scalars or not _takes_single(annotation)):
        return [scalar(item.strip()) for item in text.split(",") if item.strip()]
    return scalar(text)


def _takes_single(annotation: Any) -> bool:
    """The field takes a single (non-list) value too."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _takes_single(get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        return any(_takes_single(a) for a in get_args(annotation) if a is not type(None))
    return origin is not list


# Where a body field's description does not shorten into one line of --help.
SHORT = {
    "truncation_direction": "which end truncation cuts: right keeps the first tokens",
    "prompt_name": "one of the model's prompts, put before each text",
    "dimensions": "keep the first D values of each vector (Matryoshka)",
    "layers": "hidden states to read: -1 the last layer, 0 the embeddings",
    "function_to_apply": "softmax, sigmoid or none; null: as the problem type says",
    "multi_label": "score each label on its own",
    "allow_single_text": "score pairs with a model that reads single texts",
    "candidate_labels": "the labels to choose from, comma-separated",
    "aggregation_strategy": "how tokens group into entities",
    "classify.top_k": "labels per input, best first; null: all",
}


def short(task: str, name: str, description: str | None) -> str:
    """A field's description to its first sentence, without asides: one line of --help."""
    if f"{task}.{name}" in SHORT or name in SHORT:
        return SHORT.get(f"{task}.{name}", SHORT.get(name, ""))
    text = re.split(r"; |\. (?=[A-Z])", description or name.replace("_", " "))[0]
    text = re.sub(r" ?\([^)]*\)", "", text).rstrip(".")
    return text[:1].lower() + text[1:]


def metavar(annotation: Any) -> str:
    scalars, takes_list, takes_none = flag_kind(annotation)
    choices = literals(annotation)
    if choices:
        shown = "{" + ",".join(map(str, choices)) + (",null" if takes_none else "") + "}"
    else:
        shown = "N" if int in scalars else "X" if float in scalars else "TEXT"
    return f"{shown}[,...]" if takes_list else shown


def literals(annotation: Any) -> list[Any]:
    origin = get_origin(annotation)
    if origin is Literal:
        return list(dict.fromkeys(str(v).lower() for v in get_args(annotation)))
    return [v for a in get_args(annotation) for v in literals(a)]
