"""Topology-aware restart_job: reads nodes and pods, plans with :mod:`.placement_plan`, restarts through
:func:`.apply.restart_workload` (docs/placement.md).

:meth:`PlacementRestarter.restart` is what the executor calls for ``restart_job`` / ``requeue_job``:

0. A command with ``params.only_if_waiting`` (the engine adding nodes suspected since to a restart
   that waits for capacity) is ``skipped`` when every pod of the workload is placed: a placed job
   is never restarted for it.
1. A workload whose replacement pods are already waiting (unscheduled) with every excluded node
   kept off (for a JobSet: by its child Jobs' pod templates) is not restarted again (``skipped``):
   that would only recreate pending pods.
2. A Kueue-managed Job or JobSet (``kueue.x-k8s.io/queue-name`` and a Workload object, CRD
   present) is requeued through its Workload (:mod:`.kueue`; a JobSet's placement goes onto its
   suspended child Jobs).
3. Otherwise the workload's restart plan is adjusted before anything is written: the excluded nodes
   are re-read from the API server and any the pods could still land on (not cordoned, no taint
   they do not tolerate) get the required ``hostname NotIn`` (so the isolation is in the same
   write that lets the pods be recreated); the pod templates get preferred node affinity toward the
   surviving ranks' NVLink domain / leaf / rack / spine / pool (and the standby pool); and the
   capacity verdict is taken (Job, PyTorchJob, JobSet). A JobSet whose webhook refuses the template
   change gets the same placement on its suspended child Jobs, in the patch that excludes the
   suspects (:func:`.placement_plan.child_job_ops`).
4. No healthy capacity: the result says ``capacity: insufficient`` and what is missing, a Warning
   Event ``FleetmedicCapacityWait`` goes on the workload, ``fleetmedic_executor_capacity_waits_total``
   counts it; the pods stay Pending in the scheduler's queue with their own priority, and the
   executor waits up to ``placement.capacity_wait_s`` for them to be scheduled, observing the wait in
   ``fleetmedic_executor_capacity_wait_seconds``.

With the executor's :class:`~fleetmedic.executor.cache.ClusterCache` (``executor.cluster_cache``,
synced), the topology and the GPUs the live pods request per node come from its watch-maintained
indexes: no list per restart. Without it (or before its first lists are in) nodes are listed once
per ``placement.node_cache_s`` and the live pods once per restart. The excluded nodes are always
read afresh.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fleetmedic.config import Settings
from fleetmedic.executor.cache import ClusterCache, node_state
from fleetmedic.executor.cluster import ApiError, WorkloadCluster
from fleetmedic.executor.workload import apply as wl
from fleetmedic.executor.workload import kueue
from fleetmedic.executor.workload import placement_plan as pm
from fleetmedic.executor.workload.api import pod_node, record_event
from fleetmedic.executor.workload.jobset import child_jobs
from fleetmedic.executor.workload.placement_metrics import PlacementMetrics
from fleetmedic.executor.workload.plan import (
    JOB,
    JOBSET,
    PYTORCHJOB,
    RestartPlan,
    WorkloadError,
    WorkloadKind,
    excluded_nodes,
    parse_job_ref,
    pod_spec_paths,
)
from fleetmedic.k8s_keys import ANNOTATION_EXCLUDED_NODES, ANNOTATION_PLACEMENT

log = logging.getLogger(__name__)
PLACED_ACTIONS = frozenset({"restart_job", "requeue_job"})
_NODE_CACHES: weakref.WeakKeyDictionary[WorkloadCluster, NodeCache] = weakref.WeakKeyDictionary()


class NodeCache:
    """All nodes (JSON), listed at most once per ``ttl_s`` (shared by the restarters of one cluster)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._at = 0.0
        self._nodes: list[dict[str, Any]] | None = None

    def get(self, cluster: WorkloadCluster, ttl_s: float, now: float, refresh: bool = False) -> list[dict[str, Any]]:
        with self._lock:
            if refresh or self._nodes is None or now - self._at > ttl_s:
                self._nodes, self._at = cluster.list_nodes(), now
            return self._nodes


class PlacementRestarter:
    def __init__(self, cluster: WorkloadCluster, settings: Settings, metrics: PlacementMetrics | None = None,
                 stop: threading.Event | None = None, clock: Callable[[], float] = time.monotonic,
                 cache: ClusterCache | None = None) -> None:
        self.cluster = cluster
        self.cache = cache
        self.settings = settings
        self.metrics = metrics
        self.stop = stop or threading.Event()
        self.clock = clock
        self._cache = _NODE_CACHES.setdefault(cluster, NodeCache())

    # --- entry ------------------------------------------------------------------------------------

    def restart(self, job: str, *, action: str, exclude_nodes: Sequence[str], params: Mapping[str, str],
                dry_run: bool, actor: str) -> wl.WorkloadOutcome:
        cfg = self.settings.placement
        if params.get("only_if_waiting") == "true":  # more exclusions for a restart that waits, never a new restart
            placed = self._placed_already(job, params)
            if placed is not None:
                return placed
        if not cfg.enabled or action not in PLACED_ACTIONS:
            return wl.restart_workload(self.cluster, job, action=action, exclude_nodes=exclude_nodes, params=params,
                                       dry_run=dry_run, actor=actor)
        try:
            waiting = self._already_waiting(job, exclude_nodes, params)
        except (WorkloadError, ApiError) as exc:
            waiting = None
            log.debug("no waiting check for %s: %s", job, exc)
        if waiting is not None:
            return waiting
        step = RestartPlacement(self, exclude_nodes, params)
        seen = step.seen

        if cfg.kueue == "auto":  # a Kueue-managed Job or JobSet: through its Workload (kueue.py)
            queued = kueue.requeue_if_managed(self.cluster, job, action=action, exclude_nodes=exclude_nodes,
                                              params=params, dry_run=dry_run, actor=actor, placement=step)
            if queued is not None:  # Kueue keeps it queued with its priority: no capacity wait of ours
                details = {**queued.details, **seen.get("details", {})}
                if queued.outcome == "applied" and self.metrics and "capacity" in details:
                    self.metrics.placements.labels(capacity=details["capacity"]).inc()
                return dataclasses.replace(queued, details=details)

        out = wl.restart_workload(self.cluster, job, action=action, exclude_nodes=exclude_nodes, params=params,
                                  dry_run=dry_run, actor=actor, placement=step)
        verdict: pm.CapacityVerdict | None = seen.get("verdict")
        details = {**out.details, **seen.get("details", {})}
        if verdict is None or out.outcome != "applied":
            return dataclasses.replace(out, details=details)
        if self.metrics:  # counted once the restart is applied (a 409 re-plans: _adjust runs again)
            self.metrics.placements.labels(capacity=details["capacity"]).inc()
            forced = [n for n in details.get("isolation_forced", "").split(",") if n]
            if forced:
                self.metrics.forced_exclusions.inc(len(forced))
        if verdict.sufficient:
            return dataclasses.replace(out, details=details)
        return self._capacity_wait(out, details, verdict, seen["kind"], seen["obj"], action, actor)

    # --- planning ---------------------------------------------------------------------------------

    def _adjust(self, kind: WorkloadKind, obj: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], plan: RestartPlan,
                exclude: Sequence[str], params: Mapping[str, str], seen: dict[str, Any]) -> RestartPlan:
        cfg = self.settings.placement
        seen.update(kind=kind, obj=obj)
        current = [pod_node(p) for p in pods if pod_node(p)]
        states, nodes = self._node_states(current)
        fresh = {name: self._read_state(name) for name in sorted(set(exclude))}
        paths = pod_spec_paths(kind, obj)
        planned = {op["path"][: -len("/affinity")]: op["value"] for op in plan.template_ops
                   if op["path"].endswith("/affinity")}
        specs_now = [{**spec, "affinity": planned.get(ptr, spec.get("affinity"))} for ptr, spec in paths]
        force = pm.unisolated(exclude, fresh, specs_now)
        never = params.get("anti_affinity") == "never"
        keep_off = sorted(set(force) | set(exclude)) if cfg.exclude_suspects and not never else force
        topo = pm.FleetTopology(states.values(), cfg)
        domain = pm.job_domain(topo, current, exclude)
        terms = pm.preferred_terms(topo, domain)
        tolerations = pm.standby_tolerations(cfg)
        meta = obj.get("metadata") or {}
        previous = pm.previous_placement(meta.get("annotations") or {})
        earlier = [n for n in ((meta.get("annotations") or {}).get(ANNOTATION_EXCLUDED_NODES) or "").split(",") if n]
        release = pm.back_in_service(earlier, [*exclude, *keep_off], states, self.settings.executor.taint_key)
        recipe = pm.Recipe(tuple(terms), tuple(tolerations), previous, tuple(keep_off), tuple(release))
        seen["recipe"] = recipe  # a JobSet whose webhook refuses the template: applied to its child Jobs
        ops = [op for op in plan.template_ops if not op["path"].endswith("/affinity")]
        new_specs = []
        for (ptr, spec), affinity in zip(paths, (s["affinity"] for s in specs_now), strict=True):
            spec_ops, new_spec = pm.placed_ops(ptr, spec, affinity, recipe)
            ops += spec_ops
            new_specs.append(new_spec)
        still = pm.unisolated(exclude, fresh, new_specs)
        if still:  # cannot happen: place() ANDs them into every required term
            raise WorkloadError(f"excluded node(s) {', '.join(still)} neither isolated nor excluded by the plan")
        demands = self._demands(kind, obj, new_specs, len(pods))
        own = {str(p["metadata"].get("uid")) for p in pods if p.get("metadata")}
        states = self._with_requests(nodes, own) if nodes is not None else self._cached_requests(states, own)
        verdict = pm.capacity_verdict(demands, list(states.values()), exclude, topo, domain)
        annotations = {**plan.annotations,
                       ANNOTATION_PLACEMENT: pm.placement_record(terms, tolerations, domain)}
        excluded_now = sorted((set(plan.excluded) | set(keep_off)) - set(release))
        if excluded_now:
            annotations[ANNOTATION_EXCLUDED_NODES] = ",".join(excluded_now)
        words = ", ".join(f"{lvl}={v}" for lvl, v in domain.items() if topo.label_of[lvl])
        summary = plan.summary + (f"; prefer {words}" if words and terms else "")
        seen["verdict"] = verdict
        seen["details"] = {**verdict.details(), "isolation_forced": ",".join(force),
                           "isolated_by": _isolation_words(exclude, fresh, force)}
        if release:
            seen["details"]["exclusion_released"] = ",".join(release)
        if kind is JOB and (obj.get("spec") or {}).get("podReplacementPolicy") != "Failed":
            seen["details"]["placement_note"] = ("podReplacementPolicy is not Failed: replacements may be created "
                                                 "while the old pods still hold their nodes' GPUs, and land elsewhere")
        remove = tuple(plan.remove_annotations) + ((ANNOTATION_EXCLUDED_NODES,) if not excluded_now else ())
        return dataclasses.replace(plan, template_ops=ops, annotations=annotations, summary=summary,
                                   excluded=tuple(excluded_now), remove_annotations=remove)

    def _demands(self, kind: WorkloadKind, obj: Mapping[str, Any], specs: Sequence[Mapping[str, Any]],
                 live: int) -> list[pm.Demand]:
        """The pods the restart recreates, each with the pod spec it will be created from."""
        res = self.settings.placement.gpu_resource
        spec = obj.get("spec") or {}
        if kind is JOB:
            parallelism = spec.get("parallelism")
            count = max(live, 1 if parallelism is None else int(parallelism))
            return [pm.Demand(pm.pod_gpus(specs[0], res), specs[0])] * count
        if kind is PYTORCHJOB:
            out: list[pm.Demand] = []
            for (_, rspec), s in zip(sorted((spec.get("pytorchReplicaSpecs") or {}).items()), specs, strict=False):
                out += [pm.Demand(pm.pod_gpus(s, res), s)] * int((rspec or {}).get("replicas") or 1)
            return out
        if kind is JOBSET:  # every child Job's pods: replicas x parallelism per replicated job
            out = []
            for rjob, s in zip(spec.get("replicatedJobs") or [], specs, strict=False):
                job_spec = (rjob.get("template") or {}).get("spec") or {}
                parallelism = job_spec.get("parallelism")
                replicas = rjob.get("replicas")
                count = (1 if replicas is None else int(replicas)) * (1 if parallelism is None else int(parallelism))
                out += [pm.Demand(pm.pod_gpus(s, res), s)] * count
            return out
        return []

    # --- the cluster --------------------------------------------------------------------------------

    def nodes(self, knowing: Sequence[str] = ()) -> list[dict[str, Any]]:
        """All nodes, listed at most once per ``placement.node_cache_s`` unless the cached list lacks
        one of ``knowing`` (a node that joined since: its job's pods run there)."""
        cached = self._cache.get(self.cluster, self.settings.placement.node_cache_s, self.clock())
        if set(knowing) - {_name(n) for n in cached}:
            return self._cache.get(self.cluster, self.settings.placement.node_cache_s, self.clock(), refresh=True)
        return cached

    def _node_states(self, knowing: Sequence[str]) -> tuple[dict[str, pm.NodeState], list[dict[str, Any]] | None]:
        """Every node's state (no requests applied), and the listed nodes when not from the cache."""
        cache = self.cache
        if cache is None or not cache.synced:
            nodes = self.nodes(knowing=knowing)
            return {_name(n): self._state(n, {}) for n in nodes}, nodes
        states = cache.node_states()
        for name in sorted(set(knowing) - set(states)):  # joined a moment ago: the watch has not told us yet
            read = self._read_state(name)
            if read is not None:
                states[name] = read
        return states, None

    def _cached_requests(self, states: Mapping[str, pm.NodeState], own: set[str]) -> dict[str, pm.NodeState]:
        """``states`` with the GPUs live pods (other than ``own``) request, from the cache's index."""
        assert self.cache is not None
        requested = self.cache.requested_by_node(exclude_pods=own)
        return {name: dataclasses.replace(s, requested=requested[name]) if requested.get(name) else s
                for name, s in states.items()}

    def _read_state(self, name: str) -> pm.NodeState | None:
        node = self.cluster.get_node(name)
        return self._state(node, {}) if node is not None else None

    def _with_requests(self, nodes: Sequence[Mapping[str, Any]], own: set[str]) -> dict[str, pm.NodeState]:
        """Node states with the GPUs live pods (other than the workload's own ``own``) request."""
        res = self.settings.placement.gpu_resource
        requested: dict[str, int] = {}
        for p in self.cluster.live_pods():
            node = pod_node(p)
            if not node or (p.get("metadata") or {}).get("uid") in own:
                continue
            requested[node] = requested.get(node, 0) + pm.pod_gpus(p.get("spec") or {}, res)
        return {_name(n): self._state(n, requested) for n in nodes}

    def _state(self, node: Mapping[str, Any], requested: Mapping[str, int]) -> pm.NodeState:
        state = node_state(node, self.settings.placement.gpu_resource)
        return dataclasses.replace(state, requested=requested.get(state.name, 0))

    # --- scarce capacity ----------------------------------------------------------------------------

    def _placed_already(self, job: str, params: Mapping[str, str]) -> wl.WorkloadOutcome | None:
        """``skipped`` when an ``only_if_waiting`` command finds the workload gone or no pod of it
        waiting to be scheduled: the job was placed, and is not restarted for nodes suspected since."""
        namespace, name = parse_job_ref(job)
        found = wl.find_workload(self.cluster, namespace, name, params.get("kind", ""))
        if found is None:
            return wl.WorkloadOutcome("skipped", f"workload {job} not found: nothing waits to be placed")
        kind, obj = found
        why = not_waiting(wl.workload_pods(self.cluster, kind, obj))
        return wl.WorkloadOutcome("skipped", f"{kind.kind} {job}: {why}; not restarted") if why else None

    def _already_waiting(self, job: str, exclude: Sequence[str],
                         params: Mapping[str, str]) -> wl.WorkloadOutcome | None:
        """``skipped`` when the workload's pods already wait unscheduled and every excluded node is
        kept off them: restarting again would only recreate pending pods."""
        namespace, name = parse_job_ref(job)
        found = wl.find_workload(self.cluster, namespace, name, params.get("kind", ""))
        if found is None:
            return None
        kind, obj = found
        pods = wl.workload_pods(self.cluster, kind, obj)
        pending = [p for p in pods if not pod_node(p)]
        if not pending:
            return None
        specs = [spec for _, spec in pod_spec_paths(kind, obj)]
        if kind is JOBSET:  # the exclusion may be on the child Jobs only (the webhook refused the template)
            meta = obj.get("metadata") or {}
            children = child_jobs(self.cluster, namespace, name, str(meta.get("uid")))
            specs = [((c.get("spec") or {}).get("template") or {}).get("spec") or {} for c in children] or specs
        fresh = {n: self._read_state(n) for n in sorted(set(exclude))}
        if pm.unisolated(exclude, fresh, specs) or any(pod_node(p) in set(exclude) for p in pods):
            return None
        return wl.WorkloadOutcome("skipped", f"{kind.kind} {job}: {len(pending)} replacement pod(s) already wait for "
                                             "capacity and the excluded nodes are kept off; not restarting again",
                                  {"kind": kind.kind, "capacity": "waiting", "pending_pods": str(len(pending)),
                                   "excluded_nodes": ",".join(sorted(excluded_nodes_of(specs)))})

    def _capacity_wait(self, out: wl.WorkloadOutcome, details: dict[str, str], verdict: pm.CapacityVerdict,
                       kind: WorkloadKind, obj: Mapping[str, Any], action: str, actor: str) -> wl.WorkloadOutcome:
        message = f"no healthy capacity for the replacement pods: {verdict.missing()}; they wait in the " \
                  "scheduler's queue with their priority"
        record_event(self.cluster, kind, obj, "FleetmedicCapacityWait", message, actor, warning=True)
        if self.metrics:
            self.metrics.waits.labels(action=action).inc()
        t0 = self.clock()
        limit = self.settings.placement.capacity_wait_s
        scheduled = False
        while limit > 0 and not self.stop.is_set():
            fresh = wl.find_workload(self.cluster, str(obj["metadata"]["namespace"]), str(obj["metadata"]["name"]),
                                     kind.kind)
            pods = wl.workload_pods(self.cluster, kind, fresh[1]) if fresh else []
            if pods and all(pod_node(p) for p in pods) and len(pods) >= verdict.pods:
                scheduled = True
                break
            if self.clock() - t0 >= limit:
                break
            self.stop.wait(self.settings.placement.capacity_poll_s)
        waited = self.clock() - t0
        if self.metrics and limit > 0:
            self.metrics.wait_seconds.observe(waited)
        details = {**details, "capacity_wait_s": f"{waited:.1f}",
                   "capacity_still_waiting": str(not scheduled).lower()}
        return dataclasses.replace(out, reason=f"{out.reason}; {message}", details=details)


@dataclasses.dataclass
class RestartPlacement:
    """The placement step of one restart (the :class:`~.api.Placement` the restart is handed);
    ``seen`` keeps what it decided (kind, workload, recipe, verdict, details) for the result."""

    restarter: PlacementRestarter
    exclude: Sequence[str]
    params: Mapping[str, str]
    seen: dict[str, Any] = dataclasses.field(default_factory=dict)

    def place(self, kind: WorkloadKind, obj: dict[str, Any], pods: list[dict[str, Any]],
              plan: RestartPlan) -> RestartPlan:
        return self.restarter._adjust(kind, obj, pods, plan, self.exclude, self.params, self.seen)

    def child_ops(self, child: dict[str, Any], ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
        recipe: pm.Recipe | None = self.seen.get("recipe")
        return pm.child_job_ops(child, ops, recipe) if recipe is not None else ops


def not_waiting(pods: Sequence[Mapping[str, Any]]) -> str:
    """Why a workload with these pods has nothing waiting to be scheduled ("" when a pod waits, or none
    exists yet: its controller is still recreating them)."""
    if not pods or any(not pod_node(p) for p in pods):
        return ""
    return f"all {len(pods)} pod(s) are placed already"


def excluded_nodes_of(specs: Sequence[Mapping[str, Any]]) -> set[str]:
    sets = [excluded_nodes(s.get("affinity")) for s in specs]
    return set.intersection(*sets) if sets else set()


def _isolation_words(exclude: Sequence[str], fresh: Mapping[str, pm.NodeState | None], force: Sequence[str]) -> str:
    """How each excluded node is kept off: gone, cordon, taint, anti-affinity (the template's, or
    ``anti-affinity-added`` by this restart)."""
    words = []
    for name in sorted(set(exclude)):
        node = fresh.get(name)
        if node is None:
            how = "gone"
        elif name in force:
            how = "anti-affinity-added"
        elif node.unschedulable:
            how = "cordon"
        elif any(effect in pm.BLOCKING_EFFECTS for _, effect in node.taints):
            how = "taint"
        else:
            how = "anti-affinity"
        words.append(f"{name}:{how}")
    return ",".join(words)


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")
