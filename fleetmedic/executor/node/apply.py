"""The node track: one node command in, one result out. :class:`NodeTrack` decides with :mod:`.plan`
and :mod:`.long_plan`, acts through the :class:`~fleetmedic.executor.cluster.Cluster` (quick actions
here, long ones in :mod:`.long_apply`), and writes each change with :func:`.write.write_plan`.

:mod:`fleetmedic.executor.dispatch` has already screened the command (signature, expiry) and
routed it here. The order of checks: the node must exist; a command id recorded on it is a
duplicate (``skipped``, whoever applied it); a node with the opt-out label is left alone
(``skipped``); dry run reports what it would do (``skipped``, ``dry run: would ...``) and changes
nothing. The change and the command id are written in one patch guarded by the node's
resourceVersion, so two executors cannot both apply it.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable

from fleetmedic.actions import DISRUPTIVE, NODE_LONG, NODE_QUICK
from fleetmedic.config import Settings
from fleetmedic.executor.cache import ClusterCache
from fleetmedic.executor.cluster import Cluster, Conflict
from fleetmedic.executor.metrics import ExecutorMetrics
from fleetmedic.executor.node import long_apply as la
from fleetmedic.executor.node import long_plan as pl
from fleetmedic.executor.node import plan as p
from fleetmedic.executor.node.write import write_plan
from fleetmedic.records import Outcome, RemediationCommand, RemediationResult

ATTEMPTS = 5  # re-reads after a 409 before giving up


class NodeTrack:
    def __init__(self, cluster: Cluster, settings: Settings, *, identity: str, clock: Callable[[], float],
                 stop: threading.Event, metrics: ExecutorMetrics | None = None,
                 cache: ClusterCache | None = None) -> None:
        self.cluster = cluster
        self.cache = cache  # nodes and pods by watch (the dry-run drain reads it; None: list from the API)
        self.settings = settings
        self.identity = identity
        self.clock = clock
        self.ctx = la.Context(cluster, settings, clock, stop, metrics, cache)

    def in_flight_here(self, cmd: RemediationCommand) -> bool:
        """Whether ``cmd`` is a long action in progress on its node (started before a crash or a
        takeover): it is finished even though it expired meanwhile."""
        if not cmd.node or cmd.action not in NODE_LONG:
            return False
        node = self.cluster.read_node(cmd.node)
        return node is not None and p.screen(cmd, node.annotations) == "resume"

    def _result(self, cmd: RemediationCommand, outcome: Outcome, reason: str = "",
                details: dict[str, str] | None = None, dry: bool = False) -> RemediationResult:
        return p.result_of(cmd, outcome, self.clock(), self.identity, reason, details, dry)

    def handle(self, cmd: RemediationCommand, dry: bool) -> RemediationResult:
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
        write_plan(self.cluster, touched, cmd, plan, self.clock(),
                   record=plan.outcome != "failed" or action in NODE_LONG)
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
