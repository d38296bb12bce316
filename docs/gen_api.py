"""The service's reference pages, made from its own declarations when the site is built, so that
they cannot drift from the code:

    python docs/gen_api.py api         # every route, from the FastAPI app's OpenAPI schema
    python docs/gen_api.py settings    # every setting: variable, flag, default, trade-off
    python docs/gen_api.py metrics     # every Prometheus series: type, labels, meaning

Nothing is loaded: `create_app` only declares the routes; the lifespan, which opens the
packages, never runs. docs/hooks.py puts `api` in as the page api-reference.md and replaces
`<!-- reference: settings -->` and `<!-- reference: metrics -->` lines of a page.
"""

from __future__ import annotations

import json
import re
import sys
import textwrap
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DIRECTIVE = re.compile(r"^<!-- reference: (\w+) -->$")


def openapi() -> dict[str, Any]:
    from service.app import create_app
    from service.settings import Settings

    schema: dict[str, Any] = create_app(Settings(model_dir=Path("models"))).openapi()
    return schema


# -- JSON schema -> words -----------------------------------------------------------------------


def type_of(schema: dict[str, Any]) -> str:
    """A JSON schema as a short type: `string or list of string`, `LabelScore`, `0-10000`."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        return f"[{name}](#{name.lower()})"
    if "anyOf" in schema:
        return " or ".join(dict.fromkeys(type_of(s) for s in schema["anyOf"]))
    if "enum" in schema:
        return " / ".join(f"`{v}`" for v in schema["enum"])
    if "const" in schema:
        return f"`{schema['const']}`"
    kind = schema.get("type")
    if kind == "array":
        if "prefixItems" in schema:
            return "[" + ", ".join(type_of(s) for s in schema["prefixItems"]) + "]"
        return "list of " + type_of(schema.get("items", {}))
    if kind == "object":
        extra = schema.get("additionalProperties")
        return f"object of {type_of(extra)}" if isinstance(extra, dict) else "object"
    if kind in ("integer", "number") and ("minimum" in schema or "maximum" in schema):
        low, high = schema.get("minimum"), schema.get("maximum")
        bounds = f"{_num(low) if low is not None else ''}-{_num(high) if high is not None else ''}"
        return f"{kind} ({bounds})"
    return {None: "any", "null": "null"}.get(kind, kind)


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def cell(text: str) -> str:
    """Text that can sit in a Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


def fields(schema: dict[str, Any]) -> list[str]:
    """A model's fields as table rows: name, type, default, meaning."""
    required = set(schema.get("required", []))
    rows = []
    for name, prop in schema.get("properties", {}).items():
        default = "required" if name in required else f"`{_default(prop.get('default'))}`"
        rows.append(
            f"| `{name}` | {cell(type_of(prop))} | {default} | {cell(prop.get('description', ''))} |"
        )
    return rows


def _default(value: Any) -> str:
    """A default as JSON writes it (null, true, [...]), a string as it is."""
    return value if isinstance(value, str) else json.dumps(value)


def referenced(schema: dict[str, Any]) -> set[str]:
    """The component schemas the routes use, directly or through another schema."""
    components = schema["components"]["schemas"]
    seen: set[str] = set()
    todo = re.findall(r'"#/components/schemas/(\w+)"', json.dumps(schema["paths"]))
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += re.findall(r'"#/components/schemas/(\w+)"', json.dumps(components[name]))
    return seen


FIELDS_HEADER = ["| field | type | default | meaning |", "|---|---|---|---|"]


def api() -> str:
    schema = openapi()
    components = schema["components"]["schemas"]
    out = [
        "# API reference",
        "",
        "Made from the service's OpenAPI schema when the site is built (`docs/gen_api.py`): every "
        "route, its body fields with their defaults, its answer and its error statuses. A running "
        "server shows the same at `/docs`. The [API guide](api.md) has an example of each.",
        "",
    ]
    by_tag: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for path, operations in schema["paths"].items():
        for method, op in operations.items():
            by_tag.setdefault(op.get("tags", ["other"])[0], []).append((method, path, op))
    for tag, ops in by_tag.items():
        out += [f"## {tag[:1].upper() + tag[1:]}", ""]
        for method, path, op in ops:
            out += [f"### `{method.upper()} {path}`", "", op.get("summary", "")]
            if op.get("description"):
                out += ["", " ".join(op["description"].split())]
            params = op.get("parameters", [])
            if params:
                out += ["", "| parameter | in | type | |", "|---|---|---|---|"]
                out += [
                    f"| `{p['name']}` | {p['in']} | {cell(type_of(p.get('schema', {})))} | "
                    f"{'required' if p.get('required') else 'optional'} |"
                    for p in params
                ]
            body = op.get("requestBody", {}).get("content", {}).get("application/json")
            if body:
                ref = body["schema"].get("$ref")
                model = components[ref.rsplit("/", 1)[1]] if ref else body["schema"]
                name = ref.rsplit("/", 1)[1] if ref else "JSON object"
                out += ["", f"Body: {name}", "", *FIELDS_HEADER, *fields(model)]
            answers = []
            for status, response in op.get("responses", {}).items():
                content = response.get("content", {})
                shape = next(iter(content.values()), {}).get("schema", {}) if content else {}
                what = type_of(shape) if shape else ""
                text = response.get("description", "")
                answers.append(
                    f"| {status} | {cell(what if status.startswith('2') else text)} |"
                    if what != "any" or not status.startswith("2")
                    else f"| {status} | {cell(text)} |"
                )
            out += ["", "| status | answer |", "|---|---|", *answers, ""]
    out += ["## Schemas", "", "The objects the routes take and answer.", ""]
    for name, model in components.items():
        if name not in referenced(schema) or "properties" not in model:
            continue
        out += [f"### {name}", ""]
        if model.get("description"):
            out += [" ".join(model["description"].split()), ""]
        out += [*FIELDS_HEADER, *fields(model), ""]
    return "\n".join(out)


def settings() -> str:
    """Every setting, in `python -m service --help`'s groups."""
    from service.__main__ import GROUPS
    from service.settings import Settings

    out = []
    for group, names in GROUPS.items():
        out += [f"**{group[:1].upper() + group[1:]}**", "",
                "| variable | flag | default | trade-off |", "|---|---|---|---|"]  # fmt: skip
        for name in names:
            field = Settings.model_fields[name]
            default = field.get_default(call_default_factory=True)
            shown = (  # as --help shows it
                "unset" if default is None or default == {}
                else ",".join(default) or "empty" if isinstance(default, list)
                else str(default).lower() if isinstance(default, bool)
                else str(default).removeprefix("./") if isinstance(default, Path)
                else str(default)
            )  # fmt: skip
            flag = "--" + name.replace("_", "-")
            out.append(
                f"| `BERT_HEADS_{name.upper()}` | `{flag}` | `{shown}` | "
                f"{cell(field.description or '')} |"
            )
        out.append("")
    listed = {name for names in GROUPS.values() for name in names}
    missing = sorted(set(Settings.model_fields) - listed)
    assert not missing, f"settings in no --help group (service/__main__.py GROUPS): {missing}"
    return "\n".join(out)


def metrics() -> str:
    """Every collector of service.metrics.Metrics, with the suffixes Prometheus exposes."""
    from prometheus_client import Counter, Gauge, Histogram

    from service.metrics import Metrics

    rows = ["| series | type | labels | meaning |", "|---|---|---|---|"]
    for collector in vars(Metrics()).values():
        if not isinstance(collector, Counter | Gauge | Histogram):
            continue
        [family] = collector.describe()
        name = family.name + ("_total" if family.type == "counter" else "")
        if family.type == "histogram":
            name += "_bucket / _sum / _count"
        labels = ", ".join(f"`{label}`" for label in collector._labelnames)
        rows.append(f"| `{name}` | {family.type} | {labels} | {cell(family.documentation)} |")
    return "\n".join(rows) + "\n"


REFERENCES = {"settings": settings, "metrics": metrics}


def expand(markdown: str) -> str:
    """`markdown` with each `<!-- reference: NAME -->` line replaced by that table."""
    out = []
    for line in markdown.splitlines():
        m = DIRECTIVE.match(line.strip())
        indent = line[: len(line) - len(line.lstrip())]
        out.append(textwrap.indent(REFERENCES[m.group(1)](), indent) if m else line)
    return "\n".join(out) + ("\n" if markdown.endswith("\n") else "")


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    what = sys.argv[1] if len(sys.argv) > 1 else "api"
    print({"api": api, **REFERENCES}[what]())
