"""The whole pipeline at a fleet's load, for minutes to hours, with faults and chaos on a schedule.

    .venv/bin/python bench/soak.py --nodes 200 --minutes 5 --json soak.json [--html soak.html]

What runs, each a real OS process (``kill -9`` is real):

- **services** (``fleetmedic.devenv``, the code of ``fleetmedic dev up``): the three-broker
  SASL_SSL Kafka cluster (``dev up --only kafka --brokers 3 --security sasl_ssl``) and the control
  plane (etcd, kube-apiserver, controller-manager, scheduler, kwok; ``dev up --only kube``) with
  ``--nodes`` kwok GPU nodes, the CRDs and the real JobSet controller, all on free ports under
  ``--run-dir`` (default ``/tmp/soak-run``), so they never meet another ``dev up`` or a test
  session's services. kwok's node Leases last ``--lease-s`` (600 s, as bench_executor_scale).
- **workloads**: 8-rank batch Jobs (8 GPUs a rank) on a quarter of the nodes, and one JobSet (a
  leader and 7 workers), with real pods that kube-scheduler places and kwok runs.
- **fleetmedic**, each as the chart's Deployments run it (a process that exits is started again
  after the kubelet's back-off, 10 s): ``exporter remote-write``, two ``worker --role detect``,
  ``worker --role decide``, ``executor``, ``watch-jobs``; ``exporter kmsg`` on a recorded kernel
  log line for the kernel-log faults. One config (``<run-dir>/soak/fleetmedic.yaml``): the
  cluster's client section, replication factor 3, ``min.insync.replicas`` 2, ``--partitions``
  partitions for the telemetry topics, the safety budgets at their defaults.
- **load** (``bench/soak_load.py``, its own process): what Prometheus sends a remote-write
  receiver for ``--nodes`` dcgm-exporters scraped every 10 s (8 GPUs, 20 series each), and the
  faults: hard faults (an XID in the telemetry; the second of every four in the kernel log
  instead) and degradations (a hot, throttled GPU) on nodes the soak chooses among those running
  job pods, one rack apart, and negative controls (a whole job pauses: every GPU of its nodes goes
  idle at once). The soak keeps its own truth (which node got what, and the first sample that
  carried it).

Chaos (from 45 % of the run to 85 %, evenly spaced; faults go on meanwhile): kill -9 of a
stage-1 worker, of the decision stage and of the executor; a broker killed and started again; a broker stalled for 15 s
(SIGSTOP, then SIGCONT); a kube-apiserver restart. The brokers hit are the leaders of the
commands topic at the time.

Measured (``--json``; an HTML page of plots with ``--html``, default beside the JSON):

- GPU samples/s into stage 1 (``telemetry.gpu``'s end offsets, x 8) and out of it (stage 1's
  committed offsets, x 8), over the run;
- per fault: sample time -> first finding on the node -> first command for the node -> cordon
  seen on the API server (a node watch); p50 / p99 / max, all faults, the telemetry path's outside
  the chaos windows (from an event until 60 s after it ended), and the kernel-log faults apart
  (their time includes starting the kmsg exporter process);
- faults isolated (hard faults whose node was cordoned), false isolations (a node cordoned that
  had no hard fault or degradation), negative controls isolated;
- commands lost (on ``remediation.audit`` but not on the commands topic, or never answered by
  the executor) and duplicated (an id twice on the topic, or applied twice);
- consumer lag of every group every ``--sample-s`` s: the max, and per chaos event the time
  until it is back at steady state (at most twice the 99th percentile before the first event,
  and never less than one second of telemetry);
- RSS of every process at start and end, and its slope over the last two thirds of the run
  (MiB per hour, least squares), with each process's CPU;
- dead letters by stage and reason; the machine's load average (``uptime``) over the run.

Everything started is stopped at the end, whatever happened (``--keep`` leaves the services up).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import html
import itertools
import json
import logging
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fleetmedic import records as r  # noqa: E402
from fleetmedic.bus import client_options, detect_group  # noqa: E402
from fleetmedic.config import Settings, parse_config  # noqa: E402
from fleetmedic.devenv import fleet as fl  # noqa: E402
from fleetmedic.devenv import proc as dproc  # noqa: E402
from fleetmedic.devenv import settings as dsettings  # noqa: E402
from fleetmedic.devenv.kafka_cluster import KafkaCluster, stalled  # noqa: E402
from fleetmedic.devenv.kclient import connect  # noqa: E402
from fleetmedic.devenv.kube import Kube, Ports  # noqa: E402
from fleetmedic.k8s_keys import ANNOTATION_KWOK_COMPLETE  # noqa: E402

SIGNING_KEY = "soak-signing-key-" + "s" * 32
INTERVAL_S = 10.0
NAMESPACE = "soak-jobs"
SYSTEM_NS = "soak-system"
BACKOFF_S = 10.0  # the kubelet's first restart back-off
STALL_S = 15.0  # longer than broker.session.timeout.ms (9 s): the stalled broker is fenced
CHAOS_TAIL_S = 60.0  # a fault injected within this long after a chaos event ended is "in its window"
XIDS = [79, 74, 95, 62, 119, 46, 48, 64]
SUSPECTS_PER_5_MIN = 3.5  # see Soak.plan  # isolating XIDs (reset_gpu, reboot_node, isolate), rotated


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --- processes ------------------------------------------------------------------------------------


class Supervised:
    """A fleetmedic process as a Deployment's container: started again ``BACKOFF_S`` after it
    exits (doubled per exit, at most 5 min). Its log is appended to across restarts."""

    def __init__(self, name: str, argv: list[str], logfile: Path, env: dict[str, str]) -> None:
        self.name, self.argv, self.logfile, self.env = name, argv, logfile, env
        self.exits: list[dict[str, Any]] = []
        self.starts: list[float] = []
        self._stop = threading.Event()
        self.proc = self._start()
        self._thread = threading.Thread(target=self._watch, name=f"kubelet-{name}", daemon=True)
        self._thread.start()

    def _start(self) -> subprocess.Popen[bytes]:
        with self.logfile.open("ab") as out:
            p = subprocess.Popen(self.argv, env=self.env, stdout=out, stderr=subprocess.STDOUT, cwd=self.logfile.parent)
        self.starts.append(time.time())
        return p

    def _watch(self) -> None:
        backoff = BACKOFF_S
        while not self._stop.is_set():
            rc = self.proc.poll()
            if rc is None:
                self._stop.wait(0.2)
                continue
            self.exits.append({"at": time.time(), "rc": rc})
            log(f"{self.name} exited {rc}; restarting in {backoff:.0f} s")
            if self._stop.wait(backoff):
                return
            backoff = min(2 * backoff, 300.0)
            self.proc = self._start()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc.poll() is None else None

    def kill9(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)

    def stop(self) -> int | None:
        self._stop.set()
        self._thread.join(10)
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                return self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def fleetmedic_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "fleetmedic.cli.main", *args]


def proc_stat(pid: int) -> tuple[float, float] | None:
    """(RSS MiB, CPU s) of ``pid``, or None when it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    m = re.search(r"VmRSS:\s+(\d+) kB", status)
    tck = os.sysconf("SC_CLK_TCK")
    return (int(m.group(1)) / 1024 if m else 0.0), (int(stat[11]) + int(stat[12])) / tck


# --- Kafka: everything the pipeline wrote, and the groups' lag --------------------------------------


@dataclass
class Seen:
    """What the soak's reader took from the pipeline's topics (wall times from the records'
    CreateTime)."""

    findings: list[tuple[float, r.Finding]] = field(default_factory=list)
    commands: list[tuple[float, r.RemediationCommand]] = field(default_factory=list)
    results: list[tuple[float, r.RemediationResult]] = field(default_factory=list)
    audited: set[str] = field(default_factory=set)
    dead: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)


class Reader:
    """Reads findings, commands, results, the audit log and dead letters from the start, in a
    thread, until stopped; and answers the consumer groups' lag."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.seen = Seen()
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="reader", daemon=True)

    def start(self) -> Reader:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _main(self) -> None:
        try:
            asyncio.run(self._read())
        except BaseException as exc:  # reported at the end
            self.error = exc
            log(f"reader failed: {exc!r}")

    async def _read(self) -> None:
        from aiokafka import AIOKafkaConsumer

        t = self.settings.topics.topic
        names = {t("findings"): "f", t("remediation.commands"): "c", t("remediation.results"): "r",
                 t("remediation.audit"): "a", t("deadletter"): "d"}
        while not self._stop.is_set():
            consumer = AIOKafkaConsumer(*names, **client_options(self.settings.kafka, metadata_max_age_ms=5000),
                                        auto_offset_reset="earliest", enable_auto_commit=False,
                                        group_id=None)
            try:
                await consumer.start()
                while not self._stop.is_set():
                    batch = await consumer.getmany(timeout_ms=500)
                    for tp, recs in batch.items():
                        kind = names[tp.topic]
                        for rec in recs:
                            self._take(kind, rec.timestamp / 1000, rec.value or b"")
                return
            except Exception as exc:  # a broker fault under the reader: reconnect, keep reading
                log(f"reader: {exc!r}; reconnecting")
                await asyncio.sleep(1.0)
            finally:
                with contextlib.suppress(Exception):
                    await consumer.stop()

    def _take(self, kind: str, at: float, value: bytes) -> None:
        s = self.seen
        with s.lock:
            if kind == "f":
                s.findings.append((at, r.decode(r.Finding, value)))
            elif kind == "c":
                s.commands.append((at, r.decode(r.RemediationCommand, value)))
            elif kind == "r":
                s.results.append((at, r.decode(r.RemediationResult, value)))
            elif kind == "a":
                s.audited.update(r.decode(r.AuditRecord, value).command_ids)
            else:
                d = r.decode(r.DeadLetter, value)
                s.dead[f"{d.stage}: {d.error.split(':', 1)[0][:80]}"] += 1


async def lag_and_ends(settings: Settings) -> tuple[dict[str, int], dict[str, int]]:
    """Per consumer group of the run: its lag (end - committed, summed over its partitions); and
    the end offsets of the telemetry topics, with stage 1's committed offsets on them."""
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient

    opts = client_options(settings.kafka)
    admin = AIOKafkaAdminClient(**opts, request_timeout_ms=8000)
    consumer = AIOKafkaConsumer(**opts, enable_auto_commit=False, request_timeout_ms=8000)
    await admin.start()
    await consumer.start()
    try:
        groups = [g for g, _ in await admin.list_consumer_groups() if g.startswith(settings.kafka.consumer_group)]
        committed = {g: await admin.list_consumer_group_offsets(g) for g in groups}
        tps = {tp for offs in committed.values() for tp in offs}
        gpu = settings.topics.topic("telemetry.gpu")
        tps |= {TopicPartition(gpu, p) for p in range(settings.topics.default_partitions)}
        ends = await consumer.end_offsets(list(tps))
        lag = {g: sum(max(0, ends[tp] - o.offset) for tp, o in offs.items() if o.offset >= 0)
               for g, offs in committed.items()}
        tele = {"gpu_end": sum(n for tp, n in ends.items() if tp.topic == gpu),
                "gpu_done": sum(o.offset for tp, o in committed.get(detect_group(settings), {}).items()
                                if tp.topic == gpu and o.offset >= 0)}
        return lag, tele
    finally:
        await consumer.stop()
        await admin.close()


# --- the API server: when each node was cordoned ----------------------------------------------------


class NodeWatch:
    """Watches the fleet's nodes (list, then watch; again after any error, e.g. an apiserver
    restart) and keeps the first time each was seen unschedulable, and every such change."""

    def __init__(self, kubeconfig: Path, selector: str) -> None:
        self.kubeconfig, self.selector = kubeconfig, selector
        self.cordoned: dict[str, float] = {}
        self.uncordoned: dict[str, list[float]] = defaultdict(list)
        self.state: dict[str, bool] = {}
        self.reconnects = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="node-watch", daemon=True)

    def start(self) -> NodeWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)

    def _see(self, name: str, unschedulable: bool) -> None:
        now = time.time()
        before = self.state.get(name)
        self.state[name] = unschedulable
        if unschedulable and not before and before is not None:
            self.cordoned.setdefault(name, now)
        elif before and not unschedulable:
            self.uncordoned[name].append(now)

    def _main(self) -> None:
        from kubernetes import client, watch

        while not self._stop.is_set():
            try:
                with connect(self.kubeconfig) as api:
                    core = client.CoreV1Api(api)
                    listed = core.list_node(label_selector=self.selector)
                    for n in listed.items:
                        self._see(n.metadata.name, bool(n.spec.unschedulable))
                    rv = listed.metadata.resource_version
                    while not self._stop.is_set():
                        w = watch.Watch()
                        for ev in w.stream(core.list_node, label_selector=self.selector, resource_version=rv,
                                           timeout_seconds=30, allow_watch_bookmarks=True):
                            obj = ev["object"]
                            rv = obj.metadata.resource_version
                            if ev["type"] in ("ADDED", "MODIFIED"):
                                self._see(obj.metadata.name, bool(obj.spec.unschedulable))
                            if self._stop.is_set():
                                break
            except Exception:
                self.reconnects += 1
                self._stop.wait(1.0)


# --- the run ---------------------------------------------------------------------------------------


@dataclass
class Chaos:
    name: str
    at: float  # planned, seconds from the load's start
    started: float = 0.0
    ended: float = 0.0
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class Soak:
    args: argparse.Namespace
    run_dir: Path
    cluster: KafkaCluster | None = None
    faults: list[dict[str, Any]] = field(default_factory=list)
    kube: Kube | None = None
    settings: Settings | None = None
    config: Path | None = None
    procs: dict[str, Supervised] = field(default_factory=dict)
    services: dict[str, Callable[[], int | None]] = field(default_factory=dict)  # name -> pid
    samples: list[dict[str, Any]] = field(default_factory=list)
    chaos: list[Chaos] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)
    placement: dict[str, str] = field(default_factory=dict)  # node -> job
    load_start: float = 0.0
    jobset_stop: Callable[[], None] | None = None

    @property
    def work(self) -> Path:
        return self.run_dir / "soak"

    # --- services ---

    def start_services(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        base = self._free_kafka_base()
        self.cluster = KafkaCluster.on_ports(self.run_dir / "kafka", 3, base, "sasl_ssl")
        self.kube = Kube(self.run_dir / "kube", Ports.free(), node_lease_s=self.args.lease_s)
        errors: list[BaseException] = []

        def up(fn: Callable[[], Any]) -> None:
            try:
                fn()
            except BaseException as exc:
                errors.append(exc)

        t0 = time.monotonic()
        threads = [threading.Thread(target=up, args=(lambda: self.cluster.start(timeout=240),)),  # type: ignore[union-attr]
                   threading.Thread(target=up, args=(lambda: self.kube.start(timeout=240),))]  # type: ignore[union-attr]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        if errors:
            raise errors[0]
        log(f"kafka (3 brokers, sasl_ssl, {self.cluster.bootstrap}) and the control plane "
            f"({self.kube.server}) up in {time.monotonic() - t0:.0f} s")
        for i in self.cluster.ids:
            self.services[f"kafka-{i}"] = (lambda i=i: self.cluster.pid(i))  # type: ignore[union-attr]
        for p in self.kube._procs():
            self.services[p.name] = p.pid

    @staticmethod
    def _free_kafka_base() -> int:
        for base in range(29092, 29800, 10):
            if not any(dproc.port_open(base + k) for k in range(6)):
                return base
        raise RuntimeError("no six free ports for the Kafka cluster")

    def stop_services(self) -> None:
        if self.jobset_stop is not None:
            with contextlib.suppress(Exception):
                self.jobset_stop()
        if self.cluster is not None:
            for node in self.cluster.ids:
                with contextlib.suppress(Exception):
                    self.cluster.signal(node, signal.SIGCONT)
            self.cluster.stop()
        if self.kube is not None:
            self.kube.stop()

    # --- fleet and jobs ---

    def make_fleet(self) -> None:
        from kubernetes import client

        assert self.kube is not None
        with connect(self.kube.kubeconfig) as api:
            fl.install_crds(api, sorted((ROOT / "tests" / "data" / "crds").glob("*.yaml")))
            t0 = time.monotonic()
            fleet = fl.create_fleet(api, self.args.nodes, name="soak", timeout=max(120.0, 0.5 * self.args.nodes))
            self.nodes = fleet.nodes
            log(f"{len(fleet.nodes)} kwok GPU nodes Ready in {time.monotonic() - t0:.0f} s")
            core = client.CoreV1Api(api)
            for ns in (NAMESPACE, SYSTEM_NS):
                core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
            self._jobs(api, fleet)

    def _jobs(self, api: Any, fleet: fl.Fleet) -> None:
        from kubernetes import client

        from fleetmedic.devenv.jobset import create_when_served, jobset_controller, register_webhooks
        from fleetmedic.devenv.placement import jobset_manifest
        from fleetmedic.devenv.waiting import wait
        from fleetmedic.devenv.workloads import gpu_job

        assert self.kube is not None
        ranks = 8
        jobs = max(1, self.args.nodes // 4 // ranks)
        batch = client.BatchV1Api(api)
        for j in range(jobs):
            manifest = gpu_job(f"train-{j:03d}", fleet, ranks, indexed=True)
            manifest["spec"]["podReplacementPolicy"] = "Failed"
            batch.create_namespaced_job(NAMESPACE, client.V1Job.from_dict(manifest))
        manager = str(dsettings.layout().jobset_manager)
        if Path(manager).is_file():
            workdir = self.work / "jobset"
            workdir.mkdir(exist_ok=True)
            cm = jobset_controller(manager, self.kube.kubeconfig, workdir)
            cm.__enter__()
            self.jobset_stop = lambda: cm.__exit__(None, None, None)
            self.services["jobset-controller"] = lambda: _pid_of(str(workdir / "jobset.yaml"))
            register_webhooks(api, NAMESPACE, workdir)
            body = jobset_manifest("pretrain", fleet, ranks, "Failed")
            wait("the JobSet created", lambda: create_when_served(client.CustomObjectsApi(api), NAMESPACE, body), 120)
        else:
            log(f"no JobSet controller at {manager}: Jobs only")
        want = jobs * ranks + (ranks if self.jobset_stop else 0)
        core = client.CoreV1Api(api)

        def running() -> bool:
            pods = core.list_namespaced_pod(NAMESPACE).items
            up = [p for p in pods if p.status.phase == "Running" and p.spec.node_name]
            self.placement = {p.spec.node_name: (p.metadata.labels or {}).get("app", "?") for p in up}
            return len(up) >= want

        t0 = time.monotonic()
        wait(f"{want} job pods Running", running, timeout=max(180.0, want * 0.5))
        log(f"{jobs} Jobs + {'1 JobSet' if self.jobset_stop else 'no JobSet'}: {want} pods Running "
            f"in {time.monotonic() - t0:.0f} s")

    # --- fleetmedic ---

    def write_config(self) -> None:
        assert self.cluster is not None and self.kube is not None
        self.rw_port = dproc.free_ports(1)[0]
        doc: dict[str, Any] = {
            "kafka": self.cluster.kafka_section(consumer_group="soak", client_id="soak"),
            "topics": {"prefix": "soak.", "default_partitions": self.args.partitions, "replication_factor": 3,
                       "min_insync_replicas": 2},
            "metrics": {"port": 0, "bind_address": "127.0.0.1"},
            "exporters": {"remote_write": {"listen": f"127.0.0.1:{self.rw_port}",
                                           "assemble_s": self.args.assemble_s}},
            "jobwatch": {"kubeconfig": str(self.kube.kubeconfig), "namespaces": [NAMESPACE]},
            "executor": {
                "kubeconfig": str(self.kube.kubeconfig), "diagnostics_namespace": SYSTEM_NS,
                "lease_namespace": SYSTEM_NS, "namespace_policies": {NAMESPACE: "evict_now"},
                "diagnostics_tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}],
                "diagnostics_pod_annotations": {ANNOTATION_KWOK_COMPLETE: "true"},
            },
        }
        text = yaml.safe_dump(doc, sort_keys=False)
        self.config = self.work / "fleetmedic.yaml"
        self.config.write_text(text)
        self.settings = parse_config(text, env={})

    def start_fleetmedic(self) -> None:
        from fleetmedic.streams.app import ensure_topics

        assert self.settings is not None and self.config is not None
        asyncio.run(ensure_topics(self.settings))
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETMEDIC__")}
        env["FLEETMEDIC_SIGNING_KEY"] = SIGNING_KEY
        cfg = str(self.config)
        specs = {
            "remote-write": fleetmedic_argv("exporter", "remote-write", "--config", cfg),
            "watch-jobs": fleetmedic_argv("watch-jobs", "--config", cfg),
            "detect-0": fleetmedic_argv("worker", "--role", "detect", "--config", cfg),
            "detect-1": fleetmedic_argv("worker", "--role", "detect", "--config", cfg),
            "decide": fleetmedic_argv("worker", "--role", "decide", "--config", cfg),
            "executor": fleetmedic_argv("executor", "--config", cfg, "--identity", "soak-executor"),
        }
        for name, argv in specs.items():
            self.procs[name] = Supervised(name, argv, self.work / f"{name}.log", env)
        for name in ("detect-0", "detect-1"):
            self._wait_log(name, "detect: partitions", 240)
        self._wait_log("decide", "[^Worker]: Ready", 240)
        self._wait_log("remote-write", "metrics on", 60)
        self._wait_log("executor", "metrics on", 60)
        log("fleetmedic up: " + ", ".join(f"{n} (pid {p.pid})" for n, p in self.procs.items()))

    def _wait_log(self, name: str, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        path = self.procs[name].logfile
        while text not in path.read_text(errors="replace"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name}: no {text!r} in {timeout:.0f} s:\n" + tail(path))
            time.sleep(0.5)

    # --- the plan: faults, chaos ---

    def plan(self, seconds: float) -> list[dict[str, Any]]:
        """Faults on nodes running job pods first (so they hit a job), each on its own rack, evenly
        spread after a minute of warm-up, at a rate the default safety settings let through:
        :data:`SUSPECTS_PER_5_MIN` nodes with a hard fault or a degradation per 5 min (the breaker
        opens at 6 suspects in 5 min, or 2 % of the fleet; 8 new isolations per 10 min), the XIDs
        rotated (one XID on 4 nodes in 5 min opens it too). A fault the safety settings held back
        would be theirs to explain, not the load's. Negative controls: every node of a whole job
        goes idle at once (the job pauses: a checkpoint, a data stall), one job per six suspects.
        One rank alone going idle while its job's other ranks compute is not a control: that is
        how a hung GPU looks, and fleetmedic rightly isolates it."""
        rng = random.Random(self.args.seed)
        rack = {n: i // 4 for i, n in enumerate(self.nodes)}  # fleet.Topology: 4 nodes a rack
        warm, cool = 60.0, 45.0  # the detectors' baselines first; the last fault's answer before the end
        span = seconds - warm - cool
        suspects = max(4, int(SUSPECTS_PER_5_MIN * span / 300.0))
        jobs: dict[str, list[str]] = defaultdict(list)
        for n, job in self.placement.items():
            jobs[job].append(n)
        trains = sorted(j for j in jobs if j.startswith("train-"))
        rng.shuffle(trains)
        paused = trains[:max(1, suspects // 6)]
        controls = {n for j in paused for n in jobs[j]}
        busy = [n for n in self.nodes if n in self.placement and n not in controls]
        idle = [n for n in self.nodes if n not in self.placement]
        rng.shuffle(busy)
        rng.shuffle(idle)
        used_racks: set[int] = set()
        chosen: list[str] = []
        for n in busy + idle:  # nodes with job pods first
            if rack[n] not in used_racks:
                chosen.append(n)
                used_racks.add(rack[n])
        chosen.reverse()  # pop() takes the busy ones first
        if len(chosen) < suspects:
            raise RuntimeError(f"only {len(chosen)} racks for {suspects} faults: more --nodes")
        faults = []
        hard = 0
        for k in range(suspects):
            at = round(warm + span * (k + 0.5) / suspects, 1)
            if k % 4 == 2:
                faults.append({"kind": "degrade", "node": chosen.pop(), "gpu": (k + 3) % 8, "at_s": at,
                               "via": "telemetry"})
                continue
            faults.append({"kind": "hard", "node": chosen.pop(), "gpu": k % 8, "xid": XIDS[hard % len(XIDS)],
                           "at_s": at, "via": "kmsg" if hard % 4 == 1 else "telemetry"})
            hard += 1
        for k, job in enumerate(paused):
            at = round(warm + span * (k + 0.75) / len(paused), 1)
            faults += [{"kind": "control", "node": n, "gpu": -1, "job": job, "at_s": at, "via": "telemetry"}
                       for n in sorted(jobs[job])]
        return faults

    def chaos_plan(self, seconds: float) -> list[Chaos]:
        names = ["kill -9 stage-1 worker", "broker stall", "kill -9 decision stage", "kube-apiserver restart",
                 "broker restart", "kill -9 executor"]
        lo, hi = 0.45 * seconds, 0.85 * seconds
        return [Chaos(n, round(lo + (hi - lo) * k / (len(names) - 1), 1)) for k, n in enumerate(names)]

    def do_chaos(self, c: Chaos) -> None:
        assert self.cluster is not None and self.kube is not None and self.settings is not None
        c.started = time.time()
        log(f"chaos: {c.name}")
        try:
            if c.name.startswith("kill -9"):
                target = {"kill -9 stage-1 worker": "detect-0", "kill -9 decision stage": "decide",
                          "kill -9 executor": "executor"}[c.name]
                c.detail["pid"] = self.procs[target].pid
                self.procs[target].kill9()
            elif c.name == "broker restart":
                node = self._commands_leader()
                c.detail["node"] = node
                self.cluster.kill(node)
                c.detail["restart_s"] = round(self.cluster.start_broker(node, timeout=240), 1)
            elif c.name == "broker stall":
                node = self._commands_leader()
                c.detail["node"] = node
                with stalled(self.cluster, node):
                    time.sleep(STALL_S)
            elif c.name == "kube-apiserver restart":
                apiserver = next(p for p in self.kube._procs() if p.name == "kube-apiserver")
                apiserver.stop(timeout=30)
                apiserver.start()
                dproc.wait_until(lambda: self._apiserver_ready(), timeout=180, what="kube-apiserver /readyz",
                                 log=apiserver.log, procs=[apiserver])
        except Exception as exc:
            c.detail["error"] = repr(exc)
            log(f"chaos {c.name} failed: {exc!r}")
        c.ended = time.time()
        log(f"chaos: {c.name} done in {c.ended - c.started:.1f} s {c.detail}")

    def _chaos_loop(self) -> None:
        """The chaos events in turn, each at its time (one at a time: a restart is waited for),
        beside the sampling, so lag and memory are seen during each."""
        for c in self.chaos:
            delay = self.load_start + c.at - time.time()
            if delay > 0:
                time.sleep(delay)
            self.do_chaos(c)

    def _commands_leader(self) -> int:
        assert self.cluster is not None and self.settings is not None
        try:
            node = self.cluster.leader(self.settings.topics.topic("remediation.commands"))
            if node in self.cluster.ids:
                return node
        except Exception:
            pass
        return self.cluster.ids[0]

    def _apiserver_ready(self) -> bool:
        from fleetmedic.devenv.kube import _get

        assert self.kube is not None
        try:
            return _get(f"{self.kube.server}/readyz", token=self.kube._token()) == b"ok"
        except Exception:
            return False

    def kmsg_fault(self, f: dict[str, Any]) -> None:
        """The kernel log line of an XID on the node, through ``fleetmedic exporter kmsg --input``
        (one process per fault, as the DaemonSet's pod on that node would read it)."""
        assert self.config is not None
        d = self.work / "kmsg"
        d.mkdir(exist_ok=True)
        pci = f"0000:{0x18 + 16 * f['gpu']:02x}:00"
        boot = time.time() - 1000.0
        lines = d / f"{f['node']}.dmesg"
        lines.write_text(f"[ 1000.000000] NVRM: Xid (PCI:{pci}): {f['xid']}, pid=4242, name=python, "
                         "GPU has fallen off the bus.\n")
        pci_map = d / "pci-map.csv"
        pci_map.write_text("".join(f"{g}, 00000000:{0x18 + 16 * g:02X}:00.0\n" for g in range(8)))
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETMEDIC__")}
        with (d / f"{f['node']}.log").open("ab") as out:
            subprocess.Popen(fleetmedic_argv("exporter", "kmsg", "--config", str(self.config), "--input", str(lines),
                                             "--node", f["node"], "--pci-map", str(pci_map), "--no-nvml",
                                             "--boot-time", f"{boot:.3f}", "--metrics-port", "-1"),
                             env=env, stdout=out, stderr=subprocess.STDOUT, cwd=d)
        with (self.work / "truth.jsonl").open("a") as truth:
            truth.write(json.dumps({**f, "sample_ts": boot + 1000.0, "sent_at": time.time()}) + "\n")

    # --- sampling ---

    def sample(self, loadgen: subprocess.Popen[bytes] | None) -> None:
        assert self.settings is not None
        row: dict[str, Any] = {"t": time.time(), "load1": os.getloadavg()[0]}
        try:
            lag, tele = asyncio.run(asyncio.wait_for(lag_and_ends(self.settings), 15))
            row["lag"], row["tele"] = lag, tele
        except Exception as exc:
            row["lag_error"] = repr(exc)[:200]
        pids: dict[str, int | None] = {n: p.pid for n, p in self.procs.items()}
        pids.update({n: fn() for n, fn in self.services.items()})
        pids["soak"] = os.getpid()
        if loadgen is not None:
            pids["load generator"] = loadgen.pid if loadgen.poll() is None else None
        row["proc"] = {}
        for name, pid in pids.items():
            got = proc_stat(pid) if pid else None
            if got is not None:
                row["proc"][name] = {"pid": pid, "rss_mb": round(got[0], 1), "cpu_s": round(got[1], 2)}
        self.samples.append(row)

    # --- the soak ---

    def run(self) -> dict[str, Any]:
        args = self.args
        seconds = args.minutes * 60.0
        assert self.settings is not None and self.kube is not None
        faults = self.faults
        self.chaos = self.chaos_plan(seconds) if not args.no_chaos else []
        reader = Reader(self.settings).start()
        watch = NodeWatch(self.kube.kubeconfig, "fleetmedic.io/fleet=soak").start()
        truth = self.work / "truth.jsonl"
        stats = self.work / "load-stats.jsonl"
        for p in (truth, stats):
            p.unlink(missing_ok=True)
        self.load_start = time.time() + 2.0
        plan = {"url": f"http://127.0.0.1:{self.rw_port}/api/v1/write", "nodes": self.nodes, "interval_s": INTERVAL_S,
                "start": self.load_start, "seconds": seconds, "seed": args.seed,
                "faults": [f for f in faults if f["via"] == "telemetry"], "truth": str(truth), "stats": str(stats)}
        (self.work / "load-plan.json").write_text(json.dumps(plan))
        with (self.work / "load.log").open("ab") as out:
            loadgen = subprocess.Popen([sys.executable, str(ROOT / "bench" / "soak_load.py"),
                                        str(self.work / "load-plan.json")], stdout=out, stderr=subprocess.STDOUT)
        log(f"load: {len(self.nodes)} nodes x 8 GPUs every {INTERVAL_S:.0f} s "
            f"({len(self.nodes) * 8 / INTERVAL_S:,.0f} GPU samples/s) for {args.minutes} min; "
            f"{len(faults)} faults, {len(self.chaos)} chaos events")
        kmsg = sorted((f for f in faults if f["via"] == "kmsg"), key=lambda f: f["at_s"])
        chaos_thread = threading.Thread(target=self._chaos_loop, name="chaos", daemon=True)
        chaos_thread.start()
        next_sample = time.time()
        try:
            while time.time() < self.load_start + seconds:
                now = time.time()
                if loadgen.poll() is not None:
                    raise RuntimeError(f"the load generator exited {loadgen.returncode}:\n"
                                       + tail(self.work / "load.log"))
                if now >= next_sample:
                    self.sample(loadgen)
                    next_sample = now + args.sample_s
                if kmsg and now >= self.load_start + kmsg[0]["at_s"]:
                    self.kmsg_fault(kmsg.pop(0))
                time.sleep(0.2)
            chaos_thread.join(timeout=300)
            try:
                loadgen.wait(timeout=60)
            except subprocess.TimeoutExpired:  # behind its schedule: what it did not send is not sent
                log("the load generator is still sending a minute after the load's end: stopped")
                loadgen.kill()
                loadgen.wait()
            log("load done; waiting for the pipeline to drain")
            drain_until = time.time() + args.drain_s
            while time.time() < drain_until:
                self.sample(None)
                last = self.samples[-1].get("lag", {})
                if last and not any(last.values()) and self._answered(reader, truth):
                    break
                time.sleep(args.sample_s)
            time.sleep(5.0)
            self.sample(None)
        finally:
            if loadgen.poll() is None:
                loadgen.kill()
            watch.stop()
            reader.stop()
        exits = {n: p.exits for n, p in self.procs.items()}
        return self.report(faults, reader, watch, truth, stats, exits)

    def _answered(self, reader: Reader, truth: Path) -> bool:
        """Every command on the topic has a result."""
        s = reader.seen
        with s.lock:
            ids = {c.id for _, c in s.commands}
            done = {x.command_id for _, x in s.results}
        return ids <= done

    def stop_fleetmedic(self) -> dict[str, int | None]:
        return {n: p.stop() for n, p in self.procs.items()}

    # --- the figures ---

    def report(self, faults: list[dict[str, Any]], reader: Reader, watch: NodeWatch, truth_path: Path,
               stats_path: Path, exits: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
        s = reader.seen
        truth = [json.loads(x) for x in truth_path.read_text().splitlines()] if truth_path.exists() else []
        injected = {t["node"]: t for t in truth}
        windows = [(c.started, c.ended + CHAOS_TAIL_S) for c in self.chaos if c.started]

        first_finding: dict[str, float] = {}
        for at, f in sorted(s.findings, key=lambda x: x[0]):
            if f.node in injected and at >= injected[f.node]["sample_ts"] - 1:
                first_finding.setdefault(f.node, at)
        first_command: dict[str, float] = {}
        cordon_cmd: dict[str, float] = {}
        for at, c in sorted(s.commands, key=lambda x: x[0]):
            if c.node:
                if c.node in injected and at >= injected[c.node]["sample_ts"] - 1:
                    first_command.setdefault(c.node, at)
                if c.action == "cordon":
                    cordon_cmd.setdefault(c.node, at)
        per_fault = []
        for t in truth:
            n, t0 = t["node"], t["sample_ts"]
            row = {"node": n, "kind": t["kind"], "via": t["via"], "xid": t.get("xid"), "sample_ts": t0,
                   "in_chaos": any(a <= t0 <= b for a, b in windows)}
            for key, got in (("finding_s", first_finding.get(n)), ("command_s", first_command.get(n)),
                             ("cordon_s", watch.cordoned.get(n))):
                row[key] = round(got - t0, 3) if got is not None and got >= t0 - 1 else None
            per_fault.append(row)

        def pcts(xs: list[float]) -> dict[str, Any]:
            if not xs:
                return {"n": 0}
            xs = sorted(xs)
            q = lambda p: xs[min(len(xs) - 1, round(p * (len(xs) - 1)))]  # noqa: E731
            return {"n": len(xs), "p50": round(q(0.5), 3), "p99": round(q(0.99), 3), "max": round(xs[-1], 3)}

        hard = [p for p in per_fault if p["kind"] == "hard"]
        latency = {}
        for key in ("finding_s", "command_s", "cordon_s"):
            # the kernel-log faults' figures include starting their kmsg exporter (a DaemonSet's runs
            # all along): apart, and out of the telemetry path's
            latency[key] = {"all": pcts([p[key] for p in hard if p[key] is not None]),
                            "outside_chaos": pcts([p[key] for p in hard if p[key] is not None and not p["in_chaos"]
                                                   and p["via"] == "telemetry"]),
                            "kmsg": pcts([p[key] for p in hard if p[key] is not None and p["via"] == "kmsg"])}
        degr = [p for p in per_fault if p["kind"] == "degrade"]
        latency["degrade_finding_s"] = pcts([p["finding_s"] for p in degr if p["finding_s"] is not None])

        bad = {p["node"] for p in per_fault if p["kind"] in ("hard", "degrade")}
        controls = {p["node"] for p in per_fault if p["kind"] == "control"}
        cordoned_by_us = set(cordon_cmd)
        isolations = {
            "hard_faults": len(hard), "hard_isolated": sum(p["cordon_s"] is not None for p in hard),
            "degradations": len(degr), "degradations_found": sum(p["finding_s"] is not None for p in degr),
            "degradations_isolated": sum(p["cordon_s"] is not None for p in degr),
            "false_isolations": sorted(cordoned_by_us - bad),
            "controls": len(controls), "controls_isolated": sorted(cordoned_by_us & controls),
            "cordoned_seen_not_commanded": sorted(set(watch.cordoned) - cordoned_by_us),
        }

        ids = Counter(c.id for _, c in s.commands)
        applied = Counter(x.command_id for _, x in s.results if x.outcome == "applied")
        answered = {x.command_id for _, x in s.results}
        outcomes = Counter(f"{x.action}: {x.outcome}" for _, x in s.results)
        commands = {
            "on_topic": len(ids), "duplicated_on_topic": sorted(i for i, n in ids.items() if n > 1),
            "applied_twice": sorted(i for i, n in applied.items() if n > 1),
            "audited_not_on_topic": sorted(s.audited - set(ids)),
            "on_topic_not_audited": sorted(set(ids) - s.audited),
            "never_answered": sorted(set(ids) - answered), "outcomes": dict(sorted(outcomes.items())),
            "by_action": dict(Counter(c.action for _, c in s.commands)),
        }
        commands["lost"] = len(commands["audited_not_on_topic"]) + len(commands["never_answered"])
        commands["duplicated"] = len(commands["duplicated_on_topic"]) + len(commands["applied_twice"])

        rows = [x for x in self.samples if "lag" in x]
        lag_series = {g: [(x["t"] - self.load_start, x["lag"].get(g, 0)) for x in rows]
                      for g in sorted({g for x in rows for g in x["lag"]})}
        first_chaos = min((c.started for c in self.chaos if c.started), default=float("inf"))
        steady_rows = [x for x in rows if self.load_start + 60 <= x["t"] < first_chaos]
        per_second = self.args.nodes / INTERVAL_S
        steady = {}
        for g in lag_series:
            pre = sorted(x["lag"].get(g, 0) for x in steady_rows) or [0]
            steady[g] = max(2 * pre[min(len(pre) - 1, round(0.99 * (len(pre) - 1)))], per_second)
        recovery = []
        for c in self.chaos:
            if not c.started:
                continue
            back: dict[str, Any] = {}
            for g in lag_series:
                after = [x for x in rows if x["t"] >= c.started]
                peak = max((x["lag"].get(g, 0) for x in after if x["t"] <= c.ended + 120), default=0)
                ok = [x["t"] for x in after if x["t"] >= c.ended and x["lag"].get(g, 0) <= steady[g]]
                back[g] = {"peak": peak, "back_s": round(ok[0] - c.ended, 1) if ok else None}
            worst = [v["back_s"] for v in back.values()]
            recovery.append({"event": c.name, "at_s": round(c.started - self.load_start, 1),
                             "took_s": round(c.ended - c.started, 1), **c.detail, "groups": back,
                             "back_to_steady_s": None if None in worst else max(worst, default=0.0)})

        tele = [(x["t"], x["tele"]) for x in rows if "tele" in x]
        steady_tele = [(t, v) for t, v in tele if self.load_start + 30 <= t <= self.load_start + self.args.minutes * 60]
        throughput = {}
        if len(steady_tele) >= 2:
            (ta, a), (tb, b) = steady_tele[0], steady_tele[-1]
            throughput = {"gpu_samples_in_per_s": round(8 * (b["gpu_end"] - a["gpu_end"]) / (tb - ta), 1),
                          "gpu_samples_out_per_s": round(8 * (b["gpu_done"] - a["gpu_done"]) / (tb - ta), 1),
                          "offered_gpu_samples_per_s": self.args.nodes * 8 / INTERVAL_S}
        load_stats = [json.loads(x) for x in stats_path.read_text().splitlines()] if stats_path.exists() else []
        if load_stats:
            last = load_stats[-1]
            throughput["load_generator"] = {k: last[k] for k in ("samples", "posts", "retries", "failed_posts",
                                                                 "refused", "cpu_s")}
            throughput["load_generator"]["late_s_max"] = max(x["late_s"] for x in load_stats)

        memory = {}
        names = sorted({n for x in self.samples for n in x.get("proc", {})})
        end_t = self.load_start + self.args.minutes * 60
        for n in names:
            pts = [(x["t"], x["proc"][n]) for x in self.samples if n in x.get("proc", {})]
            last_pid = pts[-1][1]["pid"]
            mine = [(t, v) for t, v in pts if v["pid"] == last_pid]
            tail_pts = [(t, v["rss_mb"]) for t, v in mine if t >= self.load_start + self.args.minutes * 20
                        and t <= end_t]
            slope = _slope(tail_pts) * 3600 if len(tail_pts) >= 3 else None
            wall = pts[-1][0] - pts[0][0]
            cpu = sum(max(0.0, b[1]["cpu_s"] - a[1]["cpu_s"]) for a, b in itertools.pairwise(pts)
                      if a[1]["pid"] == b[1]["pid"])
            memory[n] = {"rss_start_mb": pts[0][1]["rss_mb"], "rss_end_mb": pts[-1][1]["rss_mb"],
                         "rss_max_mb": max(v["rss_mb"] for _, v in pts),
                         "slope_last_two_thirds_mb_per_h": None if slope is None else round(slope, 1),
                         "pids": len({v["pid"] for _, v in pts}), "cores": round(cpu / wall, 3) if wall > 0 else None}

        loads = [x["load1"] for x in self.samples]
        return {
            "command": " ".join(sys.argv), "nodes": self.args.nodes, "gpus": self.args.nodes * 8,
            "minutes": self.args.minutes, "interval_s": INTERVAL_S, "partitions": self.args.partitions,
            "assemble_s": self.args.assemble_s, "cpus": os.cpu_count(),
            "machine_load": {"start": loads[0] if loads else None, "max": max(loads, default=None),
                             "mean": round(statistics.fmean(loads), 2) if loads else None},
            "throughput": throughput, "latency": latency, "isolations": isolations, "commands": commands,
            "lag": {"max": {g: max(v for _, v in xs) for g, xs in lag_series.items()}, "steady_threshold": steady,
                    "chaos": recovery},
            "findings": {"total": len(s.findings), "per_minute": round(len(s.findings) / self.args.minutes, 1),
                         "by_detector": dict(Counter(f.detector for _, f in s.findings).most_common())},
            "memory": memory, "dead_letters": dict(s.dead), "process_exits": exits,
            "node_watch_reconnects": watch.reconnects, "reader_error": repr(reader.error) if reader.error else None,
            "faults": per_fault,
            "series": {"lag": lag_series,
                       "rss": {n: [(round(x["t"] - self.load_start, 1), x["proc"][n]["rss_mb"]) for x in self.samples
                                   if n in x.get("proc", {})] for n in names},
                       "chaos": [{"name": c.name, "start": round(c.started - self.load_start, 1),
                                  "end": round(c.ended - self.load_start, 1)} for c in self.chaos if c.started]},
        }


def _slope(pts: list[tuple[float, float]]) -> float:
    n = len(pts)
    mx = sum(t for t, _ in pts) / n
    my = sum(v for _, v in pts) / n
    den = sum((t - mx) ** 2 for t, _ in pts)
    return sum((t - mx) * (v - my) for t, v in pts) / den if den else 0.0


def _pid_of(needle: str) -> int | None:
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError):
                if needle in (d / "cmdline").read_bytes().decode(errors="replace"):
                    return int(d.name)
    return None


def tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""


# --- the plots --------------------------------------------------------------------------------------


def _svg(title: str, series: dict[str, list[tuple[float, float]]], chaos: list[dict[str, Any]], ylabel: str,
         dots: bool = False) -> str:
    w, h, pad = 900, 260, 50
    pts = [p for xs in series.values() for p in xs]
    if not pts:
        return f"<h3>{html.escape(title)}</h3><p>no data</p>"
    x0, x1 = min(0.0, min(t for t, _ in pts)), max(t for t, _ in pts) or 1.0
    y1 = max(v for _, v in pts) or 1.0

    def sx(t: float) -> float:
        return pad + (t - x0) / ((x1 - x0) or 1) * (w - 2 * pad)

    def sy(v: float) -> float:
        return h - pad + 10 - v / y1 * (h - 2 * pad)

    colours = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#7f7f7f",
               "#bcbd22", "#17becf"]
    out = [f'<h3>{html.escape(title)}</h3><svg width="{w}" height="{h + 20}" style="font:11px sans-serif">',
           f'<line x1="{pad}" y1="{h - pad + 10}" x2="{w - pad}" y2="{h - pad + 10}" stroke="#000"/>',
           f'<text x="{pad}" y="{h + 5}">{x0:.0f} s</text><text x="{w - pad - 40}" y="{h + 5}">{x1:.0f} s</text>',
           f'<text x="5" y="{pad - 25}">{html.escape(ylabel)} (max {y1:,.1f})</text>']
    for c in chaos:
        width = max(1.0, sx(c["end"]) - sx(c["start"]))
        out.append(f'<rect x="{sx(c["start"]):.1f}" y="{pad - 10}" width="{width:.1f}" height="{h - 2 * pad + 20}" '
                   f'fill="#f4a" opacity="0.25"><title>{html.escape(c["name"])}</title></rect>')
    for k, (name, xs) in enumerate(series.items()):
        col = colours[k % len(colours)]
        if dots:
            out += [f'<circle cx="{sx(t):.1f}" cy="{sy(v):.1f}" r="3" fill="{col}"/>' for t, v in xs]
        else:
            path = " ".join(f"{sx(t):.1f},{sy(v):.1f}" for t, v in xs)
            out.append(f'<polyline fill="none" stroke="{col}" stroke-width="1.5" points="{path}"/>')
        out.append(f'<text x="{w - pad + 5 - 200}" y="{pad - 10 + 12 * k}" fill="{col}">{html.escape(name)}</text>')
    out.append("</svg>")
    return "".join(out)


def write_html(result: dict[str, Any], path: Path) -> None:
    ser = result["series"]
    chaos = ser["chaos"]
    lat: dict[str, list[tuple[float, float]]] = defaultdict(list)
    start = min((f["sample_ts"] for f in result["faults"]), default=0.0)
    for f in result["faults"]:
        if f["cordon_s"] is not None:
            lat[f"{f['kind']}: sample -> cordon"].append((f["sample_ts"] - start + 60, f["cordon_s"]))
        if f["finding_s"] is not None:
            lat[f"{f['kind']}: sample -> finding"].append((f["sample_ts"] - start + 60, f["finding_s"]))
    rss = {n: xs for n, xs in ser["rss"].items()}
    summary = {k: result[k] for k in ("command", "nodes", "minutes", "machine_load", "throughput", "latency",
                                      "isolations", "dead_letters")}
    summary["commands"] = {k: result["commands"][k] for k in ("on_topic", "lost", "duplicated", "by_action")}
    summary["lag"] = {k: result["lag"][k] for k in ("max", "chaos")}
    doc = ["<!doctype html><meta charset=utf-8><title>fleetmedic soak</title><body style='font-family:sans-serif'>",
           f"<h2>fleetmedic soak: {result['nodes']} nodes, {result['minutes']} min</h2>",
           "<p>shaded: chaos events (hover for the name)</p>",
           _svg("consumer lag (messages)", ser["lag"], chaos, "messages"),
           _svg("latency per fault (s), by the fault's time (approx.)", dict(lat), chaos, "seconds", dots=True),
           _svg("RSS (MiB)", rss, chaos, "MiB"),
           f"<pre>{html.escape(json.dumps(summary, indent=1))}</pre></body>"]
    path.write_text("".join(doc))


# --- main -------------------------------------------------------------------------------------------


@contextlib.contextmanager
def soak_services(s: Soak) -> Iterator[Soak]:
    try:
        s.start_services()
        yield s
    finally:
        if not s.args.keep:
            s.stop_services()
            log("services stopped")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=200)
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--json", type=Path, required=True, help="write the figures here")
    ap.add_argument("--html", type=Path, help="the plots (default: --json with .html)")
    ap.add_argument("--run-dir", type=Path, default=Path(os.environ.get("SOAK_RUN_DIR", "/tmp/soak-run")))
    ap.add_argument("--partitions", type=int, default=4, help="partitions of the telemetry topics")
    ap.add_argument("--assemble-s", type=float, default=1.0,
                    help="exporters.remote_write.assemble_s (a scrape's samples arrive in one request here)")
    ap.add_argument("--lease-s", type=int, default=600, help="kwok's node Lease duration")
    ap.add_argument("--sample-s", type=float, default=5.0, help="how often lag, RSS and CPU are sampled")
    ap.add_argument("--drain-s", type=float, default=120.0, help="at most this long for the pipeline to drain")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--no-chaos", action="store_true")
    ap.add_argument("--keep", action="store_true", help="leave the services running")
    args = ap.parse_args(argv)
    left = KafkaCluster.load(args.run_dir / "kafka")
    if (left is not None and left.running()) or Kube.load(args.run_dir / "kube").running():
        raise SystemExit(f"services run in {args.run_dir}: `FLEETMEDIC_RUN_DIR={args.run_dir} fleetmedic dev down` "
                         "first, or another --run-dir")
    for sub in ("kafka", "kube", "soak"):  # what an earlier soak left there
        shutil.rmtree(args.run_dir / sub, ignore_errors=True)
    os.environ["FLEETMEDIC_RUN_DIR"] = str(args.run_dir)
    for noisy in ("aiokafka", "kafka", "urllib3", "kubernetes"):  # the soak's own clients, under broker faults
        logging.getLogger(noisy).setLevel(logging.CRITICAL)
    s = Soak(args, args.run_dir)
    log(f"soak: {args.nodes} nodes, {args.minutes} min, run dir {args.run_dir}; uptime: {_uptime()}")
    with soak_services(s):
        s.make_fleet()
        s.write_config()
        s.faults = s.plan(args.minutes * 60.0)
        try:
            s.start_fleetmedic()
            result = s.run()
        finally:
            codes = s.stop_fleetmedic()
            log(f"fleetmedic stopped: {codes}")
    result["exit_codes"] = codes
    result["uptime_end"] = _uptime()
    args.json.write_text(json.dumps(result, indent=1))
    html_path = args.html or args.json.with_suffix(".html")
    write_html(result, html_path)
    brief = {k: result[k] for k in ("throughput", "latency", "isolations")}
    brief["commands"] = {k: result["commands"][k] for k in ("on_topic", "lost", "duplicated")}
    brief["lag_max"] = result["lag"]["max"]
    brief["lag_back_s"] = {c["event"]: c["back_to_steady_s"] for c in result["lag"]["chaos"]}
    brief["rss_slope_mb_per_h"] = {n: m["slope_last_two_thirds_mb_per_h"] for n, m in result["memory"].items()}
    brief["cores"] = {n: m["cores"] for n, m in result["memory"].items()}
    brief["dead_letters"] = result["dead_letters"]
    print(json.dumps(brief, indent=1))
    log(f"figures in {args.json}, plots in {html_path}")
    return 0


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


if __name__ == "__main__":
    sys.exit(main())
