"""``fleetmedic executor --config FILE``: the Kubernetes executor (docs/executor.md).

Connects to the cluster (``executor.in_cluster``: the pod's ServiceAccount; otherwise
``executor.kubeconfig``, ``$KUBECONFIG`` or ``~/.kube/config``), campaigns for the Lease
``executor.lease_namespace/lease_name``, and while it leads consumes ``remediation.commands`` and
publishes ``remediation.results``, until SIGINT/SIGTERM (then it hands the Lease back). Commands are
verified with the command key their ``fleetmedic-key-id`` header names: the active one
(``signing.key_file`` or ``signing.key_env``, id ``signing.key_id``) or one of
``signing.command_keys`` (a rotation's overlap); without the active key, or with an entry it cannot
load, it refuses to start (exit 2). Metrics on ``metrics.bind_address:metrics.port`` (0: an ephemeral port, logged).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys

from fleetmedic.cli.common import (
    EXIT_INVALID,
    add_dry_run,
    add_loglevel,
    examples,
    kube_access_problem,
    kubeconfig_path,
    settings_and_command_keys,
    setup_logging,
)
from fleetmedic.config import Settings
from fleetmedic.signing import KeySet


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("executor", help="run the Kubernetes executor (acts on remediation commands)",
                       description="Carry out signed remediation commands on a Kubernetes cluster: cordon, taint, "
                                   "drain, diagnostics, job restarts, return to service; leader-elected.",
                       epilog=examples("fleetmedic executor --config my.yaml",
                                       "fleetmedic executor --config my.yaml --dry-run --identity executor-a",
                                       "KUBECONFIG=~/.kube/prod fleetmedic executor --config my.yaml "
                                       "--bootstrap broker-0:9092"))
    p.add_argument("--config", metavar="FILE", help="YAML config (defaults when omitted)")
    p.add_argument("--identity", help="leader-election identity (default: executor.identity, else hostname-pid)")
    add_dry_run(p)
    add_loglevel(p)
    p.set_defaults(handler=run_executor)


def identity_of(settings: Settings, given: str | None) -> str:
    return given or settings.executor.identity or f"{socket.gethostname()}-{os.getpid()}"


def run_executor(args: argparse.Namespace) -> int:
    loaded = settings_and_command_keys(args.config)
    if loaded is None:
        return EXIT_INVALID
    settings, keys = loaded
    why = kube_access_problem("executor", settings.executor.in_cluster, settings.executor.kubeconfig)
    if why is not None:
        print(f"error: {why}", file=sys.stderr)
        return EXIT_INVALID
    setup_logging(args.loglevel)
    return asyncio.run(_serve(settings, keys, identity_of(settings, args.identity)))


async def _serve(settings: Settings, keys: KeySet, identity: str) -> int:
    from kubernetes import client, config
    from prometheus_client import CollectorRegistry

    from fleetmedic.executor.kube import KubeCluster
    from fleetmedic.executor.metrics import ExecutorMetrics
    from fleetmedic.executor.service import ExecutorService
    from fleetmedic.serving import Health, serve

    e = settings.executor
    if e.in_cluster:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
        api = client.ApiClient()
    else:
        api = config.new_client_from_config(config_file=kubeconfig_path(e.kubeconfig))  # type: ignore[no-untyped-call]
    registry = CollectorRegistry()
    metrics = ExecutorMetrics(registry)
    health = Health(settings.metrics.stall_after_s)
    server = serve(registry, settings.metrics.port, settings.metrics.bind_address, health, settings.cluster.name)
    log = logging.getLogger("fleetmedic.executor")
    log.info("executor %s; metrics on http://%s:%d/metrics; command keys accepted: %s%s", identity,
             *server.server_address[:2], ", ".join(sorted(keys.keys)),
             "; dry run (safety.dry_run): every command is reported, nothing is changed" if settings.safety.dry_run
             else "")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    service = ExecutorService(settings, keys, KubeCluster(api, instance=identity), identity, metrics)
    beating = asyncio.create_task(health.beat_every("executor"))
    health.ready()  # a standby is ready too: it is alive and will take over when it wins the lease
    try:
        await service.run(stop)
    finally:
        beating.cancel()
        server.shutdown()
        api.close()  # type: ignore[no-untyped-call]
    log.info("executor %s stopped", identity)
    return 0
