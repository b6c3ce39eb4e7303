"""Closed loop against the fleet simulator: its job controller, executor and failure logs drive the engine,
the engine's commands change the simulated fleet, and the simulator's scorer checks the targets that do
not depend on statistical detection — software faults and job bugs isolate no node, and a GPU that fell
off the bus (seen by the real XID detector) is isolated while its job moves elsewhere, with no repeat
failure. With the shipped defaults: several distinct hard faults at once on 16 and 32 nodes are all
isolated within one decision interval, with or without a topology; one signature on 40 % of the fleet
trips the breaker and isolates nothing preventive."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from fleetmedic.config import Settings, parse_config
from fleetmedic.evaluation import scoring
from fleetmedic.models import stages
from fleetmedic.records import Incident, RemediationCommand
from fleetmedic.remediation.engine import DecisionEngine, Decisions
from fleetmedic.sim import engine as sim_engine
from fleetmedic.sim.embedded import fleet_topology


def closed_loop(faults: str, settings: Settings, hours: float = 2.0, hard_faults: bool = False,
                seed: int = 3, nodes: int = 32, topology: bool = True, device_plugin: bool = True,
                ) -> tuple[Any, DecisionEngine, list[Incident], list[RemediationCommand]]:
    sim = sim_engine.Simulator(sim_engine.SimConfig(nodes=nodes, duration_s=hours * 3600, seed=seed, faults=faults,
                                                    ports=False, device_plugin_health=device_plugin))
    engine = DecisionEngine(settings, fleet_topology(sim.fleet) if topology else None)
    detection = stages.NodeDetection(settings.detection) if hard_faults else None
    out = Decisions()
    for tick in sim.run():
        now = tick.t
        step = Decisions()
        for e in tick.job_events:
            step.extend(engine.on_job_event(e, now))
        if detection is not None and tick.gpu is not None:
            records = tick.gpu.to_records()
            engine.nodes_seen((m.node for m in records), now)
            for f in detection.on_gpu(records):
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


# --- dead nodes are isolated whatever the budget; a storm trips the breaker -----------------

THREE = "xid79@30m/1/2,xid48@30m/6/5,xid64@30m/11/0"  # GPU off the bus, DBE, row-remap failure
FIVE = THREE + ",xid95@30m/14/3,xid74@30m/9/7"


@pytest.mark.parametrize(("nodes", "faults", "topology"), [(16, FIVE, True), (32, THREE, True), (32, FIVE, False)],
                         ids=["16-nodes-5-faults", "32-nodes-3-faults", "32-nodes-5-faults-no-topology"])
def test_distinct_hard_faults_at_once_are_all_isolated_within_one_decision_interval(
        nodes: int, faults: str, topology: bool) -> None:
    sim, engine, _, commands = closed_loop(faults, Settings(), hours=1.0, hard_faults=True, nodes=nodes,
                                           topology=topology, device_plugin=False)
    dead = [t for t in sim.truth() if t.fault_class == "hardware"]
    assert len(dead) == faults.count("@")
    for t in dead:
        node = t.nodes[0]
        assert {"cordon", "taint", "drain"} <= {c.action for c in commands if c.node == node}, t.kind
    late = {k: v for k, v in sim.accounting().dangerous_by_fault.items() if v > 60.0}
    assert not late, late  # no dead node schedulable past one decision interval
    assert engine.fleet_size == nodes  # a topology, or the telemetry seen
    assert engine.gate.breaker.state.trips == 0


def test_one_signature_on_40_percent_of_the_fleet_trips_the_breaker_and_nothing_preventive_happens() -> None:
    storm = [0, 3, 5, 8, 10, 13, 15, 18, 20, 23, 25, 28, 30]  # 13 of 32 nodes, at most 2 per rack
    faults = ",".join(f"psu_failure@30m+2h/{n}" for n in storm)  # power brake: preventive evidence
    sim, engine, _, commands = closed_loop(faults, Settings(), hours=1.0, hard_faults=True)
    assert engine.breaker_open and engine.gate.breaker.state.trips == 1
    assert "same evidence (power_brake:clocks_event_reasons)" in engine.gate.breaker.state.opened_reason
    assert not [c for c in commands if c.action in ("cordon", "taint", "drain")]
    waiting = engine.nodes_in("suspect")
    assert len(waiting) >= engine.gate.breaker.signature_level(32)
    assert all(engine.state.nodes[n].blocked_reason == "breaker_open" for n in waiting)
    report = engine.report(sim.now)
    assert report["refused_now"]["preventive"] == len(waiting) and report["node_time"]["refused_preventive_s"] > 0
