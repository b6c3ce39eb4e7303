"""An in-memory API server for :mod:`fleetmedic.kube_watch`'s lists and watches, for fast tests and benches.

:class:`FakeApiServer` answers the two calls ``kube_watch`` makes of a ``kubernetes`` ApiClient
(``param_serialize``, ``call_api``) from objects held as JSON bytes, by API path:

- a list: pages of ``limit`` objects with continue tokens and a resourceVersion; with
  ``expire_continue`` the next request that carries a continue token is answered 410, as an API
  server that compacted past the token answers;
- a watch: the lines queued with :meth:`send` (an event) or :meth:`gone` (a 410 ``ERROR`` event),
  until the watch's ``timeoutSeconds``.

Every request is recorded in ``requests`` (path and query); ``before`` is called with each first
(a test's hook to change the objects mid-list). What it does not do: label selectors, field
selectors, anything but GET.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit


class _Raw:
    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks

    def stream(self, amt: int | None = None, decode_content: bool = False) -> Iterator[bytes]:
        return self._chunks

    def release_conn(self) -> None:
        pass


class _Response:
    def __init__(self, status: int, body: bytes = b"", chunks: Iterator[bytes] | None = None) -> None:
        self.status = status
        self._body = body
        self.response = _Raw(chunks or iter(()))

    def read(self) -> bytes:
        return self._body


class FakeApiServer:
    """Objects by API path, listed in pages and watched; see the module docstring."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, bytes]] = {}
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.before: Callable[[str, dict[str, str]], None] | None = None
        self.expire_continue = False
        self.version = 1
        self._lines: dict[str, queue.Queue[bytes]] = {}
        self._lock = threading.Lock()

    # --- the objects ------------------------------------------------------------------------------

    def put(self, path: str, obj: dict[str, Any]) -> None:
        """Add or replace ``obj`` (by metadata namespace/name) at ``path``."""
        meta = obj.setdefault("metadata", {})
        with self._lock:
            self.version += 1
            meta["resourceVersion"] = str(self.version)
            key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
            self.objects.setdefault(path, {})[key] = json.dumps(obj, separators=(",", ":")).encode()

    def delete(self, path: str, key: str) -> None:
        """Remove the object ``"namespace/name"`` from ``path`` (no watch event: :meth:`send` one)."""
        with self._lock:
            self.objects.get(path, {}).pop(key, None)

    def send(self, path: str, etype: str, obj: dict[str, Any]) -> None:
        """Queue a watch event for the watches of ``path``."""
        self._queue(path).put(json.dumps({"type": etype, "object": obj}).encode() + b"\n")

    def gone(self, path: str) -> None:
        """Queue a 410 ``ERROR`` event for the watches of ``path``: their callers list again."""
        self._queue(path).put(b'{"type":"ERROR","object":{"kind":"Status","code":410}}\n')

    def _queue(self, path: str) -> queue.Queue[bytes]:
        with self._lock:
            return self._lines.setdefault(path, queue.Queue())

    # --- what kube_watch calls --------------------------------------------------------------------

    def param_serialize(self, method: str, resource_path: str, query_params: list[tuple[str, str]] | None = None,
                        **_: Any) -> tuple[str, str, dict[str, str], None, None]:
        return method, f"{resource_path}?{urlencode(query_params or [])}", {}, None, None

    def call_api(self, method: str, url: str, *_: Any, **__: Any) -> _Response:
        parts = urlsplit(url)
        path, query = parts.path, dict(parse_qsl(parts.query))
        self.requests.append((path, query))
        if self.before is not None:
            self.before(path, query)
        if query.get("watch"):
            return _Response(200, chunks=self._watch(path, float(query.get("timeoutSeconds") or 1)))
        if "continue" in query and self.expire_continue:
            self.expire_continue = False
            return _Response(410, b'{"kind":"Status","code":410,"reason":"Expired"}')
        with self._lock:
            items = list(self.objects.get(path, {}).values())
            version = self.version
        start = int(query.get("continue") or 0)
        limit = int(query.get("limit") or 0) or len(items) or 1
        chunk, more = items[start:start + limit], start + limit < len(items)
        meta = json.dumps({"resourceVersion": str(version), **({"continue": str(start + limit)} if more else {})})
        return _Response(200, b'{"metadata":' + meta.encode() + b',"items":[' + b",".join(chunk) + b"]}")

    def _watch(self, path: str, timeout_s: float) -> Iterator[bytes]:
        lines, deadline = self._queue(path), time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                yield lines.get(timeout=min(left, 0.1))
            except queue.Empty:
                continue


# --- objects as a kwok cluster serves them ----------------------------------------------------------

_TS = "2026-01-01T00:00:00Z"
_CONDITIONS = (("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
               ("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
               ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
               ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
               ("NetworkUnavailable", "False", "RouteCreated", "RouteController created a route"))


def _managed(manager: str, fields: dict[str, Any], subresource: str = "") -> dict[str, Any]:
    entry = {"manager": manager, "operation": "Update", "apiVersion": "v1", "time": _TS, "fieldsType": "FieldsV1",
             "fieldsV1": fields}
    return {**entry, "subresource": subresource} if subresource else entry


def _field_set(obj: Any) -> Any:
    """managedFields' FieldsV1 of ``obj``: every key as ``f:key`` (lists as one entry), as the API
    server writes them."""
    if isinstance(obj, dict):
        return {".": {}, **{f"f:{k}": _field_set(v) for k, v in obj.items()}}
    return {}


def served_node(fleet: str, index: int) -> dict[str, Any]:
    """Node ``index`` of ``fleet`` (:func:`fleetmedic.devenv.fleet.node_manifest`) as the API server
    returns it once kwok has initialised it: uid, managedFields, kwok's status (about 5 KB of JSON)."""
    from fleetmedic.devenv.fleet import node_manifest

    node = node_manifest(fleet, index)
    name = node["metadata"]["name"]
    cidr = f"10.{index // 250 % 250}.{index % 250}.0/24"
    node["spec"].update({"podCIDR": cidr, "podCIDRs": [cidr]})
    node["status"].update({
        "conditions": [{"lastHeartbeatTime": _TS, "lastTransitionTime": _TS, "message": m, "reason": r, "status": s,
                        "type": t} for t, s, r, m in _CONDITIONS],
        "addresses": [{"address": f"10.0.{index // 250 % 250}.{index % 250}", "type": "InternalIP"},
                      {"address": name, "type": "Hostname"}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10247}},
        "nodeInfo": {"architecture": "amd64", "bootID": "", "containerRuntimeVersion": "kwok-v0.8.0",
                     "kernelVersion": "kwok-v0.8.0", "kubeProxyVersion": "kwok-v0.8.0", "kubeletVersion": "kwok-v0.8.0",
                     "machineID": "", "operatingSystem": "linux", "osImage": "", "systemUUID": ""},
        "phase": "Running"})
    node["metadata"].update({
        "uid": f"00000000-0000-4000-8000-{index:012d}", "creationTimestamp": _TS,
        "managedFields": [_managed("OpenAPI-Generator", {"f:metadata": _field_set(
                              {"annotations": node["metadata"]["annotations"], "labels": node["metadata"]["labels"]}),
                              "f:spec": {"f:taints": {}}}),
                          _managed("kwok", {"f:status": _field_set(node["status"])}, "status"),
                          _managed("kube-controller-manager", {"f:spec": _field_set(
                              {"podCIDR": cidr, "podCIDRs": cidr})})]})
    return node


def served_pod(namespace: str, job: str, rank: int, node: str, phase: str = "Running", uid: str = "") -> dict[str, Any]:
    """Rank ``rank`` of the Indexed GPU Job ``job`` as the API server returns it once kwok runs it on
    ``node``: the Job controller's labels, finalizer and owner, the service-account volume,
    tolerations, kwok's status, managedFields (about 6 KB of JSON)."""
    uid = uid or f"{job}-{rank}-uid"
    job_uid = f"{job}-job-uid"
    labels = {"batch.kubernetes.io/controller-uid": job_uid, "batch.kubernetes.io/job-completion-index": str(rank),
              "batch.kubernetes.io/job-name": job, "controller-uid": job_uid, "job-name": job}
    meta = {"name": f"{job}-{rank}-x7k2p", "generateName": f"{job}-{rank}-", "namespace": namespace, "uid": uid,
            "creationTimestamp": _TS, "labels": labels,
            "annotations": {"batch.kubernetes.io/job-completion-index": str(rank)},
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": job, "uid": job_uid,
                                 "controller": True, "blockOwnerDeletion": True}],
            "finalizers": ["batch.kubernetes.io/job-tracking"]}
    gpu = {"nvidia.com/gpu": "8"}
    spec = {"volumes": [{"name": "kube-api-access-abcde", "projected": {"defaultMode": 420, "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {
                    "apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}}],
            "containers": [{"name": "trainer", "image": "example.invalid/trainer:1",
                            "env": [{"name": "JOB_COMPLETION_INDEX", "valueFrom": {"fieldRef": {
                                "fieldPath": "metadata.labels['batch.kubernetes.io/job-completion-index']"}}}],
                            "resources": {"limits": gpu, "requests": gpu},
                            "volumeMounts": [{"name": "kube-api-access-abcde", "readOnly": True,
                                              "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
                            "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
                            "imagePullPolicy": "IfNotPresent"}],
            "restartPolicy": "Never", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
            "nodeSelector": {"fleetmedic.io/fleet": "soak"}, "serviceAccountName": "default",
            "serviceAccount": "default", "nodeName": node, "securityContext": {}, "hostname": f"{job}-{rank}",
            "schedulerName": "default-scheduler",
            "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"},
                            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                             "tolerationSeconds": 300},
                            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
                             "tolerationSeconds": 300}],
            "priority": 0, "enableServiceLinks": True, "preemptionPolicy": "PreemptLowerPriority"}
    status = {"phase": phase,
              "conditions": [{"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": _TS}
                             for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady",
                                       "PodScheduled")],
              "hostIP": "10.0.0.1", "hostIPs": [{"ip": "10.0.0.1"}],
              "podIP": "10.0.0.2", "podIPs": [{"ip": "10.0.0.2"}],
              "startTime": _TS, "qosClass": "BestEffort",
              "containerStatuses": [{"name": "trainer", "state": {"running": {"startedAt": _TS}}, "lastState": {},
                                     "ready": True, "restartCount": 0, "image": "example.invalid/trainer:1",
                                     "imageID": "", "started": True}]}
    meta["managedFields"] = [_managed("kube-controller-manager", {"f:metadata": _field_set(
                                 {k: meta[k] for k in ("annotations", "labels", "generateName")}),
                                 "f:spec": _field_set(spec)}),
                             _managed("kwok", {"f:status": _field_set(status)}, "status")]
    return {"metadata": meta, "spec": spec, "status": status}
