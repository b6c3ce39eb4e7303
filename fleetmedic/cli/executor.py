"""``fleetmedic executor --config FILE``: the Kubernetes executor (docs/executor.md).

Connects to the cluster (``executor.in_cluster``: the pod's ServiceAccount; otherwise
``executor.kubeconfig``, ``$KUBECONFIG`` or ``~/.kube/config``), campaigns for the Lease
``executor.lease_namespace/lease_name``, and while it leads consumes ``remediation.commands`` and
publishes ``remediation.results``, until SIGINT/SIGTERM (then it hands the Lease back). Commands are
verified with the key from ``signing.key_file`` or ``signing.key_env``; without one it refuses to
start (exit 2). Metrics on ``metrics.bind_address:metrics.port`` (0: an ephemeral port, logged).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket

from fleetmedic.cli.common import EXIT_INVALID, add_loglevel, settings_and_key, setup_logging
from fleetmedic.config import Settings


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("executor", help="run the Kubernetes executor (acts on remediation commands)",
                       description="Carry out signed remediation commands on a Kubernetes cluster: cordon, taint, "
                                   "drain, diagnostics, job restarts, return to service; leader-elected.")
    p.add_argument("--config", metavar="FILE", help="YAML config (defaults when omitted)")
    p.add_argument("--identity", help="leader-election identity (default: executor.identity, else hostname-pid)")
    add_loglevel(p)
    p.set_defaults(handler=run_executor)


def identity_of(settings: Settings, given: str | None) -> str:
    return given or settings.executor.identity or f"{socket.gethostname()}-{os.getpid()}"


def run_executor(args: argparse.Namespace) -> int:
    loaded = settings_and_key(args.config)
    if loaded is None:
        return EXIT_INVALID
    settings, key = loaded
    setup_logging(args.loglevel)
    return asyncio.run(_serve(settings, key, identity_of(settings, args.identity)))


async def _serve(settings: Settings, key: bytes, identity: str) -> int:
    from kubernetes import client, config
    from prometheus_client import CollectorRegistry, start_http_server

    from fleetmedic.executor.kube import Cluster
    from fleetmedic.executor.metrics import ExecutorMetrics
    from fleetmedic.executor.service import ExecutorService

    e = settings.executor
    if e.in_cluster:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
        api = client.ApiClient()
    else:
        path = e.kubeconfig or os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
        api = config.new_client_from_config(config_file=path)  # type: ignore[no-untyped-call]
    registry = CollectorRegistry()
    metrics = ExecutorMetrics(registry)
    server, _ = start_http_server(settings.metrics.port, addr=settings.metrics.bind_address, registry=registry)
    log = logging.getLogger("fleetmedic.executor")
    log.info("executor %s; metrics on http://%s:%d/metrics", identity, *server.server_address[:2])
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    service = ExecutorService(settings, key, Cluster(api, instance=identity), identity, metrics)
    try:
        await service.run(stop)
    finally:
        server.shutdown()
        api.close()  # type: ignore[no-untyped-call]
    log.info("executor %s stopped", identity)
    return 0
