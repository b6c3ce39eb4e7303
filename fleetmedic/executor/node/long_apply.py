"""The long node actions: drain (Eviction API), diagnostics and hook Jobs.

Each records its progress in the node's annotations before acting (``fleetmedic.io/inflight`` plus
``fleetmedic.io/drain``, ``fleetmedic.io/diagnostics`` or ``fleetmedic.io/hook``: the
``ANNOTATION_*`` keys of :mod:`fleetmedic.k8s_keys`), so an executor that restarts, or a standby
that takes over, resumes the same drain from its original start (the timeout still counts from
there) or watches the same Job instead of starting another. ``stop`` (leadership lost, shutdown)
interrupts them without a result: the command is delivered again to whoever leads next.

The drain's poll reads the node's pods from the executor's :class:`~fleetmedic.executor.cache.ClusterCache`
when one is running and synced (a list per poll is an etcd range over every pod on a server without
a pod watch cache), and from the API otherwise. The cache may lag, so the API still decides what
the cache cannot: the poll after an eviction (the cache may not show the pod leaving yet) and the
end of the drain (the node empty, or the timeout reached) are read from the API.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetmedic.config import Settings
from fleetmedic.executor.cluster import Cluster
from fleetmedic.executor.metrics import ExecutorMetrics
from fleetmedic.executor.node import conditions
from fleetmedic.executor.node import long_plan as pl
from fleetmedic.executor.node import plan as p
from fleetmedic.executor.node.conditions import Condition
from fleetmedic.executor.node.write import write_plan
from fleetmedic.k8s_keys import (
    ANNOTATION_CORDONED_BY,
    ANNOTATION_DIAGNOSTICS,
    ANNOTATION_DRAIN,
    ANNOTATION_HOOK,
    ANNOTATION_INFLIGHT,
)
from fleetmedic.records import RemediationCommand

if TYPE_CHECKING:
    from fleetmedic.executor.cache import ClusterCache

POLL_S = 0.5


class Interrupted(Exception):
    """The executor was asked to stop: leave the action for the next leader, publish nothing."""


@dataclass
class Context:
    cluster: Cluster
    settings: Settings
    clock: Callable[[], float]
    stop: threading.Event
    metrics: ExecutorMetrics | None
    cache: ClusterCache | None = None  # nodes and pods by watch (None: every read lists from the API)
    pod_reads: Counter[str] = field(default_factory=Counter)  # the drain polls' reads: "api" or "cache"

    def sleep(self, seconds: float) -> None:
        if self.stop.wait(seconds):
            raise Interrupted()

    def write(self, node: p.NodeView, cmd: RemediationCommand, plan: p.NodePlan) -> None:
        """One step's change to the node (patch, condition, Event): :func:`.write.write_plan`."""
        write_plan(self.cluster, node, cmd, plan, self.clock())


def _inflight(cmd: RemediationCommand, now: float) -> str:
    return json.dumps({"id": cmd.id, "action": cmd.action, "since": now}, separators=(",", ":"))


def drain(ctx: Context, cmd: RemediationCommand, node: p.NodeView) -> p.NodePlan:
    """Cordon (if needed), then evict the node's pods per namespace policy until none is left, PDBs
    permitting; give up at ``drain_timeout_s`` naming the blocking PodDisruptionBudgets."""
    cfg = ctx.settings.executor
    now = ctx.clock()
    started = pl.drain_started(node.annotations, cmd, now)
    state = pl.drain_state(node.annotations)
    evicted: list[str] = list(state.get("evicted", [])) if state.get("command") == cmd.id else []
    begin: dict[str, str | None] = {ANNOTATION_INFLIGHT: _inflight(cmd, started),
                                    ANNOTATION_DRAIN: json.dumps({"command": cmd.id, "started": started,
                                                                  "state": "in_progress", "evicted": evicted})}
    cordon = not node.unschedulable
    if cordon:
        begin[ANNOTATION_CORDONED_BY] = p.ACTOR
    resumed = state.get("command") == cmd.id
    ctx.write(node, cmd, p.NodePlan(
        "applied", unschedulable=True if cordon else None, labels={cfg.lifecycle_label: "draining"},
        annotations=begin, condition=Condition("True", "Draining", f"fleetmedic drain: {cmd.reason}"[:1024]),
        event=p.Note("FleetmedicDrainResumed" if resumed else "FleetmedicDrainStarted",
                     f"{'resuming' if resumed else 'draining'} the node (incident {cmd.incident_id}): {cmd.reason}",
                     warning=True)))
    if ctx.metrics:
        ctx.metrics.drains.inc()
    try:
        blocked: dict[str, tuple[str, ...]] = {}
        fresh = True  # read this poll from the API (first poll, and after an eviction)
        while True:
            now = ctx.clock()
            step = _drain_step(ctx, node.name, started, now, fresh)
            if step.done:
                break
            if step.timed_out:
                return _drain_end(ctx, cmd, node, started, evicted, blocked, step)
            blocked, fresh = {}, False
            for pod in step.evict:
                ev = ctx.cluster.evict(pod)
                if ev.evicted:
                    fresh = True
                    if pod.ref not in evicted:
                        evicted.append(pod.ref)
                else:
                    blocked[pod.ref] = ev.blockers or (ev.message,)
            ctx.sleep(cfg.eviction_retry_backoff_s if blocked else POLL_S)
    finally:
        if ctx.metrics:
            ctx.metrics.drains.dec()
    return _drain_end(ctx, cmd, node, started, evicted, {}, None)


def _drain_step(ctx: Context, node: str, started: float, now: float, fresh: bool) -> pl.DrainStep:
    """One poll's plan: from the cache when it is synced and ``fresh`` is not asked for; a plan that
    would end the drain (nothing left, or timed out) is made again from the API's list."""
    cache = ctx.cache if ctx.cache is not None and ctx.cache.synced else None
    if cache is not None and not fresh:
        ctx.pod_reads["cache"] += 1
        step = pl.plan_drain(cache.pods_on(node), ctx.settings.executor, started, now)
        if not (step.done or step.timed_out):
            return step
    ctx.pod_reads["api"] += 1
    return pl.plan_drain(ctx.cluster.pods_on(node), ctx.settings.executor, started, now)


def _drain_end(ctx: Context, cmd: RemediationCommand, node: p.NodeView, started: float, evicted: list[str],
               blocked: dict[str, tuple[str, ...]], step: pl.DrainStep | None) -> p.NodePlan:
    cfg = ctx.settings.executor
    took = ctx.clock() - started
    details = {"evicted_pods": ",".join(evicted)[:4000], "drain_s": f"{took:.1f}"} if evicted else \
        {"drain_s": f"{took:.1f}"}
    if step is None:
        ann = {ANNOTATION_INFLIGHT: None,
               ANNOTATION_DRAIN: json.dumps({"command": cmd.id, "started": started, "state": "done",
                                             "evicted": evicted[:200]})}
        return p.NodePlan("applied", details=details, labels={cfg.lifecycle_label: "quarantined"}, annotations=ann,
                          condition=Condition("True", "Drained", f"drained by fleetmedic: {cmd.reason}"[:1024]),
                          event=p.Note("FleetmedicDrained", f"drained in {took:.0f}s, {len(evicted)} pod(s) evicted"))
    pdbs = sorted({b for bs in blocked.values() for b in bs if "/" in b})
    waiting = [x.ref for x in step.wait] + [x.ref for x in step.evict]
    why = (f"drain gave up after {took:.0f}s (drain_timeout_s {cfg.drain_timeout_s:g}): "
           + (f"evictions refused by PodDisruptionBudget {', '.join(pdbs)}" if pdbs else
              f"pods still on the node: {', '.join(waiting[:10])}"))
    details |= {"blocking_pdbs": ",".join(pdbs), "remaining_pods": ",".join(waiting)[:4000]}
    ann = {ANNOTATION_INFLIGHT: None,
           ANNOTATION_DRAIN: json.dumps({"command": cmd.id, "started": started, "state": "failed",
                                         "evicted": evicted[:200], "why": why[:512]})}
    return p.NodePlan("failed", why, details, annotations=ann,
                      event=p.Note("FleetmedicDrainFailed", why, warning=True))


def node_busy(ctx: Context, node: str) -> str:
    """The running pods that are not DaemonSet, mirror or fleetmedic's own (refs), ``""`` if none."""
    pods = [x for x in ctx.cluster.pods_on(node) if x.phase not in ("Succeeded", "Failed") and not x.deleting
            and x.owner_kind != "DaemonSet" and not x.mirror
            and not x.role]
    return ", ".join(x.ref for x in pods[:5])


def run_job(ctx: Context, cmd: RemediationCommand, node: p.NodeView, doc: dict[str, Any], state_key: str,
            timeout_s: float) -> tuple[bool | None, str, str]:
    """Create (or find again) the Job and wait for it: (passed, message, job ref); None: timed out."""
    meta = doc["metadata"]
    ref = f"{meta['namespace']}/{meta['name']}"
    state = p.annotation_json(node.annotations.get(state_key, ""))
    started = float(state["started"]) if state.get("command") == cmd.id and "started" in state else ctx.clock()
    ctx.write(node, cmd, p.NodePlan(
        "applied", annotations={ANNOTATION_INFLIGHT: _inflight(cmd, started),
                                state_key: json.dumps({"command": cmd.id, "job": ref, "verdict": "running",
                                                       "started": started})},
        labels={ctx.settings.executor.lifecycle_label: "diagnosing"} if cmd.action == "run_diagnostics" else {},
        condition=Condition("True", "DiagnosticsRunning" if cmd.action == "run_diagnostics" else "HookRunning",
                              f"fleetmedic {cmd.action}: Job {ref}"),
        event=p.Note(f"Fleetmedic{p.camel(cmd.action)}Started", f"{cmd.action}: Job {ref} ({cmd.reason})")))
    ctx.cluster.create_job(doc)
    while True:
        outcome = ctx.cluster.job_outcome(meta["namespace"], meta["name"])
        if outcome is None:  # deleted under us: create it again
            ctx.cluster.create_job(doc)
        elif outcome.passed is not None:
            return outcome.passed, outcome.message, ref
        if ctx.clock() - started > timeout_s:
            return None, f"no outcome within {timeout_s:g}s", ref
        ctx.sleep(POLL_S)


def diagnostics(ctx: Context, cmd: RemediationCommand, node: p.NodeView) -> p.NodePlan:
    cfg = ctx.settings.executor
    doc = pl.diagnostics_job(cmd, node, cfg)
    passed, message, ref = run_job(ctx, cmd, node, doc, ANNOTATION_DIAGNOSTICS, cfg.diagnostics_timeout_s + 60.0)
    verdict = "pass" if passed else "fail"
    details = {"verdict": verdict, "diagnostics": verdict, "job": ref, "level": cmd.params.get("level", "3")}
    if not passed:
        details["failed_tests"] = pl.failed_tests(message) if passed is False else "timeout"
    why = f"diagnostics {verdict}" + (f" ({details['failed_tests']}): {message}" if not passed else "")
    ann = {ANNOTATION_INFLIGHT: None,
           ANNOTATION_DIAGNOSTICS: json.dumps({"command": cmd.id, "job": ref, "verdict": verdict,
                                               "failed_tests": details.get("failed_tests", "")})}
    return p.NodePlan("applied", why[:4096] if not passed else "", details, annotations=ann,
                      labels={cfg.lifecycle_label: "validated" if passed else "quarantined"},
                      condition=Condition("True", "DiagnosticsPassed" if passed else "DiagnosticsFailed",
                                            f"{why} (Job {ref})"[:1024]),
                      event=p.Note("FleetmedicDiagnosticsPassed" if passed else "FleetmedicDiagnosticsFailed",
                                   f"{why} (Job {ref})", warning=not passed),
                      class_conditions=conditions.diagnosed(bool(passed), f"{why} (Job {ref})", node.conditions))


def hook(ctx: Context, cmd: RemediationCommand, node: p.NodeView, template_file: str) -> p.NodePlan:
    cfg = ctx.settings.executor
    try:
        doc = pl.hook_job(Path(template_file).read_text(), cmd, node, cfg)
    except (OSError, ValueError) as exc:
        return p.NodePlan("failed", f"executor.action_hooks.{cmd.action}: {exc}")
    passed, message, ref = run_job(ctx, cmd, node, doc, ANNOTATION_HOOK, cfg.diagnostics_timeout_s)
    ann: dict[str, str | None] = {ANNOTATION_INFLIGHT: None, ANNOTATION_HOOK: None}
    if passed:
        return p.NodePlan("applied", details={"job": ref, "hook": cmd.action}, annotations=ann,
                          event=p.Note(f"Fleetmedic{p.camel(cmd.action)}Done",
                                       f"{cmd.action} hook Job {ref} succeeded"))
    why = f"{cmd.action} hook Job {ref} " + ("failed: " + message if passed is False else message)
    return p.NodePlan("failed", why, {"job": ref}, annotations=ann,
                      event=p.Note(f"Fleetmedic{p.camel(cmd.action)}Failed", why, warning=True))

