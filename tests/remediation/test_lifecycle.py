"""The per-node escalation state machine: ordered node steps that wait for results and job
boundaries, the validation gate before return to service, probation, the reset -> reboot -> repair
ladder, timeouts, flap hysteresis, ownership of cordons, opt-out, and audited clearing."""

from __future__ import annotations

from fleetmedic.connectors.kube.node_conditions import ConditionTracker
from fleetmedic.records import RemediationCommand, RemediationResult
from tests.remediation.helpers_world import World

NODES = [f"node-{i}" for i in range(8)]


def answer(w: World, cmd: RemediationCommand, outcome: str = "applied", **details: str) -> None:
    w._take(w.engine.on_result(RemediationResult(command_id=cmd.id, action=cmd.action, outcome=outcome,  # type: ignore[arg-type]
                                                 ts=w.now, node=cmd.node, details=details), w.now))


def answer_all(w: World, action: str, node: str, outcome: str = "applied", **details: str) -> None:
    for c in w.cmds(action, node=node):
        if c.id not in w._executed:
            w._executed.add(c.id)
            answer(w, c, outcome, **details)


def hardware(w: World, node: str = "node-3", hint: str = "isolate") -> None:
    w.finding(node, kind="hard_fault", severity="critical", hint=hint, detector="hard_rules")


def test_quick_steps_go_together_and_diagnostics_wait_for_the_drain() -> None:
    w = World(auto_execute=False)
    hardware(w)
    assert [c.action for c in w.cmds(node="node-3")] == ["cordon", "taint", "drain"]
    answer_all(w, "cordon", "node-3")
    answer_all(w, "taint", "node-3")
    assert not w.cmds("run_diagnostics")
    answer_all(w, "drain", "node-3")
    assert [c.action for c in w.cmds(node="node-3")][-1] == "run_diagnostics"
    assert w.engine.node_state("node-3") == "diagnosing"


def test_passing_diagnostics_return_the_node_on_probation_then_healthy() -> None:
    w = World()
    hardware(w)
    assert w.engine.node_state("node-3") == "probation"
    rts = w.cmds("return_to_service", node="node-3")
    assert rts and rts[0].params["uncordon"] == "true"
    w.advance(86_400 + 20)
    assert w.engine.node_state("node-3") == "healthy"


def test_failed_diagnostics_climb_the_ladder_then_ask_for_repair() -> None:
    w = World(verdicts={"node-3": "fail"})
    hardware(w)
    actions = [c.action for c in w.cmds(node="node-3")]
    assert actions == ["cordon", "taint", "drain", "run_diagnostics", "reset_gpu", "run_diagnostics", "reboot_node",
                       "run_diagnostics", "escalate"]
    assert w.engine.node_state("node-3") == "repair_needed"
    assert not w.cmds("return_to_service")


def test_a_hint_starts_the_ladder_at_its_rung() -> None:
    w = World(verdicts={"node-3": "fail"})
    hardware(w, hint="reboot_node")
    actions = [c.action for c in w.cmds(node="node-3")]
    assert actions[:5] == ["cordon", "taint", "drain", "reboot_node", "run_diagnostics"]
    assert "reset_gpu" not in actions  # the ladder continues after the highest rung tried


def test_repair_is_validated_by_diagnostics_before_the_node_returns() -> None:
    w = World(verdicts={"node-3": "fail"})
    hardware(w)
    w.verdicts["node-3"] = "pass"
    w._take(w.engine.node_repaired("node-3", actor="alice", reason="replaced GPU 2", now=w.now))
    w.execute()
    assert w.engine.node_state("node-3") == "probation"
    assert any(a.actor == "alice" and "replaced GPU 2" in a.explanation for a in w.decisions("cleared"))


def test_a_repair_the_executor_reports_complete_is_validated_before_return() -> None:
    w = World(verdicts={"node-3": "fail"})
    hardware(w)
    repair = [c for c in w.cmds("escalate", node="node-3") if c.params["escalation"] == "repair"]
    assert len(repair) == 1 and w.engine.node_state("node-3") == "repair_needed"
    w.verdicts["node-3"] = "pass"
    w.advance(4 * 3600)  # the repair takes hours; nothing else happens meanwhile
    answer(w, repair[0], "applied", repair="completed")
    w.execute()
    assert [c.action for c in w.cmds(node="node-3")][-2:] == ["run_diagnostics", "return_to_service"]
    assert w.engine.node_state("node-3") == "probation"


def test_diagnostics_that_never_report_count_as_failed() -> None:
    w = World(auto_execute=False)
    hardware(w)
    for action in ("cordon", "taint", "drain"):
        answer_all(w, action, "node-3")
    w.advance(3600 + 20)
    assert [c.action for c in w.cmds(node="node-3")][-1] == "reset_gpu"
    assert any("no result for run_diagnostics" in a.explanation for a in w.decisions("result"))


def test_unanswered_steps_are_reissued_with_new_ids_then_escalated() -> None:
    w = World(auto_execute=False, config="policy: {action_retries: 1, action_timeout_s: 100}")
    hardware(w)
    w.advance(110)
    drains = w.cmds("drain", node="node-3")
    assert len(drains) == 2 and drains[0].id != drains[1].id
    w.advance(110)
    assert w.engine.gate.holds("node-3") and w.engine.node_state("node-3") != "healthy"  # held; a human is told
    assert {"reason": "drain_failed", "escalation": "notify"} in [c.params for c in w.cmds("escalate", node="node-3")]


def test_a_refused_step_is_not_a_verdict_and_waits_to_be_retried() -> None:
    w = World(auto_execute=False)
    hardware(w)
    for action in ("cordon", "taint", "drain"):
        answer_all(w, action, "node-3")
    answer_all(w, "run_diagnostics", "node-3", "failed")  # "node has running ranks; drain it first"
    assert not w.cmds("reset_gpu") and w.engine.node_state("node-3") == "diagnosing"
    w.advance(130)
    assert len(w.cmds("run_diagnostics", node="node-3")) == 2
    answer_all(w, "run_diagnostics", "node-3", diagnostics="pass")  # the simulator's spelling of the verdict
    assert w.engine.node_state("node-3") == "probation"


def test_a_failed_cordon_is_retried_even_while_a_drain_is_in_flight() -> None:
    w = World(auto_execute=False)
    hardware(w)
    answer(w, w.cmds("cordon", node="node-3")[0], "failed", reason="conflict")
    assert len(w.cmds("cordon", node="node-3")) == 2


def test_a_flapping_node_goes_to_repair_instead_of_back_to_service() -> None:
    w = World(config="safety: {node_cooldown_s: 0}")
    for _ in range(2):
        hardware(w)
        w.advance(60)
    assert w.engine.node_state("node-3") == "probation"
    hardware(w)
    assert w.engine.node_state("node-3") == "repair_needed"
    assert len(w.cmds("return_to_service", node="node-3")) == 2
    assert any("flapping" in a.explanation for a in w.decisions("escalated"))


def test_a_repaired_flapping_node_returns_after_passing_diagnostics() -> None:
    # the returns before the repair were the fault the repair fixed: they must not send the repaired
    # node straight back to repair (a loop of repairs for flap_window_s)
    w = World(config="safety: {node_cooldown_s: 0}")
    for _ in range(3):
        hardware(w)
        w.advance(60)
    assert w.engine.node_state("node-3") == "repair_needed"
    repair = [c for c in w.cmds("escalate", node="node-3") if c.params["escalation"] == "repair"]
    answer(w, repair[-1], "applied", repair="completed")
    w.advance(60)
    assert w.engine.node_state("node-3") == "probation"
    assert len(w.cmds("return_to_service", node="node-3")) == 3


def test_a_cordon_someone_else_made_is_never_lifted() -> None:
    w = World(auto_execute=False)
    w.observe("node-3", cordoned=True, by_fleetmedic=False)
    assert any("cordoned by someone else" in a.explanation for a in w.decisions("skipped"))
    hardware(w)
    answer_all(w, "cordon", "node-3", "skipped", already_cordoned="true")
    for action in ("taint", "drain", "run_diagnostics"):
        answer_all(w, action, "node-3", verdict="pass")
    rts = w.cmds("return_to_service", node="node-3")
    assert len(rts) == 1 and rts[0].params["uncordon"] == "false" and rts[0].params["untaint"] == "true"
    assert not w.cmds("uncordon")


def test_an_uncordon_by_someone_else_is_respected_and_audited() -> None:
    w = World(auto_execute=False)
    hardware(w)
    answer_all(w, "cordon", "node-3")
    w.observe("node-3", cordoned=False, by_fleetmedic=False)
    assert w.engine.node_state("node-3") == "probation"
    assert not w.engine.gate.holds("node-3")
    assert any(a.actor == "kubernetes" for a in w.decisions("cleared"))


def test_an_opted_out_node_gets_no_node_commands_only_an_escalation() -> None:
    w = World()
    w.place("ml/a", NODES)
    w.observe("node-3", cordoned=False, by_fleetmedic=False, labels={"fleetmedic.io/opt-out": "true"})
    hardware(w)
    assert [c.action for c in w.cmds(node="node-3")] == ["escalate"]
    assert w.cmds("restart_job", job="ml/a")  # the job track still runs
    assert w.engine.node_state("node-3") == "healthy"


def test_clearing_by_command_returns_the_node_and_is_audited() -> None:
    w = World(verdicts={"node-3": "fail"})
    hardware(w)
    assert w.engine.node_state("node-3") == "repair_needed"
    w._take(w.engine.clear_node("node-3", actor="bob", reason="false alarm, checked by hand", now=w.now))
    assert w.engine.node_state("node-3") == "probation"
    cleared = w.decisions("cleared")
    assert cleared and cleared[0].actor == "bob" and cleared[0].state_from == "repair_needed"
    assert w.cmds("return_to_service", node="node-3")[-1].params["actor"] == "bob"
    assert not w.engine.gate.holds("node-3")


def test_preventive_isolation_cordons_now_and_diagnoses_at_the_job_boundary() -> None:
    w = World()
    w.place("ml/a", NODES)
    w.finding("node-2", kind="degradation", severity="warning", detector="gpu_baseline")
    w.advance(600)
    assert not w.cmds(node="node-2")  # one warning: watched, not acted on
    w.finding("node-2", kind="degradation", severity="warning", detector="gpu_baseline")  # the detector reasserts
    w.advance(60)
    assert [c.action for c in w.cmds(node="node-2")] == ["cordon", "taint"]
    assert not w.cmds("restart_job") and not w.cmds("drain")
    w.complete("ml/a")
    w.execute()
    assert [c.action for c in w.cmds(node="node-2")][2] == "run_diagnostics"


def test_hard_evidence_upgrades_a_preventive_plan_to_drain_now() -> None:
    w = World(auto_execute=False)
    w.place("ml/a", NODES)
    w.finding("node-2", kind="degradation", severity="warning", detector="gpu_baseline")
    hardware(w, "node-2")
    assert [c.action for c in w.cmds(node="node-2")] == ["cordon", "taint", "drain"]
    assert w.cmds("restart_job", job="ml/a")[0].exclude_nodes == ["node-2"]


def test_a_one_node_job_bug_on_a_node_back_on_probation_isolates_nothing() -> None:
    # seen in the quality benchmark: a node just back from repair ran a one-node job whose own bug (an
    # illegal memory access) failed it; probation's lower threshold made that single failure isolate
    # the node, though the job's retry on another node then failed the same way (a job bug)
    from tests.remediation.helpers_world import ILLEGAL

    w = World(config="safety: {node_cooldown_s: 0}")
    hardware(w)
    assert w.engine.node_state("node-3") == "probation"
    w.advance(3600)
    cordons = len(w.cmds("cordon", node="node-3"))  # the hardware fault's
    w.place("ml/eval", ["node-3"])
    w.fail("ml/eval", "node-3", [ILLEGAL])
    w.advance(60)
    assert len(w.cmds("cordon", node="node-3")) == cordons
    restart = w.cmds("restart_job", job="ml/eval")[-1]  # its retry goes elsewhere
    assert "node-3" in restart.exclude_nodes
    w.place("ml/eval", ["node-5"], attempt=2)
    w.fail("ml/eval", "node-5", [ILLEGAL])
    w.advance(60)
    assert any(i.incident_class == "job_bug" for i in w.incidents if "ml/eval" in i.jobs)
    assert len(w.cmds("cordon", node="node-3")) == cordons and "node-5" not in w.isolated()
    # a different job failing on the probation node, not alone there, is the node's doing (the job bug's
    # failure no longer counts against node-3)
    w.place("ml/other", ["node-3", "node-7"])
    w.fail("ml/other", "node-3", [ILLEGAL])
    w.advance(60)
    assert len(w.cmds("cordon", node="node-3")) == cordons + 1


def test_a_job_bug_whose_application_xids_spread_over_its_nodes_isolates_no_node_on_probation() -> None:
    # an illegal memory access raises XID 13 on every GPU the kernel ran on: the job's 16 nodes all
    # report it, and the one rank that logged the error sits on a node back on probation, where a
    # single software failure would otherwise escalate the node
    from tests.remediation.helpers_world import ILLEGAL

    w = World(config="safety: {node_cooldown_s: 0}")
    hardware(w)
    assert w.engine.node_state("node-3") == "probation"
    w.advance(3600)
    cordons = len(w.cmds("cordon", node="node-3"))
    nodes = [f"node-{i}" for i in range(16)]
    w.place("ml/pretrain", nodes)
    for n in nodes:
        w.xid(n, 13)
    w.fail("ml/pretrain", "node-3", [ILLEGAL])
    w.advance(60)
    inc = w.last_incident(job="ml/pretrain")
    assert inc.incident_class == "job_bug" and "application XIDs" in inc.summary, inc.summary
    assert len(w.cmds("cordon", node="node-3")) == cordons and not w.cmds("cordon", node="node-9")
    # the same failure with the XID on two of the 16 nodes only is the node's on probation
    w.advance(3600)
    w.place("ml/other", nodes)
    for n in ("node-3", "node-9"):
        w.xid(n, 13)
    w.fail("ml/other", "node-3", [ILLEGAL])
    w.advance(60)
    assert w.last_incident(job="ml/other").incident_class != "job_bug"
    assert len(w.cmds("cordon", node="node-3")) == cordons + 1


def test_a_node_isolated_for_a_node_condition_returns_only_once_diagnostics_passed_and_the_condition_cleared() -> None:
    """Diagnostics test GPUs: a read-only filesystem passes them. The node awaits repair until the node
    watch reports the condition cleared, is validated again, then returns."""
    w = World()
    tracker = ConditionTracker.of(w.settings)

    def feed(status: str, reason: str) -> None:
        obj = {"metadata": {"name": "node-5"}, "status": {"conditions": [
            {"type": "ReadonlyFilesystem", "status": status, "reason": reason,
             "lastTransitionTime": f"2026-12-02T00:00:{int(w.now) % 60:02d}Z"}]}}
        for f in tracker.observe("MODIFIED", obj, w.now):
            w._take(w.engine.on_finding(f, w.now))

    feed("False", "FilesystemIsNotReadOnly")
    feed("True", "FilesystemIsReadOnly")
    w.advance(600)  # isolated, drained, diagnostics passed: the condition is still set
    assert len(w.cmds("run_diagnostics", node="node-5")) == 1 and not w.cmds("return_to_service", node="node-5")
    assert w.engine.node_state("node-5") == "repair_needed"
    (ticket,) = w.cmds("escalate", node="node-5")
    assert "ReadonlyFilesystem is still set" in ticket.reason
    feed("False", "FilesystemIsNotReadOnly")
    w.advance(600)  # validated again, then returned
    assert len(w.cmds("run_diagnostics", node="node-5")) == 2
    assert w.cmds("return_to_service", node="node-5") and w.engine.node_state("node-5") == "probation"


def test_by_default_a_node_whose_diagnostics_pass_after_definitive_evidence_goes_to_repair_first() -> None:
    """A DBE that diagnostics miss would go back schedulable: by default (``definitive_return: repair``)
    the node goes to repair, and returns once the repair is validated; with ``diagnostics`` at once."""
    w = World()
    w.dbe("node-4")
    w.advance(600)
    assert w.cmds("run_diagnostics", node="node-4") and not w.cmds("return_to_service", node="node-4")
    assert w.engine.node_state("node-4") == "repair_needed"
    (ticket,) = w.cmds("escalate", node="node-4")
    assert "policy.definitive_return" in ticket.reason
    w._take(w.engine.node_repaired("node-4", actor="ops", reason="GPU swapped", now=w.now))
    w.advance(600)
    assert w.cmds("return_to_service", node="node-4") and w.engine.node_state("node-4") == "probation"
    trusting = World(config="safety: {max_quarantined_fraction: 0.1}\npolicy: {definitive_return: diagnostics}")
    trusting.dbe("node-4")
    trusting.advance(600)
    assert trusting.cmds("return_to_service", node="node-4") and not trusting.cmds("escalate", node="node-4")


def _degrade_until_cordoned(w: World, node: str, metric: str, rounds: int = 20) -> bool:
    """Report the degradation every 30 s until the node is cordoned (confirmation, then settling)."""
    before = len(w.cmds("cordon", node=node))
    for _ in range(rounds):
        w.degradation(node, metric=metric, severity="critical")
        w.advance(30)
        if len(w.cmds("cordon", node=node)) > before:
            return True
    return False


def test_passing_diagnostics_acquit_a_gpu_of_its_temperatures_but_of_nothing_else() -> None:
    # seen in the quality benchmark: a healthy GPU with a higher thermal resistance than its siblings
    # runs further above them at a higher power, and every change of job moved its temperature off
    # its baseline; its diagnostics passed each time, and it was isolated four times in a day
    w = World(config="safety: {node_cooldown_s: 0, max_quarantined_fraction: 0.1}")
    w.place("ml/a", [f"node-{i}" for i in range(4)])
    assert _degrade_until_cordoned(w, "node-2", "memory_temp")
    w.advance(600)  # diagnostics pass: back to service
    assert w.engine.node_state("node-2") in ("probation", "healthy")
    cordons, restarts = len(w.cmds("cordon", node="node-2")), len(w.cmds("restart_job"))
    w.place("ml/b", ["node-2", "node-5"])
    assert not _degrade_until_cordoned(w, "node-2", "gpu_temp")  # another temperature, another job's power
    acquittals = [a for a in w.audit if a.node == "node-2" and "policy.acquittal_s" in a.explanation]
    assert acquittals and "diagnostics passed" in acquittals[-1].explanation
    assert len(w.cmds("cordon", node="node-2")) == cordons
    assert len(w.cmds("restart_job")) == restarts  # and its jobs are not moved for it
    # evidence the diagnostics were not acquitted of still isolates it
    assert _degrade_until_cordoned(w, "node-2", "sm_clock")


def test_the_acquittal_ends_after_its_window_and_can_be_turned_off() -> None:
    w = World(config="safety: {node_cooldown_s: 0, max_quarantined_fraction: 0.1}\npolicy: {acquittal_s: 3600}")
    assert _degrade_until_cordoned(w, "node-2", "memory_temp")
    w.advance(600)
    assert not _degrade_until_cordoned(w, "node-2", "memory_temp")
    w.advance(3600)
    assert _degrade_until_cordoned(w, "node-2", "memory_temp")
    off = World(config="safety: {node_cooldown_s: 0, max_quarantined_fraction: 0.1}\npolicy: {acquitted_metrics: []}")
    assert _degrade_until_cordoned(off, "node-2", "memory_temp")
    off.advance(600)
    assert _degrade_until_cordoned(off, "node-2", "memory_temp")
