"""The embedded engine: the pipeline's stages in one process, without Kafka.

:class:`EmbeddedPipeline` wires the same stage objects the Kafka workers run (stage 1 in a plain
aiokafka loop, :mod:`fleetmedic.streams.detect`; the decision stage as a Faust agent,
:mod:`fleetmedic.streams.decide`), detection per node
(:class:`~fleetmedic.models.stages.NodeDetection`), detection across nodes
(:class:`~fleetmedic.models.stages.FleetDetection`) and the decision engine
(:class:`~fleetmedic.remediation.engine.DecisionEngine`), with an in-memory bus: what a stage
emits goes straight to the next one, in order. Commands are signed when a key is given.

:func:`run_simulation` closes the loop with the fleet simulator as the cluster: its telemetry goes
in, the commands go back to it, and its executor results come back to the engine. ``backtest``,
the demo, the quality benchmark and tests use it.

Event time has the Kafka stages' bound (:mod:`fleetmedic.models.event_time`): a record stamped
more than ``streams.max_future_skew_s`` ahead of the clock is dead-lettered (``out.dead_letters``,
topic ``deadletter``) and changes nothing. The clock here is the simulation's: the ``now`` each
input comes with.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from fleetmedic import records as r
from fleetmedic.config import Settings
from fleetmedic.evaluation.truth import TruthRecord
from fleetmedic.models.event_time import refuse_future
from fleetmedic.models.stages import FleetDetection, NodeDetection, stage1_batch, summarise_batch
from fleetmedic.remediation.engine import DecisionEngine, Decisions
from fleetmedic.remediation.operator import apply_operator_command
from fleetmedic.remediation.topology import Placement, Topology
from fleetmedic.signing import CommandExpired, KeySet, SignatureError, sign
from fleetmedic.sim.closed_loop import Accounting
from fleetmedic.sim.engine import Simulator
from fleetmedic.sim.fleet import Fleet


@dataclass
class Collected:
    """Everything the pipeline emitted, in order."""

    findings: list[r.Finding] = field(default_factory=list)
    incidents: list[r.Incident] = field(default_factory=list)
    commands: list[r.RemediationCommand] = field(default_factory=list)
    audit: list[r.AuditRecord] = field(default_factory=list)
    results: list[r.RemediationResult] = field(default_factory=list)
    dead_letters: list[r.DeadLetter] = field(default_factory=list)


class EmbeddedPipeline:
    def __init__(self, settings: Settings, topology: Topology | None = None, key: bytes | None = None) -> None:
        self.settings = settings
        self.node_stage = NodeDetection(settings.detection)
        self.fleet_stage = FleetDetection(settings.detection)
        self.engine = DecisionEngine(settings, topology)
        self.key = key
        self.out = Collected()
        self._listeners: list[Callable[[str, r.Record], None]] = []

    def subscribe(self, listener: Callable[[str, r.Record], None]) -> None:
        """Call ``listener(topic, record)`` for everything emitted (topics as in :mod:`fleetmedic.bus`)."""
        self._listeners.append(listener)

    # --- inputs ---------------------------------------------------------------------------------

    def gpu(self, msgs: list[r.GpuTelemetry], now: float) -> list[r.RemediationCommand]:
        msgs = [m for m in msgs if not self._ahead("telemetry.gpu", m, now)]
        if not msgs:
            return []
        self.engine.nodes_seen((m.node for m in msgs), now)  # the fleet, when no node list or topology names it
        batch = stage1_batch(msgs)  # the columns converted once for both
        for summary in summarise_batch(msgs, batch, self.settings.detection.peers):
            self.fleet_stage.on_summary(summary)
        return self._findings(self.node_stage.on_gpu(msgs, batch), now)

    def port(self, msg: r.PortTelemetry, now: float) -> list[r.RemediationCommand]:
        if self._ahead("telemetry.port", msg, now):
            return []
        stage = self.node_stage.on_port if msg.device_kind == "host" else self.fleet_stage.on_port
        return self._findings(stage(msg), now)

    def kernel(self, ev: r.KernelEvent, now: float) -> list[r.RemediationCommand]:
        """A classified kernel-log line (``kernel.events``), as stage 1 reads it: an XID joins the
        node's telemetry's as one event, an SXid, AER error or machine check is a finding."""
        if self._ahead("kernel.events", ev, now):
            return []
        self.engine.nodes_seen((ev.node,), now)
        return self._findings(self.node_stage.on_kernel(ev), now)

    def job(self, event: r.JobEvent, now: float) -> list[r.RemediationCommand]:
        if self._ahead("jobs.events", event, now):
            return []
        commands = self._findings(self.fleet_stage.on_job(event), now)
        return commands + self._decisions(self.engine.on_job_event(event, now))

    def result(self, result: r.RemediationResult, now: float) -> list[r.RemediationCommand]:
        if self._ahead("remediation.results", result, now):
            return []
        self.out.results.append(result)
        self._emit("remediation.results", result)
        return self._decisions(self.engine.on_result(result, now))

    def finding(self, finding: r.Finding, now: float) -> list[r.RemediationCommand]:
        """A finding from outside the pipeline's detectors (another producer on ``findings``)."""
        if self._ahead("findings", finding, now):
            return []
        return self._decisions(self.engine.on_finding(finding, now))

    def observation(self, obs: r.NodeObservation, now: float) -> list[r.RemediationCommand]:
        """A node as the cluster's Node watch reports it (``cluster.nodes``), as the decision stage takes it."""
        if self._ahead("cluster.nodes", obs, now):
            return []
        if obs.deleted:
            return self._decisions(self.engine.node_removed(obs.node, now))
        return self._decisions(self.engine.node_observed(obs.node, cordoned=obs.cordoned,
                                                         cordoned_by_fleetmedic=obs.cordoned_by_fleetmedic,
                                                         labels=obs.labels, now=now))

    def operator(self, cmd: r.OperatorCommand, keys: KeySet, now: float) -> list[r.RemediationCommand]:
        """An operator command (``remediation.operator``): verified against ``keys`` and applied, or
        dead-lettered with the reason, as the decision stage does."""
        if self._ahead("remediation.operator", cmd, now):
            return []
        try:
            decisions = apply_operator_command(self.engine, cmd, keys, now)
        except (SignatureError, CommandExpired) as exc:
            self._dead_letter("remediation.operator", cmd, f"operator command {cmd.id} rejected: {exc}", now)
            return []
        return self._decisions(decisions)

    def resume_breaker(self, actor: str, reason: str, now: float) -> list[r.RemediationCommand]:
        """A person closes the open breaker (``fleetmedic ctl resume-breaker``)."""
        return self._decisions(self.engine.resume_breaker(actor=actor, reason=reason, now=now))

    def node_observed(self, node: str, *, cordoned: bool, cordoned_by_fleetmedic: bool,
                      now: float) -> list[r.RemediationCommand]:
        """A node's cordon as the executor sees it (who made it decides whether it is ours); not the
        cluster's node list, so it leaves the fleet size as it was."""
        return self._decisions(self.engine.node_observed(node, cordoned=cordoned,
                                                         cordoned_by_fleetmedic=cordoned_by_fleetmedic, now=now,
                                                         listed=False))

    def tick(self, now: float) -> list[r.RemediationCommand]:
        commands = self._findings(self.fleet_stage.tick(now), now)
        return commands + self._decisions(self.engine.tick(now))

    # --- plumbing -------------------------------------------------------------------------------

    def _findings(self, findings: Iterable[r.Finding], now: float) -> list[r.RemediationCommand]:
        commands: list[r.RemediationCommand] = []
        for f in findings:
            self.out.findings.append(f)
            self._emit("findings", f)
            commands += self._decisions(self.engine.on_finding(f, now))
        return commands

    def _decisions(self, d: Decisions) -> list[r.RemediationCommand]:
        for inc in d.incidents:
            self.out.incidents.append(inc)
            self._emit("incidents", inc)
        commands = [sign(c, self.key) for c in d.commands] if self.key else list(d.commands)
        for cmd in commands:
            self.out.commands.append(cmd)
            self._emit("remediation.commands", cmd)
        for a in d.audit:
            self.out.audit.append(a)
            self._emit("remediation.audit", a)
        return commands

    def _ahead(self, topic: str, record: r.Record, now: float) -> bool:
        """Whether ``record`` is stamped too far ahead of the simulation's ``now`` (then dead-lettered)."""
        why = refuse_future(record, now, self.settings.streams.max_future_skew_s)
        if why is None:
            return False
        self._dead_letter(topic, record, why, now)
        return True

    def _dead_letter(self, topic: str, record: r.Record, error: str, now: float) -> None:
        dl = r.DeadLetter(ts=max(0.0, now), topic=topic, stage="embedded", error=error, original=r.encode(record))
        self.out.dead_letters.append(dl)
        self._emit("deadletter", dl)

    def _emit(self, topic: str, record: r.Record) -> None:
        for listener in self._listeners:
            listener(topic, record)


def fleet_topology(fleet: Fleet) -> Topology:
    """Topology of a simulated fleet (racks, rail leaves per NIC, SKU as pool)."""
    nodes: dict[str, Placement] = {}
    nics = fleet.spec.nics_per_node
    for n, name in enumerate(fleet.node_names):
        rails = {f"mlx5_{k}": fleet.leaf_names[int(fleet.ports.leaf_of[n, k])] for k in range(nics)}
        nodes[name] = Placement(rack=fleet.rack_names[int(fleet.node_rack[n])], leaf=rails.get("mlx5_0", ""),
                                pool=fleet.sku_of(n).key, rails=rails)
    return Topology(nodes)


@dataclass
class SimulationRun:
    pipeline: EmbeddedPipeline
    truth: list[TruthRecord]
    accounting: Accounting
    ticks: int


@dataclass(frozen=True)
class OnCall:
    """The person a breaker trip pages (its ``escalate``, the FleetmedicBreakerOpen alert). They look
    ``delay_s`` after the page and resume the breaker once the storm is over (every count below its
    level, what ``resume: auto`` waits for); while it is not, they look again every ``delay_s``."""

    delay_s: float = 1800.0

    def paged(self, commands: Iterable[r.RemediationCommand]) -> bool:
        return any(c.action == "escalate" and c.params.get("reason") == "breaker_open" for c in commands)


def run_simulation(sim: Simulator, settings: Settings, key: bytes | None = None,
                   on_tick: Callable[[float, EmbeddedPipeline], None] | None = None,
                   topology: bool = True, oncall: OnCall | None = None) -> SimulationRun:
    """Drive the simulator through the pipeline with the closed loop: commands go back to it.
    ``topology=False``: the engine is given no topology (racks, leaves) and sizes the fleet from
    the telemetry it sees, as a deployment without a node watch does. ``oncall``: a person resumes
    a tripped breaker (:class:`OnCall`); without one, a breaker with ``resume: command`` stays open."""
    pipeline = EmbeddedPipeline(settings, fleet_topology(sim.fleet) if topology else None, key)
    index = sim.fleet.node_index
    # for the accounting: which nodes of each re-placement fleetmedic suspected at that moment
    sim.workload.suspected_by = lambda: {index[n] for n in pipeline.engine.suspected_nodes() if n in index}
    ticks = 0
    look_at: float | None = None  # when the person on call looks at the open breaker next
    for out in sim.run():
        now = float(out.t)
        commands: list[r.RemediationCommand] = []
        for res in out.results:
            commands += pipeline.result(res, now)
        for obs in out.nodes:  # cordons made by people (planned maintenance)
            commands += pipeline.node_observed(obs.node, cordoned=obs.cordoned,
                                               cordoned_by_fleetmedic=obs.cordoned_by_fleetmedic, now=now)
        for event in out.job_events:
            commands += pipeline.job(event, now)
        if out.gpu is not None:
            commands += pipeline.gpu(out.gpu.to_records(), now)
        if out.ports is not None:
            for msg in out.ports.to_records():
                commands += pipeline.port(msg, now)
        commands += pipeline.tick(now)
        if oncall is not None:
            if look_at is not None and now >= look_at:
                look_at = None
                if pipeline.engine.breaker_open and not pipeline.engine.breaker_calm(now):
                    look_at = now + oncall.delay_s
                elif pipeline.engine.breaker_open:
                    commands += pipeline.resume_breaker("oncall", "the storm is over (simulated on-call)", now)
            if look_at is None and oncall.paged(commands):
                look_at = now + oncall.delay_s
        for cmd in commands:
            sim.submit(cmd)
        ticks += 1
        if on_tick is not None:
            on_tick(now, pipeline)
    return SimulationRun(pipeline, list(sim.truth()), sim.accounting(), ticks)
