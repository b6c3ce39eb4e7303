"""``fleetmedic worker --config FILE``: the streaming pipeline on Kafka, in this process.

It creates the missing topics (``topics`` section: prefix, partitions), reads the decision
engine's last snapshot from ``<kafka.consumer_group>-engine-state``, then runs the Faust worker
(app id = ``kafka.consumer_group``, no web server) with the agents of
:mod:`fleetmedic.streams.worker` until SIGINT/SIGTERM, when it writes a final snapshot. Commands
are signed with the key from ``signing.key_file`` or the variable named by ``signing.key_env``;
without a key it refuses to start (exit 2). Prometheus metrics are served on
``metrics.bind_address:metrics.port`` (port 0: an ephemeral port, logged).

Run one worker: the decision stage keeps global state and needs every partition of its inputs.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
from pathlib import Path

from fleetmedic.config import Settings
from fleetmedic.config_cli import EXIT_INVALID, settings_or_none
from fleetmedic.signing import load_key


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("worker", help="run the streaming pipeline (detection, triage, policy) on Kafka",
                       description="Run the streaming pipeline (detection, triage, policy, signed commands) on "
                                   "Kafka in this process, until SIGINT or SIGTERM.")
    p.add_argument("--config", metavar="FILE", help="YAML config (defaults when omitted)")
    p.add_argument("--datadir", metavar="DIR", help="faust's data directory (default: a temporary one)")
    p.add_argument("--loglevel", default="info", choices=["debug", "info", "warning", "error"])
    p.set_defaults(handler=run_worker)


def signing_key(settings: Settings) -> bytes:
    """The command signing key from ``signing.key_file`` or the env var ``signing.key_env``."""
    s = settings.signing
    if s.key_file:
        return load_key(Path(s.key_file).read_bytes())
    text = os.environ.get(s.key_env, "")
    if not text:
        raise ValueError(f"signing key: set signing.key_file or the environment variable {s.key_env}")
    return load_key(text)


def run_worker(args: argparse.Namespace) -> int:
    settings = settings_or_none(args.config)
    if settings is None:
        return EXIT_INVALID
    try:
        key = signing_key(settings)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_INVALID
    logging.basicConfig(level=args.loglevel.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.datadir:
        return _run(settings, key, args.datadir, args.loglevel)
    with tempfile.TemporaryDirectory(prefix="fleetmedic-worker-") as datadir:
        return _run(settings, key, datadir, args.loglevel)


def _run(settings: Settings, key: bytes, datadir: str, loglevel: str) -> int:
    from fleetmedic.streams.runner import run

    return run(settings, key, datadir, loglevel)
