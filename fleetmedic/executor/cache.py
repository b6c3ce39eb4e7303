"""The executor's in-memory view of the cluster's Nodes and Pods, kept by list + watch.

The topology-aware restart (:mod:`.workload.placement_apply`) needs every node's topology labels,
readiness, cordon and taints, and the GPUs the live pods on each node request. Listing all nodes
and all pods for every restart costs O(fleet) API work and decoding per command (at 2,000 nodes
and 4,000 pods: seconds on the client, a full etcd range on a server without a pod watch cache).
:class:`ClusterCache` lists each resource once, then follows its watch, and keeps what placement
reads already indexed:

- ``nodes``: node name -> :class:`~.workload.placement_plan.NodeState` (GPU requests not applied);
- ``pods``: pod uid -> :class:`CachedPod` (node, phase, GPU request, the drain's view of it);
- ``by_node``: node name -> uids of the pods bound to it;
- ``requested``: node name -> GPUs requested by its live pods (phase neither Succeeded nor
  Failed), updated by the difference each pod event makes (O(1) per event).

One thread per resource; raw JSON (no client models: the decode is the cost that matters), listed
and watched through :mod:`fleetmedic.kube_watch` (pages of 500, in one piece if a page's continue
token expires meanwhile). The watch is renewed when it times out, the resource listed again when
the server answers 410 Gone (the new list replaces the old state in one swap), and after any other
error after a backoff (doubling to ``MAX_BACKOFF_S``); meanwhile the last state is served, like an
informer's. Until the first list of both resources is in, :attr:`synced` is False and callers list
from the API server.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from fleetmedic.executor.node.long_plan import PodView
from fleetmedic.executor.node.plan import MIRROR_ANNOTATION
from fleetmedic.executor.workload.placement_plan import NodeState, pod_gpus
from fleetmedic.k8s_keys import LABEL_ROLE
from fleetmedic.kube_watch import ApiClient, Gone, event_of, list_objects, resource_version, watch_lines

log = logging.getLogger(__name__)
WATCH_TIMEOUT_S = 300
BACKOFF_S = 0.5
MAX_BACKOFF_S = 30.0
FINISHED = ("Succeeded", "Failed")


@dataclass(frozen=True, slots=True)
class CachedPod:
    uid: str
    node: str
    phase: str
    gpus: int
    view: PodView

    @property
    def live(self) -> bool:
        return self.phase not in FINISHED


def node_state(obj: Mapping[str, Any], gpu_resource: str) -> NodeState:
    """A Node (JSON) as placement sees it; the same fields ``PlacementRestarter._state`` reads."""
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    try:
        gpus = int(str((status.get("allocatable") or {}).get(gpu_resource, "0")))
    except ValueError:
        gpus = 0
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    taints = tuple((str(t.get("key")), str(t.get("effect"))) for t in spec.get("taints") or [])
    return NodeState(name=str(meta.get("name") or ""), labels=dict(meta.get("labels") or {}), allocatable=gpus,
                     requested=0, unschedulable=bool(spec.get("unschedulable")), ready=ready, taints=taints)


def cached_pod(obj: Mapping[str, Any], gpu_resource: str) -> CachedPod:
    """A Pod (JSON) as the executor keeps it."""
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    owners = meta.get("ownerReferences") or []
    controller = next((o for o in owners if o.get("controller")), owners[0] if owners else None)
    phase = str(status.get("phase") or "")
    try:
        gpus = pod_gpus(spec, gpu_resource)
    except (TypeError, ValueError, AttributeError):
        gpus = 0
    view = PodView(namespace=str(meta.get("namespace") or ""), name=str(meta.get("name") or ""), phase=phase,
                   owner_kind=str(controller.get("kind") or "") if controller else "",
                   mirror=MIRROR_ANNOTATION in (meta.get("annotations") or {}),
                   deleting=meta.get("deletionTimestamp") is not None,
                   role=str((meta.get("labels") or {}).get(LABEL_ROLE, "")))
    return CachedPod(uid=str(meta.get("uid") or f"{view.namespace}/{view.name}"),
                     node=str(spec.get("nodeName") or ""), phase=phase, gpus=gpus, view=view)


class ClusterCache:
    """Nodes and pods by list + watch, with the indexes placement reads; see the module docstring."""

    def __init__(self, api: ApiClient, gpu_resource: str = "nvidia.com/gpu",
                 watch_timeout_s: int = WATCH_TIMEOUT_S) -> None:
        self.api = api
        self.gpu_resource = gpu_resource
        self.watch_timeout_s = watch_timeout_s
        self.nodes: dict[str, NodeState] = {}
        self.pods: dict[str, CachedPod] = {}
        self.by_node: dict[str, set[str]] = {}
        self.requested: dict[str, int] = {}
        self.events = 0  # watch events applied (both resources)
        self.relists = 0
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._listed = {"nodes": threading.Event(), "pods": threading.Event()}
        self._threads: list[threading.Thread] = []

    # --- lifecycle -------------------------------------------------------------------------------

    def start(self) -> ClusterCache:
        for plural in ("nodes", "pods"):
            t = threading.Thread(target=self._run, args=(plural,), name=f"executor-cache-{plural}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def wait_synced(self, timeout: float) -> bool:
        return all(e.wait(timeout) for e in self._listed.values())

    @property
    def synced(self) -> bool:
        return all(e.is_set() for e in self._listed.values())

    def close(self) -> None:
        """Stop the watches (they end at their next event or watch timeout: daemon threads)."""
        self.stop.set()

    # --- reads (each under the lock: a consistent copy) ----------------------------------------------

    def node_states(self) -> dict[str, NodeState]:
        """Every node (``requested`` 0: see :meth:`requested_by_node`)."""
        with self._lock:
            return dict(self.nodes)

    def requested_by_node(self, exclude_pods: Iterable[str] = ()) -> dict[str, int]:
        """GPUs requested by the live pods bound to each node, less those of ``exclude_pods`` (uids:
        a restarted workload's own pods); nodes with none are left out."""
        with self._lock:
            requested = dict(self.requested)
            for uid in exclude_pods:
                pod = self.pods.get(uid)
                if pod is not None and pod.live and pod.node and pod.gpus:
                    requested[pod.node] -= pod.gpus
            return requested

    def node(self, name: str) -> NodeState | None:
        with self._lock:
            return self.nodes.get(name)

    def pods_on(self, node: str) -> list[PodView]:
        """The pods bound to ``node`` (from the pods-by-node index)."""
        with self._lock:
            return [self.pods[uid].view for uid in sorted(self.by_node.get(node, ()))]

    # --- the indexes -------------------------------------------------------------------------------

    def _put_pod(self, pod: CachedPod | None, uid: str) -> None:
        """Replace pod ``uid`` by ``pod`` (None: gone), keeping the indexes (call under the lock)."""
        old = self.pods.pop(uid, None)
        if old is not None and old.node:
            uids = self.by_node.get(old.node)
            if uids is not None:
                uids.discard(uid)
                if not uids:
                    del self.by_node[old.node]
            if old.live and old.gpus:
                left = self.requested.get(old.node, 0) - old.gpus
                if left:
                    self.requested[old.node] = left
                else:
                    self.requested.pop(old.node, None)
        if pod is None:
            return
        self.pods[uid] = pod
        if pod.node:
            self.by_node.setdefault(pod.node, set()).add(uid)
            if pod.live and pod.gpus:
                self.requested[pod.node] = self.requested.get(pod.node, 0) + pod.gpus

    def apply(self, plural: str, etype: str, obj: Mapping[str, Any]) -> None:
        """One watch event (``ADDED``, ``MODIFIED``, ``DELETED``) of a node or a pod."""
        with self._lock:
            self.events += 1
            if plural == "nodes":
                name = str((obj.get("metadata") or {}).get("name") or "")
                if etype == "DELETED":
                    self.nodes.pop(name, None)
                elif name:
                    self.nodes[name] = node_state(obj, self.gpu_resource)
                return
            pod = cached_pod(obj, self.gpu_resource)
            self._put_pod(None if etype == "DELETED" else pod, pod.uid)

    def _replace(self, plural: str, items: list[dict[str, Any]]) -> None:
        """A full list: the state of ``plural`` becomes exactly ``items`` (one swap)."""
        if plural == "nodes":
            nodes = {}
            for obj in items:
                s = node_state(obj, self.gpu_resource)
                if s.name:
                    nodes[s.name] = s
            with self._lock:
                self.nodes = nodes
            return
        pods = [cached_pod(obj, self.gpu_resource) for obj in items]
        with self._lock:
            self.pods, self.by_node, self.requested = {}, {}, {}
            for pod in pods:
                self._put_pod(pod, pod.uid)

    # --- list + watch ------------------------------------------------------------------------------

    def _run(self, plural: str) -> None:
        backoff = BACKOFF_S
        rv = ""
        while not self.stop.is_set():
            try:
                if not rv:
                    rv = self._relist(plural)
                    backoff = BACKOFF_S
                rv = self._watch(plural, rv)
            except Gone:
                rv = ""
            except Exception as exc:  # network, TLS, API errors: keep the last state, list again later
                log.warning("executor cache: %s: %s; listing again in %.1fs", plural, exc, backoff)
                rv = ""
                self.stop.wait(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)

    def _relist(self, plural: str) -> str:
        """List ``plural`` into the cache; its resourceVersion (the raw list is not kept: a local of
        the watch loop would hold it for as long as the watch runs)."""
        items, rv = list_objects(self.api, f"/api/v1/{plural}")
        self._replace(plural, items)
        self.relists += 1
        self._listed[plural].set()
        return rv

    def _watch(self, plural: str, rv: str) -> str:
        path = f"/api/v1/{plural}"
        for line in watch_lines(self.api, path, "", rv, self.watch_timeout_s):
            if self.stop.is_set():
                break
            event = event_of(line, path)
            if event is None:  # an update the cache cannot apply: list again rather than lag
                raise ValueError(f"unreadable watch event {line[:200]!r}")
            etype, obj = event
            rv = resource_version(obj) or rv
            if etype != "BOOKMARK" and isinstance(obj.get("metadata"), dict):
                self.apply(plural, etype, obj)
        return rv
