"""One command in, one result out: :class:`CommandExecutor` screens a command and routes it to its
track, the one place the routing rule (:func:`fleetmedic.actions.targets_node`) is applied.

The order of checks for every command: signature and expiry (refused: ``skipped`` with the reason;
an expired long action this executor's predecessor started is finished all the same), the cluster
it is addressed to (:func:`~fleetmedic.signing.cluster_refusal`; the service refuses those before
they get here, without a result), then a dry run already answered (``skipped``), then the track:

- node track (:class:`~.node.apply.NodeTrack`): the node's commands, quick and long;
- job track (:class:`~.workload.track.JobTrack`): the ledger, then the workload restart.

Dry run (``command.dry_run`` or ``safety.dry_run``) reports what the track would do and changes
nothing. :func:`target` names the queue a command waits in (:mod:`.queueing`): commands for one
target run in order, one at a time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from fleetmedic.actions import targets_node
from fleetmedic.config import Settings
from fleetmedic.executor.cache import ClusterCache
from fleetmedic.executor.cluster import ApiError, Cluster
from fleetmedic.executor.kube import KubeCluster
from fleetmedic.executor.metrics import ExecutorMetrics
from fleetmedic.executor.node import plan as p
from fleetmedic.executor.node.apply import NodeTrack
from fleetmedic.executor.workload.placement_apply import PlacementRestarter
from fleetmedic.executor.workload.track import JobTrack, Restarter
from fleetmedic.records import RemediationCommand, RemediationResult
from fleetmedic.signing import KeySet, as_command_keys, cluster_refusal

log = logging.getLogger(__name__)


def target(cmd: RemediationCommand) -> str:
    """The target a command acts on, by its track: ``node:<name>`` or ``job:<namespace/name>``."""
    return f"node:{cmd.node}" if targets_node(cmd.action, cmd.node) else f"job:{cmd.job}"


class CommandExecutor:
    def __init__(self, cluster: Cluster, settings: Settings, keys: KeySet | bytes, *, identity: str,
                 restarter: Restarter, clock: Callable[[], float] = time.time,
                 metrics: ExecutorMetrics | None = None, stop: threading.Event | None = None,
                 cache: ClusterCache | None = None) -> None:
        self.settings = settings
        self.keys = as_command_keys(keys)  # by id; one bare key is the default id's
        self.identity = identity
        self.clock = clock
        self.metrics = metrics
        self.stop = stop or threading.Event()
        self._dry_seen: set[str] = set()
        self.node = NodeTrack(cluster, settings, identity=identity, clock=clock, stop=self.stop, metrics=metrics,
                              cache=cache)
        self.job = JobTrack(cluster, restarter, ledger_namespace=settings.executor.lease_namespace,
                            identity=identity, clock=clock)

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
        if rejected and rejected.startswith("expired") and self.node.in_flight_here(cmd):
            rejected = None  # a long action this command started (before a crash or takeover) is finished
        if rejected:
            if self.metrics:
                self.metrics.rejected.labels(reason="expired" if rejected.startswith("expired") else "signature").inc()
            return p.result_of(cmd, "skipped", self.clock(), self.identity, rejected)
        c = self.settings.cluster
        foreign = cluster_refusal(cmd, c.name, accept_unlabeled=c.accept_unlabeled_commands)
        if foreign:  # the service refuses these before handing them over; this is the last line
            if self.metrics:
                self.metrics.rejected.labels(reason="cluster").inc()
            return p.result_of(cmd, "skipped", self.clock(), self.identity, f"refused: {foreign}")
        dry = cmd.dry_run or self.settings.safety.dry_run
        if dry and cmd.id in self._dry_seen:
            return p.result_of(cmd, "skipped", self.clock(), self.identity, "duplicate command id (already applied)",
                               dry_run=True)
        track = self.node if targets_node(cmd.action, cmd.node) else self.job
        try:
            result = track.handle(cmd, dry)
        except ApiError as exc:
            result = p.result_of(cmd, "failed", self.clock(), self.identity, str(exc), dry_run=dry)
        if dry:
            self._dry_seen.add(cmd.id)
        return result


def kube_executor(cluster: KubeCluster, settings: Settings, keys: KeySet | bytes, *, identity: str,
                  clock: Callable[[], float] = time.time, metrics: ExecutorMetrics | None = None,
                  stop: threading.Event | None = None, cache: ClusterCache | None = None) -> CommandExecutor:
    """The executor on an API server: job commands restart workloads through the topology-aware
    :class:`~.workload.placement_apply.PlacementRestarter` (docs/placement.md)."""
    stop = stop or threading.Event()
    restarter = PlacementRestarter(cluster, settings, metrics.placement if metrics else None, stop=stop,
                                   cache=cache)
    return CommandExecutor(cluster, settings, keys, identity=identity, restarter=restarter, clock=clock,
                           metrics=metrics, stop=stop, cache=cache)
