"""``fleetmedic schema``: write (or check) one JSON Schema per wire record type."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import msgspec

from fleetmedic.bus import TOPICS


def render_schemas() -> dict[str, str]:
    """File name -> JSON Schema text for every topic's value type."""
    out: dict[str, str] = {}
    for topic in TOPICS:
        schema = msgspec.json.schema(topic.value)
        schema["$id"] = f"https://fleetmedic.io/schemas/{topic.schema_file}"
        schema["title"] = topic.value.__name__
        schema["description"] = (
            f"Value of topic `{topic.name}` (key: {topic.key}). "
            + " ".join((topic.value.__doc__ or "").split())
        )
        out[topic.schema_file] = json.dumps(schema, indent=2, sort_keys=True) + "\n"
    return out


def stale_schemas(directory: Path) -> list[str]:
    """Names of schema files in ``directory`` that are missing, different, or no longer generated."""
    wanted = render_schemas()
    stale = [
        name
        for name, text in wanted.items()
        if not (directory / name).is_file() or (directory / name).read_text(encoding="utf-8") != text
    ]
    if directory.is_dir():
        stale += sorted(p.name for p in directory.glob("*.schema.json") if p.name not in wanted)
    return stale


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    schema = sub.add_parser("schema", help="write the JSON Schema of every topic's messages")
    schema.add_argument("--out", default="deploy/schemas", help="directory (default: deploy/schemas)")
    schema.add_argument("--check", action="store_true", help="exit 1 if the files in --out are stale")
    schema.set_defaults(handler=run_schema)


def run_schema(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if args.check:
        stale = stale_schemas(out)
        for name in stale:
            print(f"stale: {out / name}", file=sys.stderr)
        return 1 if stale else 0
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.schema.json"):
        old.unlink()
    for name, text in render_schemas().items():
        (out / name).write_text(text, encoding="utf-8")
        print(out / name)
    return 0
