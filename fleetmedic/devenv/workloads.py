"""GPU workloads on a dev fleet, for the workload-restart and placement tests and benches: GPU job
manifests pinned to a test fleet, quarantining a node the way the executor does, and a pod watch that
records every binding."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client, watch

from fleetmedic.devenv import fleet as fl
from fleetmedic.k8s_keys import LABEL_FLEET, TAINT_QUARANTINE

QUARANTINE_TAINT = {"key": TAINT_QUARANTINE, "value": "suspect", "effect": "NoSchedule"}
GPUS = {fl.GPU: "8"}
TOLERATE_ALL = [{"operator": "Exists"}]


def pod_spec(fleet: fl.Fleet, tolerations: list[dict[str, Any]] | None = None,
             restart_policy: str = "Never") -> dict[str, Any]:
    return {
        "restartPolicy": restart_policy,
        "nodeSelector": {LABEL_FLEET: fleet.name},
        "tolerations": tolerations if tolerations is not None else [fl.KWOK_TOLERATION],
        "containers": [{"name": "trainer", "image": "example.invalid/trainer:1",
                        "resources": {"requests": GPUS, "limits": GPUS}}],
    }


def gpu_job(name: str, fleet: fl.Fleet, pods: int = 4, indexed: bool = False,
            tolerations: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"parallelism": pods, "completions": pods, "backoffLimit": 10,
                            "template": {"metadata": {"labels": {"app": name}},
                                         "spec": pod_spec(fleet, tolerations)}}
    if indexed:
        spec["completionMode"] = "Indexed"
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}, "spec": spec}


def quarantine(api: client.ApiClient, node: str) -> None:
    """Cordon and taint ``node`` as the executor does (``fleetmedic.io/quarantine:NoSchedule``)."""
    core = client.CoreV1Api(api)
    current: Any = core.read_node(node)
    taints = [t.to_dict() for t in (current.spec.taints or [])] + [QUARANTINE_TAINT]
    core.patch_node(node, {"spec": {"unschedulable": True, "taints": taints}})



def live_pods(api: client.ApiClient, namespace: str, selector: str) -> list[Any]:
    """The selected pods (V1Pod) not being deleted."""
    pods: list[Any] = client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector=selector).items
    return [p for p in pods if p.metadata and not p.metadata.deletion_timestamp]


def running(api: client.ApiClient, namespace: str, selector: str, count: int,
            exclude_uids: set[str] = frozenset()) -> list[Any] | None:  # type: ignore[assignment]
    """``count`` Running pods not among ``exclude_uids``, or None."""
    pods = [p for p in live_pods(api, namespace, selector)
            if p.status and p.status.phase == "Running" and p.metadata.uid not in exclude_uids]
    return pods if len(pods) == count else None


@dataclass
class BindingWatch:
    """Watches the namespace's pods from a resourceVersion on; records (pod uid, name, node) of
    every pod event that carries a node name, until stopped."""

    api: client.ApiClient
    namespace: str
    bindings: list[tuple[str, str, str]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> BindingWatch:
        core = client.CoreV1Api(self.api)
        listed: Any = core.list_namespaced_pod(self.namespace)
        rv = listed.metadata.resource_version
        self._thread = threading.Thread(target=self._run, args=(rv,), daemon=True)
        self._thread.start()
        return self

    def _run(self, rv: str) -> None:
        core = client.CoreV1Api(self.api)
        while not self._stop.is_set():
            w: Any = watch.Watch()  # type: ignore[no-untyped-call]
            try:
                for ev in w.stream(core.list_namespaced_pod, self.namespace, resource_version=rv,
                                   timeout_seconds=2):
                    pod = ev["object"]
                    rv = pod.metadata.resource_version
                    if pod.spec and pod.spec.node_name:
                        self.bindings.append((pod.metadata.uid, pod.metadata.name, pod.spec.node_name))
                    if self._stop.is_set():
                        break
            finally:
                w.stop()

    def stop(self) -> list[tuple[str, str, str]]:
        time.sleep(0.5)  # let the last events arrive
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=10)
        return list(self.bindings)
