"""The executor's node and pod cache (executor/cache.py).

- The indexes (pods by node, GPUs requested per node) follow each event: a pod added, moved,
  finished, deleted; a node changed and deleted (the data structure alone, no server).
- On the real control plane: after its list, the watch keeps the cache equal to what the API server
  lists (pods by node against ``Cluster.pods_on``, GPU requests against a fresh list, a cordon, a
  label, a deleted pod and a deleted node), and the topology-aware restart plans from the same node
  states with the cache as with its per-restart lists.
- A restart placed from the cache (no node or pod list) keeps the replacements in the job's leaf
  and off the quarantined suspect.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client

from fleetmedic.config import Settings
from fleetmedic.devenv import fleet as fl
from fleetmedic.devenv.kclient import connect
from fleetmedic.devenv.placement import leaves_of, pick_suspect, recover, start_one_job_per_leaf
from fleetmedic.devenv.waiting import wait
from fleetmedic.devenv.workloads import quarantine
from fleetmedic.executor.cache import ClusterCache
from fleetmedic.executor.kube import KubeCluster
from fleetmedic.executor.workload.placement_apply import _NODE_CACHES, PlacementRestarter

GPU = "nvidia.com/gpu"


def _pod(uid: str, node: str, gpus: int, phase: str = "Running", ns: str = "ml") -> dict[str, Any]:
    return {"metadata": {"name": f"p-{uid}", "namespace": ns, "uid": uid},
            "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"limits": {GPU: str(gpus)}}}]},
            "status": {"phase": phase}}


def _node(name: str, gpus: int = 8, unschedulable: bool = False) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"rack": "r1"}},
            "spec": {"unschedulable": unschedulable, "taints": [{"key": "k", "effect": "NoSchedule"}]},
            "status": {"allocatable": {GPU: str(gpus)}, "conditions": [{"type": "Ready", "status": "True"}]}}


def test_indexes_follow_every_event() -> None:
    cache = ClusterCache(client.ApiClient())
    cache.apply("nodes", "ADDED", _node("n1"))
    cache.apply("nodes", "ADDED", _node("n2"))
    cache.apply("pods", "ADDED", _pod("a", "n1", 4))
    cache.apply("pods", "ADDED", _pod("b", "n1", 2))
    cache.apply("pods", "ADDED", _pod("c", "", 8, "Pending"))  # not bound: no node, no request
    assert cache.requested_by_node() == {"n1": 6}
    assert [p.name for p in cache.pods_on("n1")] == ["p-a", "p-b"]
    assert cache.requested_by_node(exclude_pods={"a"}) == {"n1": 2}

    cache.apply("pods", "MODIFIED", _pod("c", "n2", 8, "Running"))  # bound
    cache.apply("pods", "MODIFIED", _pod("b", "n1", 2, "Succeeded"))  # finished: on the node, no request
    assert cache.requested_by_node() == {"n1": 4, "n2": 8}
    assert [p.name for p in cache.pods_on("n1")] == ["p-a", "p-b"]
    cache.apply("pods", "DELETED", _pod("b", "n1", 2, "Succeeded"))
    cache.apply("pods", "DELETED", _pod("a", "n1", 4))
    assert cache.requested_by_node() == {"n2": 8} and cache.pods_on("n1") == [] and "n1" not in cache.by_node

    cache.apply("nodes", "MODIFIED", _node("n1", gpus=4, unschedulable=True))
    n1 = cache.node("n1")
    assert n1 is not None
    assert (n1.allocatable, n1.unschedulable, n1.ready, n1.taints) == (4, True, True, (("k", "NoSchedule"),))
    cache.apply("nodes", "DELETED", _node("n1"))
    assert set(cache.node_states()) == {"n2"}

    # a full list replaces everything at once
    cache._replace("pods", [_pod("d", "n2", 1)])
    assert cache.requested_by_node() == {"n2": 1} and set(cache.pods) == {"d"}


def _listed_requests(api: client.ApiClient, nodes: set[str]) -> dict[str, int]:
    pods = client.CoreV1Api(api).list_pod_for_all_namespaces(
        field_selector="status.phase!=Succeeded,status.phase!=Failed").items
    out: dict[str, int] = {}
    for p in pods:
        if p.spec.node_name in nodes:
            gpus = sum(int((c.resources.limits or {}).get(GPU, 0)) for c in p.spec.containers)
            if gpus:
                out[p.spec.node_name] = out.get(p.spec.node_name, 0) + gpus
    return out



def test_watch_keeps_the_cache_equal_to_the_api_server(
    kube_api: client.ApiClient, namespace: str, make_fleet: Callable[..., fl.Fleet]
) -> None:
    fleet = make_fleet(3)
    nodes = set(fleet.nodes)
    core = client.CoreV1Api(kube_api)

    def pod(node: str, gpus: int) -> str:
        name = f"p-{uuid.uuid4().hex[:6]}"
        core.create_namespaced_pod(namespace, client.V1Pod.from_dict({
            "metadata": {"name": name},
            "spec": {"nodeName": node, "tolerations": [fl.KWOK_TOLERATION],
                     "containers": [{"name": "c", "image": "example.invalid/c:1",
                                     "resources": {"limits": {GPU: str(gpus)}}}]}}))
        return name

    first = [pod(fleet.nodes[0], 4), pod(fleet.nodes[0], 2)]  # before the cache: in its first list
    cache = ClusterCache(kube_api, watch_timeout_s=5).start()  # short watches: each renewal is exercised
    try:
        assert cache.wait_synced(30.0)
        later = pod(fleet.nodes[1], 8)  # after: from the watch
        cluster = KubeCluster(kube_api)

        def agrees() -> bool:
            return (cache.requested_by_node().keys() & nodes == _listed_requests(kube_api, nodes).keys()
                    and all(cache.requested_by_node().get(n, 0) == _listed_requests(kube_api, nodes).get(n, 0)
                            for n in nodes)
                    and all({p.ref for p in cache.pods_on(n)} == {p.ref for p in cluster.pods_on(n)} for n in nodes))

        wait("the cache's pods match the API server's", agrees)
        assert cache.requested_by_node()[fleet.nodes[0]] == 6 and cache.requested_by_node()[fleet.nodes[1]] == 8
        core.delete_namespaced_pod(first[0], namespace, grace_period_seconds=0)
        wait("the deleted pod leaves the index", lambda: cache.requested_by_node().get(fleet.nodes[0]) == 2)
        core.patch_node(fleet.nodes[2], {"spec": {"unschedulable": True}, "metadata": {"labels": {"x": "y"}}})
        wait("the cordon and the label reach the cache",
               lambda: (s := cache.node(fleet.nodes[2])) is not None and s.unschedulable and s.labels.get("x") == "y")
        time.sleep(6.0)  # past a watch renewal
        core.delete_namespaced_pod(later, namespace, grace_period_seconds=0)
        wait("a pod deleted after a renewal leaves the index",
               lambda: fleet.nodes[1] not in cache.requested_by_node())
        assert _listed_requests(kube_api, nodes) == {fleet.nodes[0]: 2}

        # the restart plans from the same node states with the cache as with its lists
        settings = Settings()
        with_cache = PlacementRestarter(KubeCluster(kube_api), settings, cache=cache)
        listing = PlacementRestarter(KubeCluster(kube_api), settings)
        own = {str(p.metadata.uid) for p in core.list_namespaced_pod(namespace).items
               if p.spec.node_name == fleet.nodes[0]}
        cached_states, none = with_cache._node_states(fleet.nodes)
        listed_states, listed_nodes = listing._node_states(fleet.nodes)
        assert none is None and listed_nodes is not None
        assert {n: cached_states[n] for n in nodes} == {n: listed_states[n] for n in nodes}
        for own_pods in (set(), own):
            a = with_cache._cached_requests(cached_states, own_pods)
            b = listing._with_requests(listed_nodes, own_pods)
            assert {n: a[n] for n in nodes} == {n: b[n] for n in nodes}
        assert a[fleet.nodes[0]].requested == 0 and a[fleet.nodes[2]].unschedulable

        core.delete_node(fleet.nodes[2])
        wait("the deleted node leaves the cache", lambda: cache.node(fleet.nodes[2]) is None)
    finally:
        cache.close()


def test_a_restart_placed_from_the_cache_stays_in_the_leaf_and_off_the_suspect(
    kube_api: client.ApiClient, kube_config: Path, namespace: str, make_fleet: Callable[..., fl.Fleet]
) -> None:
    fleet = make_fleet(8, nodes_per_rack=2, racks_per_leaf=2)
    leaf_of = leaves_of(kube_api, fleet)
    jobs = start_one_job_per_leaf(kube_api, namespace, fleet, pods=3, leaves=[min(leaf_of.values())])
    suspect = pick_suspect(kube_api, namespace, "job-0")
    quarantine(kube_api, suspect)
    with connect(kube_config) as api:  # its own client and cluster: the per-cluster node list stays untouched
        cache = ClusterCache(api).start()
        try:
            assert cache.wait_synced(30.0)
            wait("the cordon reaches the cache", lambda: bool((s := cache.node(suspect)) and s.unschedulable))
            cluster = KubeCluster(api)
            restarter = PlacementRestarter(cluster, Settings(), cache=cache)
            r = recover(kube_api, restarter, namespace, "job-0", jobs["job-0"], 3, suspect, leaf_of, {suspect: 0.0})
        finally:
            cache.close()
        listed = _NODE_CACHES.get(cluster)
        assert listed is not None and listed._nodes is None  # placed from the cache: no node list
    assert r.outcome == "applied", r.reason
    assert r.details["capacity"] == "sufficient" and r.details["preferred_domain"] == f"leaf={r.leaf}", r.details
    assert suspect not in r.nodes_after and r.in_leaf == 3, r.nodes_after
