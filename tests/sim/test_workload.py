"""Training jobs run in lock-step (the slowest rank sets the step time), checkpoint at their
interval (a job-wide pause every GPU of the job shows), report placement, start, per-step and
per-rank progress, complete and are replaced by new jobs, and the scheduler packs gangs onto free,
schedulable nodes."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from fleetmedic.sim.engine import SimConfig, Simulator
from fleetmedic.sim.fleet import FleetSpec, build_fleet
from fleetmedic.sim.telemetry import NoiseSpec
from fleetmedic.sim.workload import Workload, WorkloadSpec


def test_step_time_is_set_by_the_slowest_rank() -> None:
    fleet = build_fleet(FleetSpec(nodes=4), 1)
    wl = Workload(fleet, WorkloadSpec(job_sizes=(4,), target_utilization=1.0), np.random.default_rng(0), 0.0)
    job = wl.jobs[0]
    job.nodes = [0, 1, 2, 3]
    slow = np.ones((4, 8))
    net = np.ones(4)
    base, _ = wl._step_time(job, slow, net)
    slow[2, 5] = 1.2
    st, own = wl._step_time(job, slow, net)
    compute = job.step_s * (1 - job.comm_frac)
    assert st == pytest.approx(base + 0.2 * compute)
    assert own[2, 5] == pytest.approx(st) and own[0, 0] == pytest.approx(base)  # the others wait
    net[1] = 1.5
    st2, _ = wl._step_time(job, slow, net)
    assert st2 == pytest.approx(st + 0.5 * job.step_s * job.comm_frac)


def _run(minutes: float = 80, **spec: object) -> tuple[Simulator, list]:  # type: ignore[type-arg]
    sim = Simulator(SimConfig(fleet=FleetSpec(nodes=8, nodes_per_su=4, spines=2), duration_s=minutes * 60, seed=2,
                              faults="none", noise=NoiseSpec.named("none"),
                              workload=WorkloadSpec(job_sizes=(4, 2), **spec)))  # type: ignore[arg-type]
    outs = list(sim.run())
    return sim, outs


def test_job_events_tell_the_life_of_a_job() -> None:
    sim, outs = _run(minutes=20)
    events = [e for o in outs for e in o.job_events]
    job = sim.workload.jobs[0]
    mine = [e for e in events if e.job == job.ref]
    kinds = [e.event for e in mine]
    assert kinds[:2] == ["placement", "start"] and "progress" in kinds
    placement = mine[0].placement
    assert len(placement) == job.world_size == len(job.nodes) * 8
    assert all(p.node == sim.fleet.node_names[job.nodes[p.rank // 8]] and p.gpus == [p.rank % 8] for p in placement)
    per_rank = [e for e in mine if e.event == "progress" and e.rank is not None]
    assert {e.node for e in per_rank} == {sim.fleet.node_names[n] for n in job.nodes}
    steps = [e.step for e in mine if e.event == "progress" and e.rank is None]
    assert steps == sorted(steps) and steps[-1] > 0


def test_checkpoints_pause_every_gpu_of_the_job() -> None:
    sim, outs = _run(minutes=75, checkpoint_interval_s=1200.0, checkpoint_s=(60.0, 60.0))
    job = sim.workload.jobs[0]
    n = job.nodes[0]
    util = [(o.t, float(np.nanmax(o.gpu.column("gpu_util")[list(o.gpu.node).index(n)]))) for o in outs]
    low = np.array([u < 20 and t - sim.start > 400 for t, u in util])
    # stretches of >= 3 low rounds (a data stall is one sample; a checkpoint lasts a minute)
    starts = [util[i][0] for i in range(len(util) - 2)
              if low[i] and low[i + 1] and low[i + 2] and (i == 0 or not low[i - 1])]
    assert len(starts) >= 2, "no checkpoint pauses seen"
    assert all(1100 < b - a < 1500 for a, b in itertools.pairwise(starts))
    assert job.ckpt_step > 0


def test_completed_jobs_are_replaced_and_nodes_stay_busy() -> None:
    sim, outs = _run(minutes=120, short_job_fraction=1.0, short_run_s=(1200.0, 1800.0), target_utilization=0.75)
    events = [e for o in outs for e in o.job_events]
    assert sum(e.event == "completion" for e in events) >= 2
    assert len(sim.workload.jobs) > 3
    busy = np.mean([(o.gpu.column("gpu_util").max(axis=1) > 50).mean() for o in outs[60:]])
    assert busy > 0.4
