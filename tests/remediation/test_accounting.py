"""Honest metrics: job and node failures with their own denominators, dangerous-but-schedulable
and healthy-but-unschedulable node-time, the MTTR split, and repeat placements on held nodes."""

from __future__ import annotations

from fleetmedic.remediation.accounting import Accounting
from tests.remediation.helpers_world import ECC, World, timeout_line

NODES = [f"node-{i}" for i in range(8)]


def test_job_and_node_failures_have_their_own_denominators() -> None:
    a = Accounting()
    a.fleet(100, 0.0)
    for _ in range(4):
        a.job_attempt()
    a.job_running("ml/a", 0.0)
    a.job_failed("transient_software")
    a.job_failed("hardware")
    a.node_failed("hardware")
    a.job_stopped("ml/a", 7200.0)
    r = a.report(86_400.0)
    assert r["job_failures"]["per_attempt"] == 0.5 and r["job_failures"]["job_hours"] == 2.0
    assert r["node_failures"]["node_days"] == 100.0 and r["node_failures"]["per_node_day"] == 0.01


def test_node_time_splits_dangerous_schedulable_from_healthy_unschedulable() -> None:
    a = Accounting()
    a.isolation_started("bad", "hardware", evidence_at=100.0)
    a.isolated("bad", 130.0)
    a.verdict("bad", passed=False, first_try=True, now=500.0)
    a.isolation_started("fine", "degradation", evidence_at=0.0)
    a.isolated("fine", 10.0)
    a.verdict("fine", passed=True, first_try=True, now=400.0)
    a.returned("fine", 410.0)
    r = a.report(1000.0)
    assert r["node_time"] == {"dangerous_but_schedulable_s": 30.0, "healthy_but_unschedulable_s": 400.0,
                              "refused_definitive_s": 0.0, "refused_preventive_s": 0.0, "refused_uncertain_s": 0.0}
    assert r["isolations"] == {"total": 2, "confirmed_bad": 1, "healthy_first_try": 1, "for_software_or_job_bugs": 0}


def test_mttr_is_split_into_detect_isolate_wait_restore_first_step() -> None:
    a = Accounting()
    a.isolation_started("n1", "hardware", evidence_at=0.0)
    a.recovery_started("ml/a", "inc", failed_attempt=0, fault_at=90.0, detected_at=100.0, suspects=["n1"], now=100.0)
    a.isolated("n1", 105.0)
    a.job_progress("ml/a", "placement", 1, 160.0)
    a.job_progress("ml/a", "start", 1, 190.0)
    assert a.job_progress("ml/a", "progress", 1, 250.0) == "inc"
    mttr = a.report(300.0)["mttr_s"]
    assert {k: v["mean"] for k, v in mttr.items()} == {
        "detect": 10.0, "isolate": 5.0, "wait_for_capacity": 60.0, "restore": 30.0, "first_good_step": 60.0}


def test_a_hardware_recovery_in_the_engine_fills_every_phase_and_counts_once() -> None:
    w = World()
    w.place("ml/a", NODES)
    w.advance(50)
    for i, n in enumerate(NODES):
        w.fail("ml/a", n, [ECC] if n == "node-3" else [timeout_line(i)])
    w.advance(40)  # settle, decide, restart elsewhere (the fake executor re-places and starts the job)
    w.advance(30)
    w.progress("ml/a")
    r = w.engine.report(w.now)
    assert r["job_failures"]["by_class"] == {"hardware": 1}
    assert r["node_failures"]["by_class"] == {"hardware": 1}
    assert all(r["mttr_s"][p]["count"] == 1 for p in ("detect", "isolate", "wait_for_capacity", "restore",
                                                      "first_good_step"))
    assert r["mttr_s"]["detect"]["mean"] >= 30.0  # the settle window is part of detection


def test_placing_a_job_on_a_held_node_is_counted_and_audited() -> None:
    w = World(auto_execute=False)
    w.finding("node-3", kind="hard_fault", severity="critical", hint="isolate")
    w.place("ml/new", ["node-2", "node-3"])
    assert w.engine.report(w.now)["repeats"]["placements_on_isolated_nodes"] == 1
    assert w.decisions("repeat_placement")[0].node == "node-3"


def test_a_restarted_attempt_that_runs_long_enough_is_recovered_and_a_failure_sets_it_back() -> None:
    a = Accounting()
    a.recovery_started("ml/a", "inc", failed_attempt=0, fault_at=90.0, detected_at=100.0, suspects=[], now=100.0)
    a.job_progress("ml/a", "placement", 1, 160.0)
    a.job_progress("ml/a", "start", 1, 190.0)
    assert a.recoveries_due(700.0, 600.0) == []
    a.job_progress("ml/a", "failure", 1, 700.0)  # the restarted attempt failed: not recovered
    assert a.recoveries_due(2000.0, 600.0) == []
    a.job_progress("ml/a", "start", 2, 2000.0)
    assert a.recoveries_due(2599.0, 600.0) == []
    assert a.recoveries_due(2600.0, 600.0) == [("ml/a", "inc")]
    assert a.report(2600.0)["mttr_s"]["first_good_step"]["mean"] == 600.0


def test_a_job_that_runs_again_without_progress_reports_resolves_every_incident_that_moved_it() -> None:
    """The Kubernetes job watcher sees pods run, not training steps: a restarted job that keeps running
    is recovered after ``policy.recovered_after_s``, and every incident that waited for it resolves
    (one that moved it before it had recovered included), so their suspects are no longer avoided."""
    # policy.recovered_after_s: 600 by default; the node returns after its diagnostics
    w = World(config="safety: {max_quarantined_fraction: 0.1}\npolicy: {definitive_return: diagnostics}")
    w.place("ml/a", NODES)
    w.advance(50)
    w.fail("ml/a", "node-3", [ECC])
    w.advance(40)
    first = w.last_incident(node="node-3")
    w.advance(100)  # restarted; it fails again on another node before it has recovered
    w.fail("ml/a", w.placements["ml/a"][0], [ECC])
    w.advance(40)
    second = w.last_incident(job="ml/a")
    assert second.id != first.id and len(w.cmds("restart_job", job="ml/a")) == 2
    w.advance(3600)  # runs, no progress reports; the suspects are diagnosed and returned
    status = {i.id: i.status for i in w.incidents}
    assert status[first.id] == "resolved" and status[second.id] == "resolved"
    assert w.engine.report(w.now)["mttr_s"]["first_good_step"]["count"] == 1
    assert not w.engine.suspected_nodes()
