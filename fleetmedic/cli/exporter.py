"""``fleetmedic exporter nvml|prometheus|remote-write|kafka|infiniband|logs|kmsg``: run one connector until SIGTERM.

Every connector reads the ``exporters`` section of the config (docs/connectors.md), sends its
records to the topics of the ``topics`` section on Kafka — or, with ``--output FILE``, writes them
as JSON lines (``-`` = stdout) for debugging — and serves its ``fleetmedic_connector_*`` metrics on
``metrics.bind_address:metrics.port`` (``--metrics-port 0``: an ephemeral port, logged; ``-1``: off).
``--duration 10m`` stops it after that long (checks, demos). Exit codes: 0 after a clean stop, 2 for
an invalid config, 3 when the source cannot be used at all (no NVIDIA driver, no permission).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from fleetmedic.cli.common import (
    EXIT_INVALID,
    add_loglevel,
    duration,
    examples,
    settings_or_none,
    setup_logging,
    timestamp,
)
from fleetmedic.config import Settings

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from fleetmedic.connectors.runtime import ConnectorMetrics, Outbox, Sink

EXIT_SOURCE_UNAVAILABLE = 3
CONNECTORS = {
    "nvml": "sample this node's GPUs through NVML (fields and XID events)",
    "prometheus": "scrape dcgm-exporter/node-exporter endpoints, or poll a Prometheus server",
    "remote-write": "receive Prometheus remote write 1.0 (snappy protobuf) and publish what it carries",
    "kafka": "re-publish Telegraf / prometheus-kafka-adapter JSON topics as fleetmedic records",
    "infiniband": "read InfiniBand port counters with perfquery (topology from the config)",
    "logs": "classify job log lines from Kafka (e.g. Fluent Bit) into job failure events",
    "kmsg": "read this node's kernel log (/dev/kmsg or the journal): XIDs, SXids, PCIe AER, mlx5, MCE/EDAC",
}

#: one or two command lines for each connector's help
EXAMPLES = {
    "nvml": ["fleetmedic exporter nvml --config my.yaml",
             "fleetmedic exporter nvml --output - --duration 30s --metrics-port -1"],
    "prometheus": ["fleetmedic exporter prometheus --config my.yaml",
                   "fleetmedic exporter prometheus --config my.yaml --output - --duration 2m"],
    "remote-write": ["fleetmedic exporter remote-write --config my.yaml --listen 0.0.0.0:9201"],
    "kafka": ["fleetmedic exporter kafka --config my.yaml --bootstrap broker-0:9092"],
    "infiniband": ["fleetmedic exporter infiniband --config my.yaml"],
    "logs": ["fleetmedic exporter logs --config my.yaml"],
    "kmsg": ["fleetmedic exporter kmsg --config my.yaml",
             "fleetmedic exporter kmsg --input saved.dmesg --pci-map gpus.csv --output -"],
}

Source = Callable[[asyncio.Event], Awaitable[None]]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("exporter", help="run a connector: " + ", ".join(CONNECTORS),
                       description="Run one connector that turns an outside source into fleetmedic records on "
                                   "Kafka, until SIGINT or SIGTERM. Connectors: "
                                   + "; ".join(f"{name}: {text}" for name, text in CONNECTORS.items()) + ".",
                       epilog=examples(*(EXAMPLES[name][0] for name in CONNECTORS)))
    kinds = p.add_subparsers(dest="connector", metavar="CONNECTOR")
    kinds.required = True
    for name, text in CONNECTORS.items():
        k = kinds.add_parser(name, help=text, description=text, epilog=examples(*EXAMPLES[name]))
        k.add_argument("--config", metavar="FILE", help="YAML config (defaults when omitted)")
        k.add_argument("--output", metavar="FILE", help="write JSON lines here instead of Kafka (- = stdout)")
        k.add_argument("--duration", type=duration, metavar="DURATION", help="stop after this long, e.g. 90s, 10m, 2h")
        k.add_argument("--metrics-port", type=int, metavar="PORT", help="override metrics.port (-1: no endpoint)")
        add_loglevel(k)
        if name == "kmsg":
            _kmsg_arguments(k)
        if name == "remote-write":
            k.add_argument("--listen", metavar="HOST:PORT", default="",
                           help="address to receive on (default exporters.remote_write.listen, 0.0.0.0:9201; "
                                "port 0: an ephemeral port, logged)")
        k.set_defaults(handler=run_exporter)


def _kmsg_arguments(k: argparse.ArgumentParser) -> None:
    k.add_argument("--source", choices=["kmsg", "journal"], default="kmsg",
                   help="/dev/kmsg (default) or the journal (journalctl -k -o json --follow)")
    k.add_argument("--input", metavar="FILE", default="",
                   help="a recorded kernel log instead (cat /dev/kmsg, journalctl -o json, or dmesg lines)")
    k.add_argument("--device", metavar="PATH", default="/dev/kmsg", help="the kmsg device (default /dev/kmsg)")
    k.add_argument("--state-file", metavar="FILE", default=None,
                   help="where the position handled last is kept, to resume without re-reporting "
                        "(default /var/lib/fleetmedic/kmsg-state.json; none with --input; '' = none)")
    k.add_argument("--node", metavar="NAME", default="",
                   help="the node's name (default $NODE_NAME, else the host name)")
    k.add_argument("--pci-map", metavar="FILE", default="",
                   help="PCI address -> GPU index (YAML mapping, or nvidia-smi --query-gpu=index,pci.bus_id "
                        "--format=csv,noheader); default: from NVML")
    k.add_argument("--no-nvml", action="store_true", help="do not ask NVML for the PCI map")
    k.add_argument("--patterns", metavar="FILE", default="", help="log pattern library (default: the shipped one)")
    k.add_argument("--backlog-max-age", type=duration, metavar="DURATION", default=3600.0,
                   help="with no state (a first start), skip records older than this (default 1h)")
    k.add_argument("--xid-window", type=duration, metavar="DURATION", default=30.0,
                   help="an XID reported in the driver's own words and its Xid line within this long are one "
                        "(default 30s)")
    k.add_argument("--boot-time", type=timestamp, metavar="T", default=None,
                   help="for kmsg records in --input: when their boot started, RFC 3339 or Unix seconds "
                        "(default: this host's)")


def run_exporter(args: argparse.Namespace) -> int:
    settings = settings_or_none(args.config)
    if settings is None:
        return EXIT_INVALID
    setup_logging(args.loglevel)
    from fleetmedic.connectors.runtime import SourceUnavailable

    if getattr(args, "input", "") and args.metrics_port is None:
        args.metrics_port = -1  # a recorded log: a one-shot run, no metrics endpoint unless asked for
    try:
        return asyncio.run(_run(args.connector, settings, args.output, args.duration, args.metrics_port, args))
    except SourceUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_SOURCE_UNAVAILABLE
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_INVALID


async def _run(connector: str, settings: Settings, output: str | None, duration: float | None,
               metrics_port: int | None, options: argparse.Namespace | None = None) -> int:
    from prometheus_client import CollectorRegistry

    from fleetmedic.connectors.runtime import (
        ConnectorMetrics,
        JsonlSink,
        KafkaSink,
        Outbox,
        pump_settings,
        run_until_stopped,
    )
    from fleetmedic.serving import Health, serve

    if connector == "remote-write":
        from fleetmedic.connectors.remote_write.assembler import parse_listen
        from fleetmedic.connectors.remote_write.auth import check_exposure

        rw = settings.exporters.remote_write  # before anything starts
        check_exposure(parse_listen(getattr(options, "listen", "") or rw.listen)[0], rw)

    registry = CollectorRegistry()
    metrics = ConnectorMetrics(registry, connector)
    outbox = Outbox(settings.exporters.queue_max, metrics)
    port = settings.metrics.port if metrics_port is None else metrics_port
    health = Health(settings.metrics.stall_after_s)
    if port >= 0:
        server = serve(registry, port, settings.metrics.bind_address, health, settings.cluster.name)
        logging.getLogger("fleetmedic.connectors").info(
            "metrics on http://%s:%d/metrics", settings.metrics.bind_address, server.server_port)
    sink: Sink = JsonlSink(output, settings.cluster.name) if output else KafkaSink(settings)
    if connector == "remote-write":
        from fleetmedic.connectors.remote_write.server import HealthSink

        sink = HealthSink(sink)  # the receiver answers 503 while sending fails
    stop = asyncio.Event()
    # the remote-write receiver stops on its own event: it first releases what it holds into the
    # outbox, then returns, and only then does the pump drain (a source that still adds records
    # once the pump has stopped would lose them)
    shutdown = asyncio.Event() if connector == "remote-write" else stop
    source = build_source(connector, settings, outbox, metrics, options, registry=registry, sink=sink,
                          shutdown=shutdown)
    loop = asyncio.get_running_loop()
    if duration is not None:
        loop.call_later(duration, shutdown.set)
    beating = asyncio.create_task(health.beat_every(connector))
    health.ready()
    try:
        if shutdown is stop:
            await run_until_stopped(source, outbox, sink, metrics, pump_settings(settings), stop)
            return 0
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, shutdown.set)
        try:
            await run_until_stopped(source, outbox, sink, metrics, pump_settings(settings), stop,
                                    handle_signals=False)
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
        return 0
    finally:
        beating.cancel()


def build_source(connector: str, settings: Settings, outbox: Outbox, metrics: ConnectorMetrics,
                 options: argparse.Namespace | None = None, registry: CollectorRegistry | None = None,
                 sink: Sink | None = None, shutdown: asyncio.Event | None = None) -> Source:
    if connector == "prometheus":
        from fleetmedic.connectors.prometheus.ingest import PrometheusSource

        return PrometheusSource(settings, outbox, metrics).run
    if connector == "remote-write":
        from prometheus_client import CollectorRegistry as Registry

        from fleetmedic.connectors.remote_write.server import HealthSink, RemoteWriteReceiver

        return RemoteWriteReceiver(settings, outbox, metrics, registry or Registry(),
                                   health=sink if isinstance(sink, HealthSink) else None,
                                   listen=getattr(options, "listen", "") or None, shutdown=shutdown).run
    if connector == "nvml":
        from fleetmedic.connectors.nvml.exporter import NvmlSource, import_pynvml

        return NvmlSource(import_pynvml(), settings, outbox, metrics).run
    if connector == "kafka":
        from fleetmedic.connectors.kafka_telemetry.exporter import KafkaTelemetrySource

        return KafkaTelemetrySource(settings, outbox, metrics).run
    if connector == "infiniband":
        from fleetmedic.connectors.infiniband.exporter import PerfquerySource

        return PerfquerySource(settings, outbox, metrics).run
    if connector == "logs":
        from fleetmedic.connectors.logs.events import LogSource

        return LogSource(settings, outbox, metrics).run
    if connector == "kmsg":
        from fleetmedic.connectors.kernel.kmsg import KmsgSource, kmsg_options

        return KmsgSource(settings, outbox, metrics, kmsg_options(options)).run
    raise ValueError(f"unknown connector {connector!r}")


def main(argv: list[str] | None = None) -> int:
    """``python -m fleetmedic.cli.exporter nvml ...``: the exporters without the rest of the CLI's
    imports (what a slim node image or scripts/device/nvml_check.sh needs: msgspec, PyYAML,
    prometheus-client, nvidia-ml-py)."""
    parser = argparse.ArgumentParser(prog="fleetmedic-exporter")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    add_parser(sub)
    args = parser.parse_args(["exporter", *(sys.argv[1:] if argv is None else argv)])
    handler: Callable[[argparse.Namespace], int] = args.handler
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
