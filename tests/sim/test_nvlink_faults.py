"""NVLink degradation through the whole pipeline: a slow rise and repeated bursts of
NVLink errors on one GPU, its siblings flat, are each found as a degradation of that GPU within a
reasonable delay, with no finding on its siblings."""

from __future__ import annotations

import functools

import msgspec

from fleetmedic.config import Settings
from fleetmedic.evaluation.scoring import ScoreReport, score
from fleetmedic.sim.embedded import SimulationRun, run_simulation
from fleetmedic.sim.engine import SimConfig, Simulator
from fleetmedic.sim.faults import KINDS
from fleetmedic.sim.fleet import FleetSpec
from fleetmedic.sim.workload import WorkloadSpec

SLOW, BURST = (3, 2), (5, 4)  # (node, GPU)
SPEC = f"nvlink_degrading_slow@20m+3h/{SLOW[0]}/{SLOW[1]},nvlink_burst@20m+3h/{BURST[0]}/{BURST[1]}"


@functools.cache
def _run() -> tuple[SimulationRun, ScoreReport, float]:
    sim = Simulator(SimConfig(fleet=FleetSpec(nodes=8, nodes_per_su=4, spines=2), duration_s=80 * 60.0, seed=11,
                              faults=SPEC, workload=WorkloadSpec(target_utilization=1.0, job_sizes=(4, 2),
                                                                 short_job_fraction=0.0)))
    run = run_simulation(sim, Settings())
    acc = msgspec.to_builtins(run.accounting)
    out = run.pipeline.out
    return run, score(run.truth, out.incidents, out.commands, None, acc if isinstance(acc, dict) else None), sim.start


def test_the_kinds_are_degradation_of_a_gpu_drawn_only_when_asked_for() -> None:
    for kind in ("nvlink_degrading_slow", "nvlink_burst"):
        info = KINDS[kind]
        assert (info.fault_class, info.component, info.expected, info.target) == (
            "degradation", "gpu", "isolate_node", "gpu")
        assert info.weight == 0  # `mix` draws what it drew before


def test_a_slow_nvlink_rise_is_found_within_half_an_hour() -> None:
    run, report, _ = _run()
    (t,) = [t for t in run.truth if t.kind == "nvlink_degrading_slow"]
    assert t.id in report.delays, "not detected"
    # the errors grow from none to 0.2/s over two hours: they pass a few a minute after ~15 min
    assert report.delays[t.id] <= 30 * 60


def test_nvlink_bursts_are_found_within_a_minute() -> None:
    run, report, _ = _run()
    (t,) = [t for t in run.truth if t.kind == "nvlink_burst"]
    assert t.id in report.delays, "not detected"
    assert report.delays[t.id] <= 60


def test_no_finding_on_the_siblings_and_no_false_incident() -> None:
    run, report, _ = _run()
    out = run.pipeline.out
    names = run.truth[0].node.rsplit("-", 1)[0]
    faulty = {f"{names}-{n:04d}": g for n, g in (SLOW, BURST)}
    on_gpus = [(f.node, f.gpu, f.detector) for f in out.findings if f.gpu is not None and f.kind != "telemetry"]
    assert on_gpus and all(node in faulty and gpu == faulty[node] for node, gpu, _ in on_gpus), on_gpus
    assert {d for *_, d in on_gpus} >= {"gpu_siblings"}
    assert report.false_incidents == 0
