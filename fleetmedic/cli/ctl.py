"""``fleetmedic ctl``: a person steering the running pipeline, and reading what it decided.

The first three publish an :class:`~fleetmedic.records.OperatorCommand` on
``remediation.operator`` (key: the node, or ``fleet``), signed with an *operator key*
(``signing.operator_key_files`` / ``operator_key_dir`` / ``operator_key_env``; with several, the one
``--key-id`` or ``signing.operator_key_id`` names), never with the command key the executor trusts.
The decision stage verifies it against its operator keys and applies it once; the audit log then shows it with the actor
``operator:<--actor>``. ``audit`` prints ``remediation.audit`` records, one line each (``--json``:
the records), from the beginning or those of the last ``--since`` (``90s``, ``10m``, ``2h``), and keeps
following with ``--follow``. ``get nodes|incidents|breaker`` shows what the decision stage holds and
why, folded from its topics.
"""


from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import os
import sys
import time
import uuid

import msgspec

from fleetmedic.cli import ctl_get
from fleetmedic.cli.common import (
    EXIT_INVALID,
    EXIT_KAFKA,
    duration,
    examples,
    kafka_failure,
    quiet_kafka_logs,
    settings_or_none,
    signing_key,
)
from fleetmedic.config import Settings
from fleetmedic.records import AuditRecord, InvalidRecord, OperatorCommand, decode, encode, foreign
from fleetmedic.signing import UnusableKey, operator_keys, sign, sign_bytes

OPERATOR_TTL_S = 600.0
EXAMPLES = (
    'fleetmedic ctl resume-breaker --reason "exporter rollout fixed"',
    'fleetmedic ctl clear-node gpu-node-17 --reason "replaced the riser, ran dcgmi diag -r 4 by hand"',
    'fleetmedic ctl node-repaired gpu-node-17 --reason "RMA done"',
    "fleetmedic ctl audit --node gpu-node-17 --since 2h",
    "fleetmedic ctl get nodes",
)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("ctl", help="operator commands to the running pipeline; read its audit log",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog=examples(*EXAMPLES))
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    for verb, needs_node, text in (
        ("resume-breaker", False, "close the open circuit breaker (isolation resumes)"),
        ("clear-node", True, "return a node to service now, without diagnostics (you vouch for it)"),
        ("node-repaired", True, "a node awaiting repair was repaired: validate it with diagnostics, then return it"),
    ):
        v = verbs.add_parser(verb, help=text, description=text,
                             epilog=examples(*(e for e in EXAMPLES if e.startswith(f"fleetmedic ctl {verb} "))))
        if needs_node:
            v.add_argument("node")
        v.add_argument("--reason", required=True, help="why (kept in the audit log)")
        v.add_argument("--actor", default=None, help="who (default: the login name)")
        v.add_argument("--key-id", default=None, help="the operator key to sign with (default: "
                       "signing.operator_key_id, else the only one configured)")
        v.add_argument("--config", metavar="FILE", help="YAML config (defaults when omitted)")
        v.set_defaults(handler=run_operator_command, action=verb.replace("-", "_"))
    a = verbs.add_parser("audit", help="print the decision stage's audit records",
                         description="Print the decision stage's audit records, one line each: what it decided, "
                                     "and why.",
                         epilog=examples("fleetmedic ctl audit --since 1h",
                                         "fleetmedic ctl audit --node gpu-node-17 --follow",
                                         "fleetmedic ctl audit --since 24h --json"))
    a.add_argument("--config", metavar="FILE", help="YAML config (defaults when omitted)")
    a.add_argument("--node", help="only records about this node")
    a.add_argument("--since", type=duration, metavar="DURATION",
                   help="only records of the last 90s, 10m, 2h (plain seconds also work)")
    a.add_argument("--follow", action="store_true", help="keep printing new records until interrupted")
    a.add_argument("--json", action="store_true", help="print the records as JSON lines")
    a.set_defaults(handler=run_audit)
    ctl_get.add_parser(verbs)


def run_operator_command(args: argparse.Namespace) -> int:
    settings = settings_or_none(args.config)
    if settings is None:
        return EXIT_INVALID
    source = settings.signing
    if args.key_id:
        source = msgspec.structs.replace(source, operator_key_id=args.key_id)
    try:
        key_id, key = operator_keys(source, os.environ, command_key=_command_key_if_here(settings)).signer()
    except UnusableKey as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_INVALID
    now = time.time()
    cmd = sign(OperatorCommand(
        id=f"op-{uuid.uuid4().hex}", action=args.action, actor=args.actor or getpass.getuser(), reason=args.reason,
        issued_at=now, expires_at=now + OPERATOR_TTL_S, node=getattr(args, "node", "") or "",
        cluster=settings.cluster.name,  # signed: only the decision stage of this cluster applies it
    ), key)
    try:
        with quiet_kafka_logs():
            asyncio.run(_publish(settings, cmd, key_id, key))
    except Exception as exc:  # the broker's errors are many; the operator needs the one that matters
        why = kafka_failure(exc, settings.kafka) or f"{type(exc).__name__}: {exc}"
        print(f"error: could not publish to Kafka: {why}", file=sys.stderr)
        return EXIT_KAFKA
    print(f"published {cmd.action} {cmd.node or ''} as {cmd.id} (actor {cmd.actor}, operator key {key_id}); "
          f"`fleetmedic ctl audit` shows what the decision stage did with it".replace("  ", " "))
    return 0


def _command_key_if_here(settings: Settings) -> bytes:
    """The command key if this machine holds it (then an operator key equal to it is refused), else b""."""
    try:
        return signing_key(settings)
    except (OSError, ValueError):
        return b""


async def _publish(settings: Settings, cmd: OperatorCommand, key_id: str, key: bytes) -> None:
    from aiokafka import AIOKafkaProducer

    from fleetmedic.bus import DECISIONS, producer_options

    producer = AIOKafkaProducer(**producer_options(settings.kafka, DECISIONS))
    try:
        await producer.start()
        value = encode(cmd)  # signed as these bytes (the header), and in the body during the migration
        await producer.send_and_wait(settings.topics.topic("remediation.operator"), value,
                                     key=(cmd.node or "fleet").encode(), headers=sign_bytes(value, key_id, key))
    finally:
        await producer.stop()


def format_audit(rec: AuditRecord) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(rec.ts))
    target = rec.node or rec.job or "fleet"
    move = f" {rec.state_from}->{rec.state_to}" if rec.state_to else ""
    cmds = f" [{', '.join(rec.command_ids)}]" if rec.command_ids else ""
    dry = " (dry run)" if rec.dry_run else ""
    return f"{when} {rec.decision:<15} {target:<24} {rec.actor}:{move} {rec.explanation}{cmds}{dry}"


def run_audit(args: argparse.Namespace) -> int:
    settings = settings_or_none(args.config)
    if settings is None:
        return EXIT_INVALID
    try:
        with contextlib.suppress(KeyboardInterrupt), quiet_kafka_logs():
            asyncio.run(_audit(settings, args))
    except Exception as exc:
        why = kafka_failure(exc, settings.kafka)
        if why is None:
            raise
        print(f"error: could not read the audit log from Kafka: {why}", file=sys.stderr)
        return EXIT_KAFKA
    return 0


async def _audit(settings: Settings, args: argparse.Namespace) -> None:
    from aiokafka import AIOKafkaConsumer

    from fleetmedic.bus import client_options

    consumer = AIOKafkaConsumer(settings.topics.topic("remediation.audit"), **client_options(settings.kafka),
                                group_id=None, auto_offset_reset="earliest", enable_auto_commit=False)
    since = time.time() - args.since if args.since else 0.0
    try:
        await consumer.start()
        while True:
            batch = await consumer.getmany(timeout_ms=1000)
            if not batch and not args.follow:
                break
            for msgs in batch.values():
                for msg in msgs:
                    try:
                        rec = decode(AuditRecord, msg.value)
                    except InvalidRecord as exc:
                        print(f"offset {msg.offset}: {exc}", file=sys.stderr)
                        continue
                    if rec.ts < since or (args.node and rec.node != args.node) or foreign(rec, settings.cluster.name):
                        continue  # another cluster's record (a shared audit topic) is not this one's story
                    print(encode(rec).decode() if args.json else format_audit(rec), flush=True)
    finally:
        await consumer.stop()
