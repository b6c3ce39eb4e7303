"""Placement scenarios for the placement tests and bench/bench_recovery_placement.py: start one
multi-node Job per leaf of a labelled kwok fleet, then recover them (quarantine one node, restart
through :class:`~fleetmedic.executor.workload.placement_apply.PlacementRestarter`) and record where the
replacements land."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from kubernetes import client, watch
from kubernetes.client import ApiException

from fleetmedic.devenv import fleet as fl
from fleetmedic.devenv.jobset import create_when_served
from fleetmedic.devenv.waiting import wait
from fleetmedic.devenv.workloads import gpu_job, live_pods, quarantine
from fleetmedic.executor.workload.placement_apply import PlacementRestarter
from fleetmedic.k8s_keys import LABEL_LEAF


def leaves_of(api: client.ApiClient, fleet: fl.Fleet) -> dict[str, str]:
    """node -> leaf label, for the fleet's nodes."""
    nodes: list[Any] = client.CoreV1Api(api).list_node(label_selector=fleet.selector).items
    return {n.metadata.name: n.metadata.labels[LABEL_LEAF] for n in nodes}


def set_cordon(api: client.ApiClient, nodes: Sequence[str], cordoned: bool) -> None:
    core = client.CoreV1Api(api)
    for n in nodes:
        core.patch_node(n, {"spec": {"unschedulable": cordoned}})


def start_one_job_per_leaf(api: client.ApiClient, namespace: str, fleet: fl.Fleet, pods: int,
                           leaves: Sequence[str] | None = None,
                           replacement_policy: str | None = "Failed", kind: str = "Job") -> dict[str, str]:
    """A ``pods`` x 8-GPU Job named ``job-<i>`` in each leaf (each started while only its leaf is
    schedulable, so it starts there without any affinity of its own); returns job -> leaf. The
    fleet is left uncordoned. ``podReplacementPolicy: Failed`` (default here): the Job controller
    creates replacements once the old pods are gone, so their GPUs are free for them. With
    ``kind="JobSet"``, a JobSet (a JobSet controller must run) of one leader and ``pods - 1``
    workers, each a 1-pod child Job; its pods carry ``app=job-<i>`` too."""
    leaf_of = leaves_of(api, fleet)
    wanted = sorted(set(leaf_of.values())) if leaves is None else list(leaves)
    batch, custom = client.BatchV1Api(api), client.CustomObjectsApi(api)
    jobs: dict[str, str] = {}
    set_cordon(api, list(leaf_of), True)
    try:
        for i, leaf in enumerate(wanted):
            members = [n for n, lf in leaf_of.items() if lf == leaf]
            set_cordon(api, members, False)
            name = f"job-{i}"
            manifest = gpu_job(name, fleet, pods)
            if replacement_policy:
                manifest["spec"]["podReplacementPolicy"] = replacement_policy
            if kind == "JobSet":
                body = jobset_manifest(name, fleet, pods, replacement_policy)
                wait(f"{name}: created", partial(create_when_served, custom, namespace, body), 60)
            else:
                batch.create_namespaced_job(namespace, fl.model(client.V1Job, manifest))
            wait(f"{name}: {pods} Running pods", partial(_running, api, namespace, name, pods), 90)
            set_cordon(api, members, True)
            jobs[name] = leaf
    finally:
        set_cordon(api, list(leaf_of), False)
    return jobs


def jobset_manifest(name: str, fleet: fl.Fleet, pods: int, replacement_policy: str | None) -> dict[str, Any]:
    """A JobSet ``name``: replicated jobs ``leader`` (1) and ``workers`` (``pods - 1``), 1 pod each."""
    def rjob(rname: str, replicas: int) -> dict[str, Any]:
        job = gpu_job(name, fleet, 1)["spec"]
        job["backoffLimit"] = 0
        if replacement_policy:
            job["podReplacementPolicy"] = replacement_policy
        return {"name": rname, "replicas": replicas, "template": {"spec": job}}

    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": name},
            "spec": {"replicatedJobs": [rjob("leader", 1), rjob("workers", pods - 1)]}}


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
    leaf_room: int = 0

    @property
    def in_leaf(self) -> int:
        return sum(1 for n in self.nodes_after if self.leaf_of.get(n) == self.leaf)

    @property
    def on_suspect(self) -> int:
        return sum(1 for n in self.nodes_after if n in self.suspects)

    @property
    def leaf_had_capacity(self) -> bool:
        """At the restart, the leaf had at least as many healthy nodes without another job's pods
        as the job has pods (its own nodes count: the restart frees them)."""
        return self.leaf_room >= len(self.nodes_after or [0])

    leaf_of: dict[str, str] = field(default_factory=dict, repr=False)
    suspects: dict[str, float] = field(default_factory=dict, repr=False)  # node -> time.time() of its quarantine


def leaf_room(api: client.ApiClient, namespace: str, jobs: dict[str, str], leaf_of: dict[str, str],
              suspects: dict[str, float]) -> dict[str, int]:
    """Per job: nodes of its leaf that are not quarantined and run no other job's pod."""
    taken: dict[str, set[str]] = {}
    for p in live_pods(api, namespace, ""):
        if p.spec.node_name:
            taken.setdefault(p.spec.node_name, set()).add(p.metadata.labels.get("app", ""))
    return {job: sum(1 for n, lf in leaf_of.items() if lf == leaf and n not in suspects
                     and not (taken.get(n, set()) - {job})) for job, leaf in jobs.items()}


def pick_suspect(api: client.ApiClient, namespace: str, job: str, pick: int = 0) -> str:
    """The node of the job's ``pick``-th pod (by node name); "" when none is bound."""
    nodes = sorted(p.spec.node_name for p in live_pods(api, namespace, f"app={job}") if p.spec.node_name)
    return nodes[pick % len(nodes)] if nodes else ""


def recover(api: client.ApiClient, restarter: PlacementRestarter, namespace: str, job: str, leaf: str,
            pods: int, suspect: str, leaf_of: dict[str, str], suspects: dict[str, float], room: int = 0) -> Recovery:
    """Restart the job away from ``suspect`` (already quarantined, or not: the restart must cope),
    wait for ``pods`` new Running pods."""
    old = frozenset(p.metadata.uid for p in live_pods(api, namespace, f"app={job}"))
    t0 = time.monotonic()
    out = restarter.restart(f"{namespace}/{job}", action="restart_job", exclude_nodes=[suspect],
                            params={"command_id": f"{job}-{suspect}"}, dry_run=False, actor="placement-test")
    after: list[Any] = []
    outcome: str = out.outcome
    reason = out.reason
    if out.outcome == "applied":
        try:
            after = wait(f"{job}: {pods} replacement pods Running", lambda: _running(api, namespace, job, pods, old),
                         120)
        except AssertionError as exc:
            pending = [(p.metadata.name, p.spec.node_name, p.status.phase, bool(p.metadata.deletion_timestamp))
                       for p in live_pods(api, namespace, f"app={job}")]
            outcome, reason = "timeout", f"{exc}; pods now: {pending}"
    return Recovery(job, leaf, suspect, outcome, reason, dict(out.details),
                    sorted(p.spec.node_name for p in after), time.monotonic() - t0, room, leaf_of, suspects)


def recover_round(api: client.ApiClient, restarter: PlacementRestarter, namespace: str, jobs: dict[str, str],
                  pods: int, leaf_of: dict[str, str], suspects: dict[str, float], pick: int = 0) -> list[Recovery]:
    """One recovery of each job: quarantine one node of each (``suspects`` gains them, with the time
    of their quarantine), then restart
    them all concurrently (as the executor runs commands for different jobs)."""
    chosen = {job: node for job in jobs if (node := pick_suspect(api, namespace, job, pick))}
    jobs = {job: leaf for job, leaf in jobs.items() if job in chosen}  # a job still waiting is left alone
    for node in chosen.values():
        quarantine(api, node)
        suspects[node] = time.time()
    room = leaf_room(api, namespace, jobs, leaf_of, suspects)
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        futures = [pool.submit(recover, api, restarter, namespace, job, leaf, pods, chosen[job], leaf_of, suspects,
                               room[job]) for job, leaf in jobs.items()]
        return [f.result() for f in futures]


@dataclass
class ScheduleWatch:
    """Watches a namespace's pods; records (time.time(), pod uid, name, node) when a pod it first saw
    unscheduled is seen bound: every scheduling decision made while it runs, and nothing else."""

    api: client.ApiClient
    namespace: str
    bindings: list[tuple[float, str, str, str]] = field(default_factory=list)
    _unbound: set[str] = field(default_factory=set)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> ScheduleWatch:
        listed: Any = client.CoreV1Api(self.api).list_namespaced_pod(self.namespace)
        rv = listed.metadata.resource_version
        self._thread = threading.Thread(target=self._run, args=(rv,), daemon=True)
        self._thread.start()
        return self

    def _run(self, rv: str) -> None:
        core = client.CoreV1Api(self.api)
        while not self._stop.is_set():
            w: Any = watch.Watch()  # type: ignore[no-untyped-call]
            try:
                for ev in w.stream(core.list_namespaced_pod, self.namespace, resource_version=rv, timeout_seconds=2,
                                   allow_watch_bookmarks=True):
                    pod = ev["object"]
                    rv = pod.metadata.resource_version
                    if ev["type"] != "BOOKMARK":
                        self._saw(pod)
                    if self._stop.is_set():
                        break
            except ApiException as exc:
                if exc.status != 410:
                    raise
                # our version was compacted away (a quiet namespace between bookmarks): list again
                listed: Any = core.list_namespaced_pod(self.namespace)
                for pod in listed.items:
                    self._saw(pod)
                rv = listed.metadata.resource_version
            finally:
                w.stop()

    def _saw(self, pod: Any) -> None:
        uid, node = pod.metadata.uid, pod.spec.node_name if pod.spec else None
        if not node:
            self._unbound.add(uid)
        elif uid in self._unbound:
            self._unbound.discard(uid)
            self.bindings.append((time.time(), uid, pod.metadata.name, node))

    def stop(self) -> list[tuple[float, str, str, str]]:
        time.sleep(0.5)  # let the last events arrive
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=10)
        return list(self.bindings)


def repeat_placements(bindings: Sequence[tuple[float, str, str, str]],
                      suspects: dict[str, float]) -> list[tuple[str, str]]:
    """(pod, node) of pods scheduled onto a node after its quarantine."""
    return [(name, node) for t, _, name, node in bindings if node in suspects and t >= suspects[node]]
