"""A fake GPU fleet on the dev control plane: kwok nodes with topology labels, CRDs, evictions.

Node labels (the topology fleetmedic reasons about; values are unique per fleet; the keys are
``LABEL_*`` of :mod:`fleetmedic.k8s_keys`, but for the zone's):

- ``fleetmedic.io/fleet``: the fleet name (one ``create_fleet`` call); used to clean up.
- ``fleetmedic.io/pool``: node pool, e.g. ``h100``.
- ``fleetmedic.io/rack``: rack, ``<fleet>-rack-NN`` (``nodes_per_rack`` nodes each).
- ``fleetmedic.io/leaf``: leaf switch, ``<fleet>-leaf-NN`` (``racks_per_leaf`` racks each).
- ``topology.kubernetes.io/zone``: the zone, ``<zone>``.
- ``kubernetes.io/hostname``, ``node.kubernetes.io/instance-type``, ``nvidia.com/gpu.product``,
  ``nvidia.com/gpu.count``: as a kubelet and NVIDIA GPU feature discovery would set them.

Each node has ``nvidia.com/gpu: "8"`` capacity and allocatable, the annotation
``kwok.x-k8s.io/node: fake`` (kwok manages it and makes it Ready) and the taint
``kwok.x-k8s.io/node=fake:NoSchedule``; pods must carry ``KWOK_TOLERATION`` to land there.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

import yaml
from kubernetes import client
from kubernetes.client import ApiException

from fleetmedic.devenv.kclient import get_json
from fleetmedic.devenv.kube import KWOK_ANNOTATION
from fleetmedic.k8s_keys import LABEL_FLEET, LABEL_LEAF, LABEL_POOL, LABEL_RACK

M = TypeVar("M")
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: 10x faster on big manifests
GPU = "nvidia.com/gpu"
LABEL_ZONE = "topology.kubernetes.io/zone"
KWOK_TAINT = {"key": KWOK_ANNOTATION[0], "value": KWOK_ANNOTATION[1], "effect": "NoSchedule"}
KWOK_TOLERATION = {
    "key": KWOK_ANNOTATION[0],
    "operator": "Equal",
    "value": KWOK_ANNOTATION[1],
    "effect": "NoSchedule",
}


@dataclass(frozen=True)
class Topology:
    nodes_per_rack: int = 4
    racks_per_leaf: int = 4
    pool: str = "h100"
    zone: str = "dev-a"
    gpus: int = 8
    gpu_product: str = "NVIDIA-H100-80GB-HBM3"
    cpu: str = "192"
    memory: str = "2Ti"


@dataclass(frozen=True)
class Fleet:
    name: str
    nodes: list[str] = field(default_factory=list)

    @property
    def selector(self) -> str:
        return f"{LABEL_FLEET}={self.name}"


def node_manifest(fleet: str, index: int, topo: Topology = Topology()) -> dict[str, Any]:
    """The Node object for node ``index`` of ``fleet`` (pure)."""
    rack = index // topo.nodes_per_rack
    leaf = rack // topo.racks_per_leaf
    name = f"{fleet}-gpu-{index:03d}"
    resources = {"cpu": topo.cpu, "memory": topo.memory, "pods": "110", GPU: str(topo.gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_ANNOTATION[0]: KWOK_ANNOTATION[1]},
            "labels": {
                "type": "kwok",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": f"fake-{topo.gpus}x{topo.pool}",
                LABEL_FLEET: fleet,
                LABEL_POOL: topo.pool,
                LABEL_RACK: f"{fleet}-rack-{rack:02d}",
                LABEL_LEAF: f"{fleet}-leaf-{leaf:02d}",
                LABEL_ZONE: topo.zone,
                "nvidia.com/gpu.product": topo.gpu_product,
                "nvidia.com/gpu.count": str(topo.gpus),
            },
        },
        "spec": {"taints": [KWOK_TAINT]},
        "status": {"capacity": resources, "allocatable": resources},
    }


def new_fleet_name(prefix: str = "fleet") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def create_fleet(
    api: client.ApiClient,
    count: int,
    name: str | None = None,
    topo: Topology = Topology(),
    timeout: float = 60.0,
) -> Fleet:
    """Create ``count`` kwok GPU nodes and wait until all are Ready and schedulable."""
    core = client.CoreV1Api(api)
    fleet = Fleet(name or new_fleet_name(), [])
    for i in range(count):
        body = node_manifest(fleet.name, i, topo)
        node = core.create_node(model(client.V1Node, body))
        if not (node.status and node.status.allocatable and GPU in node.status.allocatable):
            core.patch_node_status(body["metadata"]["name"], {"status": body["status"]})
        fleet.nodes.append(body["metadata"]["name"])
    wait_schedulable(api, fleet.nodes, timeout=timeout)
    return fleet


def schedulable(node: client.V1Node) -> bool:
    """Ready, and no longer carrying the not-ready taint the node lifecycle controller manages."""
    conditions = (node.status.conditions or []) if node.status else []
    ready = any(c.type == "Ready" and c.status == "True" for c in conditions)
    taints = node.spec.taints or [] if node.spec else []
    return ready and not any(t.key.startswith("node.kubernetes.io/") for t in taints)


def wait_schedulable(api: client.ApiClient, names: Sequence[str], timeout: float = 60.0) -> None:
    core = client.CoreV1Api(api)
    wanted = set(names)
    deadline = time.monotonic() + timeout
    while True:
        nodes = core.list_node().items
        pending = wanted - {name_of(n) for n in nodes if schedulable(n)}
        if not pending:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{len(pending)} of {len(wanted)} nodes not Ready after {timeout:.0f}s: {sorted(pending)[:5]}"
            )
        time.sleep(0.25)


def delete_fleet(api: client.ApiClient, fleet: Fleet | str) -> int:
    """Delete every node of the fleet; return how many were deleted."""
    name = fleet.name if isinstance(fleet, Fleet) else fleet
    core = client.CoreV1Api(api)
    nodes = core.list_node(label_selector=f"{LABEL_FLEET}={name}").items
    for n in nodes:
        try:
            core.delete_node(name_of(n))
        except ApiException as exc:
            if exc.status != 404:
                raise
    return len(nodes)


def install_crds(api: client.ApiClient, paths: Iterable[Path], timeout: float = 60.0) -> list[str]:
    """Create the CRDs in ``paths`` (skip those that exist) and wait until they are Established."""
    ext = client.ApiextensionsV1Api(api)
    names = []
    for path in paths:
        for doc in yaml.load_all(path.read_text(), Loader=_LOADER):  # CRDs are ~1 MB
            if not doc or doc.get("kind") != "CustomResourceDefinition":
                continue
            names.append(doc["metadata"]["name"])
            try:
                # the manifests are large: skip deserialising the echo
                crd = model(client.V1CustomResourceDefinition, doc)
                ext.create_custom_resource_definition(crd, _preload_content=False)
            except ApiException as exc:
                if exc.status != 409:
                    raise
    deadline = time.monotonic() + timeout
    for name in names:
        while not _established(api, name):
            if time.monotonic() > deadline:
                raise TimeoutError(f"CRD {name} not Established after {timeout:.0f}s")
            time.sleep(0.2)
    return names


def _established(api: client.ApiClient, name: str) -> bool:
    doc = get_json(api, f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
    conditions = doc.get("status", {}).get("conditions") or []
    return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)


def model(cls: type[M], doc: dict[str, Any]) -> M:
    """A typed model from a manifest dict (the v37 client validates bodies with pydantic); never None."""
    obj = cls.from_dict(doc)  # type: ignore[attr-defined]
    if obj is None:
        raise ValueError(f"empty {cls.__name__} manifest")
    return cast(M, obj)


def name_of(obj: Any) -> str:
    """``obj.metadata.name`` of a typed Kubernetes object ("" if unset)."""
    meta = getattr(obj, "metadata", None)
    return str(getattr(meta, "name", "") or "")


@dataclass(frozen=True)
class Eviction:
    """The outcome of ``evict``: evicted or not, how many tries, the last HTTP status."""

    evicted: bool
    attempts: int
    status: int
    reason: str = ""


def evict(
    api: client.ApiClient,
    pod: str,
    namespace: str,
    attempts: int = 5,
    backoff: float = 0.5,
) -> Eviction:
    """Evict a pod through the Eviction API, retrying while a PodDisruptionBudget blocks it (429).

    Gives up after ``attempts`` tries and reports it; other API errors propagate. A pod that is
    already gone (404) counts as evicted.
    """
    core = client.CoreV1Api(api)
    body = client.V1Eviction(metadata=client.V1ObjectMeta(name=pod, namespace=namespace))
    status, reason = 0, ""
    for attempt in range(1, attempts + 1):
        try:
            core.create_namespaced_pod_eviction(pod, namespace, body)
            return Eviction(True, attempt, 201)
        except ApiException as exc:
            status, reason = exc.status, _message(exc)
            if exc.status == 404:
                return Eviction(True, attempt, 404, reason)
            if exc.status != 429:
                raise
        if attempt < attempts:
            time.sleep(backoff * 2 ** (attempt - 1))
    return Eviction(False, attempts, status, reason)


def _message(exc: ApiException) -> str:
    import json

    try:
        return str(json.loads(exc.body or "{}").get("message", exc.reason))
    except ValueError:
        return str(exc.reason)
