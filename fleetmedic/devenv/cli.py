"""``fleetmedic dev build|up|down|status``: the real Kafka and Kubernetes services, locally.

``up`` starts a broker and a control plane under ``$FLEETMEDIC_RUN_DIR`` (default
``/tmp/fleetmedic-dev``) and a fleet of kwok GPU nodes; ``down`` stops every service started from
that directory (including ones a killed pytest session left behind). ``up --only kafka --brokers 3
--security sasl_ssl`` starts a production-shaped cluster (KRaft, TLS, SCRAM users) instead of the
single plaintext broker; either way ``$FLEETMEDIC_RUN_DIR/kafka/client.yaml`` is
the client side as a fleetmedic config.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from fleetmedic.cli.common import duration
from fleetmedic.devenv import build, proc, settings
from fleetmedic.devenv.kafka import DEFAULT_PORT, Kafka
from fleetmedic.devenv.kafka_cluster import SECURITY, KafkaCluster, replication, write_client_yaml
from fleetmedic.devenv.kube import Kube, Ports
from fleetmedic.k8s_keys import LABEL_FLEET

SERVICES = ("kafka", "kube")
DEV_FLEET = "dev"


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "dev",
        help="build, start and stop the real Kafka and Kubernetes services used by tests",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=_examples("fleetmedic dev build", "fleetmedic dev up --nodes 16", "fleetmedic dev status",
                         "fleetmedic dev down --wipe"),
    )
    _fill(parser)


def _examples(*lines: str) -> str:
    return "examples:\n" + "\n".join(f"  {line}" for line in lines)


def _fill(parser: argparse.ArgumentParser) -> None:
    dev = parser.add_subparsers(dest="dev_command", metavar="ACTION")
    dev.required = True

    def only(p: argparse.ArgumentParser) -> None:
        p.add_argument("--only", choices=SERVICES, help="act on this service only")

    p = dev.add_parser("build", help="fetch the Kafka jars and build the Kubernetes binaries (once)",
                       epilog=_examples("fleetmedic dev build", "fleetmedic dev build --only kube"))
    only(p)
    p.set_defaults(handler=cmd_build)

    p = dev.add_parser("up", help="start Kafka, the control plane and a kwok GPU fleet",
                       epilog=_examples("fleetmedic dev up",
                                        "fleetmedic dev up --only kafka --brokers 3 --security ssl"))
    only(p)
    p.add_argument("--nodes", type=int, default=64, help="kwok GPU nodes in fleet 'dev' (default 64)")
    p.add_argument("--kafka-port", type=int, default=DEFAULT_PORT,
                   help="broker port (controller: +1; with --brokers N, broker i on PORT+2i, its controller +1)")
    p.add_argument("--brokers", type=int, default=1, choices=range(1, 6), metavar="N",
                   help="Kafka nodes (KRaft, broker and controller in each; default 1; 3 for a replicated cluster)")
    p.add_argument("--security", default="plaintext", choices=SECURITY,
                   help="Kafka listeners: plaintext (default), ssl (mutual TLS) or sasl_ssl (SCRAM-SHA-512 or "
                        "PLAIN over TLS); certificates and users are made at the first start")
    p.add_argument("--apiserver-port", type=int, default=Ports().apiserver, help="kube-apiserver port")
    p.add_argument("--crds", type=Path, default=Path("tests/data/crds"), help="install the CRDs in DIR")
    p.add_argument("--timeout", type=duration, default=180.0, metavar="DURATION",
                   help="how long each service may take to start, e.g. 90s, 5m (default 3m)")
    p.set_defaults(handler=cmd_up)

    p = dev.add_parser("down", help="stop every service started from the run directory",
                       epilog=_examples("fleetmedic dev down", "fleetmedic dev down --wipe"))
    only(p)
    p.add_argument("--wipe", action="store_true", help="also delete their data and logs")
    p.set_defaults(handler=cmd_down)

    p = dev.add_parser("status", help="show which services run and where they listen",
                       epilog=_examples("fleetmedic dev status"))
    p.set_defaults(handler=cmd_status)


def _wanted(args: argparse.Namespace) -> tuple[bool, bool]:
    only = getattr(args, "only", None)
    return only in (None, "kafka"), only in (None, "kube")


def cmd_build(args: argparse.Namespace) -> int:
    kafka, kube = _wanted(args)
    t = time.monotonic()
    try:
        build.build(kafka=kafka, kube=kube)
    except build.BuildError as exc:
        print(f"build failed: {exc}", file=sys.stderr)
        return 1
    print(f"dev build: done in {time.monotonic() - t:.0f}s (cache {settings.layout().cache})")
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    want_kafka, want_kube = _wanted(args)
    if cmd_build(args) != 0:
        return 1
    root = settings.run_dir()
    kafka: Kafka | KafkaCluster = Kafka(root / "kafka", port=args.kafka_port, controller_port=args.kafka_port + 1)
    if args.brokers > 1 or args.security != "plaintext":
        kafka = KafkaCluster.on_ports(root / "kafka", args.brokers, args.kafka_port, args.security)
    kube = Kube(root / "kube", Ports(apiserver=args.apiserver_port))
    jobs = {}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        if want_kafka:
            jobs["kafka"] = pool.submit(_up_kafka, kafka, args.timeout)
        if want_kube:
            jobs["kube"] = pool.submit(_up_kube, kube, args.timeout)
    failed = False
    for name, job in jobs.items():
        try:
            print(job.result())
        except proc.ServiceError as exc:
            failed = True
            print(f"{name}: FAILED to start: {exc}", file=sys.stderr)
    if want_kube and "kube" in jobs and not failed:
        try:
            print(_up_fleet(kube, args.nodes, args.crds))
        except Exception as exc:
            failed = True
            print(f"fleet: FAILED: {exc}", file=sys.stderr)
    if failed:
        print("some services failed; `fleetmedic dev down` stops the rest", file=sys.stderr)
        return 1
    exports = []
    if want_kafka and isinstance(kafka, KafkaCluster):
        if kafka.security == "plaintext":
            exports.append(f"{settings.ENV_KAFKA_BOOTSTRAP}={kafka.bootstrap}")
        exports.append(f"{settings.ENV_KAFKA_CLUSTER}={kafka.dir}")
    elif want_kafka:
        exports.append(f"{settings.ENV_KAFKA_BOOTSTRAP}={kafka.bootstrap}")
    if want_kube:
        exports.append(f"{settings.ENV_KUBECONFIG}={kube.kubeconfig}")
    print("to point tests at these:  export " + " ".join(exports))
    return 0


def _up_kafka(kafka: Kafka | KafkaCluster, timeout: float) -> str:
    running = _kafka_running(kafka.dir)
    if running:
        return f"kafka: already running: {running}"
    if isinstance(kafka, KafkaCluster):
        took = kafka.start(timeout=timeout)
        rf, isr = replication(kafka.brokers)
        return "\n".join([
            f"kafka: {kafka.brokers} broker(s), {kafka.security}, bootstrap {kafka.bootstrap} (ready in {took:.1f}s; "
            f"logs {kafka.dir}/broker-*/kafka.log)",
            f"  replication factor {rf}, min.insync.replicas {isr}; controllers on "
            + ", ".join(f"127.0.0.1:{p}" for p in kafka.controller_ports),
            f"  client config: {kafka.client_yaml}",
        ])
    if KafkaCluster.load(kafka.dir) is not None:
        raise proc.ServiceError(f"{kafka.dir} holds a Kafka cluster's data (see its cluster.json): "
                                "`fleetmedic dev down --only kafka --wipe` first, or the same --brokers/--security")
    took = kafka.start(timeout=timeout)
    client = write_client_yaml(kafka.dir / "client.yaml", {"kafka": {"bootstrap_servers": kafka.bootstrap}},
                               f"the dev Kafka broker in {kafka.dir} (1 broker, plaintext)")
    return f"kafka: bootstrap {kafka.bootstrap} (ready in {took:.1f}s; log {kafka.log})\n  client config: {client}"


def _kafka_dirs(root: Path) -> list[Path]:
    """``kafka`` (``dev up``) and ``kafka-*`` (the fixtures' other clusters) under ``root``."""
    return [root / "kafka", *sorted(root.glob("kafka-*"))]


def _kafka_running(dir: Path) -> str:
    """What runs in ``dir``: "" when nothing."""
    cluster = KafkaCluster.load(dir)
    if cluster is not None:
        nodes = cluster.running()
        if nodes:
            return (f"{cluster.brokers}-broker {cluster.security} cluster (nodes {', '.join(map(str, nodes))} up), "
                    f"bootstrap {cluster.bootstrap}; client config {cluster.client_yaml}")
        return ""
    single = Kafka.load(dir)
    return f"bootstrap {single.bootstrap}" if single.running() else ""


def _up_kube(kube: Kube, timeout: float) -> str:
    if kube.running():
        kube = Kube.load(kube.dir)
        return f"kube: already running ({', '.join(kube.running())}), kubeconfig {kube.kubeconfig}"
    times = kube.start(timeout=timeout)
    p = kube.ports
    return "\n".join(
        [
            f"kube: apiserver {kube.server} (ready in {times['controllers']:.1f}s)",
            f"  kubeconfig {kube.kubeconfig}",
            f"  etcd http://127.0.0.1:{p.etcd}  scheduler :{p.scheduler}  "
            f"controller-manager :{p.controller_manager}  kwok :{p.kwok}  (logs {kube.dir}/*.log)",
            "  ready after (s): " + ", ".join(f"{k} {v:.1f}" for k, v in times.items()),
        ]
    )


def _up_fleet(kube: Kube, nodes: int, crds: Path) -> str:
    from kubernetes import client

    from fleetmedic.devenv import fleet
    from fleetmedic.devenv.kclient import connect

    kube = Kube.load(kube.dir)
    with connect(kube.kubeconfig) as api:
        lines = []
        if crds.is_dir():
            names = fleet.install_crds(api, sorted(crds.glob("*.yaml")))
            lines.append(f"crds: {', '.join(names)}")
        have = client.CoreV1Api(api).list_node(label_selector=f"{LABEL_FLEET}={DEV_FLEET}").items
        if nodes > 0 and not have:
            t = time.monotonic()
            f = fleet.create_fleet(api, nodes, name=DEV_FLEET, timeout=max(60.0, nodes * 1.0))
            lines.append(
                f"fleet: {len(f.nodes)} kwok GPU nodes ({f.selector}, 8 x {fleet.GPU} each) "
                f"ready in {time.monotonic() - t:.1f}s"
            )
        else:
            lines.append(f"fleet: {len(have)} nodes already in fleet '{DEV_FLEET}'")
        return "\n".join(lines)


def instance_dirs(root: Path | None = None) -> list[Path]:
    """The run directory and the per-session ones the pytest fixtures make under it."""
    root = root or settings.run_dir()
    return [root, *sorted(root.glob("pytest-*"))]


def cmd_down(args: argparse.Namespace) -> int:
    want_kafka, want_kube = _wanted(args)
    stopped = []
    for d in instance_dirs():
        if want_kube:
            kube = Kube.load(d / "kube")
            stopped += [f"{n} ({d})" for n in kube.stop()]
            if args.wipe:
                kube.wipe()
        for kdir in _kafka_dirs(d) if want_kafka else []:
            cluster = KafkaCluster.load(kdir)
            if cluster is not None:
                stopped += [f"kafka node {n} ({kdir})" for n in cluster.stop()]
                if args.wipe:
                    cluster.wipe()
                continue
            kafka = Kafka.load(kdir)
            if kafka.stop():
                stopped.append(f"kafka ({kdir})")
            if args.wipe:
                kafka.wipe()
    print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    any_running = False
    for d in instance_dirs():
        for kdir in _kafka_dirs(d):
            cluster = KafkaCluster.load(kdir)
            if cluster is not None and cluster.running():
                any_running = True
                try:
                    brokers = len(asyncio.run(asyncio.wait_for(cluster.describe(), 10))["brokers"])
                    ok = f"{brokers} of {cluster.brokers} brokers answer"
                except Exception as exc:
                    ok = f"NOT answering ({type(exc).__name__})"
                print(f"kafka ({kdir}): {_kafka_running(kdir)}; {ok}")
                continue
            kafka = Kafka.load(kdir)
            if cluster is None and kafka.running():
                any_running = True
                from fleetmedic.devenv.kafka import reachable

                ok = "answers" if reachable(kafka.bootstrap, timeout=5) else "NOT answering"
                print(f"kafka ({kdir}): bootstrap {kafka.bootstrap} {ok}; log {kafka.log}")
        kube = Kube.load(d / "kube")
        names = kube.running()
        if names:
            any_running = True
            from fleetmedic.devenv.kube import reachable as kube_reachable

            ok = "ready" if kube_reachable(kube.kubeconfig, timeout=5) else "NOT ready"
            print(f"kube ({d}): {kube.server} {ok}; running {', '.join(names)}; kubeconfig {kube.kubeconfig}")
    if not any_running:
        print(f"no services running under {settings.run_dir()}")
    for var in (settings.ENV_KAFKA_BOOTSTRAP, settings.ENV_KAFKA_CLUSTER, settings.ENV_KUBECONFIG):
        if os.environ.get(var):
            print(f"{var}={os.environ[var]} (tests use this instead of starting their own)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fleetmedic.devenv", description=__doc__)
    _fill(parser)
    args = parser.parse_args(argv)
    handler = args.handler
    code: int = handler(args)
    return code
