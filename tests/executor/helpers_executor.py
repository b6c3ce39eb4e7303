"""Helpers for the executor tests (no tests here): settings for a test namespace, signed commands,
pods pinned to a test fleet's node, and an executor service replica on its own thread."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from prometheus_client import CollectorRegistry

from fleetmedic.config import Settings, parse_config
from fleetmedic.devenv import fleet as fl
from fleetmedic.executor.cache import ClusterCache
from fleetmedic.executor.dispatch import CommandExecutor, kube_executor
from fleetmedic.executor.fake_cluster import FakeCluster
from fleetmedic.executor.kube import KubeCluster
from fleetmedic.executor.metrics import ExecutorMetrics
from fleetmedic.executor.service import ExecutorService
from fleetmedic.executor.workload.apply import WorkloadOutcome
from fleetmedic.records import RemediationCommand
from fleetmedic.signing import sign

KEY = b"k" * 40
GPUS = {fl.GPU: "8"}


def settings(namespace: str, extra: str = "", bootstrap: str = "127.0.0.1:1") -> Settings:
    """Executor settings for one test: its namespace holds the Lease, ledger and diagnostics Jobs;
    diagnostics pods tolerate the kwok taint."""
    u = uuid.uuid4().hex[:8]
    text = (f"kafka: {{bootstrap_servers: '{bootstrap}', consumer_group: fm-x{u}}}\n"
            f"topics: {{prefix: x{u}., default_partitions: 1}}\n"
            "metrics: {port: 0}\n"
            "executor:\n"
            f"  diagnostics_namespace: {namespace}\n"
            f"  lease_namespace: {namespace}\n"
            "  diagnostics_tolerations: [{key: kwok.x-k8s.io/node, operator: Exists}]\n"
            "  eviction_retry_backoff_s: 0.3\n"
            "  lease_duration_s: 3.0\n"
            + extra)
    return parse_config(text, env={})


def executor(api: client.ApiClient, s: Settings, identity: str = "test-executor",
             cache: ClusterCache | None = None) -> CommandExecutor:
    return kube_executor(KubeCluster(api, instance=identity), s, KEY, identity=identity, cache=cache)


@dataclass
class RecordingRestarter:
    """A workload restarter that records what it was asked and answers ``outcome``."""

    outcome: WorkloadOutcome = field(default_factory=lambda: WorkloadOutcome("applied", "restarted"))
    calls: list[dict[str, Any]] = field(default_factory=list)

    def restart(self, job: str, *, action: str, exclude_nodes: Sequence[str], params: Mapping[str, str],
                dry_run: bool, actor: str) -> WorkloadOutcome:
        self.calls.append({"job": job, "action": action, "exclude_nodes": list(exclude_nodes),
                           "params": dict(params), "dry_run": dry_run, "actor": actor})
        if dry_run:
            return WorkloadOutcome("skipped", f"dry run: would restart {job}", {"dry_run": "true"})
        return self.outcome


def fake_executor(cluster: FakeCluster, s: Settings, identity: str = "test-executor",
                  restarter: RecordingRestarter | None = None) -> CommandExecutor:
    """The executor on the in-memory cluster (fast tests)."""
    return CommandExecutor(cluster, s, KEY, identity=identity, restarter=restarter or RecordingRestarter())


def command(action: str, node: str = "", job: str = "", cid: str | None = None, ttl: float = 600.0,
            **kw: Any) -> RemediationCommand:
    now = time.time()
    return sign(RemediationCommand(id=cid or f"inc-{uuid.uuid4().hex[:6]}/{action}/{node or job}/e1.1",
                                   action=action, incident_id="inc-test", reason=f"test {action}", issued_at=now,
                                   expires_at=now + ttl, node=node, job=job, **kw), KEY)


def pinned_pod(name: str, node: str, labels: dict[str, str] | None = None) -> client.V1Pod:
    return client.V1Pod.from_dict({
        "metadata": {"name": name, "labels": labels or {"app": name}},
        "spec": {"nodeSelector": {"kubernetes.io/hostname": node}, "tolerations": [fl.KWOK_TOLERATION],
                 "containers": [{"name": "c", "image": "example.invalid/c:1"}]},
    })



def running(core: client.CoreV1Api, namespace: str, name: str) -> bool:
    try:
        pod = core.read_namespaced_pod(name, namespace)
    except client.ApiException:
        return False
    return bool(pod.status and pod.status.phase == "Running")


def node_events(core: client.CoreV1Api, node: str) -> list[str]:
    """Reasons of the Events `kubectl describe node` shows (involvedObject kind Node, uid = name)."""
    events = core.list_namespaced_event("default", field_selector=f"involvedObject.kind=Node,"
                                                                  f"involvedObject.name={node},involvedObject.uid={node}")
    return [e.reason for e in events.items]


class Replica:
    """An ExecutorService on its own thread and event loop."""

    def __init__(self, api: client.ApiClient, s: object, identity: str) -> None:
        self.registry = CollectorRegistry()
        self.service = ExecutorService(s, KEY, KubeCluster(api, instance=identity), identity,  # type: ignore[arg-type]
                                       ExecutorMetrics(self.registry))
        self.loop = asyncio.new_event_loop()
        self.stop = asyncio.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self.service.run(self.stop))

    def leading(self) -> bool:
        return self.registry.get_sample_value("fleetmedic_executor_leader") == 1.0

    def count(self, action: str, outcome: str) -> float:
        v = self.registry.get_sample_value("fleetmedic_executor_commands_total", {"action": action, "outcome": outcome})
        return v or 0.0

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(timeout=30)
        assert not self.thread.is_alive(), f"{self.service.identity} did not stop"
