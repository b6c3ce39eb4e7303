"""The configuration reference, generated: every setting of :class:`fleetmedic.config.Settings`
with its type, bounds and default (read from the types) and what it does (read from the comments of
the shipped example, ``deploy/config/fleetmedic.yaml``).

``fleetmedic config reference --out docs/config-reference.md`` writes it; ``--check`` compares
instead and exits 1 when the file differs. The same types give the JSON Schema of the config
(:func:`config_json_schema`), which the Helm chart's ``values.schema.json`` holds under ``config``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from msgspec import inspect as mi

from fleetmedic.config import Settings, to_builtins

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "config" / "fleetmedic.yaml"
REFERENCE = ROOT / "docs" / "config-reference.md"
CHART_SCHEMA = ROOT / "deploy" / "helm" / "fleetmedic" / "values.schema.json"

_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_.\-]+|\"[^\"]*\"):(?:\s|$)(?P<rest>.*)$")


# --- the example's comments --------------------------------------------------------------------


def _split_comment(rest: str) -> tuple[str, str | None, int]:
    """A line's value part and its comment (None without one) and where the comment starts in ``rest``;
    a ``#`` inside quotes, or not after a space, is part of the value."""
    quote = ""
    for i, ch in enumerate(rest):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch == "#" and (i == 0 or rest[i - 1] in " \t"):
            return rest[:i].rstrip(), rest[i + 1:].strip(), i
    return rest.rstrip(), None, -1


def example_comments(text: str) -> dict[str, str]:
    """Setting path -> its description in the example: the comment on the key's line with the
    comment lines that continue it (aligned with it), after any comment lines just above the key at
    its own indentation. Keys inside list items are values, not settings, and are not read."""
    out: dict[str, str] = {}
    stack: list[tuple[int, str]] = []  # (indent, key) of the open mappings
    above: list[str] = []  # comment lines just above the next key
    last: str | None = None  # the key a continuation comment belongs to
    last_column = -1
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            above, last = [], None
            continue
        column = len(line) - len(line.lstrip())
        if stripped.startswith("#"):
            body = stripped[1:].strip()
            if last is not None and column == last_column:
                out[last] = f"{out[last]} {body}".strip()
            else:
                above.append(body)
                last = None
            continue
        if stripped.startswith("- "):
            above, last = [], None
            continue
        m = _KEY.match(line)
        if m is None:
            above, last = [], None
            continue
        indent = len(m["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        key = m["key"].strip('"')
        path = ".".join([k for _, k in stack] + [key])
        value, comment, at = _split_comment(m["rest"])
        text_ = " ".join([*above, comment or ""]).strip()
        if text_:
            out[path] = text_
        above = []
        last, last_column = (path, len(line) - len(m["rest"]) + at) if comment is not None else (None, -1)
        if not value:
            stack.append((indent, key))
    return out


# --- the types ---------------------------------------------------------------------------------


@dataclass
class Row:
    path: str
    type: str
    default: str
    description: str = ""


@dataclass
class Reference:
    rows: list[Row] = field(default_factory=list)
    comments: dict[str, str] = field(default_factory=dict)


def _number(v: float) -> str:
    return f"{int(v):,}" if float(v).is_integer() and abs(v) < 1e15 else f"{v:g}"


def _bounds(t: mi.IntType | mi.FloatType) -> str:
    parts = []
    if t.gt is not None:
        parts.append(f"> {_number(t.gt)}")
    if t.ge is not None:
        parts.append(f">= {_number(t.ge)}")
    if t.lt is not None:
        parts.append(f"< {_number(t.lt)}")
    if t.le is not None and t.le < 1e9:
        parts.append(f"<= {_number(t.le)}")
    return f" ({', '.join(parts)})" if parts else ""


def type_text(t: mi.Type) -> str:
    """A type as the reference shows it: ``float (> 0)``, ``up | down``, ``list of int``."""
    if isinstance(t, mi.BoolType):
        return "bool"
    if isinstance(t, mi.IntType):
        return "int" + _bounds(t)
    if isinstance(t, mi.FloatType):
        return "float" + _bounds(t)
    if isinstance(t, mi.StrType):
        return "string"
    if isinstance(t, mi.NoneType):
        return "null"
    if isinstance(t, mi.LiteralType):
        return " \\| ".join(str(v) for v in t.values)
    if isinstance(t, mi.UnionType):
        return " or ".join(type_text(x) for x in t.types)
    if isinstance(t, mi.ListType | mi.SetType | mi.FrozenSetType | mi.VarTupleType):
        return f"list of {type_text(t.item_type)}"
    if isinstance(t, mi.DictType):
        return f"map of {type_text(t.key_type)} to {type_text(t.value_type)}"
    if isinstance(t, mi.StructType):
        return "{" + ", ".join(f.name for f in t.fields) + "}"
    return type(t).__name__.removesuffix("Type").lower()


_REQUIRED = object()


def _default_text(value: Any) -> str:
    if value is _REQUIRED:
        return "(required)"
    text = json.dumps(value, separators=(", ", ": "), sort_keys=False)
    if len(text) > 80:
        text = text[:77] + "..."
    return "`" + text.replace("|", "\\|") + "`"


def _struct_of(t: mi.Type) -> mi.StructType | None:
    if isinstance(t, mi.StructType):
        return t
    if isinstance(t, mi.ListType | mi.DictType):
        inner = t.item_type if isinstance(t, mi.ListType) else t.value_type
        return inner if isinstance(inner, mi.StructType) else None
    return None


def _rows(t: mi.StructType, defaults: dict[str, Any], prefix: str, out: list[Row]) -> None:
    for f in t.fields:
        path = f"{prefix}{f.encode_name}"
        default = defaults.get(f.encode_name) if isinstance(defaults, dict) else None
        if isinstance(f.type, mi.StructType):
            _rows(f.type, default or {}, path + ".", out)
            continue
        out.append(Row(path, type_text(f.type), _default_text(default)))
        inner = _struct_of(f.type)
        if inner is not None:  # each entry of a list or map of sections: its fields and their defaults
            suffix = "[]." if isinstance(f.type, mi.ListType) else ".<name>."
            _rows(inner, _field_defaults(inner), path + suffix, out)


def _field_defaults(t: mi.StructType) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in t.fields:
        if f.default is not msgspec.NODEFAULT:
            out[f.encode_name] = to_builtins(f.default)
        elif f.default_factory is not msgspec.NODEFAULT:
            out[f.encode_name] = to_builtins(f.default_factory())
        else:
            out[f.encode_name] = _REQUIRED
    return out


def reference(example_text: str) -> Reference:
    """Every setting with its type, default and the example's description of it."""
    import yaml

    comments = example_comments(example_text)
    shipped = yaml.safe_load(example_text) or {}
    info = mi.type_info(Settings)
    assert isinstance(info, mi.StructType)
    rows: list[Row] = []
    defaults = to_builtins(Settings())
    _rows(info, defaults, "", rows)
    for row in rows:
        row.description = comments.get(row.path, "")
        here, default = _at(shipped, row.path), _at(defaults, row.path)
        if here is not _ABSENT and default is not _ABSENT and not isinstance(here, list | dict) and here != default:
            row.description += f" (the shipped example sets `{json.dumps(here)}`)"
    return Reference(rows, comments)


_ABSENT = object()


def _at(doc: Any, path: str) -> Any:
    for key in path.split("."):
        if not isinstance(doc, dict) or key not in doc:
            return _ABSENT
        doc = doc[key]
    return doc


def render(ref: Reference) -> str:
    """The reference as Markdown: one table per top-level section, each section opened by what the
    example says of it."""
    lines = [
        "# Configuration reference",
        "",
        "<!-- Generated by `fleetmedic config reference --out docs/config-reference.md` from the types in",
        "     fleetmedic/config/ and the comments of deploy/config/fleetmedic.yaml. Do not edit: change",
        "     those and regenerate (a test fails when this file is stale). -->",
        "",
        "Every setting of the config file, with its type, bounds and default, and what the commented",
        "example ([`deploy/config/fleetmedic.yaml`](../deploy/config/fleetmedic.yaml)) says of it. Durations",
        "are in seconds (`_s`), fractions in [0, 1]. `a[].b` is field `b` of each entry of the list `a`;",
        "`a.<name>.b` is field `b` of each entry of the map `a`. Any value can be overridden from the",
        "environment: `FLEETMEDIC__<SECTION>__<KEY>=value`. [`docs/tuning.md`](tuning.md) says which",
        "thresholds to tune, in what order, and how to measure them on your own data.",
        "",
    ]
    sections: dict[str, list[Row]] = {}
    for row in ref.rows:
        sections.setdefault(row.path.split(".", 1)[0], []).append(row)
    for section, rows in sections.items():
        lines += [f"## `{section}`", ""]
        if ref.comments.get(section):
            lines += [_cell(ref.comments[section]), ""]
        lines += ["| setting | type | default | what it does |", "|---|---|---|---|"]
        lines += [f"| `{r.path}` | {r.type} | {r.default} | {_cell(r.description)} |" for r in rows]
        lines.append("")
    return "\n".join(lines)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def config_json_schema() -> dict[str, Any]:
    """The JSON Schema of the config file, self-contained (``$defs`` inlined), every section closed
    to unknown keys: what the Helm chart's ``values.schema.json`` holds under ``config``. Every key
    is optional (the chart's ``config`` lists only the settings that differ from the defaults)."""
    from fleetmedic.config.names import NAMES  # what the names under a map or list field must be

    schema = msgspec.json.schema(Settings)
    defs = schema.get("$defs", {})
    for (section, name), names in NAMES.items():  # the loader's name checks, as the schema can say them
        node = defs.get(section.__name__, {}).get("properties", {}).get(name)
        if node is None or not names.known or names.valid is not None:
            continue
        if names.of == "keys" and node.get("type") == "object":
            node["propertyNames"] = {"enum": list(names.known)}
        elif names.of == "values" and node.get("type") == "array":
            node["items"] = {"enum": list(names.known)}

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                return inline(defs[node["$ref"].rsplit("/", 1)[1]])
            out = {k: inline(v) for k, v in node.items() if k not in ("title", "description", "default")}
            if out.get("type") == "object" and "properties" in out:
                out.setdefault("additionalProperties", False)
            return out
        if isinstance(node, list):
            return [inline(v) for v in node]
        return node

    root = inline({"$ref": schema["$ref"]}) if "$ref" in schema else inline(schema)
    assert isinstance(root, dict)
    return root


def chart_schema_text(current: str) -> str:
    """The chart's ``values.schema.json`` (``current``) with its ``config`` property replaced by
    :func:`config_json_schema`, as it is committed (two-space indent, a final newline)."""
    doc = json.loads(current)
    if not isinstance(doc, dict) or not isinstance(doc.get("properties"), dict):
        raise ValueError("expected a JSON Schema object with `properties`")
    old = doc["properties"].get("config", {})
    new = config_json_schema()
    if isinstance(old, dict) and old.get("description"):
        new = {"description": old["description"], **new}
    port = new["properties"]["metrics"]["properties"]["port"]
    port["minimum"] = 1  # the pods' metrics port is a containerPort: 0 (an ephemeral port) cannot be scraped
    doc["properties"]["config"] = new
    return json.dumps(doc, indent=2) + "\n"
