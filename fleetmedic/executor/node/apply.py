"""One command in, one result out: :class:`CommandExecutor` decides with :mod:`.plan`, acts through
:class:`~fleetmedic.executor.kube.Cluster`.

The order of checks for every command: signature and expiry (refused: ``skipped`` with the reason),
then the target. Node track: the node must exist; a command id recorded on it is a duplicate
(``skipped``, whoever applied it); a node with the opt-out label is left alone (``skipped``); dry run
(``command.dry_run`` or ``safety.dry_run``) reports what it would do (``skipped``, ``dry run: would
...``) and changes nothing. The change and the command id are written in one patch guarded by the
node's resourceVersion, so two executors cannot both apply it. Job track: the id is recorded in the
ledger ConfigMap *before* the workload is restarted (at most once), then
``fleetmedic.executor.workload.apply.restart_workload`` does the work.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable

from fleetmedic.actions import DISRUPTIVE, JOB_TRACK_ACTIONS, NODE_LONG, NODE_QUICK, targets_node
from fleetmedic.config import Settings
from fleetmedic.executor.cache import ClusterCache
from fleetmedic.executor.kube import ApiError, Cluster, Conflict
from fleetmedic.executor.metrics import ExecutorMetrics
from fleetmedic.executor.node import long_apply as la
from fleetmedic.executor.node import long_plan as pl
from fleetmedic.executor.node import plan as p
from fleetmedic.executor.workload.placement_apply import PlacementRestarter
from fleetmedic.k8s_keys import ANNOTATION_COMMANDS
from fleetmedic.records import Outcome, RemediationCommand, RemediationResult
from fleetmedic.signing import KeySet, as_command_keys

log = logging.getLogger(__name__)
ATTEMPTS = 5  # re-reads after a 409 before giving up


class CommandExecutor:
    def __init__(self, cluster: Cluster, settings: Settings, keys: KeySet | bytes, *, identity: str,
                 clock: Callable[[], float] = time.time, metrics: ExecutorMetrics | None = None,
                 stop: threading.Event | None = None, cache: ClusterCache | None = None) -> None:
        self.cluster = cluster
        self.cache = cache  # nodes and pods by watch (placement reads it; None: list per restart)
        self.settings = settings
        self.keys = as_command_keys(keys)  # by id; one bare key is the default id's
        self.identity = identity
        self.clock = clock
        self.metrics = metrics
        self.stop = stop or threading.Event()
        self._dry_seen: set[str] = set()
        self.ctx = la.Context(cluster, settings, clock, self.stop, metrics, self._commit, cache)

    # --- entry ------------------------------------------------------------------------------------

    def handle(self, cmd: RemediationCommand, *, verified_by_header: bool = False) -> RemediationResult:
        """Carry out ``cmd`` (blocking; long actions take as long as they take). Raises
        :class:`~fleetmedic.executor.node.long_apply.Interrupted` when asked to stop.
        ``verified_by_header``: see :func:`~fleetmedic.executor.node.plan.reject_reason`."""
        t0 = time.monotonic()
        result = self._handle(cmd, verified_by_header)
        if self.metrics:
            self.metrics.observe(cmd.action, result.outcome, time.monotonic() - t0)
        log.info("%s %s %s: %s%s", cmd.id, cmd.action, result.outcome, result.reason,
                 f" {dict(result.details)}" if result.details else "")
        return result

    def _handle(self, cmd: RemediationCommand, verified_by_header: bool = False) -> RemediationResult:
        now = self.clock()
        rejected = p.reject_reason(cmd, self.keys, now, max_future_skew_s=self.settings.streams.max_future_skew_s,
                                   allow_demo=self.settings.signing.allow_demo_keys,
                                   verified_by_header=verified_by_header)
        if rejected and rejected.startswith("expired") and self._in_flight_here(cmd):
            rejected = None  # a long action this command started (before a crash or takeover) is finished
        if rejected:
            if self.metrics:
                self.metrics.rejected.labels(reason="expired" if rejected.startswith("expired") else "signature").inc()
            return self._result(cmd, "skipped", rejected)
        dry = cmd.dry_run or self.settings.safety.dry_run
        if dry and cmd.id in self._dry_seen:
            return self._result(cmd, "skipped", "duplicate command id (already applied)", dry=True)
        try:
            result = self._node_command(cmd, dry) if targets_node(cmd.action, cmd.node) else self._job_command(cmd, dry)
        except ApiError as exc:
            result = self._result(cmd, "failed", str(exc), dry=dry)
        if dry:
            self._dry_seen.add(cmd.id)
        return result

    def _in_flight_here(self, cmd: RemediationCommand) -> bool:
        if not cmd.node or cmd.action not in NODE_LONG:
            return False
        node = self.cluster.read_node(cmd.node)
        return node is not None and p.screen(cmd, node.annotations) == "resume"

    def _result(self, cmd: RemediationCommand, outcome: Outcome, reason: str = "",
                details: dict[str, str] | None = None, dry: bool = False) -> RemediationResult:
        return p.result_of(cmd, outcome, self.clock(), self.identity, reason, details, dry)

    # --- node track -------------------------------------------------------------------------------

    def _node_command(self, cmd: RemediationCommand, dry: bool) -> RemediationResult:
        for _ in range(ATTEMPTS):
            node = self.cluster.read_node(cmd.node)
            if node is None:
                return self._result(cmd, "failed", f"unknown node {cmd.node}", dry=dry)
            seen = p.screen(cmd, node.annotations)
            if seen == "duplicate":
                return self._result(cmd, "skipped", "duplicate command id (already applied)", dry=dry)
            if p.opted_out(node, self.settings.safety.opt_out_label):
                return self._result(cmd, "skipped", f"node opts out of remediation (label "
                                                    f"{self.settings.safety.opt_out_label})", dry=dry)
            try:
                return self._node_action(cmd, node, dry)
            except Conflict:
                continue
        return self._result(cmd, "failed", f"node {cmd.node} kept changing ({ATTEMPTS} conflicts)", dry=dry)

    def _node_action(self, cmd: RemediationCommand, node: p.NodeView, dry: bool) -> RemediationResult:
        cfg = self.settings.executor
        action = cmd.action
        hooks: dict[str, str] = {str(k): v for k, v in cfg.action_hooks.items()}
        hook_file = hooks.get(action, "")
        if dry:
            return self._result(cmd, "skipped", "dry run: would " + self._would(cmd, node, hook_file), dry=True)
        if action in NODE_QUICK and not hook_file:
            plan = p.plan_node_action(cmd, node, cfg, self.clock())
        elif action == "drain":
            plan = la.drain(self.ctx, cmd, node)
        elif action == "run_diagnostics":
            busy = "" if p.screen(cmd, node.annotations) == "resume" else la.node_busy(self.ctx, node.name)
            if busy:
                return self._result(cmd, "failed", f"node has running pods ({busy}); drain it first")
            plan = la.diagnostics(self.ctx, cmd, node)
        elif hook_file:
            plan = la.hook(self.ctx, cmd, node, hook_file)
        elif action in DISRUPTIVE:
            plan = p.no_hook_plan(cmd)
        else:
            return self._result(cmd, "failed", f"{action} needs a job, not a node")
        touched = node if action in NODE_QUICK and not hook_file else dataclasses.replace(node, resource_version="")
        self._commit(touched, cmd, plan, record=plan.outcome != "failed" or action in NODE_LONG)
        return self._result(cmd, plan.outcome, plan.reason, dict(plan.details))

    def _would(self, cmd: RemediationCommand, node: p.NodeView, hook_file: str) -> str:
        cfg = self.settings.executor
        if cmd.action in NODE_QUICK and not hook_file:
            plan = p.plan_node_action(cmd, node, cfg, self.clock())
            if plan.outcome != "applied":
                return f"not act ({plan.outcome}: {plan.reason})"
            return ", ".join(plan.changes()) or "change nothing"
        if cmd.action == "drain":
            cache = self.cache if self.cache is not None and self.cache.synced else None
            pods = cache.pods_on(node.name) if cache is not None else self.cluster.pods_on(node.name)
            step = pl.plan_drain(pods, cfg, self.clock(), self.clock())
            return (f"cordon and drain {node.name}: evict {len(step.evict)} pod(s) now "
                    f"({', '.join(x.ref for x in step.evict[:5])}), wait for {len(step.wait)}, leave "
                    f"{len(step.skipped)} (DaemonSet/mirror/finished)")
        if cmd.action == "run_diagnostics":
            job = pl.diagnostics_job(cmd, node, cfg)
            return f"create diagnostics Job {job['metadata']['namespace']}/{job['metadata']['name']} on {node.name}"
        if hook_file:
            return f"run the {cmd.action} hook Job from {hook_file} for {node.name}"
        return f"record {cmd.action} on {node.name} (no hook configured)"

    def _commit(self, node: p.NodeView, cmd: RemediationCommand, plan: p.NodePlan, record: bool = False) -> None:
        """Write ``plan`` to the node: one merge patch (guarded by ``node.resource_version`` when set)
        carrying the changes and, with ``record``, the command id; then the condition and the Event."""
        ann = dict(plan.annotations)
        if record:
            fresh = node if node.resource_version else self.cluster.read_node(node.name)
            ann[ANNOTATION_COMMANDS] = p.remember(fresh.annotations if fresh else {}, cmd, self.clock())
        plan = dataclasses.replace(plan, annotations=ann)
        patch = p.merge_patch(plan, node)
        if patch.get("spec") or set(patch["metadata"]) - {"resourceVersion"}:
            self.cluster.patch_node(node.name, patch)
        if plan.condition is not None:
            self.cluster.set_condition(node.name, plan.condition)
        for ctype, cond in plan.class_conditions:
            self.cluster.set_condition(node.name, cond, ctype)
        if plan.event is not None:
            self.cluster.event(node.name, plan.event, cmd.action)

    # --- job track --------------------------------------------------------------------------------

    def _job_command(self, cmd: RemediationCommand, dry: bool) -> RemediationResult:
        if cmd.action not in JOB_TRACK_ACTIONS:
            return self._result(cmd, "failed", f"{cmd.action} needs a node", dry=dry)
        ns = self.settings.executor.lease_namespace
        for _ in range(ATTEMPTS):
            ann, version = self.cluster.read_ledger(ns)
            if p.screen(cmd, ann) == "duplicate":
                return self._result(cmd, "skipped", "duplicate command id (already applied)", dry=dry)
            if dry:
                break
            try:  # at most once: the id is recorded before the workload is touched
                self.cluster.patch_ledger(ns, {ANNOTATION_COMMANDS: p.remember(ann, cmd, self.clock())}, version)
                break
            except Conflict:
                continue
        else:
            return self._result(cmd, "failed", f"the ledger kept changing ({ATTEMPTS} conflicts)", dry=dry)
        if cmd.action == "escalate":
            what = cmd.params.get("escalation", "notify")
            return self._result(cmd, "skipped", f"no escalate hook configured (executor.action_hooks): escalation "
                                                f"'{what}' about {cmd.job} recorded only in this result", dry=dry)
        # the topology-aware restart (docs/placement.md)
        placement_metrics = self.metrics.placement if self.metrics else None
        restarter = PlacementRestarter(self.cluster.api, self.settings, placement_metrics, stop=self.stop,
                                       cache=self.cache)
        out = restarter.restart(cmd.job, action=cmd.action, exclude_nodes=list(cmd.exclude_nodes),
                                params={**cmd.params, "command_id": cmd.id}, dry_run=dry, actor=self.identity)
        return self._result(cmd, out.outcome, out.reason, dict(out.details), dry=dry)
