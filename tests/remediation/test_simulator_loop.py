"""Closed loop against the fleet simulator: its job controller,
executor and failure logs drive the engine, the engine's commands change the simulated fleet, and
the simulator's scorer checks the targets that do not depend on statistical detection — software
faults and job bugs isolate no node, and a GPU that fell off the bus (seen by the real XID detector)
is isolated while its job moves elsewhere, with no repeat failure."""

from __future__ import annotations

from typing import Any

import msgspec

from fleetmedic.config import Settings, parse_config
from fleetmedic.evaluation import scoring
from fleetmedic.models import stages
from fleetmedic.records import Incident, RemediationCommand
from fleetmedic.remediation.engine import DecisionEngine, Decisions
from fleetmedic.sim import engine as sim_engine
from fleetmedic.sim.embedded import fleet_topology


def closed_loop(faults: str, settings: Settings, hours: float = 2.0, hard_faults: bool = False,
                seed: int = 3) -> tuple[Any, DecisionEngine, list[Incident], list[RemediationCommand]]:
    sim = sim_engine.Simulator(sim_engine.SimConfig(nodes=32, duration_s=hours * 3600, seed=seed, faults=faults,
                                                    ports=False))
    engine = DecisionEngine(settings, fleet_topology(sim.fleet))
    detection = stages.NodeDetection(settings.detection) if hard_faults else None
    out = Decisions()
    for tick in sim.run():
        now = tick.t
        step = Decisions()
        for e in tick.job_events:
            step.extend(engine.on_job_event(e, now))
        if detection is not None and tick.gpu is not None:
            for f in detection.on_gpu(tick.gpu.to_records()):
                if f.kind == "hard_fault":  # the XID/hard-rule detectors, not the statistical ones
                    step.extend(engine.on_finding(f, now))
        for r in tick.results:
            step.extend(engine.on_result(r, now))
        step.extend(engine.tick(now))
        sim.submit_all(step.commands)
        out.extend(step)
    latest = list({i.id: i for i in out.incidents}.values())
    return sim, engine, latest, out.commands


def score(sim: Any, incidents: list[Incident], commands: list[RemediationCommand]) -> Any:
    return scoring.score(sim.truth(), incidents, commands, sim.meta(), msgspec.to_builtins(sim.accounting()))


def test_software_faults_and_job_bugs_isolate_no_node_in_the_closed_loop() -> None:
    sim, _, incidents, commands = closed_loop("job_bug@30m,worker_crash@45m,nccl_timeout@60m", Settings())
    report = score(sim, incidents, commands)
    assert report.isolation.software_faults_isolated == 0
    assert not [c for c in commands if c.action in ("cordon", "taint", "drain")]
    bugs = [i for i in incidents if i.incident_class == "job_bug"]
    assert bugs and all(i.suspects[0].kind == "job" for i in bugs)


def test_a_gpu_off_the_bus_is_isolated_and_its_job_moves_without_repeat_failures() -> None:
    sim, engine, incidents, commands = closed_loop("xid79@30m/3", parse_config(""), hard_faults=True)
    node = sim.truth()[0].nodes[0]
    hardware = [i for i in incidents if i.incident_class == "hardware"]
    assert hardware and hardware[0].suspects[0].name == node
    assert {c.node for c in commands if c.action == "cordon"} == {node}
    restarts = [c for c in commands if c.action == "restart_job"]
    assert restarts and all(node in c.exclude_nodes for c in restarts)
    report = score(sim, incidents, commands)
    assert report.isolation.healthy_isolated == 0
    assert engine.report(sim.config.start + 2 * 3600)["repeats"]["placements_on_isolated_nodes"] == 0
