"""The policies a history is replayed under, each acting on the same :class:`~.world.World`.

- :class:`Manual`: no automation. A person on call notices a job's failure after ``human_delay_s``
  (with a lognormal spread); where the failed node shows something (an XID, a link down, a node
  down: the mapping's evidence is visible) they cordon it, send it to repair and restart the job
  without it; where nothing shows they restart the job where it was, and take a node out once it
  has failed ``human_suspect_after`` jobs (a pod preempted or stopped by a restart is not a failure
  of its node). A degradation is noticed only once it turns into a hard
  failure. After a repair they run diagnostics and uncordon the node.
- :class:`NpdDraino`: node-problem-detector's kernel monitor and draino: a fault that reaches the
  kernel log (XIDs, read-only file systems, hung kernels) is cordoned and drained
  ``npd_delay_s`` after it shows; the job's controller restarts the job elsewhere; the person on
  call repairs cordoned nodes and handles everything else as in :class:`Manual`. No degradation
  handling, no budgets, no topology-aware placement.
- :class:`Fleetmedic`: the shipped pipeline in process (:class:`~fleetmedic.sim.embedded.EmbeddedPipeline`:
  stage 1's detectors for kernel and port records, the :class:`~fleetmedic.remediation.engine.DecisionEngine`
  with triage, policy, safety and lifecycle) fed the fault's evidence after the detectors' measured
  delay, the jobs' events, and the executor's results; its commands are carried out on the world
  with the executor's latencies. Tickets (``escalate`` that is not a repair) go to the person on call.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable

from fleetmedic import records as r
from fleetmedic.actions import JOB_ACTIONS, RELEASING
from fleetmedic.config import Settings
from fleetmedic.evaluation.scoring import is_repair
from fleetmedic.remediation.log_patterns import default_library
from fleetmedic.remediation.placements import changed_at
from fleetmedic.remediation.topology import Placement, Topology
from fleetmedic.sim.embedded import EmbeddedPipeline
from fleetmedic.sim.whatif.evidence import REASSERTED, EvidenceSource, failure_lines
from fleetmedic.sim.whatif.mapping import NPD_KERNEL_CONDITIONS
from fleetmedic.sim.whatif.world import Fault, Job, World

_REFUSED = re.compile(r"refused(?: \([a-z ]+\))?: ([^(;:]+)")


def relogged(f: Fault | None, why: str, t: float) -> bool:
    """Whether a job failing at ``t`` on ``f``'s node makes the driver log ``f``'s XID again: a job
    placed later on the faulty GPU dies of it (the failure at the fault's own onset is that XID)."""
    return (f is not None and f.entry.effect == "crash" and f.entry.evidence.startswith("xid:")
            and t > (f.turned_at if f.turned_at is not None else f.onset) and "by " not in why)


NO_NODES: frozenset[int] = frozenset()
#: why a pod stops that says nothing of its node: the big job preempted it, or a restart stopped it
NOT_THE_NODE: tuple[str, ...] = ("preempted by", "stopped by")


class OnCall:
    """The person on call: notices failures late, repairs what shows, validates repaired nodes."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.failures: dict[int, int] = {}  # node -> jobs failed there since its last repair
        self.handling: set[int] = set()  # nodes taken out, not yet back

    def notice_failure(self, world: World, job: Job, node: int, t: float, why: str = "") -> None:
        """Look at the job's failure on ``node`` after the person's delay. A pod preempted or stopped
        on purpose (``why``) is not a failure of its node: it does not count towards suspecting it."""
        counts = not any(w in why for w in NOT_THE_NODE)
        world.at(t + world.human_delay("failure", job.name, job.attempt, node),
                 lambda at: self._look(world, job, node, at, counts))

    def _look(self, world: World, job: Job, n: int, t: float, counts: bool = True) -> None:
        if n < 0:
            return
        f = world.nodes[n].fault()
        if counts:
            self.failures[n] = self.failures.get(n, 0) + 1
        shows = f is not None and f.visible and f.entry.effect == "crash"
        if (n not in self.handling and world.nodes[n].busy != "repair"
                and (shows or self.failures.get(n, 0) >= world.a.human_suspect_after)):
            self.take_out(world, n, t)
        if job.state == "waiting_to_detect" or (job.state == "waiting_for_capacity" and not job.restart_requested):
            world.request_restart(job, set(self.handling), t, self.name)

    def take_out(self, world: World, n: int, t: float) -> None:
        """Cordon, drain and repair ``n``; validate and uncordon it when repaired."""
        self.handling.add(n)
        world.cordon(n, t, self.name)
        world.send_to_repair(n, t, self.name, lambda at: self._repaired(world, n, at))

    def _repaired(self, world: World, n: int, t: float) -> None:
        level = 3
        world.start_busy(n, "diagnostics", t + world.a.diagnostics_s[level - 1], t,
                         lambda at: self._validated(world, n, at))

    def _validated(self, world: World, n: int, t: float) -> None:
        if world.diagnose(n, 3, ("oncall", t)):
            world.send_to_repair(n, t, self.name, lambda at: self._repaired(world, n, at))
            return
        self.handling.discard(n)
        self.failures.pop(n, None)
        world.uncordon(n, t)


class Manual:
    name = "manual"

    def __init__(self) -> None:
        self.oncall = OnCall("oncall")

    def start(self, world: World, t: float) -> None:
        pass

    def fault_started(self, world: World, f: Fault, t: float) -> None:
        pass

    def fault_repaired(self, world: World, f: Fault, t: float) -> None:
        pass

    def job_failed(self, world: World, job: Job, node: int, was_on: list[int], t: float, why: str) -> None:
        self.oncall.notice_failure(world, job, node, t, why)

    def job_placed(self, world: World, job: Job, t: float) -> None:
        pass

    def suspected(self, world: World, node: int, t: float) -> bool:
        return node in self.oncall.handling

    def unbindable(self, world: World, t: float) -> frozenset[int]:
        return NO_NODES  # no bind-time check


class NpdDraino(Manual):
    name = "npd-draino"

    def job_failed(self, world: World, job: Job, node: int, was_on: list[int], t: float, why: str) -> None:
        super().job_failed(world, job, node, was_on, t, why)
        f = world.nodes[node].fault() if node >= 0 else None
        if f is not None and relogged(f, why, t):
            entry = f.entry  # the XID logged again as the job dies on the GPU: the kernel monitor sees it
            world.at(t + world.a.npd_delay_s, lambda at: self._drain(world, f, entry, at))

    def fault_started(self, world: World, f: Fault, t: float) -> None:
        ev = f.entry.evidence
        head, _, arg = ev.partition(":")
        if head == "xid" or (head == "node_condition" and arg.partition("=")[0] in NPD_KERNEL_CONDITIONS):
            entry = f.entry
            world.at(f.evidence_at + world.a.npd_delay_s, lambda at: self._drain(world, f, entry, at))

    def _drain(self, world: World, f: Fault, entry: object, t: float) -> None:
        n = f.node
        if not f.active or f.entry is not entry or n in self.oncall.handling or world.nodes[n].cordoned_by:
            return
        world.cordon(n, t, "npd-draino")
        world.at(t + world.a.drain_grace_s, lambda at: world.drain(n, at, "drained by draino"))
        # the condition pages the person on call, who sends the node to repair
        world.at(t + world.human_delay("npd", n, t), lambda at: self._hand_over(world, n, at))

    def _hand_over(self, world: World, n: int, t: float) -> None:
        if n not in self.oncall.handling and world.nodes[n].busy != "repair":
            self.oncall.take_out(world, n, t)


def fleet_topology(world: World) -> Topology:
    """Racks of ``nodes_per_rack`` and leaves of ``nodes_per_leaf`` nodes, the nodes placed in a
    seeded random order: a history names its nodes in the order they first failed, and placing
    them in that order would put faults close in time into one rack (a correlation the history
    does not have)."""
    a = world.a
    order = list(range(len(world.nodes)))
    world.rng("topology").shuffle(order)
    return Topology({world.nodes[n].name: Placement(rack=f"rack-{i // a.nodes_per_rack:05d}",
                                                    leaf=f"leaf-{i // a.nodes_per_leaf:04d}", pool="gpu")
                     for i, n in enumerate(order)})


def _rank_placements(world: World, nodes: list[int], last: tuple[list[int], list[r.RankPlacement]] | None
                     ) -> list[r.RankPlacement]:
    """A record a rank (rank ``i`` on ``nodes[i]``, every GPU of the node), read-only. A placement of
    the size of ``last`` (the job's last nodes and records) that differs from it in a few ranks (a
    lock-step job placed again without a node or two) takes its records and makes the changed ones."""
    gpus = list(range(world.a.gpus_per_node))  # one list for every rank: the records are read-only
    names = world.nodes
    if last is not None and last[1]:
        at = changed_at(last[0], nodes)
        if at is not None:
            made = last[1].copy()
            for i in at:
                made[i] = r.RankPlacement(rank=i, node=names[nodes[i]].name, gpus=gpus)
            return made
    return [r.RankPlacement(rank=i, node=names[n].name, gpus=gpus) for i, n in enumerate(nodes)]


#: between inputs the engine ticks every IDLE_TICK_S: what it waits for then (refused isolations
#: retried, action timeouts, breaker resume, probation) is ten minutes to days away. After an input it
#: ticks at the first ``tick_s`` boundary past each settle window the input may have opened.
IDLE_TICK_S = 600.0


class Fleetmedic:
    """The shipped engine in the loop (see the module docstring)."""

    def __init__(self, settings: Settings, name: str = "fleetmedic") -> None:
        self.name = name
        self.settings = settings
        self.oncall = OnCall(f"{name}-oncall")
        self.pipeline: EmbeddedPipeline | None = None
        self.evidence = EvidenceSource(settings, default_library())
        self._next_tick = float("inf")
        self._extra: set[float] = set()
        tr, sf = settings.triage, settings.safety
        #: after an input (which the engine acts on at once): when each settle window or backoff it
        #: may have opened ends
        self.windows = sorted({tr.failure_settle_s, tr.network_settle_s, sf.settle_s,
                               settings.policy.transient_retry_backoff_s} - {0.0})
        self.refused: dict[str, int] = {}
        self.breaker_reasons: dict[str, int] = {}
        self.commands: dict[str, int] = {}
        self.breaker_trips = 0
        #: job -> (its nodes, its placement records) when last placed
        self._placements: dict[int, tuple[list[int], list[r.RankPlacement]]] = {}
        self._last_excluded: tuple[list[str], set[int]] | None = None  # (see :meth:`_excluded`)

    # --- the engine's inputs ----------------------------------------------------------------------

    def start(self, world: World, t: float) -> None:
        self.world = world
        self.pipeline = EmbeddedPipeline(self.settings, fleet_topology(world))
        for job in world.jobs:
            self.job_placed(world, job, t)
        self._schedule_tick(t + 600.0)

    @property
    def engine_pipeline(self) -> EmbeddedPipeline:
        assert self.pipeline is not None
        return self.pipeline

    def fault_started(self, world: World, f: Fault, t: float) -> None:
        entry = f.entry
        world.at(f.evidence_at, lambda at: self._evidence(world, f, entry, at, first=True))

    def fault_repaired(self, world: World, f: Fault, t: float) -> None:
        """A repaired node's condition clears: the node watch reports it."""
        kind, _, arg = f.entry.evidence.partition(":")
        if kind == "node_condition":
            p = self.engine_pipeline
            self._execute(world, [c for x in self.evidence.condition_cleared(world.nodes[f.node].name, arg, t)
                                  for c in p.finding(x, t)], t)

    def _evidence(self, world: World, f: Fault, entry: object, t: float, first: bool) -> None:
        if not f.active or f.entry is not entry:
            return
        node = world.nodes[f.node]
        p = self.engine_pipeline
        kind, _, arg = f.entry.evidence.partition(":")
        cmds: list[r.RemediationCommand] = []
        delivered = True
        if node.busy in ("repair", "reboot", "reset_gpu"):
            # a node being repaired, rebooting or resetting its GPUs reports nothing; one the engine
            # holds or diagnoses reports what it reports (the engine mutes it, and a lasting
            # condition keeps the node from returning on passing diagnostics)
            delivered = False
        elif kind == "xid" and first:
            for rec in self.evidence.kernel(node.name, int(arg), t):
                cmds += p.kernel(rec, t) if isinstance(rec, r.KernelEvent) else []
        elif kind in ("ib_link_down", "nic_speed_low"):
            for msg in self.evidence.ports(node.name, kind, t, first):
                cmds += p.port(msg, t)
        elif kind == "node_condition" and first:
            for finding in self.evidence.condition(node.name, arg, t):
                cmds += p.finding(finding, t)
        elif kind == "straggler":
            if node.job is not None and node.job.state == "running" and node.job.size > 1:
                cmds += p.finding(self.evidence.gpu_finding(node.name, kind, t, node.job.ref), t)
        elif kind in ("pcie_width_low", "thermal_slowdown", "power_brake", "nvlink_errors", "ecc_sbe_rate"):
            cmds += p.finding(self.evidence.gpu_finding(node.name, kind, t), t)
        if delivered:
            self._execute(world, cmds, t)
        if kind in REASSERTED:
            world.at(t + self.settings.detection.reassert_s, lambda at: self._evidence(world, f, entry, at, False))

    def job_failed(self, world: World, job: Job, node: int, was_on: list[int], t: float, why: str) -> None:
        f = world.nodes[node].fault() if node >= 0 else None
        evidence = f.entry.evidence if f is not None else ("software" if "stopped by" not in why else "")
        code, reason, lines = failure_lines(evidence) if evidence else (143, "Evicted", ["SIGTERM received"])
        if "drain" in why or "repair" in why or "reboot" in why or "preempted" in why or "stopped by" in why:
            code, reason, lines = 143, "Evicted", [f"Terminated: {why}"]
        try:
            rank = was_on.index(node)
        except ValueError:
            rank = 0
        ev = r.JobEvent(job=job.ref, event="failure", ts=round(t, 3), attempt=job.attempt, workload_kind="PyTorchJob",
                        world_size=job.size, rank=rank, node=world.nodes[node].name if node >= 0 else "",
                        exit_code=code, reason=reason, log_excerpt=lines)
        self._execute(world, self.engine_pipeline.job(ev, t), t)
        if f is not None and relogged(f, why, t):
            # a job dying on the faulty GPU makes the driver log the XID again
            self._evidence(world, f, f.entry, t, first=True)
        if job.failures_in_a_row > world.a.backoff_limit:
            self.oncall.notice_failure(world, job, node, t, why)

    def job_placed(self, world: World, job: Job, t: float) -> None:
        last = self._placements.get(job.index)
        if last is not None and last[0] == job.nodes:
            placement = last[1]  # placed where it ran: the same records (they are read-only)
        else:
            placement = _rank_placements(world, job.nodes, last)
            self._placements[job.index] = (job.nodes, placement)  # (``job.nodes`` is read-only)
        ev = r.JobEvent(job=job.ref, event="start", ts=round(t, 3), attempt=job.attempt, workload_kind="PyTorchJob",
                        world_size=job.size, placement=placement)
        self._execute(world, self.engine_pipeline.job(ev, t), t)

    def suspected(self, world: World, node: int, t: float) -> bool:
        """Whether the engine, at ``t``, holds anything against ``node``: an isolation, a lifecycle
        underway, or a finding not yet acted on (refused, settling, being confirmed)."""
        return world.nodes[node].name in self.engine_pipeline.engine.suspected_nodes()

    def unbindable(self, world: World, t: float) -> frozenset[int]:
        """With ``admission.enabled``, the nodes the bind-time check refuses at ``t`` (their cordon
        issued, not yet applied): the engine's answer at the moment of the bind."""
        if not self.settings.admission.enabled:
            return NO_NODES
        refused = self.engine_pipeline.engine.cordons_in_flight()
        return frozenset(world.index[n] for n in refused if n in world.index) if refused else NO_NODES

    # --- ticks ------------------------------------------------------------------------------------

    def _schedule_tick(self, at: float) -> None:
        """The idle chain: one tick every IDLE_TICK_S (a tick due at ``at`` replaces a later one)."""
        self._next_tick = at
        self.world.at(at, lambda t: self._tick(t, at))

    def _tick(self, t: float, due: float | None) -> None:
        if due is not None:
            if due != self._next_tick:
                return  # superseded
            self._schedule_tick(t + IDLE_TICK_S)
        self._execute(self.world, self.engine_pipeline.tick(t), t, wake=False)

    def _wake(self, t: float) -> None:
        """After an input the engine may wait out a settle window: tick when each could end (the
        decision stage ticks every ``tick_s``, so at the first tick past it)."""
        step = self.world.a.tick_s
        for window in self.windows:
            at = (int((t + window) / step) + 1) * step
            if at not in self._extra:
                self._extra.add(at)
                self.world.at(at, self._extra_tick)

    def _extra_tick(self, t: float) -> None:
        self._extra.discard(t)
        self._tick(t, None)

    # --- the executor -----------------------------------------------------------------------------

    def _execute(self, world: World, cmds: Iterable[r.RemediationCommand], t: float, wake: bool = True) -> None:
        """Carry out ``cmds`` (the engine's answer to an input at ``t``): any input may start a
        settle window or a deadline, so the engine ticks closely for a while after it."""
        cmds = list(cmds)
        if wake or cmds:
            self._wake(t)
        for cmd in cmds:
            self.commands[cmd.action] = self.commands.get(cmd.action, 0) + 1
            world.at(t + world.a.executor_latency_s, functools.partial(self._apply, world, cmd))
        self._note_audit()

    def _note_audit(self) -> None:
        """Count refusals and breaker trips; the person on call looks at a tripped breaker after
        ``human_delay_s``, as the FleetmedicBreakerOpen alert asks, and resumes it once the storm is
        over (every count below its level), else looks again later."""
        out = self.engine_pipeline.out
        for a in out.audit:
            if a.decision == "blocked":
                m = _REFUSED.search(a.explanation)
                key = m.group(1).strip() if m else a.explanation[:60]
                self.refused[key] = self.refused.get(key, 0) + 1
            elif a.decision == "breaker_tripped":
                self.breaker_trips += 1
                reason = a.explanation.partition(": ")[2].partition(";")[0][:100]
                self.breaker_reasons[reason] = self.breaker_reasons.get(reason, 0) + 1
                t = a.ts
                self.world.at(t + self.world.human_delay("breaker", t), self._resume_breaker)
        out.audit.clear()
        out.findings.clear()
        out.incidents.clear()
        out.commands.clear()
        out.results.clear()

    def _resume_breaker(self, t: float) -> None:
        engine = self.engine_pipeline.engine
        if engine.breaker_open and not engine.breaker_calm(t):
            self.world.at(t + self.world.human_delay("breaker", t), self._resume_breaker)
            return
        d = engine.resume_breaker(actor="oncall", reason="looked at the trip (whatif)", now=t)
        self._execute(self.world, self.engine_pipeline._decisions(d), t)

    def _result(self, world: World, cmd: r.RemediationCommand, t: float, outcome: str, reason: str = "",
                details: dict[str, str] | None = None) -> None:
        res = r.RemediationResult(command_id=cmd.id, action=cmd.action, outcome=outcome, ts=round(t, 3),  # type: ignore[arg-type]
                                  reason=reason, node=cmd.node, job=cmd.job, executor="whatif", dry_run=cmd.dry_run,
                                  details=details or {})
        self._execute(world, self.engine_pipeline.result(res, t), t)

    def _observed(self, world: World, n: int, t: float) -> None:
        node = world.nodes[n]
        self._execute(world, self.engine_pipeline.node_observed(
            node.name, cordoned=bool(node.cordoned_by), cordoned_by_fleetmedic=node.cordoned_by == self.name, now=t), t)

    def _apply(self, world: World, cmd: r.RemediationCommand, t: float) -> None:
        if cmd.dry_run:
            self._result(world, cmd, t, "skipped", "dry run")
            return
        if cmd.expires_at < t:
            self._result(world, cmd, t, "skipped", "expired before it could be applied")
            return
        n = world.index.get(cmd.node, -1) if cmd.node else -1
        if cmd.node and n < 0:
            self._result(world, cmd, t, "failed", f"unknown node {cmd.node}")
            return
        a = cmd.action
        if a in ("cordon", "taint"):
            world.cordon(n, t, self.name)
            self._result(world, cmd, t, "applied")
            self._observed(world, n, t)
        elif a == "drain":
            world.cordon(n, t, self.name)
            self._observed(world, n, t)

            def evict(at: float) -> None:
                evicted = world.drain(n, at, "drained by fleetmedic")
                self._result(world, cmd, at, "applied", details={"evicted_jobs": ",".join(evicted)} if evicted else {})

            world.at(t + world.a.drain_grace_s, evict)
        elif a in RELEASING:
            if world.nodes[n].busy:
                self._result(world, cmd, t, "failed", f"node busy: {world.nodes[n].busy}")
                return
            world.uncordon(n, t)
            self._result(world, cmd, t, "applied")
            self._observed(world, n, t)
        elif a in JOB_ACTIONS:
            job = world.job_by_ref(cmd.job)
            if job is None:
                self._result(world, cmd, t, "failed", f"unknown job {cmd.job}")
                return
            exclude = self._excluded(world, cmd.exclude_nodes)
            if cmd.params.get("only_if_waiting") == "true":  # more exclusions for a waiting job only
                if job.state != "waiting_for_capacity":
                    self._result(world, cmd, t, "skipped", "the job is not waiting for capacity")
                    return
                world.add_exclusions(job, exclude)
                self._result(world, cmd, t, "applied")
                return
            if (job.state in ("running", "restart_overhead") and job.started_at >= cmd.issued_at
                    and exclude.isdisjoint(job.owned)):
                # the job's controller restarted it since, away from the nodes to exclude
                self._result(world, cmd, t, "skipped", "already restarted without the excluded nodes")
                return
            job.exclude = set()  # the command's list replaces the last one (the executor lifts the rest)
            ok = world.request_restart(job, exclude, t, self.name)
            self._result(world, cmd, t, "applied" if ok else "skipped")
        elif a in ("run_diagnostics", "reset_gpu", "reboot_node"):
            self._timed(world, cmd, n, t)
        elif a == "escalate":
            if n >= 0 and is_repair(cmd):
                world.cordon(n, t, self.name)
                world.send_to_repair(n, t, self.name, lambda at: self._result(
                    world, cmd, at, "applied", details={"repair": "completed"}))
            else:
                self._result(world, cmd, t, "applied", "escalated (ticket only)")
                if n >= 0:
                    world.at(t + world.human_delay("ticket", n, t), lambda at: self._ticket(world, n, at))
        else:
            self._result(world, cmd, t, "applied")

    def _excluded(self, world: World, names: list[str]) -> set[int]:
        """The nodes of a command's exclusions (a new set: the world keeps it); the same list as the
        last command's (the requeues of the jobs one placement preempted) is looked up once."""
        last = self._last_excluded
        if last is None or last[0] != names:
            last = self._last_excluded = (names, {world.index[x] for x in names if x in world.index})
        return set(last[1])

    def _timed(self, world: World, cmd: r.RemediationCommand, n: int, t: float) -> None:
        node = world.nodes[n]
        if node.busy:
            self._result(world, cmd, t, "failed", f"node busy: {node.busy}")
            return
        if cmd.action != "reboot_node" and node.job is not None:
            self._result(world, cmd, t, "failed", f"node has running ranks of {node.job.ref}; drain it first")
            return
        if cmd.action == "run_diagnostics":
            level = min(4, max(1, int(cmd.params.get("level", "3") or 3)))

            def done(at: float) -> None:
                fail = world.diagnose(n, level, cmd.id)
                details = {"diagnostics": "fail" if fail else "pass", "level": str(level)}
                if fail:
                    details["failed_tests"] = "memory"
                self._result(world, cmd, at, "applied", details=details)

            world.start_busy(n, "diagnostics", t + world.a.diagnostics_s[level - 1], t, done)
        elif cmd.action == "reset_gpu":
            world.start_busy(n, "reset_gpu", t + world.a.reset_gpu_s, t,
                             lambda at: self._result(world, cmd, at, "applied"))
        else:
            world.start_busy(n, "reboot", t + world.a.reboot_s, t, lambda at: self._result(world, cmd, at, "applied"))

    def _ticket(self, world: World, n: int, t: float) -> None:
        """The person on call reads a ticket: a node with a harmful fault goes to repair, and is
        reported repaired to the engine (which validates it before it returns)."""
        f = world.nodes[n].fault()
        if f is None or not f.harmful or world.nodes[n].busy == "repair":
            return
        world.cordon(n, t, self.name)
        world.send_to_repair(n, t, f"{self.name}-oncall", lambda at: self._operator_repaired(world, n, at))

    def _operator_repaired(self, world: World, n: int, t: float) -> None:
        engine = self.engine_pipeline.engine
        d = engine.node_repaired(world.nodes[n].name, actor="oncall", reason="repaired (whatif)", now=t)
        self._execute(world, self.engine_pipeline._decisions(d), t)
