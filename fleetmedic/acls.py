"""The Kafka ACLs each component of fleetmedic needs, as data and as ``kafka-acls`` commands.

One source for three uses: ``fleetmedic kafka acls`` prints the commands for a config,
docs/operations.md lists them for the default config (a test keeps the two equal), and the tests run
the same commands against the dev cluster with the authorizer on and check that each component's
principal can do its job, and no more (tests/services/test_kafka_acls.py).

A component is what runs under one principal:

- ``detect``: stage-1 workers (``fleetmedic worker --role detect``);
- ``decide``: the decision worker (``--role decide``; ``--role all`` needs both grants);
- ``executor``: ``fleetmedic executor``;
- ``connector``: the exporters (``fleetmedic exporter ...``: NVML, Prometheus, InfiniBand, logs,
  Kafka telemetry);
- ``watch-jobs``: ``fleetmedic watch-jobs``;
- ``ctl``: ``fleetmedic ctl`` (operator commands, the audit log);
- ``subscriber``: a system that follows the decisions (a scheduler, ticketing, dashboards).

Each grant is one ``kafka-acls --add`` command: operations on literal topic names and consumer
groups. Workers also get ``Create`` on the topics they make at start (:func:`fleetmedic.streams.app.ensure_topics`,
and Faust's ``<group>-__assignor-__leader``); without it, create the topics beforehand as an admin
and keep ``Describe``. No component uses transactions, so no transactional id is granted; an
idempotent producer needs only ``Write`` on a topic (Kafka 3.0 and later, KIP-679).

Pure: names come from the settings and :mod:`fleetmedic.bus`.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from fleetmedic.bus import (
    COMPONENTS,
    INTERNAL_TOPICS,
    TOPICS,
    detect_group,
    topics_of,
)
from fleetmedic.config import Settings

DEFAULT_PRINCIPAL_PREFIX: Final = "User:fleetmedic-"
DEFAULT_SUBSCRIBER_GROUP: Final = "fleetmedic-subscriber"
TOOL: Final = "kafka-acls.sh"

TITLES: Final[dict[str, str]] = {
    "detect": "stage-1 workers (`fleetmedic worker --role detect`)",
    "decide": "the decision worker (`fleetmedic worker --role decide`; `--role all` needs both workers' grants)",
    "executor": "the executor (`fleetmedic executor`)",
    "connector": "connectors (`fleetmedic exporter ...`)",
    "watch-jobs": "the job and node watcher (`fleetmedic watch-jobs`)",
    "ctl": "operators (`fleetmedic ctl`)",
    "subscriber": "subscribers (schedulers, ticketing, dashboards: read-only)",
}


@dataclass(frozen=True)
class Grant:
    """Allow ``operations`` on every topic of ``topics`` and every group of ``groups`` (one command)."""

    operations: tuple[str, ...]
    topics: tuple[str, ...]
    groups: tuple[str, ...] = ()
    why: str = ""


@dataclass(frozen=True)
class Component:
    name: str
    title: str
    grants: tuple[Grant, ...]


def faust_leader_topic(settings: Settings) -> str:
    """The topic Faust's leader assignor creates for the decision worker's group."""
    return f"{settings.kafka.consumer_group}-__assignor-__leader"


def pipeline_topics(settings: Settings) -> tuple[str, ...]:
    """Every topic a worker creates at start when it is missing."""
    return (*(settings.topics.topic(t.name) for t in TOPICS), *(t.name(settings) for t in INTERNAL_TOPICS))


def _unique(names: Sequence[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(names))


#: each component's consumer group (none: it reads without one)
def _groups(settings: Settings, subscriber_group: str) -> dict[str, tuple[str, ...]]:
    group = settings.kafka.consumer_group
    return {"detect": (detect_group(settings),), "decide": (group,), "executor": (f"{group}-executor",),
            "subscriber": (subscriber_group,)}


#: why each component reads and writes what it does (the comment above its command)
WHY: Final[dict[tuple[str, str], str]] = {
    ("detect", "read"): "telemetry in its consumer group; its node state when assigned",
    ("detect", "write"): "findings, node summaries for the decision stage, its node state, dead letters",
    ("decide", "read"): "its inputs in its consumer group; at start its snapshot, tick log, and the commands and "
                        "audit records already sent (so none is sent twice)",
    ("decide", "write"): "incidents, signed commands, the audit log, its snapshots and ticks, dead letters",
    ("executor", "read"): "commands, in its consumer group",
    ("executor", "write"): "results; commands it cannot read",
    ("connector", "write"): "telemetry, kernel events, job failures from logs, what it cannot map",
    ("watch-jobs", "write"): "job events, node observations, findings from node conditions",
    ("ctl", "write"): "signed operator commands",
    ("ctl", "read"): "`ctl audit`, `ctl get` (no consumer group)",
    ("subscriber", "read"): "findings, the decisions, dead letters, in the subscriber's own consumer group",
}


def components(settings: Settings, subscriber_group: str = DEFAULT_SUBSCRIBER_GROUP) -> tuple[Component, ...]:
    """What each component reads, writes and creates, for ``settings``' topic names and groups: the
    reads and writes as the topic tables of :mod:`fleetmedic.bus` name them; the workers also create
    the topics they need, and the decision worker reads and creates Faust's leader topic."""
    read, write, create = ("Read", "Describe"), ("Write", "Describe"), ("Create", "Describe")
    groups = _groups(settings, subscriber_group)
    created = pipeline_topics(settings)
    ex = settings.exporters
    sources = [Grant(read, _unique(cfg.topics), (cfg.group_id,), f"`exporters.{name}.topics`, its consumer group")
               for name, cfg in (("kafka", ex.kafka), ("logs", ex.logs)) if cfg.topics]
    leader = (faust_leader_topic(settings),)
    out = []
    for name in COMPONENTS:
        reads = (*topics_of(settings, name, "read"), *(leader if name == "decide" else ()))
        grants = [Grant(read, reads, groups.get(name, ()), WHY[name, "read"])] if reads else []
        if writes := topics_of(settings, name, "write"):
            grants.append(Grant(write, writes, why=WHY[name, "write"]))
        if name == "detect":
            grants.append(Grant(create, created, why="the topics it creates at start when missing"))
        elif name == "decide":
            grants.append(Grant(create, (*created, *leader),
                                why="the topics it creates at start when missing, and Faust's leader topic"))
        elif name == "connector":
            grants.extend(sources)
        out.append(Component(name, TITLES[name], tuple(grants)))
    return tuple(out)


def principals(prefix: str = DEFAULT_PRINCIPAL_PREFIX, overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """``{component: principal}``: ``<prefix><component>`` unless ``overrides`` names one."""
    unknown = set(overrides or {}) - set(COMPONENTS)
    if unknown:
        raise ValueError(f"unknown component(s) {', '.join(sorted(unknown))} (known: {', '.join(COMPONENTS)})")
    found = {c: f"{prefix}{c}" for c in COMPONENTS} | dict(overrides or {})
    for c, p in found.items():
        kind, sep, name = p.partition(":")
        if not sep or not kind or not name:
            raise ValueError(f"principal of {c}: {p!r} is not TYPE:NAME (e.g. User:fleetmedic-{c})")
    return found


def argv(grant: Grant, principal: str, bootstrap: str, command_config: str) -> list[str]:
    """One ``kafka-acls.sh --add`` command line for ``grant``."""
    out = [TOOL, "--bootstrap-server", bootstrap]
    if command_config:
        out += ["--command-config", command_config]
    out += ["--add", "--allow-principal", principal]
    for op in grant.operations:
        out += ["--operation", op]
    for topic in grant.topics:
        out += ["--topic", topic]
    for group in grant.groups:
        out += ["--group", group]
    return out


def commands(settings: Settings, principal_of: Mapping[str, str], bootstrap: str = "$KAFKA",
             command_config: str = "admin.properties", subscriber_group: str = DEFAULT_SUBSCRIBER_GROUP,
             only: Sequence[str] = COMPONENTS) -> list[tuple[Component, list[list[str]]]]:
    """Per component (of ``only``), its ``kafka-acls`` command lines."""
    return [(c, [argv(g, principal_of[c.name], bootstrap, command_config) for g in c.grants])
            for c in components(settings, subscriber_group) if c.name in only]


def _line(args: list[str], width: int = 96) -> str:
    """A command as shell text: the connection and the principal on the first line, then the
    operations and resources, continued with ``\\``."""
    words: list[str] = []  # an option with its value is one word
    i = 1
    while i < len(args):
        if args[i] != "--add" and i + 1 < len(args):
            value = args[i + 1] if args[i + 1].startswith("$") else shlex.quote(args[i + 1])
            words.append(f"{args[i]} {value}")
            i += 2
        else:
            words.append(args[i])
            i += 1
    split = words.index("--add") + 2
    lines = [" ".join([args[0], *words[:split]])]
    rest: list[str] = []
    for w in words[split:]:
        if rest and len(rest[-1]) + 1 + len(w) <= width:
            rest[-1] += " " + w
        else:
            rest.append(w)
    return " \\\n    ".join(lines + rest)


def script(settings: Settings, principal_of: Mapping[str, str], bootstrap: str = "$KAFKA",
           command_config: str = "admin.properties", subscriber_group: str = DEFAULT_SUBSCRIBER_GROUP) -> str:
    """The commands as a shell script: per component a comment naming it, then its commands."""
    out: list[str] = []
    for c, lines in commands(settings, principal_of, bootstrap, command_config, subscriber_group):
        out.append(f"# {c.name}: {c.title.replace('`', '')} as {principal_of[c.name]}")
        for g, line in zip(c.grants, lines, strict=True):
            out.append(f"#   {g.why.replace('`', '')}")
            out.append(_line(line))
    return "\n".join(out) + "\n"
