"""The closed loop: remediation commands change the simulated fleet as an executor would (cordoned
nodes get no new ranks, drained ranks stop, restarted jobs resume from their checkpoint after the
restore delay, diagnostics take time and pass or fail by the truth, remedies clear the faults they
fix, repaired nodes come back cordoned), commands apply once, and the accounting measures MTTR
phases that add up, repeat failures and node-hours."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from fleetmedic.evaluation.scoring import score
from fleetmedic.records import JobEvent, RemediationCommand, RemediationResult
from fleetmedic.sim.closed_loop import Accounting, LoopSpec
from fleetmedic.sim.engine import SimConfig, Simulator, TickOutput
from fleetmedic.sim.fleet import FleetSpec
from fleetmedic.sim.telemetry import NoiseSpec
from fleetmedic.sim.workload import WorkloadSpec

START = SimConfig().start
Operator = Callable[[Simulator, TickOutput], list[RemediationCommand]]


def _config(faults: str, minutes: float = 90, **loop: object) -> SimConfig:
    return SimConfig(
        fleet=FleetSpec(nodes=8, nodes_per_su=4, spines=2),
        duration_s=minutes * 60,
        seed=4,
        faults=faults,
        noise=NoiseSpec.named("none"),
        workload=WorkloadSpec(target_utilization=0.75, job_sizes=(4, 2), short_job_fraction=0.0),
        loop=LoopSpec(**loop),  # type: ignore[arg-type]
    )


class Recorder:
    def __init__(self, config: SimConfig, operator: Operator | None = None) -> None:
        self.sim = Simulator(config)
        self.events: list[JobEvent] = []
        self.results: list[RemediationResult] = []
        for out in self.sim.run():
            self.events += out.job_events
            self.results += out.results
            if operator is not None:
                for c in operator(self.sim, out):
                    self.sim.submit(c)
        self.acc: Accounting = self.sim.accounting()

    def failures(self, job: str | None = None) -> list[JobEvent]:
        return [e for e in self.events if e.event == "failure" and (job is None or e.job == job)]

    def placements(self, job: str) -> list[JobEvent]:
        return [e for e in self.events if e.event == "placement" and e.job == job]


_n = 0


def cmd(action: str, t: float, node: str = "", job: str = "", **kw: object) -> RemediationCommand:
    global _n
    _n += 1
    return RemediationCommand(id=f"cmd-{_n}", action=action, incident_id="inc", reason="test", issued_at=t,  # type: ignore[arg-type]
                              expires_at=t + 600, node=node, job=job, **kw)  # type: ignore[arg-type]


BAD = "gpu-node-0001"  # runs a rank of a 2-node job in this seed; nodes 2 and 3 are spare


def isolate_on_failure(sim: Simulator, out: TickOutput) -> list[RemediationCommand]:
    """A perfect fleetmedic: on the first failure on the bad node's job, cordon it and re-place the job."""
    out_cmds = []
    for e in out.job_events:
        if e.event == "failure" and BAD in [p.node for p in _placement(sim, e.job)]:
            if not getattr(sim, "_cordoned", False):
                sim._cordoned = True  # type: ignore[attr-defined]
                out_cmds.append(cmd("cordon", e.ts + 3, node=BAD))
            out_cmds.append(cmd("restart_job", e.ts + 3, job=e.job, exclude_nodes=[BAD]))
    return out_cmds


def _placement(sim: Simulator, job: str) -> list:  # type: ignore[type-arg]
    j = sim.workload.by_ref(job)
    assert j is not None
    return [type("P", (), {"node": sim.fleet.node_names[n]}) for n in j.nodes]


def test_without_a_cordon_the_controller_replaces_the_job_on_the_bad_node_again() -> None:
    base = Recorder(_config("nic_down@20m/1/1"))  # no XID: the device plugin sees nothing wrong
    (t,) = base.sim.truth()
    assert base.acc.repeat_failures >= 1
    assert base.acc.dangerous_schedulable_node_h > 0.9 * (base.sim.end - t.onset) / 3600


def test_the_device_plugin_keeps_jobs_off_a_gpu_with_a_hard_xid() -> None:
    guarded = Recorder(_config("xid79@20m/1/1"))
    assert guarded.acc.repeat_failures == 0 and guarded.sim.gpu.unhealthy[1, 1]
    assert guarded.acc.dangerous_schedulable_node_h < 0.05
    cfg = _config("xid79@20m/1/1")
    unguarded = Recorder(SimConfig(**{**cfg.__dict__, "device_plugin_health": False}))
    assert unguarded.acc.repeat_failures >= 1


def test_cordon_and_restart_excluding_the_node_end_repeat_failures_and_recover_the_job() -> None:
    r = Recorder(_config("xid79@20m/1/1"), isolate_on_failure)
    (t,) = r.sim.truth()
    job = t.affected_jobs[0]
    assert r.acc.repeat_failures == 0
    after = [p for p in r.placements(job) if p.ts > t.onset]
    assert after and all(BAD not in {rp.node for rp in p.placement} for p in after)
    outage = next(o for o in r.acc.outages if o.cause == t.id)
    assert outage.recovered
    phases = [outage.detect_s, outage.isolate_s, outage.wait_capacity_s, outage.restore_s, outage.first_good_step_s]
    assert all(p is not None and p >= 0 for p in phases)
    assert sum(phases) == pytest.approx(outage.mttr_s, abs=0.01)  # type: ignore[arg-type]
    assert outage.restore_s >= 60  # container start + checkpoint restore  # type: ignore[operator]
    assert r.acc.dangerous_schedulable_node_h < 0.05
    assert r.acc.phases["mttr"].n >= 1


def test_restarted_job_resumes_from_its_last_checkpoint() -> None:
    r = Recorder(_config("xid79@50m/1/1"), isolate_on_failure)
    (t,) = r.sim.truth()
    job = t.affected_jobs[0]
    fail = r.failures(job)[0]
    resumed = [e for e in r.events if e.event == "progress" and e.job == job and e.ts > fail.ts and e.rank is None]
    assert fail.step is not None and resumed
    j = r.sim.workload.by_ref(job)
    assert j is not None
    # progress after the failure continues from the checkpoint, which is behind the failure's step
    assert resumed[0].step is not None and resumed[0].step < fail.step + 60 / j.step_s


def test_drain_evicts_the_ranks_and_the_controller_replaces_the_job_elsewhere() -> None:
    def op(sim: Simulator, out: TickOutput) -> list[RemediationCommand]:
        return [cmd("drain", out.t, node=BAD)] if abs(out.t - START - 1800) < 1 else []

    r = Recorder(_config("none", minutes=45), op)
    evicted = [e for e in r.failures() if e.reason == "Evicted"]
    assert len(evicted) == 1 and evicted[0].exit_code == 143
    job = evicted[0].job
    later = [p for p in r.placements(job) if p.ts > evicted[0].ts]
    assert later and BAD not in {rp.node for rp in later[0].placement}
    drained = [x for x in r.results if x.action == "drain"]
    assert drained[0].outcome == "applied" and drained[0].details["evicted_jobs"] == job


def test_diagnostics_need_an_empty_node_take_time_and_fail_by_the_truth() -> None:
    healthy = "gpu-node-0006"

    def op(sim: Simulator, out: TickOutput) -> list[RemediationCommand]:
        t = out.t - START
        if abs(t - 1500) < 1:
            return [cmd("run_diagnostics", out.t, node=BAD), cmd("drain", out.t, node=BAD),
                    cmd("drain", out.t, node=healthy)]
        if abs(t - 1600) < 1:
            return [cmd("run_diagnostics", out.t, node=BAD), cmd("run_diagnostics", out.t, node=healthy)]
        return []

    r = Recorder(_config("straggler@10m/1/4", minutes=75), op)
    diags = [x for x in r.results if x.action == "run_diagnostics"]
    busy = [x for x in diags if x.outcome == "failed"]
    assert busy and "running ranks" in busy[0].reason
    done = {x.node: x for x in diags if x.outcome == "applied"}
    assert done[BAD].details["diagnostics"] == "fail" and done[BAD].details["failed_tests"] == "targeted_power"
    assert done[healthy].details["diagnostics"] == "pass"
    assert done[BAD].ts - (START + 1600) >= 1500  # dcgmi diag -r 3 takes its time


def test_reset_gpu_clears_a_dbe_and_reboot_clears_a_gpu_fallen_off_the_bus() -> None:
    def op(sim: Simulator, out: TickOutput) -> list[RemediationCommand]:
        t = out.t - START
        if abs(t - 1500) < 1:
            return [cmd("drain", out.t, node="gpu-node-0005"), cmd("drain", out.t, node=BAD)]
        if abs(t - 1600) < 1:
            return [cmd("reset_gpu", out.t, node="gpu-node-0005", params={"gpu": "5"}),
                    cmd("reboot_node", out.t, node=BAD)]
        return []

    r = Recorder(_config("xid48@20m/5/5,xid79@20m/1/1", minutes=60), op)
    truth = {t.kind: t for t in r.sim.truth()}
    reset = next(x for x in r.results if x.action == "reset_gpu")
    reboot = next(x for x in r.results if x.action == "reboot_node")
    assert truth["xid48"].cleared_by == reset.command_id and reset.details["cleared"] == truth["xid48"].id
    assert truth["xid79"].cleared_by == reboot.command_id
    assert reboot.ts - reset.ts > 400  # a reboot takes longer than a GPU reset
    assert r.sim.gpu.dbe[5, 5] == 0 and r.sim.gpu.uncorr_rows[5, 5] == 1


def test_escalated_node_is_repaired_and_returns_only_when_told() -> None:
    def op(sim: Simulator, out: TickOutput) -> list[RemediationCommand]:
        t = out.t - START
        if abs(t - 1500) < 1:
            return [cmd("escalate", out.t, node=BAD, params={"escalation": "notify"}),
                    cmd("escalate", out.t, node=BAD, params={"escalation": "repair"})]
        if abs(t - 4200) < 1:
            return [cmd("return_to_service", out.t, node=BAD)]
        return []

    r = Recorder(_config("xid64@20m/1/2", minutes=90, repair_s=(1200.0, 1200.0)), op)
    (t,) = r.sim.truth()
    note, esc = (x for x in r.results if x.action == "escalate")
    assert note.details.get("repair") is None  # a notification sends nothing to repair
    assert esc.details.get("repair") == "completed" and t.cleared_by == esc.command_id
    assert esc.ts == pytest.approx(START + 1502 + 1200, abs=1)
    # repaired at ~2700 s but held out until the return at 4200 s: healthy but unschedulable
    assert r.acc.healthy_unschedulable_node_h == pytest.approx((4202 - 2702) / 3600, abs=0.02)
    assert r.sim.loop.schedulable()[1]


def test_retry_in_place_restarts_on_the_same_nodes() -> None:
    def op(sim: Simulator, out: TickOutput) -> list[RemediationCommand]:
        return [cmd("retry_in_place", e.ts + 2, job=e.job) for e in out.job_events if e.event == "failure"]

    r = Recorder(_config("nccl_timeout@20m", minutes=60, ), op)
    (t,) = r.sim.truth()
    job = t.affected_jobs[0]
    pl = r.placements(job)
    assert len(pl) >= 2
    assert {p.node for p in pl[-1].placement} == {p.node for p in pl[0].placement}
    assert r.acc.repeat_failures == 0 and r.sim.loop.isolations == []


def test_commands_apply_once_and_expired_or_dry_run_commands_are_skipped() -> None:
    c = cmd("cordon", START + 100, node=BAD)
    late = RemediationCommand(id="late", action="cordon", incident_id="i", reason="r", issued_at=START + 100,
                              expires_at=START + 100.5, node="gpu-node-0003")
    dry = RemediationCommand(id="dry", action="drain", incident_id="i", reason="r", issued_at=START + 100,
                             expires_at=START + 900, node="gpu-node-0002", dry_run=True)
    unknown = RemediationCommand(id="unk", action="cordon", incident_id="i", reason="r", issued_at=START + 100,
                                 expires_at=START + 900, node="no-such-node")
    sent = False

    def op(sim: Simulator, out: TickOutput) -> list[RemediationCommand]:
        nonlocal sent
        if not sent:
            sent = True
            return [c, c, late, dry, unknown]
        return []

    r = Recorder(_config("none", minutes=10), op)
    by = [(x.command_id, x.outcome) for x in r.results]
    assert by.count((c.id, "applied")) == 1 and by.count((c.id, "skipped")) == 1
    assert ("late", "skipped") in by and ("dry", "skipped") in by and ("unk", "failed") in by
    sched = r.sim.loop.schedulable()
    assert not sched[1] and sched[2] and sched[3]


def test_planned_reboot_is_cordoned_by_the_operator_first_and_uncordoned_after_it_is_back() -> None:
    sim = Simulator(_config("planned_reboot@20m/3", minutes=45))
    seen: list[tuple[float, str, bool, bool]] = []
    sched: list[tuple[float, list[bool]]] = []
    for out in sim.run():
        seen += [(out.t, o.node, o.cordoned, o.cordoned_by_fleetmedic) for o in out.nodes]
        sched.append((out.t, sim.schedulable().tolist()))
    fault = next(f for f in sim.faults.faults if f.kind == "planned_reboot")
    node = sim.fleet.node_names[fault.node]
    assert [(n, c, ours) for _, n, c, ours in seen] == [(node, True, False), (node, False, False)]
    cordoned, uncordoned = seen[0][0], seen[1][0]
    assert cordoned == pytest.approx(fault.onset, abs=sim.config.gpu_interval_s)
    assert uncordoned - float(fault.params["up_at"]) >= 100.0  # uncordoned a while after it is back up
    assert not any(row[fault.node] for t, row in sched if cordoned <= t < uncordoned)
    assert all(row[fault.node] for t, row in sched if t >= uncordoned)


def test_a_restart_only_if_waiting_never_restarts_a_placed_job() -> None:
    sent: list[RemediationCommand] = []

    def operator(sim: Simulator, out: TickOutput) -> list[RemediationCommand]:
        running = [j for j in sim.workload.jobs if j.active()]
        if sent or not running or out.t < START + 600:
            return []
        sent.append(cmd("restart_job", out.t, job=running[0].ref, exclude_nodes=[BAD],
                        params={"only_if_waiting": "true"}))
        return sent[-1:]

    rec = Recorder(_config("", minutes=20), operator)
    (result,) = [r for r in rec.results if r.command_id == sent[0].id]
    assert result.outcome == "skipped" and "placed already" in result.reason
    assert not rec.failures(sent[0].job)


def _diagnostics_on_spare_node_at_18m(faults: str) -> tuple[Simulator, RemediationResult]:
    """Diagnostics issued on the idle node 3 at 18 min, 2 min before the fault ``faults`` brings it down."""
    diag = RemediationCommand(id="diag-before-the-node-goes-down", action="run_diagnostics", incident_id="inc",
                              reason="test", issued_at=START + 1080, expires_at=START + 1680, node="gpu-node-0003")

    def op(sim: Simulator, out: TickOutput) -> list[RemediationCommand]:
        return [diag] if abs(out.t - diag.issued_at) < 1 else []

    r = Recorder(_config(faults, minutes=75), op)
    (result,) = [x for x in r.results if x.command_id == diag.id]
    return r.sim, result


def test_diagnostics_interrupted_by_planned_maintenance_run_again_once_the_node_is_back() -> None:
    # the operator reboots the idle node while its diagnostics run: they give no verdict while it is down
    # and run again, whole, once it is back (as the diagnostics Job's pod would), then pass on a healthy node
    sim, result = _diagnostics_on_spare_node_at_18m("planned_reboot@20m/3")
    fault = next(f for f in sim.faults.faults if f.kind == "planned_reboot")
    assert fault.node == 3 and fault.onset < result.ts
    up_at = float(fault.params["up_at"])
    assert result.outcome == "applied" and result.details["diagnostics"] == "pass"
    assert result.ts >= up_at + sim.loop.spec.diagnostics_s[2] - 1


def test_diagnostics_on_a_node_that_crashes_fail_in_their_usual_time() -> None:
    sim, result = _diagnostics_on_spare_node_at_18m("node_crash@20m/3")
    assert result.outcome == "applied" and result.details["diagnostics"] == "fail"
    assert result.ts == pytest.approx(START + 1082 + sim.loop.spec.diagnostics_s[2], abs=sim.config.gpu_interval_s)


def test_a_fault_that_begins_and_ends_while_its_node_is_away_for_repair_is_unobserved() -> None:
    """Nothing can show a fault on a node powered off on a technician's bench: its truth says so, and
    the scorer leaves it out of recall. A fault that was active before the repair began is observed."""
    def op(sim: Simulator, out: TickOutput) -> list[RemediationCommand]:
        if abs(out.t - START - 600) < 1:
            return [cmd("escalate", out.t, node=BAD, params={"escalation": "repair"}),
                    cmd("escalate", out.t, node="gpu-node-0002", params={"escalation": "repair"})]
        return []

    r = Recorder(_config("psu_failure@5m+2h/2,psu_failure@20m+20m/1,psu_failure@20m+20m/3", minutes=90,
                         repair_s=(3600.0, 3600.0)), op)
    by_node = {t.node: t for t in r.sim.truth()}
    assert by_node[BAD].unobserved == "repair"  # began and ended within the repair
    assert by_node["gpu-node-0002"].unobserved == ""  # active before its node left for repair
    assert by_node["gpu-node-0003"].unobserved == ""  # never in repair
    report = score(r.sim.truth(), [], [])
    assert report.unobserved == [by_node[BAD].id]
    assert report.recall == 0.0 and sum(k.faults for k in report.by_kind) == 2


def test_a_repaired_gpus_memory_rows_are_a_new_gpus() -> None:
    """A failed row remap (XID 64) and worn HBM end with the GPU replaced: while the fault lasts the
    telemetry shows the failed remap, after it no remapped row and no failure is left to report."""
    seen: dict[str, tuple[float, float]] = {}

    def op(sim: Simulator, out: TickOutput) -> list[RemediationCommand]:
        if abs(out.t - START - 1500) < 1:
            seen["during"] = (float(sim.gpu.remap_failure[1, 2]), float(sim.gpu.uncorr_rows[1, 2]))
        return []

    r = Recorder(_config("xid64@20m+20m/1/2,hbm_degradation@10m+40m/3/5", minutes=60), op)
    assert seen["during"] == (1.0, 1.0)
    (hbm,) = [t for t in r.sim.truth() if t.kind == "hbm_degradation"]
    assert float(hbm.params["fail_after_s"]) < 40 * 60  # it failed before its end
    for n, g in ((1, 2), (3, 5)):
        assert r.sim.gpu.remap_failure[n, g] == 0 and r.sim.gpu.uncorr_rows[n, g] == 0
        assert r.sim.gpu.corr_rows[n, g] == 0 and r.sim.gpu.remap_pending[n, g] == 0
