"""``fleetmedic worker --config FILE``: the streaming pipeline on Kafka, in this process.

It creates the missing topics (``topics`` section: prefix, partitions), then runs its ``--role``
until SIGINT/SIGTERM: ``detect`` (stage 1, a consumer-group loop, group
``<kafka.consumer_group>-detect``; run several), ``decide`` (the decision stage, a Faust worker
without web server, group ``<kafka.consumer_group>``; run one) or ``all`` (both, one process). The
decision stage starts from its last snapshot in ``<kafka.consumer_group>-engine-state``, replays
its inputs since, and writes a final snapshot at a stop; ``streams`` config section: intervals;
:mod:`fleetmedic.streams.worker` describes the topology and the restart guarantees. The
decision stage (``decide``, ``all``) signs commands with the command key (``signing.key_file`` or
the variable named by ``signing.key_env``) and verifies operator commands with the operator keys
(``signing.operator_key_*``), never with the command key; without a command key those roles refuse
to start (exit 2). ``detect`` needs no key. Prometheus metrics are served on
``metrics.bind_address:metrics.port`` (port 0: an ephemeral port, logged).
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile

from fleetmedic.cli.common import (
    EXIT_INVALID,
    EXIT_KAFKA,
    add_dry_run,
    add_loglevel,
    examples,
    kafka_check,
    kafka_failure,
    settings_and_key,
    setup_logging,
)
from fleetmedic.config import Settings


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("worker", help="run the streaming pipeline (detection, triage, policy) on Kafka",
                       description="Run the streaming pipeline (detection, triage, policy, signed commands) on "
                                   "Kafka in this process, until SIGINT or SIGTERM.",
                       epilog=examples("fleetmedic worker --config my.yaml",
                                       "fleetmedic worker --config my.yaml --role detect",
                                       "fleetmedic worker --config my.yaml --role decide --dry-run",
                                       "fleetmedic worker --config my.yaml --bootstrap broker-0:9092,broker-1:9092"))
    p.add_argument("--config", metavar="FILE", help="YAML config (defaults when omitted)")
    p.add_argument("--datadir", metavar="DIR", help="faust's data directory (default: a temporary one)")
    add_dry_run(p)
    add_loglevel(p)
    p.add_argument("--role", default="all", choices=["detect", "decide", "all"],
                   help="detect: stage 1 only (run several; they share the telemetry partitions); decide: the "
                        "decision stage (run exactly one); all: both in this process (default)")
    p.set_defaults(handler=run_worker)


def run_worker(args: argparse.Namespace) -> int:
    loaded = settings_and_key(args.config, need_key=args.role != "detect")  # stage 1 signs nothing
    if loaded is None:
        return EXIT_INVALID
    settings, key = loaded
    setup_logging(args.loglevel)
    why = kafka_check(settings.kafka)  # a wrong password or certificate: one line, not a retry loop
    if why is not None:
        print(f"error: {why}", file=sys.stderr)
        return EXIT_KAFKA
    if args.role != "detect":
        logging.getLogger("fleetmedic.worker").info(
            "safety.dry_run is %s: %s", str(settings.safety.dry_run).lower(),
            "commands are decided and published as dry runs; executors change nothing" if settings.safety.dry_run
            else "fleetmedic acts: executors carry out its commands")
    try:
        if args.datadir:
            return _run(settings, key, args.datadir, args.loglevel, args.role)
        with tempfile.TemporaryDirectory(prefix="fleetmedic-worker-") as datadir:
            return _run(settings, key, datadir, args.loglevel, args.role)
    except Exception as exc:
        from aiokafka.errors import KafkaError

        if not isinstance(exc, KafkaError):
            raise
        print(f"error: {kafka_failure(exc, settings.kafka) or exc}", file=sys.stderr)  # e.g. an ACL missing
        return EXIT_KAFKA


def _run(settings: Settings, key: bytes, datadir: str, loglevel: str, role: str) -> int:
    from fleetmedic.streams.runner import run

    return run(settings, key, datadir, loglevel, role)  # type: ignore[arg-type]
