"""``fleetmedic watch-jobs --config FILE``: watch training jobs on Kubernetes, publish ``jobs.events``.

Connects with ``jobwatch.kubeconfig`` (or ``$KUBECONFIG`` / ``~/.kube/config``), or the pod's
ServiceAccount with ``jobwatch.in_cluster``; produces to ``<topics.prefix>jobs.events`` on the
``kafka`` brokers; serves ``fleetmedic_jobwatch_*`` metrics on ``metrics.bind_address:metrics.port``;
runs until SIGINT or SIGTERM. See docs/workloads.md.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from fleetmedic.cli.common import (
    EXIT_INVALID,
    add_loglevel,
    examples,
    kube_access_problem,
    kubeconfig_path,
    settings_or_none,
    setup_logging,
)
from fleetmedic.config import Settings


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("watch-jobs", help="watch Jobs, PyTorchJobs, JobSets and their pods; publish jobs.events",
                       description="Watch training jobs (batch Jobs, Kubeflow PyTorchJobs, JobSets) and their "
                                   "pods, and publish placement, start, failure, completion and restart events "
                                   "to the jobs.events topic, until SIGINT or SIGTERM.",
                       epilog=examples("fleetmedic watch-jobs --config my.yaml",
                                       "KUBECONFIG=~/.kube/prod fleetmedic watch-jobs --config my.yaml "
                                       "--bootstrap broker-0:9092"))
    p.add_argument("--config", metavar="FILE", help="YAML config (defaults when omitted)")
    add_loglevel(p)
    p.set_defaults(handler=run_watch_jobs)


def run_watch_jobs(args: argparse.Namespace) -> int:
    settings = settings_or_none(args.config)
    if settings is None:
        return EXIT_INVALID
    why = kube_access_problem("jobwatch", settings.jobwatch.in_cluster, settings.jobwatch.kubeconfig)
    if why is not None:
        print(f"error: {why}", file=sys.stderr)
        return EXIT_INVALID
    setup_logging(args.loglevel)
    return asyncio.run(_serve(settings))


def kube_client(settings: Settings) -> object:
    from kubernetes import client, config

    if settings.jobwatch.in_cluster:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
        return client.ApiClient()
    from fleetmedic.devenv.kclient import api_client

    return api_client(kubeconfig_path(settings.jobwatch.kubeconfig))


async def _serve(settings: Settings) -> int:
    from kubernetes import client
    from prometheus_client import CollectorRegistry

    from fleetmedic.connectors.kube.jobs import JobWatcher
    from fleetmedic.serving import Health, serve

    registry = CollectorRegistry()
    health = Health(settings.metrics.stall_after_s)
    server = serve(registry, settings.metrics.port, settings.metrics.bind_address, health, settings.cluster.name)
    log = logging.getLogger("fleetmedic.watch_jobs")
    log.info("metrics on %s:%d", settings.metrics.bind_address, server.server_port)
    api = kube_client(settings)
    assert isinstance(api, client.ApiClient)
    until = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, until.set)
    beating = asyncio.create_task(health.beat_every("watch-jobs"))
    health.ready()
    try:
        await JobWatcher(api, settings, registry).run(until)
    finally:
        beating.cancel()
        server.shutdown()
        api.close()  # type: ignore[no-untyped-call]
    return 0
