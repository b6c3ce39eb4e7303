"""``fleetmedic ctl get nodes|incidents|breaker``: what the decision stage holds, and why.

Read from the decision stage's own output topics, the contract every subscriber sees (no access to
its state store is needed):

- nodes: ``remediation.audit`` folded per node: the lifecycle state of its last state change
  (``state_to``) and since when, the incident it is held for, whether safety refuses its isolation
  now (a ``blocked`` record after its last state change), and the last decision about it with its
  explanation (the why). Only nodes that are not healthy unless ``--all``.
- incidents: ``incidents``, the latest update of each incident: class, status, severity,
  confidence, suspects, jobs, summary. Open and mitigating ones unless ``--all``.
- breaker: ``remediation.audit``'s ``breaker_tripped``/``breaker_resumed`` records: open or
  closed, since when, by which rule or whom; the isolation budget of the latest decision that
  recorded it; the nodes whose isolation is refused now.

Each reads its topic from the beginning up to its end at the start (the audit log is one
partition, ordered), prints a table, or with ``--json`` one JSON document. Exit 1 when the broker
cannot be reached (one line saying why), 2 for an invalid config, 3 when the topic does not exist.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

import msgspec

from fleetmedic.cli.common import (
    EXIT_INVALID,
    EXIT_KAFKA,
    examples,
    kafka_failure,
    quiet_kafka_logs,
    settings_or_none,
)
from fleetmedic.config import Settings
from fleetmedic.records import AuditRecord, Incident, InvalidRecord, decode

R = TypeVar("R", AuditRecord, Incident)

#: the order nodes are listed in: the ones that need a person first
STATE_ORDER = ("repair_needed", "quarantined", "diagnosing", "suspect", "probation", "healthy")
ACTIVE_INCIDENTS = ("open", "mitigating")
EXIT_NO_TOPIC = 3


class TopicMissing(Exception):
    """The topic does not exist on this broker (nothing has written to it)."""


def add_parser(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    g = verbs.add_parser("get", help="show what the decision stage holds and why: nodes, incidents, the breaker",
                         description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                         epilog=examples("fleetmedic ctl get nodes", "fleetmedic ctl get incidents --all",
                                         "fleetmedic ctl get breaker --json"))
    what = g.add_subparsers(dest="what", metavar="WHAT", required=True)
    for name, text in (("nodes", "nodes fleetmedic holds (not healthy), their state, incident and why"),
                       ("incidents", "open and mitigating incidents: class, suspects, confidence, summary"),
                       ("breaker", "the circuit breaker (open or closed, why), the budget, refused isolations")):
        w = what.add_parser(name, help=text, description=text,
                            epilog=examples(f"fleetmedic ctl get {name}", f"fleetmedic ctl get {name} --json"))
        w.add_argument("--config", metavar="FILE", help="YAML config (defaults when omitted)")
        w.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
        if name != "breaker":
            w.add_argument("--all", action="store_true", help="healthy nodes too" if name == "nodes"
                           else "resolved and dismissed incidents too")
        if name == "nodes":
            w.add_argument("--node", metavar="NAME", help="only this node (shown whatever its state)")
        w.set_defaults(handler=run_get)


# --- folding the records ----------------------------------------------------------------------------


@dataclass
class NodeView:
    node: str
    state: str | None = None  # None: no lifecycle change recorded (only decisions about it)
    since: float | None = None
    incident_id: str = ""
    incident_class: str = ""
    refused: bool = False  # safety refuses its isolation now
    decision: str = ""  # the last decision about it
    why: str = ""  # that decision's explanation
    actor: str = ""
    at: float = 0.0  # when
    dry_run: bool = False


def fold_nodes(records: Iterable[AuditRecord]) -> dict[str, NodeView]:
    """Per node, its state and the last decision about it (records in log order; repeats of one
    id, rebuilt after a restart, count once)."""
    seen: set[str] = set()
    nodes: dict[str, NodeView] = {}
    for rec in records:
        if not rec.node or rec.id in seen:
            continue
        seen.add(rec.id)
        view = nodes.setdefault(rec.node, NodeView(rec.node))
        if rec.state_to is not None:
            view.state, view.since, view.refused = rec.state_to, rec.ts, False
            if rec.state_to == "healthy":
                view.incident_id = view.incident_class = ""
        if rec.decision == "blocked":
            view.refused = True
        if rec.incident_id and view.state != "healthy":
            if rec.incident_id != view.incident_id:
                view.incident_id, view.incident_class = rec.incident_id, ""
            view.incident_class = rec.incident_class or view.incident_class
        view.decision, view.why, view.actor, view.at, view.dry_run = (rec.decision, rec.explanation, rec.actor,
                                                                       rec.ts, rec.dry_run)
    return nodes


def held(nodes: dict[str, NodeView], everything: bool = False, node: str | None = None) -> list[NodeView]:
    """The nodes to show, the ones that need a person first."""
    if node:
        return [nodes[node]] if node in nodes else []
    shown = [v for v in nodes.values() if everything or v.refused or v.state not in (None, "healthy")]
    return sorted(shown, key=lambda v: (STATE_ORDER.index(v.state) if v.state in STATE_ORDER else len(STATE_ORDER),
                                        v.node))


def fold_incidents(records: Iterable[Incident]) -> dict[str, Incident]:
    """The latest update of each incident (the topic is one partition, in order)."""
    latest: dict[str, Incident] = {}
    for inc in records:
        latest[inc.id] = inc
    return latest


@dataclass
class BreakerView:
    open: bool = False
    since: float | None = None
    why: str = ""  # the trip's or the resume's explanation
    actor: str = ""
    trips: int = 0
    budget: dict[str, Any] | None = None  # the latest BudgetSnapshot recorded with a decision
    budget_at: float | None = None
    refused: list[str] = field(default_factory=list)  # nodes whose isolation is refused now


def fold_breaker(records: Sequence[AuditRecord]) -> BreakerView:
    view = BreakerView()
    seen: set[str] = set()
    for rec in records:
        if rec.id in seen:
            continue
        seen.add(rec.id)
        if rec.decision in ("breaker_tripped", "breaker_resumed"):
            view.open = rec.decision == "breaker_tripped"
            view.trips += view.open
            view.since, view.why, view.actor = rec.ts, rec.explanation, rec.actor
        if rec.budget is not None:
            view.budget, view.budget_at = msgspec.to_builtins(rec.budget), rec.ts
            if view.since is None or rec.ts >= view.since:
                view.open = rec.budget.breaker_open  # the engine's own word at its latest decision
    view.refused = sorted(v.node for v in fold_nodes(records).values() if v.refused)
    return view


# --- output -------------------------------------------------------------------------------------------


def _when(ts: float | None, now: float) -> str:
    if ts is None:
        return "-"
    age = max(0.0, now - ts)
    ago = (f"{age:.0f}s" if age < 120 else f"{age / 60:.0f}m" if age < 7200 else f"{age / 3600:.1f}h"
           if age < 172800 else f"{age / 86400:.1f}d")
    return f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(ts))} ({ago} ago)"


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """Columns padded to their widest cell; the last one is left as long as it is."""
    rows = [list(header), *[list(r) for r in rows]]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header) - 1)]
    return "\n".join("  ".join([*(c.ljust(w) for c, w in zip(r, widths, strict=False)), r[-1]]).rstrip()
                     for r in rows)


def format_nodes(views: list[NodeView], now: float) -> str:
    if not views:
        return "no node is held: every node fleetmedic has decided about is healthy"
    return table(("NODE", "STATE", "SINCE", "INCIDENT", "CLASS", "LAST DECISION", "WHY"), (
        (v.node, (v.state or "-") + (" (refused)" if v.refused else ""), _when(v.since, now), v.incident_id or "-",
         v.incident_class or "-", v.decision + (" (dry run)" if v.dry_run else ""), f"{v.actor}: {v.why}")
        for v in views))


def format_incidents(incidents: list[Incident], now: float) -> str:
    if not incidents:
        return "no open incident"
    header = ("INCIDENT", "CLASS", "STATUS", "SEVERITY", "CONFIDENCE", "SUSPECTS", "JOBS", "LAST SEEN", "SUMMARY")
    return table(header, (
        (i.id, i.incident_class, i.status, i.severity, f"{i.confidence:.2f}",
         ",".join(f"{s.kind}:{s.name}" for s in i.suspects) or "-", ",".join(i.jobs) or "-",
         _when(i.last_seen or i.first_seen, now), i.summary or f"{len(i.evidence)} pieces of evidence")
        for i in incidents))


def format_breaker(view: BreakerView, now: float) -> str:
    lines = [f"breaker:  {'OPEN' if view.open else 'closed'}"
             + (f" since {_when(view.since, now)}" if view.since is not None else " (never tripped)")]
    if view.why:
        lines.append(f"why:      {view.actor}: {view.why}")
    lines.append(f"trips:    {view.trips}")
    if view.budget:
        b = view.budget
        lines.append(f"budget:   {b['held']}/{b['max_held']} held on preventive or uncertain evidence, "
                     f"{b['new_in_window']}/{b['max_new_in_window']} new in the window, fleet of {b['fleet_size']} "
                     f"(recorded {_when(view.budget_at, now)})")
    lines.append(f"refused:  {', '.join(view.refused) if view.refused else 'none'}"
                 + (" (isolation refused by safety: they stay schedulable)" if view.refused else ""))
    return "\n".join(lines)


# --- reading the topics ---------------------------------------------------------------------------------


async def read_topic(settings: Settings, name: str, kind: type[R], timeout: float = 30.0) -> list[R]:
    """Every record of topic ``name`` from its beginning to its end at the start, in order per
    partition; undecodable ones are named on stderr and skipped."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from fleetmedic.bus import client_options
    from fleetmedic.streams.replay import read_ranges

    topic = settings.topics.topic(name)
    consumer = AIOKafkaConsumer(**client_options(settings.kafka), group_id=None, enable_auto_commit=False)
    try:
        await consumer.start()
        # what consumer.topics() asks, keeping the partitions (partitions_for_topic knows only the
        # topics the client follows)
        found = (await consumer._client.fetch_all_metadata()).partitions_for_topic(topic)
        if not found:
            raise TopicMissing(f"topic {topic} does not exist on {settings.kafka.bootstrap_servers}: "
                               "has the decision stage run against this broker and topics.prefix?")
        tps = [TopicPartition(topic, p) for p in sorted(found)]
        end = await consumer.end_offsets(tps)
    finally:
        await consumer.stop()
    out: list[R] = []
    for tp, msgs in sorted((await read_ranges(settings, {tp: (0, end[tp]) for tp in tps}, timeout)).items()):
        for msg in msgs:
            try:
                out.append(decode(kind, msg.value))
            except InvalidRecord as exc:
                print(f"{topic} partition {tp.partition} offset {msg.offset}: {exc}", file=sys.stderr)
    return out


def run_get(args: argparse.Namespace) -> int:
    settings = settings_or_none(args.config)
    if settings is None:
        return EXIT_INVALID
    topic = "incidents" if args.what == "incidents" else "remediation.audit"
    try:
        with quiet_kafka_logs():
            records: list[Any] = asyncio.run(read_topic(settings, topic, Incident if topic == "incidents"
                                                        else AuditRecord))
    except TopicMissing as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_NO_TOPIC
    except Exception as exc:
        why = kafka_failure(exc, settings.kafka)
        if why is None:
            raise
        print(f"error: could not read {settings.topics.topic(topic)} from Kafka: {why}", file=sys.stderr)
        return EXIT_KAFKA
    now = time.time()
    if args.what == "nodes":
        views = held(fold_nodes(records), args.all, args.node)
        print(json.dumps([asdict(v) for v in views], indent=2) if args.json else format_nodes(views, now))
    elif args.what == "incidents":
        incidents = sorted((i for i in fold_incidents(records).values() if args.all or i.status in ACTIVE_INCIDENTS),
                           key=lambda i: i.first_seen)
        print(json.dumps(msgspec.to_builtins(incidents), indent=2) if args.json
              else format_incidents(incidents, now))
    else:
        view = fold_breaker(records)
        print(json.dumps(asdict(view), indent=2) if args.json else format_breaker(view, now))
    return 0
