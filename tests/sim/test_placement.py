"""Re-placement in the simulator: a job that fleetmedic restarts comes back next to its surviving
ranks (same SU = same leaf, same rack first) when that leaf has room, elsewhere when it has none,
never on an excluded node; the job controller's own restarts (plain Kubernetes) get no such
preference; and the closed loop's accounting of re-placements (leaf locality where the leaf had
room, placements on suspect nodes) is computed from what happened in the run."""

from __future__ import annotations

import numpy as np
import pytest

from fleetmedic.cli.demo import placement_rows
from fleetmedic.records import JobEvent, RemediationCommand
from fleetmedic.sim.engine import SimConfig, Simulator
from fleetmedic.sim.fleet import FleetSpec, build_fleet
from fleetmedic.sim.placement import choose_nodes, job_domain, topology_aware
from fleetmedic.sim.telemetry import NoiseSpec
from fleetmedic.sim.workload import FAILED, Job, Workload, WorkloadSpec

# 24 nodes: SU 0 = nodes 0-7, SU 1 = 8-15, SU 2 = 16-23; racks of 4 (rack 2 = 8-11, rack 3 = 12-15)
SPEC = FleetSpec(nodes=24, nodes_per_su=8, nodes_per_rack=4, spines=2)
ALL = set(range(24))


def _workload(preference: str = "fleetmedic") -> Workload:
    fleet = build_fleet(SPEC, 1)
    assert list(fleet.node_su[[0, 8, 16]]) == [0, 1, 2] and fleet.node_rack[12] == 3
    return Workload(fleet, WorkloadSpec(job_sizes=(4,), target_utilization=0.0, topology_preference=preference),
                    np.random.default_rng(0), 0.0)


def _replace(wl: Workload, before: list[int], busy: set[int], by: str, exclude: set[int]) -> Job:
    """A job that ran on ``before`` failed; it is restarted ``by`` someone, excluding ``exclude``,
    while ``busy`` nodes run other jobs; the scheduler places it."""
    job = wl._new_job(0.0, 4)
    job.nodes, job.n_nodes, job.state = list(before), len(before), FAILED
    wl.node_job[:] = -1
    wl.node_job[sorted(busy)] = 99  # another job's ranks
    wl.restart(job, 10.0, by, "test", exclude)
    wl.schedule(10.0, np.ones(24, dtype=bool), np.ones(24, dtype=bool))
    return job


# (case, job's old nodes, nodes busy with other jobs, excluded, fleetmedic's choice, the controller's choice)
CASES = [
    ("room in the survivors' leaf: fleetmedic stays there, the controller packs into the emptiest SU",
     [8, 9, 10, 11], set(range(13, 16)) | set(range(16, 24)), {9},
     [8, 10, 11, 12], [0, 8, 10, 11]),
    ("same rack before the rest of the leaf",
     [8, 9, 12, 13], {11, 15} | set(range(16, 24)), {9},
     [8, 12, 13, 14], [0, 8, 12, 13]),
    ("no room in the survivors' leaf: elsewhere, as plain Kubernetes would",
     [8, 9, 10, 11], set(range(12, 16)) | set(range(20, 24)), {9},
     [0, 8, 10, 11], [0, 8, 10, 11]),
    ("no rank survives: the excluded node's own leaf and rack, never the node itself",
     [9], {11} | set(range(12, 16)) | set(range(16, 24)), {9},
     [8], [0]),
]


@pytest.mark.parametrize(("case", "before", "busy", "exclude", "fleetmedic", "controller"), CASES,
                         ids=[c[0] for c in CASES])
def test_fleetmedic_restarts_replace_toward_the_surviving_ranks_and_never_onto_an_excluded_node(
        case: str, before: list[int], busy: set[int], exclude: set[int], fleetmedic: list[int],
        controller: list[int]) -> None:
    wl = _workload()
    job = _replace(wl, before, busy, "cmd-1", exclude)
    assert job.nodes == fleetmedic, case
    assert not set(job.nodes) & exclude and not set(job.nodes) & busy
    wl2 = _workload()
    job2 = _replace(wl2, before, busy, "controller", exclude)
    assert job2.nodes == controller, case
    assert not set(job2.nodes) & exclude


def test_the_controller_keeps_todays_packing_and_the_preference_is_a_spec_option() -> None:
    before, busy, exclude = [8, 9, 10, 11], set(range(13, 24)), {9}
    fleet = _workload().fleet
    ok = np.array([i not in busy | exclude for i in range(24)])
    plain = choose_nodes(4, ok, before, fleet.node_su, fleet.node_rack, None)
    assert plain == [0, 8, 10, 11]  # the SU with the most free nodes: no preference applies
    assert _replace(_workload(), before, busy, "controller", exclude).nodes == plain
    assert _replace(_workload(), before, busy, "user", exclude).nodes == plain
    assert _replace(_workload("none"), before, busy, "cmd-1", exclude).nodes == plain
    assert _replace(_workload("all"), before, busy, "controller", exclude).nodes == [8, 10, 11, 12]
    assert topology_aware("fleetmedic", "cmd-7") and not topology_aware("fleetmedic", "controller")
    with pytest.raises(ValueError, match="topology_preference"):
        WorkloadSpec(topology_preference="sometimes")


def test_domain_is_the_majority_of_the_surviving_ranks() -> None:
    fleet = _workload().fleet
    d = job_domain([0, 9, 10, 13], {0}, fleet.node_su, fleet.node_rack)
    assert (d.su, d.rack) == (1, 2)  # 9, 10 in rack 2, 13 in rack 3: all in SU 1
    d = job_domain([5], {5}, fleet.node_su, fleet.node_rack)
    assert (d.su, d.rack) == (0, 1)


def test_a_too_small_fleet_leaves_the_job_pending() -> None:
    wl = _workload()
    job = _replace(wl, [8, 9, 10, 11], ALL - {0, 1, 9}, "cmd-1", {9})
    assert job.state == "pending" and job.nodes == [8, 9, 10, 11]  # waits for capacity


# --- the closed loop's accounting --------------------------------------------------------------------

BAD = "gpu-node-0001"  # runs a rank of a 2-node job in this seed (see test_closed_loop)
_n = 0


def _cmd(action: str, t: float, **kw: object) -> RemediationCommand:
    global _n
    _n += 1
    return RemediationCommand(id=f"pl-{_n}", action=action, incident_id="inc", reason="test", issued_at=t,  # type: ignore[arg-type]
                              expires_at=t + 600, **kw)  # type: ignore[arg-type]


def _run(faults: str, operator: bool) -> tuple[Simulator, list[JobEvent]]:
    sim = Simulator(SimConfig(fleet=FleetSpec(nodes=8, nodes_per_su=4, spines=2), duration_s=90 * 60, seed=4,
                              faults=faults, noise=NoiseSpec.named("none"),
                              workload=WorkloadSpec(target_utilization=0.75, job_sizes=(4, 2), short_job_fraction=0.0)))
    events: list[JobEvent] = []
    done = False
    for out in sim.run():
        events += out.job_events
        for e in out.job_events:
            j = sim.workload.by_ref(e.job)
            if operator and e.event == "failure" and j is not None and 1 in j.nodes:
                if not done:
                    sim.submit(_cmd("cordon", e.ts + 3, node=BAD))
                    done = True
                sim.submit(_cmd("restart_job", e.ts + 3, job=e.job, exclude_nodes=[BAD]))
    return sim, events


def _replacements_from_events(sim: Simulator, events: list[JobEvent]) -> tuple[int, int, int]:
    """(re-placements, replacement nodes, of which in the old nodes' majority SU) read from the
    job events alone: a placement after a failure that took a node the job had not run on."""
    last: dict[str, list[int]] = {}
    failed: set[str] = set()
    re_placed = replacements = in_leaf = 0
    idx = sim.fleet.node_index
    for e in events:
        if e.event == "failure":
            failed.add(e.job)
        elif e.event == "placement" and e.placement:
            nodes = sorted({idx[p.node] for p in e.placement})
            old = last.get(e.job, [])
            new = [n for n in nodes if n not in old]
            if e.job in failed and old and new:
                su = [int(sim.fleet.node_su[n]) for n in old]
                home = max(set(su), key=lambda s: (su.count(s), -s))
                re_placed += 1
                replacements += len(new)
                in_leaf += sum(1 for n in new if int(sim.fleet.node_su[n]) == home)
            last[e.job] = nodes
            failed.discard(e.job)
    return re_placed, replacements, in_leaf


def test_accounting_counts_leaf_locality_and_placements_on_suspects_from_the_run() -> None:
    # no isolation: the controller puts the job back on the node with the bad NIC (plain Kubernetes)
    plain, _ = _run("nic_down@20m/1/1", operator=False)
    acc = plain.accounting()
    ctl = acc.placement["job_controller"]
    assert ctl.placements >= 1 and ctl.on_suspect >= 1 and "fleetmedic" not in acc.placement
    assert acc.placement["all"].on_suspect == ctl.on_suspect
    # fleetmedic cordons and restarts excluding the node: replacements stay in the leaf, none on the suspect
    sim, events = _run("nic_down@20m/1/1", operator=True)
    acc = sim.accounting()
    fm = acc.placement["fleetmedic"]
    assert fm.re_placements >= 1 and fm.on_suspect == 0 and fm.on_excluded == 0
    assert acc.placement["all"].on_suspect == 0
    everyone = acc.placement["all"]
    re_placed, replacements, in_leaf = _replacements_from_events(sim, events)
    assert everyone.re_placements == re_placed
    assert everyone.with_room == everyone.re_placements  # spare nodes in the job's SU in this seed
    assert (everyone.replacements, everyone.in_leaf) == (replacements, in_leaf)
    assert fm.in_leaf == fm.replacements and fm.leaf_fraction == 1.0
    wait = acc.phases["wait_capacity"]
    assert wait.max_s is not None and wait.p50_s is not None and wait.max_s >= wait.p50_s >= 0
    # the demo's summary lines show these figures
    import msgspec

    b = msgspec.to_builtins(acc)
    rows = dict(placement_rows({"re_placements": b["placement"],
                                "capacity_wait_s": {"n": wait.n, "p50_s": wait.p50_s, "max_s": wait.max_s}}))
    assert rows["re-placements in the original leaf"].startswith(
        f"fleetmedic {fm.in_leaf}/{fm.replacements} nodes (1.000; leaf had room in {fm.with_room} of "
        f"{fm.re_placements})")
    assert rows["placements on suspect nodes"].startswith("0 (")
    assert rows["wait for capacity p50 / max"].endswith(f"(n={wait.n})")


def _oracle_run(preference: str) -> Simulator:
    """32 nodes in 4 leaves of 8, jobs of 2 and 4 nodes asking for 60 % of them, 8 GPU faults; a
    perfect fleetmedic cordons the faulty node of a failed job and restarts the job excluding it."""
    sim = Simulator(SimConfig(fleet=FleetSpec(nodes=32, nodes_per_su=8, nodes_per_rack=4, spines=2),
                              duration_s=6 * 3600, seed=2, faults="xid79:8", noise=NoiseSpec.named("none"),
                              ports=False, workload=WorkloadSpec(target_utilization=0.6, job_sizes=(4, 2),
                                                                 topology_preference=preference)))
    for out in sim.run():
        for e in out.job_events:
            job = sim.workload.by_ref(e.job) if e.event == "failure" else None
            bad = [sim.fleet.node_names[i] for i in (job.nodes if job else []) if sim.faults_on(i, e.ts)]
            if bad:
                sim.submit(_cmd("cordon", e.ts + 3, node=bad[0]))
                sim.submit(_cmd("restart_job", e.ts + 3, job=e.job, exclude_nodes=bad))
    return sim


def test_in_the_closed_loop_fleetmedic_restarts_stay_in_the_leaf_and_without_the_preference_they_do_not() -> None:
    aware = _oracle_run("fleetmedic").accounting().placement["fleetmedic"]
    plain = _oracle_run("none").accounting().placement["fleetmedic"]
    assert aware.with_room >= 2 and aware.in_leaf == aware.replacements and aware.leaf_fraction == 1.0
    assert plain.with_room >= 2 and plain.in_leaf < plain.replacements
    assert aware.on_suspect == plain.on_suspect == 0 and aware.on_excluded == plain.on_excluded == 0


def test_placements_on_suspects_split_into_those_fleetmedic_suspected_and_those_not_yet_detected() -> None:
    from fleetmedic.sim.placement import Domain, Replacement, count_replacements

    su = np.zeros(24, dtype=np.int64)

    def rec(nodes: tuple[int, ...], suspected: tuple[int, ...]) -> Replacement:
        return Replacement(t=0.0, by="c1", topology_aware=True, before=(0, 1), nodes=nodes, excluded=(),
                           domain=Domain(su=0, rack=0), room=True, suspected=suspected)

    counts = count_replacements([(rec((0, 2, 3), (2,)), {2: "xid79", 3: "nic_down"}),
                                 (rec((4, 5), (5,)), {4: "nic_down"})], su)
    assert (counts.on_suspect, counts.on_suspect_known, counts.on_suspect_undetected) == (3, 1, 2)
    assert counts.on_flagged == 2 and counts.undetected_by_kind == {"nic_down": 2}


def test_the_workload_records_which_placed_nodes_fleetmedic_suspected() -> None:
    wl = _workload()
    wl.suspected_by = lambda: {9, 10}
    job = wl._new_job(0.0, 4)
    job.n_nodes, job.prefer, job.exclude, job.restart_by = 4, [8, 9, 10, 11], {9}, "c1"
    ok = np.ones(24, dtype=bool)
    ok[9] = False
    chosen, record = wl._choose(job, ok, 10.0)
    assert chosen is not None and record is not None and 10 in chosen and 9 not in chosen
    assert record.suspected == (10,)
