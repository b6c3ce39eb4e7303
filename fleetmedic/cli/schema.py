"""``fleetmedic schema``: write (or check) one JSON Schema per wire record type, and with
``--asyncapi FILE`` the AsyncAPI 3.0 document of every topic (``deploy/asyncapi.yaml``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import msgspec
import yaml

from fleetmedic import __version__
from fleetmedic.bus import DEFAULT_PREFIX, TOPICS, TopicSpec
from fleetmedic.cli.common import examples
from fleetmedic.signing import KEY_ID, KEY_ID_HEADER, SIGNATURE_HEADER, SIGNATURE_PREFIX, SIGNED_TOPICS

KAFKA_BINDING = "0.5.0"


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


def _op_id(action: str, topic: TopicSpec) -> str:
    return f"{action}-{topic.name}"


def render_asyncapi() -> str:
    """The AsyncAPI 3.0 document (YAML) of every topic in :data:`~fleetmedic.bus.TOPICS`: one channel
    per topic (default prefix), its message with the value schema, the Kafka key, the signature
    headers where the topic is signed, and a send and a receive operation naming the producers and
    consumers. The schemas are the same msgspec schemas as ``deploy/schemas/`` (inlined)."""
    _, schemas = msgspec.json.schema_components([t.value for t in TOPICS],
                                                ref_template="#/components/schemas/{name}")
    signed_headers = {
        "type": "object",
        "required": [SIGNATURE_HEADER, KEY_ID_HEADER],
        "properties": {
            SIGNATURE_HEADER: {
                "type": "string",
                "pattern": f"^{SIGNATURE_PREFIX}[0-9a-f]{{64}}$",
                "description": "HMAC-SHA256 of the record's value bytes exactly as received, hex "
                               "(verify before decoding; see fleetmedic/signing.py)",
            },
            KEY_ID_HEADER: {"type": "string", "pattern": f"^{KEY_ID.pattern}$",
                            "description": "id of the key that signed the record (keys rotate: "
                                           "verifiers hold a set of keys by id)"},
        },
    }
    channels: dict[str, object] = {}
    messages: dict[str, object] = {}
    operations: dict[str, object] = {}
    for t in TOPICS:
        name = t.value.__name__
        message: dict[str, object] = {
            "name": name,
            "title": name,
            "summary": " ".join((t.value.__doc__ or "").split()),
            "contentType": "application/json",
            "payload": {"$ref": f"#/components/schemas/{name}"},
            "externalDocs": {"url": f"https://fleetmedic.io/schemas/{t.schema_file}",
                             "description": f"JSON Schema (deploy/schemas/{t.schema_file})"},
            "bindings": {"kafka": {"key": {"type": "string", "description": t.key},
                                   "bindingVersion": KAFKA_BINDING}},
        }
        if t.name in SIGNED_TOPICS:
            message["headers"] = signed_headers
        messages[name] = message
        binding: dict[str, object] = {"topic": DEFAULT_PREFIX + t.name}
        if t.single_partition:
            binding["partitions"] = 1
        if t.compacted:
            binding["topicConfiguration"] = {"cleanup.policy": ["compact"]}
        binding["bindingVersion"] = KAFKA_BINDING
        channels[t.name] = {
            "address": DEFAULT_PREFIX + t.name,
            "title": t.name,
            "description": f"Key: {t.key}. Partitioning: {t.partitioning}.",
            "messages": {name: {"$ref": f"#/components/messages/{name}"}},
            "bindings": {"kafka": binding},
        }
        for action, who in (("send", t.producers), ("receive", t.consumers)):
            operations[_op_id(action, t)] = {
                "action": action,
                "channel": {"$ref": f"#/channels/{t.name}"},
                "summary": ("produced by " if action == "send" else "consumed by ") + who,
                "messages": [{"$ref": f"#/channels/{t.name}/messages/{name}"}],
            }
    doc = {
        "asyncapi": "3.0.0",
        "info": {
            "title": "fleetmedic topics",
            "version": __version__,
            "description": (
                "Every Kafka topic fleetmedic reads or writes (generated from fleetmedic/bus.py by "
                "`fleetmedic schema --asyncapi deploy/asyncapi.yaml`; do not edit). Topic names are "
                f"`<prefix><name>` with a configurable prefix (default `{DEFAULT_PREFIX}`). Values are "
                "JSON; records on " + ", ".join(f"`{n}`" for n in sorted(SIGNED_TOPICS)) + " carry the "
                f"`{SIGNATURE_HEADER}` and `{KEY_ID_HEADER}` headers (docs/operations.md, "
                "\"Subscribing from another system\")."
            ),
        },
        "defaultContentType": "application/json",
        "servers": {
            "kafka": {"host": "{bootstrap}", "protocol": "kafka",
                      "description": "the brokers of `kafka.bootstrap_servers`",
                      "variables": {"bootstrap": {"default": "localhost:9092"}}},
        },
        "channels": channels,
        "operations": operations,
        "components": {"messages": messages, "schemas": schemas},
    }
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=100)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    schema = sub.add_parser("schema", help="write the JSON Schema of every topic's messages",
                            epilog=examples("fleetmedic schema --out deploy/schemas --asyncapi deploy/asyncapi.yaml",
                                            "fleetmedic schema --check --out deploy/schemas "
                                            "--asyncapi deploy/asyncapi.yaml"))
    schema.add_argument("--out", default="deploy/schemas", help="directory (default: deploy/schemas)")
    schema.add_argument("--asyncapi", metavar="FILE", default="",
                        help="also write (or --check) the AsyncAPI 3.0 document of every topic to FILE "
                             "(deploy/asyncapi.yaml)")
    schema.add_argument("--check", action="store_true", help="exit 1 if the files in --out (or --asyncapi) are stale")
    schema.set_defaults(handler=run_schema)


def run_schema(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if args.check:
        stale = [str(out / name) for name in stale_schemas(out)]
        if args.asyncapi and not asyncapi_is_current(Path(args.asyncapi)):
            stale.append(args.asyncapi)
        for path in stale:
            print(f"stale: {path}", file=sys.stderr)
        return 1 if stale else 0
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.schema.json"):
        old.unlink()
    for name, text in render_schemas().items():
        (out / name).write_text(text, encoding="utf-8")
        print(out / name)
    if args.asyncapi:
        Path(args.asyncapi).write_text(render_asyncapi(), encoding="utf-8")
        print(args.asyncapi)
    return 0


def asyncapi_is_current(path: Path) -> bool:
    return path.is_file() and path.read_text(encoding="utf-8") == render_asyncapi()
