"""The whole chain on the real broker and control plane, for the end-to-end tests and the MTTR bench:
the worker and the executor as ``fleetmedic`` subprocesses sharing one config, a
GPU batch Job pinned to a test fleet, its placement published as a JobEvent (what a job watcher
publishes), GPU telemetry with an XID, and a pod watch that records every binding."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from kubernetes import client, watch

from fleetmedic import records as r
from fleetmedic.config import Settings, parse_config
from fleetmedic.devenv import fleet as fl
from fleetmedic.devenv.synth import gpu_message
from fleetmedic.devenv.waiting import wait
from fleetmedic.k8s_keys import ANNOTATION_KWOK_COMPLETE, LABEL_FLEET

SIGNING_KEY = "k" * 40
GPUS = {fl.GPU: "8"}


@dataclass
class Chain:
    settings: Settings
    config: Path
    tmp: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def topic(self, name: str) -> str:
        return self.settings.topics.topic(name)

    def log(self, role: str) -> Path:
        return self.tmp / f"{role}.log"

    def alive(self) -> None:
        """Every process of the chain still runs (for :func:`fleetmedic.devenv.waiting.wait`)."""
        for role, proc in self.procs.items():
            assert proc.poll() is None, f"{role} exited {proc.returncode}:\n{tail(self, role)}"

    def context(self) -> str:
        return "\n".join(f"--- {role}\n{tail(self, role)}" for role in self.procs)


def chain_config(tmp: Path, bootstrap: str, kubeconfig: Path, namespace: str, extra: str = "") -> Chain:
    """One config for the worker and the executor: unique topics and group; the executor's Lease,
    ledger and diagnostics Jobs in ``namespace``; evict the job's pods at once; diagnostics pods
    complete under kwok (pass), and a node whose diagnostics pass returns (no repair to wait for);
    quick triage, no budgets in the way of a small test fleet."""
    u = uuid.uuid4().hex[:8]
    text = (f"kafka: {{bootstrap_servers: '{bootstrap}', consumer_group: fm-e{u}}}\n"
            f"topics: {{prefix: e{u}., default_partitions: 1}}\n"
            "metrics: {port: 0}\n"
            "triage: {failure_settle_s: 1.0, network_settle_s: 1.0, incident_merge_s: 1.0}\n"
            "policy: {flap_max_returns: 1000, probation_s: 1.0, transient_retry_backoff_s: 0.0,\n"
            "         definitive_return: diagnostics}\n"
            "safety: {max_quarantined_fraction: 1.0, max_new_isolations: 1000, max_per_rack: 100,\n"
            "         max_per_switch: 100, node_cooldown_s: 0.0,\n"
            "         breaker: {trip_min_nodes: 1000, signature_min_nodes: 1000, domain_min_nodes: 1000}}\n"
            "executor:\n"
            f"  kubeconfig: {kubeconfig}\n"
            f"  diagnostics_namespace: {namespace}\n"
            f"  lease_namespace: {namespace}\n"
            f"  namespace_policies: {{{namespace}: evict_now}}\n"
            "  diagnostics_tolerations: [{key: kwok.x-k8s.io/node, operator: Exists}]\n"
            f"  diagnostics_pod_annotations: {{{ANNOTATION_KWOK_COMPLETE}: 'true'}}\n"
            "  eviction_retry_backoff_s: 0.5\n"
            "  lease_duration_s: 3.0\n" + extra)
    tmp.mkdir(parents=True, exist_ok=True)
    config = tmp / "fleetmedic.yaml"
    config.write_text(text)
    return Chain(parse_config(text, env={}), config, tmp)


def start(chain: Chain, role: str, *args: str) -> subprocess.Popen[bytes]:
    """``fleetmedic <role> --config ...`` as a subprocess, logging to ``<tmp>/<role>.log``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETMEDIC__")}
    env["FLEETMEDIC_SIGNING_KEY"] = SIGNING_KEY
    with chain.log(role).open("ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "fleetmedic.cli.main", role.split("-")[0], "--config",
                                 str(chain.config), *args], env=env, cwd=chain.tmp, stdout=out,
                                stderr=subprocess.STDOUT)
    chain.procs[role] = proc
    return proc


def wait_ready(chain: Chain, settle_s: float = 1.0) -> None:
    """Until the worker's Faust app is Ready, then ``settle_s`` more: what is already on its input
    topics (the job's placement) is consumed before the test produces the fault (Faust interleaves
    topics in no fixed order)."""
    wait("the worker Ready", lambda: "[^Worker]: Ready" in chain.log("worker").read_text(errors="replace"), 60, chain)
    time.sleep(settle_s)


def stop_all(chain: Chain) -> None:
    for proc in chain.procs.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in chain.procs.values():
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def tail(chain: Chain, role: str, lines: int = 40) -> str:
    path = chain.log(role)
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""


def gpu_job(name: str, fleet: fl.Fleet, pods: int = 4) -> client.V1Job:
    """An Indexed batch Job of ``pods`` ranks with 8 GPUs each, pinned to the fleet (kwok toleration
    only: it does not tolerate the quarantine taint)."""
    return fl.model(client.V1Job, {
        "metadata": {"name": name},
        "spec": {"parallelism": pods, "completions": pods, "completionMode": "Indexed", "backoffLimit": 100,
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": {"restartPolicy": "Never", "nodeSelector": {LABEL_FLEET: fleet.name},
                                       "tolerations": [fl.KWOK_TOLERATION],
                                       "containers": [{"name": "trainer", "image": "example.invalid/trainer:1",
                                                       "resources": {"requests": GPUS, "limits": GPUS}}]}}},
    })


@dataclass(frozen=True)
class Rank:
    index: int
    pod: str
    uid: str
    node: str


def running_ranks(core: client.CoreV1Api, namespace: str, job: str) -> list[Rank]:
    """The job's Running, not-terminating pods, by completion index."""
    pods: list[Any] = core.list_namespaced_pod(namespace, label_selector=f"job-name={job}").items
    out = []
    for p in pods:
        meta = p.metadata
        if p.status and p.status.phase == "Running" and not meta.deletion_timestamp:
            idx = int((meta.annotations or {}).get("batch.kubernetes.io/job-completion-index", "0"))
            out.append(Rank(idx, meta.name, meta.uid, p.spec.node_name))
    return sorted(out, key=lambda x: x.index)


def placement(job_ref: str, ranks: list[Rank], ts: float, attempt: int = 0) -> list[r.JobEvent]:
    """The JobEvents a job watcher publishes for a placed job: placement, then start."""
    place = r.JobEvent(job=job_ref, event="placement", ts=ts, attempt=attempt, workload_kind="Job",
                       world_size=len(ranks), placement=[r.RankPlacement(rank=x.index, node=x.node,
                                                                         gpus=list(range(8))) for x in ranks])
    return [place, r.JobEvent(job=job_ref, event="start", ts=ts, attempt=attempt, workload_kind="Job")]


def telemetry(nodes: list[str], t_end: float, samples: int, rng: np.random.Generator,
              xid_node: str = "", xid: int = 79) -> list[r.GpuTelemetry]:
    """``samples`` messages per node, 10 s apart, ending at ``t_end``; the XID on ``xid_node`` in the last."""
    out = []
    for k in range(samples):
        t = t_end - 10.0 * (samples - 1 - k)
        for n in nodes:
            xids = [r.XidEvent(gpu=3, xid=xid, ts=t)] if n == xid_node and k == samples - 1 else None
            out.append(gpu_message(n, t, rng, xids=xids))
    return out


class PodWatch:
    """Records ``(time, pod, node)`` for every pod of the namespace seen bound to a node."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.core = client.CoreV1Api(api)
        self.namespace = namespace
        self.bindings: list[tuple[float, str, str]] = []
        self._watch: Any = watch.Watch()  # type: ignore[no-untyped-call]
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        seen: set[tuple[str, str]] = set()
        while not self._stop.is_set():
            try:
                for ev in self._watch.stream(self.core.list_namespaced_pod, self.namespace, timeout_seconds=5):
                    pod: Any = ev["object"]
                    node = pod.spec.node_name if pod.spec else None
                    if node and (pod.metadata.uid, node) not in seen:
                        seen.add((pod.metadata.uid, node))
                        self.bindings.append((time.time(), pod.metadata.name, node))
                    if self._stop.is_set():
                        return
            except Exception:  # a dropped watch: start it again (the list replays current pods)
                time.sleep(0.2)

    def onto(self, node: str, since: float) -> list[str]:
        return [pod for t, pod, n in self.bindings if n == node and t >= since]

    def stop(self) -> None:
        self._stop.set()
        self._watch.stop()
