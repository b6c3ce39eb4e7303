"""Missing data is not a fault, through the whole pipeline: partial scrapes (a round
without one GPU) and misaligned scrapes (one GPU's series stamped 1 ms apart, so a round arrives as
two records) are negative controls: no finding, no incident, no command, however often they recur."""

from __future__ import annotations

import functools

from fleetmedic.config import Settings
from fleetmedic.records import GpuTelemetry
from fleetmedic.sim.embedded import SimulationRun, run_simulation
from fleetmedic.sim.engine import SimConfig, Simulator
from fleetmedic.sim.faults import KINDS
from fleetmedic.sim.fleet import FleetSpec
from fleetmedic.sim.workload import WorkloadSpec

PARTIAL, SPLIT = (3, 2), (5, 4)  # (node, GPU)
SPEC = f"partial_scrape@10m+50m/{PARTIAL[0]}/{PARTIAL[1]},misaligned_scrape@10m+50m/{SPLIT[0]}/{SPLIT[1]}"


def _config(minutes: float = 60) -> SimConfig:
    return SimConfig(fleet=FleetSpec(nodes=8, nodes_per_su=4, spines=2), duration_s=minutes * 60.0, seed=11,
                     faults=SPEC, workload=WorkloadSpec(target_utilization=1.0, job_sizes=(4, 2),
                                                        short_job_fraction=0.0))


@functools.cache
def _run() -> SimulationRun:
    return run_simulation(Simulator(_config()), Settings())


def test_the_kinds_are_negative_controls_drawn_only_when_asked_for() -> None:
    for kind in ("partial_scrape", "misaligned_scrape"):
        info = KINDS[kind]
        assert (info.fault_class, info.expected, info.remedy, info.weight) == (
            "negative_control", "no_action", "none", 0)


def test_the_scrapes_reach_detection_as_records_without_the_gpu_and_split_in_two() -> None:
    sim = Simulator(_config(30))
    names = sim.fleet.node_names
    partial: list[GpuTelemetry] = []
    split: list[GpuTelemetry] = []
    for out in sim.run():
        if out.gpu is not None:
            for rec in out.gpu.to_records():
                if rec.node == names[PARTIAL[0]]:
                    partial.append(rec)
                elif rec.node == names[SPLIT[0]]:
                    split.append(rec)
    without = [r for r in partial if PARTIAL[1] not in r.gpus]
    assert without and all(len(r.gpus) == 7 for r in without)
    alone = [r for r in split if r.gpus == [SPLIT[1]]]
    assert alone
    for rec in alone:  # the rest of its round, 1 ms earlier
        (rest,) = [r for r in split if 0 < rec.ts - r.ts < 0.01]
        assert SPLIT[1] not in rest.gpus and len(rest.gpus) == 7
        assert abs(rec.ts - rest.ts - 0.001) < 1e-4


def test_partial_and_misaligned_scrapes_give_no_finding_no_incident_no_command() -> None:
    run = _run()
    out = run.pipeline.out
    start = min(t.onset for t in run.truth)
    nodes = {t.node for t in run.truth}
    assert len(nodes) == 2 and all(t.is_negative_control for t in run.truth)
    mine = [f for f in out.findings if f.node in nodes and f.ts >= start and f.kind != "telemetry"]
    assert mine == []
    assert not [i for i in out.incidents if any(s.name.startswith(tuple(nodes)) for s in i.suspects)]
    assert not [c for c in out.commands if c.node in nodes]
