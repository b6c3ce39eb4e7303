"""Kubernetes objects -> ``JobEvent`` records, emitted only on change (pure: dicts in, records out).

:class:`JobTracker` is fed the watch events of Pods and of the training workloads (batch Job,
Kubeflow PyTorchJob, JobSet) as JSON dicts, with the time from an injected clock, and returns the
``JobEvent`` records each change produces:

- ``placement``: the ranks' nodes, once every expected rank is scheduled (the workload's size
  known: parallelism / replicas) and whenever that map changes. A rank comes from the Indexed Job
  completion index, the PyTorchJob replica type and index (master first), or the JobSet replicated
  job, job index and completion index: ranks are numbered densely in that order.
- ``start``: every expected rank Running, once per placement.
- ``failure``: a container that terminated with a non-zero exit code (or a pod that Failed), with
  rank, node, exit code, reason and the restart count as ``attempt``, once per termination; and a
  workload whose ``Failed`` condition turned True.
- ``completion``: a workload whose Complete/Succeeded condition turned True, once; or a workload
  deleted before it completed or failed (reason ``deleted: ...``: a cancelled job ends too).
- ``restart``: the workload's restart count grew (fleetmedic's ``restart-attempts`` annotation,
  JobSet ``status.restarts``).

Which pods belong to a training job: the JobSet label, then the Kubeflow label, then the batch Job
label (a JobSet's pods carry both: they belong to the JobSet), cross-checked with a controller
owner reference where a pod has one. Pods without GPU requests are ignored when ``gpu_only``.
A malformed object is counted in ``skipped`` under its reason and ignored.

What it remembers lives as long as the objects it describes: a job's state until its workload is
deleted (a deleted workload's name for ``tombstone_s`` more), or, for a job known only through its
pods (its kind not watched), until its last pod is; a pod's view and its reported terminations
until the pod is deleted. A long-lived job whose ranks fail and are replaced keeps no trace of
the pods that are gone.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from fleetmedic.k8s_keys import ANNOTATION_RESTART_ATTEMPTS
from fleetmedic.records import JobEvent, RankPlacement

JOBSET_LABEL: Final = "jobset.sigs.k8s.io/jobset-name"
RJOB_LABEL: Final = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX_LABEL: Final = "jobset.sigs.k8s.io/job-index"
PYTORCH_LABEL: Final = "training.kubeflow.org/job-name"
REPLICA_TYPE_LABEL: Final = "training.kubeflow.org/replica-type"
REPLICA_INDEX_LABEL: Final = "training.kubeflow.org/replica-index"
JOB_LABELS: Final = ("batch.kubernetes.io/job-name", "job-name")
COMPLETION_INDEX: Final = "batch.kubernetes.io/job-completion-index"
DONE_CONDITIONS: Final = frozenset({"Complete", "Succeeded", "Completed"})
WORKLOAD_KINDS: Final = ("Job", "PyTorchJob", "JobSet")

#: The fields of a Pod and of a workload the tracker reads, as a ``fleetmedic.kube_watch.Fields``
#: tree: the watcher queues only these of each object (a test checks the tracker says the same of
#: the whole objects and of these).
POD_FIELDS: Final[dict[str, Any]] = {
    "metadata": {"name": True, "namespace": True, "uid": True, "labels": True, "ownerReferences": True,
                 "annotations": {COMPLETION_INDEX: True}, "deletionTimestamp": True, "creationTimestamp": True},
    "spec": {"nodeName": True, "containers": [{"resources": True}]},
    "status": {"phase": True, "reason": True, "containerStatuses": [
        {"name": True, "restartCount": True, "state": {"terminated": True}, "lastState": {"terminated": True}}]},
}
WORKLOAD_FIELDS: Final[dict[str, Any]] = {
    "metadata": {"name": True, "namespace": True, "uid": True, "ownerReferences": True,
                 "annotations": {ANNOTATION_RESTART_ATTEMPTS: True}},
    "spec": {"parallelism": True, "completions": True, "pytorchReplicaSpecs": {"*": {"replicas": True}},
             "replicatedJobs": [{"name": True, "replicas": True, "template": {"spec": {"parallelism": True}}}]},
    "status": {"restarts": True, "conditions": True},
}


@dataclass(frozen=True)
class PodView:
    """What the tracker keeps of one pod."""

    uid: str
    name: str
    order: tuple[Any, ...]  # sorts the pods of a job into rank order
    node: str
    phase: str
    terminations: tuple[tuple[str, int, int, str], ...]  # (container, restart count, exit code, reason)


@dataclass
class JobState:
    kind: str
    pods: dict[str, PodView] = field(default_factory=dict)
    world_size: int | None = None
    rjob_order: tuple[str, ...] = ()
    placement: tuple[tuple[int, str], ...] = ()
    started: tuple[tuple[int, str], ...] = ()
    # the terminations reported, by pod: (container, restart count); a pod's go with it
    reported: dict[str, set[tuple[str, int]]] = field(default_factory=dict)
    conditions: frozenset[str] = frozenset()
    attempt: int = 0
    owner_uid: str = ""
    workload_seen: bool = False  # False: known only through its pods (its kind not watched, or not yet listed)
    # kept up to date per pod event, so a status update costs O(1), not a sort of every rank
    live: set[str] = field(default_factory=set)  # pods neither Succeeded nor Failed
    unplaced: set[str] = field(default_factory=set)  # live pods without a node
    not_running: set[str] = field(default_factory=set)  # live pods not Running
    dirty: bool = True  # ranks or nodes changed since the placement was last computed
    # the rank orders, sorted once per change of membership, liveness or order key (not per event:
    # a failure storm over a job of k ranks would sort k times); None: sort again when asked
    live_order: list[str] | None = None  # uids of the live pods in rank order
    live_rank: dict[str, int] = field(default_factory=dict)
    all_rank: dict[str, int] | None = None  # every pod by its order key (a Failed pod's rank)

    def reorder(self, live_only: bool = False) -> None:
        """Forget the rank orders (the live one only, with ``live_only``)."""
        self.live_order = None
        if not live_only:
            self.all_rank = None

    def index(self, uid: str, view: PodView | None) -> None:
        """Record pod ``uid`` as ``view`` (None: gone) in the bookkeeping sets."""
        old = self.pods.get(uid)
        if old is None or view is None or old.order != view.order:
            self.reorder()
        was_live = uid in self.live
        for group in (self.live, self.unplaced, self.not_running):
            group.discard(uid)
        is_live = view is not None and view.phase not in ("Succeeded", "Failed")
        if view is not None and is_live:
            self.live.add(uid)
            if not view.node:
                self.unplaced.add(uid)
            if view.phase != "Running":
                self.not_running.add(uid)
        if was_live != is_live or (old is not None and view is not None and old.node != view.node):
            self.dirty = True
        if was_live != is_live:
            self.reorder(live_only=True)


class BadObject(ValueError):
    """An object the tracker cannot read: ``code`` (a metric label) and the detail."""

    def __init__(self, code: str, detail: str) -> None:
        self.code = code
        super().__init__(f"{code}: {detail}")


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping) or not meta.get("name") or not meta.get("namespace"):
        raise BadObject("no_metadata", "metadata.name or metadata.namespace missing")
    return meta


def gpu_request(pod: Mapping[str, Any], resource: str) -> int:
    total = 0
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        value = (res.get("requests") or {}).get(resource) or (res.get("limits") or {}).get(resource) or 0
        try:
            total += int(value)
        except (TypeError, ValueError):
            detail = f"spec.containers.resources.{resource}: not an integer: {value!r}"
            raise BadObject("bad_gpu_request", detail) from None
    return total


def job_of_pod(pod: Mapping[str, Any]) -> tuple[str, str, tuple[Any, ...]] | None:
    """(job "ns/name", workload kind, rank order key) of a training pod, or None."""
    meta = _meta(pod)
    labels: Mapping[str, str] = meta.get("labels") or {}
    ns = str(meta["namespace"])
    index = _int(labels.get(COMPLETION_INDEX) or (meta.get("annotations") or {}).get(COMPLETION_INDEX), 0)
    if labels.get(JOBSET_LABEL):
        js_key = (labels.get(RJOB_LABEL, ""), _int(labels.get(JOB_INDEX_LABEL), 0), index, meta["name"])
        return f"{ns}/{labels[JOBSET_LABEL]}", "JobSet", js_key
    if labels.get(PYTORCH_LABEL):
        rtype = str(labels.get(REPLICA_TYPE_LABEL, "")).lower()
        key = (0 if rtype == "master" else 1, rtype, _int(labels.get(REPLICA_INDEX_LABEL), 0), meta["name"])
        return f"{ns}/{labels[PYTORCH_LABEL]}", "PyTorchJob", key
    for label in JOB_LABELS:
        if labels.get(label):
            return f"{ns}/{labels[label]}", "Job", (index, str(meta.get("creationTimestamp") or ""), meta["name"])
    return None


def _int(text: Any, default: int) -> int:
    try:
        return int(text)
    except (TypeError, ValueError):
        return default


def _terminations(pod: Mapping[str, Any]) -> tuple[tuple[str, int, int, str], ...]:
    out = []
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        restarts = _int(cs.get("restartCount"), 0)
        current = (cs.get("state") or {}).get("terminated")
        last = (cs.get("lastState") or {}).get("terminated")
        if current:
            out.append((str(cs.get("name", "")), restarts, _int(current.get("exitCode"), -1), _why(current)))
        if last and restarts > 0:
            out.append((str(cs.get("name", "")), restarts - 1, _int(last.get("exitCode"), -1), _why(last)))
    return tuple(out)


def _why(term: Mapping[str, Any]) -> str:
    reason, message = str(term.get("reason") or ""), str(term.get("message") or "")
    return f"{reason}: {message}"[:4096] if message else reason


@dataclass
class JobTracker:
    """Feed it watch events; it returns the JobEvents they produce. ``skipped`` counts bad objects
    by (kind, code); ``last_skip`` holds the latest one's full reason (for the log)."""

    gpu_only: bool = True
    gpu_resource: str = "nvidia.com/gpu"
    jobs: dict[str, JobState] = field(default_factory=dict)
    pod_jobs: dict[str, str] = field(default_factory=dict)  # pod uid -> job
    skipped: Counter[tuple[str, str]] = field(default_factory=Counter)
    last_skip: str = ""
    # workloads deleted in the last ``tombstone_s``: job -> (its uid, when). Their pods linger (the
    # garbage collector deletes them after the workload; the Job controller first strips their
    # finalizer, an update without a deletion mark): those updates must not start the job again
    tombstone_s: float = 600.0
    tombstones: dict[str, tuple[str, float]] = field(default_factory=dict)

    def observe_pod(self, event_type: str, pod: Mapping[str, Any], now: float) -> list[JobEvent]:
        try:
            return self._pod(event_type, pod, now)
        except BadObject as exc:
            return self._skip("Pod", exc)

    def observe_workload(self, kind: str, event_type: str, obj: Mapping[str, Any], now: float) -> list[JobEvent]:
        try:
            return self._workload(kind, event_type, obj, now)
        except BadObject as exc:
            return self._skip(kind, exc)

    def skip(self, kind: str, code: str, detail: str) -> None:
        """Count an object that could not even be decoded (the adapter's JSON errors)."""
        self._skip(kind, BadObject(code, detail))

    def _skip(self, kind: str, exc: BadObject) -> list[JobEvent]:
        self.skipped[(kind, exc.code)] += 1
        self.last_skip = f"{kind}: {exc}"
        return []

    # --- pods ---------------------------------------------------------------------------------

    def _pod(self, event_type: str, pod: Mapping[str, Any], now: float) -> list[JobEvent]:
        meta = _meta(pod)
        uid = str(meta.get("uid") or f"{meta['namespace']}/{meta['name']}")
        found = job_of_pod(pod)
        if found is None or (self.gpu_only and gpu_request(pod, self.gpu_resource) <= 0):
            return self._forget_pod(uid, now) if uid in self.pod_jobs else []
        job, kind, order = found
        if event_type == "DELETED" or meta.get("deletionTimestamp") or self._of_deleted(job, kind, meta, now):
            return self._forget_pod(uid, now)
        state = self.jobs.setdefault(job, JobState(kind))
        view = PodView(uid, str(meta["name"]), order, str((pod.get("spec") or {}).get("nodeName") or ""),
                       str((pod.get("status") or {}).get("phase") or ""), _terminations(pod))
        state.index(uid, view)
        state.pods[uid] = view
        self.pod_jobs[uid] = job
        events = self._failures(job, state, view, pod, now)
        return events + self._placement_and_start(job, state, now)

    def _forget_pod(self, uid: str, now: float) -> list[JobEvent]:
        job = self.pod_jobs.pop(uid, "")
        state = self.jobs.get(job)
        if state is None:
            return []
        state.index(uid, None)
        state.pods.pop(uid, None)
        state.reported.pop(uid, None)
        if not state.pods and not state.workload_seen:
            del self.jobs[job]  # nothing else would ever end it; its next pods place it afresh
            return []
        return self._placement_and_start(job, state, now)

    def _of_deleted(self, job: str, kind: str, meta: Mapping[str, Any], now: float) -> bool:
        """Whether a pod of ``job`` belongs to a workload of that name deleted lately. A pod whose
        controller is another Job or PyTorchJob belongs to one made again under the same name (the
        tombstone goes); a JobSet's pod (its controller is a child Job) counts as the deleted one's
        until the JobSet is seen again or the tombstone expires."""
        tomb = self.tombstones.get(job)
        if tomb is None:
            return False
        if now - tomb[1] > self.tombstone_s:
            del self.tombstones[job]
            return False
        owner = next((str(r.get("uid") or "") for r in meta.get("ownerReferences") or []
                      if isinstance(r, Mapping) and r.get("controller")), "")
        if kind != "JobSet" and owner and owner != tomb[0]:
            del self.tombstones[job]
            return False
        return True

    def _bury(self, job: str, uid: str, now: float) -> None:
        for old, (_, when) in list(self.tombstones.items()):  # oldest first: drop the expired
            if now - when <= self.tombstone_s:
                break
            del self.tombstones[old]
        self.tombstones.pop(job, None)
        self.tombstones[job] = (uid, now)

    def _ranked(self, state: JobState) -> list[PodView]:
        """The live pods in rank order (sorted again only after a change of the order)."""
        if state.live_order is None:
            rank_of_rjob = {name: i for i, name in enumerate(state.rjob_order)}

            def key(p: PodView) -> tuple[Any, ...]:
                if state.kind == "JobSet":
                    return (rank_of_rjob.get(p.order[0], len(rank_of_rjob)), *p.order)
                return p.order

            live = [p for p in state.pods.values() if p.phase not in ("Succeeded", "Failed")]
            state.live_order = [p.uid for p in sorted(live, key=key)]
            state.live_rank = {uid: rank for rank, uid in enumerate(state.live_order)}
        return [state.pods[uid] for uid in state.live_order]

    def _rank(self, state: JobState, uid: str) -> int | None:
        """Pod ``uid``'s rank among the live pods; else (a Failed pod left the ranking) its place by
        order among all the job's pods; None if the job has no such pod."""
        if uid in state.live:
            self._ranked(state)
            return state.live_rank.get(uid)
        if state.all_rank is None:
            state.all_rank = {p.uid: r for r, p in enumerate(sorted(state.pods.values(), key=lambda p: p.order))}
        return state.all_rank.get(uid)

    def _placement_and_start(self, job: str, state: JobState, now: float) -> list[JobEvent]:
        if not state.live or state.unplaced:
            return []
        if state.world_size is not None and len(state.live) != state.world_size:
            return []
        events = []
        if state.dirty:
            state.dirty = False
            placement = tuple((rank, p.node) for rank, p in enumerate(self._ranked(state)))
            if placement != state.placement:
                state.placement = placement
                events.append(self._event(job, state, "placement", now, world_size=len(placement),
                                          placement=[RankPlacement(rank=r, node=n) for r, n in placement]))
        if not state.not_running and state.placement != state.started:
            state.started = state.placement
            events.append(self._event(job, state, "start", now, world_size=len(state.placement)))
        return events

    def _failures(self, job: str, state: JobState, view: PodView, pod: Mapping[str, Any],
                  now: float) -> list[JobEvent]:
        events = []
        failures = [t for t in view.terminations if t[2] != 0]
        if not failures and view.phase == "Failed":
            reason = str((pod.get("status") or {}).get("reason") or "pod failed")
            failures = [("", 0, -1, reason)]
        for container, restarts, code, reason in failures:
            reported = state.reported.setdefault(view.uid, set())
            if (container, restarts) in reported:
                continue
            reported.add((container, restarts))
            rank = self._rank(state, view.uid)
            events.append(self._event(job, state, "failure", now, rank=rank, node=view.node,
                                      exit_code=max(-1024, min(1024, code)),
                                      reason=f"{view.name}/{container}: {reason}" if container else reason,
                                      attempt=restarts))
        return events

    # --- workloads ----------------------------------------------------------------------------

    def _workload(self, kind: str, event_type: str, obj: Mapping[str, Any], now: float) -> list[JobEvent]:
        if kind not in WORKLOAD_KINDS:
            raise BadObject("unknown_kind", f"unknown workload kind {kind!r}")
        meta = _meta(obj)
        job = f"{meta['namespace']}/{meta['name']}"
        if kind == "Job" and any(r.get("controller") and r.get("kind") == "JobSet"
                                 for r in meta.get("ownerReferences") or []):
            return []  # a JobSet's child: the JobSet is the training job
        uid = str(meta.get("uid") or "")
        if event_type == "DELETED":
            state = self.jobs.pop(job, None)
            for pod_uid in list(state.pods) if state else []:
                self.pod_jobs.pop(pod_uid, None)
            self._bury(job, uid or (state.owner_uid if state else ""), now)
            if state is None or state.conditions & DONE_CONDITIONS or "Failed" in state.conditions:
                return []
            # deleted before it finished (cancelled): it ends here; nothing else would tell the pipeline,
            # which would keep counting it as running on its nodes
            return [self._event(job, state, "completion", now,
                                reason=f"deleted: the {kind} was deleted before it completed")]
        spec, status = obj.get("spec") or {}, obj.get("status") or {}
        if not isinstance(spec, Mapping) or not isinstance(status, Mapping):
            raise BadObject("bad_spec", "spec or status is not an object")
        tomb = self.tombstones.get(job)
        if tomb is not None and (event_type == "ADDED" or tomb[0] != uid or not uid):
            del self.tombstones[job]  # made again under the same name (or listed again: it is there)
        elif tomb is not None:
            return []  # a late event of the deleted one
        state = self.jobs.setdefault(job, JobState(kind))
        state.workload_seen = True
        if state.owner_uid and uid and uid != state.owner_uid:  # deleted and recreated under the same name
            state.reported.clear()
            state.conditions = frozenset()
            state.attempt = 0
        state.owner_uid = uid or state.owner_uid
        if kind != state.kind:
            state.kind = kind
            state.reorder()
        size = _size(kind, spec)
        if size != (state.world_size, state.rjob_order):
            if size[1] != state.rjob_order:
                state.reorder()
            state.world_size, state.rjob_order = size
            state.dirty = True
        events: list[JobEvent] = []
        attempt = max(_int((meta.get("annotations") or {}).get(ANNOTATION_RESTART_ATTEMPTS), 0),
                      _int(status.get("restarts"), 0))
        if attempt > state.attempt:
            state.attempt = attempt
            events.append(self._event(job, state, "restart", now, reason=f"restart {attempt}"))
        conditions = frozenset(str(c.get("type")) for c in status.get("conditions") or []
                               if isinstance(c, Mapping) and c.get("status") == "True")
        new = conditions - state.conditions
        state.conditions = conditions
        for c in status.get("conditions") or []:
            if not isinstance(c, Mapping) or c.get("type") not in new:
                continue
            why = str(c.get("reason") or c.get("type"))
            if c.get("message"):
                why = f"{why}: {c['message']}"
            if c.get("type") in DONE_CONDITIONS:
                events.append(self._event(job, state, "completion", now, reason=why[:4096]))
            elif c.get("type") == "Failed":
                events.append(self._event(job, state, "failure", now, reason=why[:4096]))
        return events + self._placement_and_start(job, state, now)

    def _event(self, job: str, state: JobState, event: str, now: float, **fields: Any) -> JobEvent:
        fields.setdefault("attempt", state.attempt)
        return JobEvent(job=job, event=event, ts=now, workload_kind=state.kind, **fields)  # type: ignore[arg-type]


def _size(kind: str, spec: Mapping[str, Any]) -> tuple[int | None, tuple[str, ...]]:
    """How many ranks the workload runs (None when unknown), and the JobSet replicated-job order."""
    try:
        if kind == "Job":
            parallelism = _int(spec.get("parallelism"), 1)
            completions = spec.get("completions")
            return (min(parallelism, _int(completions, parallelism)) if completions is not None else parallelism), ()
        if kind == "PyTorchJob":
            replicas = spec.get("pytorchReplicaSpecs") or {}
            return sum(_int((r or {}).get("replicas"), 1) for r in replicas.values()) or None, ()
        rjobs = spec.get("replicatedJobs") or []
        total = sum(_int(r.get("replicas"), 1) * _int(((r.get("template") or {}).get("spec") or {})
                                                    .get("parallelism"), 1) for r in rjobs)
        return total or None, tuple(str(r.get("name", "")) for r in rjobs)
    except AttributeError:
        raise BadObject("bad_spec", f"{kind}: spec has an unexpected shape") from None
