"""Helpers for the placement tests and bench/bench_recovery_placement.py (no tests here): start one
multi-node Job per leaf of a labelled kwok fleet, then recover them (quarantine one node, restart
through :class:`~fleetmedic.executor.capacity.PlacementRestarter`) and record where the
replacements land."""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from kubernetes import client

from fleetmedic.devenv import fleet as fl
from fleetmedic.executor.capacity import PlacementRestarter
from tests.executor.test_workloads_support import gpu_job, live_pods, quarantine, wait


def leaves_of(api: client.ApiClient, fleet: fl.Fleet) -> dict[str, str]:
    """node -> leaf label, for the fleet's nodes."""
    nodes = client.CoreV1Api(api).list_node(label_selector=fleet.selector).items
    return {n.metadata.name: n.metadata.labels[fl.LABEL_LEAF] for n in nodes}


def set_cordon(api: client.ApiClient, nodes: Sequence[str], cordoned: bool) -> None:
    core = client.CoreV1Api(api)
    for n in nodes:
        core.patch_node(n, {"spec": {"unschedulable": cordoned}})


def start_one_job_per_leaf(api: client.ApiClient, namespace: str, fleet: fl.Fleet, pods: int,
                           leaves: Sequence[str] | None = None) -> dict[str, str]:
    """A ``pods`` x 8-GPU Job named ``job-<i>`` in each leaf (each started while only its leaf is
    schedulable, so it starts there without any affinity of its own); returns job -> leaf. The
    fleet is left uncordoned."""
    leaf_of = leaves_of(api, fleet)
    wanted = sorted(set(leaf_of.values())) if leaves is None else list(leaves)
    batch = client.BatchV1Api(api)
    jobs: dict[str, str] = {}
    set_cordon(api, list(leaf_of), True)
    try:
        for i, leaf in enumerate(wanted):
            members = [n for n, lf in leaf_of.items() if lf == leaf]
            set_cordon(api, members, False)
            name = f"job-{i}"
            batch.create_namespaced_job(namespace, client.V1Job.from_dict(gpu_job(name, fleet, pods)))
            wait(f"{name}: {pods} Running pods", lambda n=name: _running(api, namespace, n, pods), 90)
            set_cordon(api, members, True)
            jobs[name] = leaf
    finally:
        set_cordon(api, list(leaf_of), False)
    return jobs


def _running(api: client.ApiClient, namespace: str, name: str, count: int,
             old: frozenset[str] = frozenset()) -> list[client.V1Pod] | None:
    pods = [p for p in live_pods(api, namespace, f"app={name}")
            if p.status and p.status.phase == "Running" and p.metadata.uid not in old]
    return pods if len(pods) == count else None


@dataclass
class Recovery:
    job: str
    leaf: str
    suspect: str
    outcome: str
    reason: str
    details: dict[str, str]
    nodes_after: list[str] = field(default_factory=list)
    seconds: float = 0.0  # from the restart call until every replacement pod is Running

    @property
    def in_leaf(self) -> int:
        return sum(1 for n in self.nodes_after if self.leaf_of.get(n) == self.leaf)

    @property
    def on_suspect(self) -> int:
        return sum(1 for n in self.nodes_after if n in self.suspects)

    @property
    def leaf_had_capacity(self) -> bool:
        return int(self.details.get("capacity_fit_in_domain", "0")) >= int(self.details.get("capacity_pods", "1"))

    leaf_of: dict[str, str] = field(default_factory=dict, repr=False)
    suspects: set[str] = field(default_factory=set, repr=False)


def pick_suspect(api: client.ApiClient, namespace: str, job: str, pick: int = 0) -> str:
    """The node of the job's ``pick``-th pod (by node name)."""
    nodes = sorted(p.spec.node_name for p in live_pods(api, namespace, f"app={job}") if p.spec.node_name)
    return nodes[pick % len(nodes)]


def recover(api: client.ApiClient, restarter: PlacementRestarter, namespace: str, job: str, leaf: str,
            pods: int, suspect: str, leaf_of: dict[str, str], suspects: set[str]) -> Recovery:
    """Restart the job away from ``suspect`` (already quarantined, or not: the restart must cope),
    wait for ``pods`` new Running pods."""
    old = frozenset(p.metadata.uid for p in live_pods(api, namespace, f"app={job}"))
    t0 = time.monotonic()
    out = restarter.restart(f"{namespace}/{job}", action="restart_job", exclude_nodes=[suspect],
                            params={"command_id": f"{job}-{suspect}"}, dry_run=False, actor="placement-test")
    after: list[client.V1Pod] = []
    if out.outcome == "applied":
        after = wait(f"{job}: {pods} replacement pods Running", lambda: _running(api, namespace, job, pods, old), 120)
    return Recovery(job, leaf, suspect, out.outcome, out.reason, dict(out.details),
                    sorted(p.spec.node_name for p in after), time.monotonic() - t0, leaf_of, suspects)


def recover_round(api: client.ApiClient, restarter: PlacementRestarter, namespace: str, jobs: dict[str, str],
                  pods: int, leaf_of: dict[str, str], suspects: set[str], pick: int = 0) -> list[Recovery]:
    """One recovery of each job: quarantine one node of each (``suspects`` gains them), then restart
    them all concurrently (as the executor runs commands for different jobs)."""
    chosen = {job: pick_suspect(api, namespace, job, pick) for job in jobs}
    for node in chosen.values():
        quarantine(api, node)
        suspects.add(node)
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        futures = [pool.submit(recover, api, restarter, namespace, job, leaf, pods, chosen[job], leaf_of, suspects)
                   for job, leaf in jobs.items()]
        return [f.result() for f in futures]
