"""The job track: one job command in, one result out. :class:`JobTrack` records the command id on
the ledger (through the :class:`~fleetmedic.executor.cluster.Cluster`) *before* the workload is
touched, so a command is carried out at most once whichever executor sees it, then hands the
restart to its :class:`Restarter` (the topology-aware
:class:`~.placement_apply.PlacementRestarter` in the executor).

:mod:`fleetmedic.executor.dispatch` has already screened the command (signature, expiry) and
routed it here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from fleetmedic.actions import JOB_TRACK_ACTIONS
from fleetmedic.executor.cluster import Cluster, Conflict
from fleetmedic.executor.node import plan as p
from fleetmedic.executor.workload.apply import WorkloadOutcome
from fleetmedic.k8s_keys import ANNOTATION_COMMANDS
from fleetmedic.records import Outcome, RemediationCommand, RemediationResult

ATTEMPTS = 5  # re-reads of the ledger after a 409 before giving up


class Restarter(Protocol):
    """What restarts a workload (:class:`~.placement_apply.PlacementRestarter`)."""

    def restart(self, job: str, *, action: str, exclude_nodes: Sequence[str], params: Mapping[str, str],
                dry_run: bool, actor: str) -> WorkloadOutcome: ...


class JobTrack:
    def __init__(self, cluster: Cluster, restarter: Restarter, *, ledger_namespace: str, identity: str,
                 clock: Callable[[], float]) -> None:
        self.cluster = cluster
        self.restarter = restarter
        self.ledger_namespace = ledger_namespace
        self.identity = identity
        self.clock = clock

    def _result(self, cmd: RemediationCommand, outcome: Outcome, reason: str = "",
                details: dict[str, str] | None = None, dry: bool = False) -> RemediationResult:
        return p.result_of(cmd, outcome, self.clock(), self.identity, reason, details, dry)

    def handle(self, cmd: RemediationCommand, dry: bool) -> RemediationResult:
        if cmd.action not in JOB_TRACK_ACTIONS:
            return self._result(cmd, "failed", f"{cmd.action} needs a node", dry=dry)
        ns = self.ledger_namespace
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
        out = self.restarter.restart(cmd.job, action=cmd.action, exclude_nodes=list(cmd.exclude_nodes),
                                     params={**cmd.params, "command_id": cmd.id}, dry_run=dry, actor=self.identity)
        return self._result(cmd, out.outcome, out.reason, dict(out.details), dry=dry)
