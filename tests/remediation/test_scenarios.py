"""BRIEF §1's three scenarios and the benchmark's targets, driven through the engine with a fake
executor: hardware faults re-place the job at once while the node is isolated, diagnosed and
returned; software faults are retried and never isolate; early degradation isolates at the job
boundary; a telemetry storm stays within budget and trips the breaker; a bad leaf is one incident."""

from __future__ import annotations

import random

from fleetmedic.records import Evidence, Finding
from tests.remediation.helpers_world import CHILD, ILLEGAL, KEYERROR, OOM, SEGV, SIGTERM, XID79, World, timeout_line

JOB = "ml/llama-70b"


def nodes(a: int, b: int) -> list[str]:
    return [f"node-{i}" for i in range(a, b)]


def fail_with(w: World, job: str, bad: str | None, line: str) -> None:
    for i, n in enumerate(w.placements[job]):
        w.fail(job, n, [line, CHILD] if n == bad or bad is None else [timeout_line(i), CHILD])


def test_hardware_fault_replaces_the_job_at_once_while_the_node_is_isolated_repaired_and_returned() -> None:
    w = World(n=32)
    w.place(JOB, nodes(0, 16))
    w.advance(60)
    w.progress(JOB)
    w.finding("node-5", kind="hard_fault", severity="critical", hint="reboot_node", detector="xid_rules", gpu=3,
              summary="XID 79 (GPU has fallen off the bus) on GPU 3")
    fail_with(w, JOB, "node-5", XID79)
    # job track: re-placed at once, excluding the suspect; node track: isolate, drain, reboot, diagnose,
    # then repair (definitive evidence: diagnostics passing do not return it), validate, return
    restart = w.cmds("restart_job", job=JOB)
    assert len(restart) == 1 and "node-5" in restart[0].exclude_nodes
    assert [c.action for c in w.cmds(node="node-5")] == ["cordon", "taint", "drain", "reboot_node", "run_diagnostics",
                                                          "escalate"]
    assert w.engine.node_state("node-5") == "repair_needed"
    w._take(w.engine.node_repaired("node-5", actor="ops", reason="GPU reseated", now=w.now))
    w.execute()
    assert [c.action for c in w.cmds(node="node-5")][-2:] == ["run_diagnostics", "return_to_service"]
    assert "node-5" not in w.placements[JOB]
    w.advance(60)
    w.progress(JOB)
    inc = w.last_incident(node="node-5")
    assert inc.incident_class == "hardware" and inc.status == "resolved"
    report = w.engine.report(w.now)
    assert report["repeats"] == {"failures_on_isolated_nodes": 0, "placements_on_isolated_nodes": 0}
    assert w.isolated() == {"node-5"}


def test_transient_software_errors_retry_in_place_and_only_repetition_on_one_node_escalates() -> None:
    w = World(n=32)
    w.place(JOB, nodes(0, 8))
    fail_with(w, JOB, "node-2", SEGV)
    w.advance(40)
    assert not w.isolated() and not w.cmds("retry_in_place")  # decided at 30 s, backoff 60 s first
    w.advance(60)
    retry = w.cmds("retry_in_place", job=JOB)
    assert len(retry) == 1 and retry[0].params == {"retry": "1", "backoff_s": "60"}
    assert w.placements[JOB] == nodes(0, 8)  # in place
    w.progress(JOB)
    fail_with(w, JOB, "node-2", SEGV)  # the same job again on the same node proves nothing about the node
    w.advance(200)
    assert not w.isolated()
    w.place("ml/other", ["node-2", "node-20"])  # a second job fails on node-2 too
    w.fail("ml/other", "node-2", [SEGV])
    w.advance(60)
    assert w.isolated() == {"node-2"}
    escalation = [a for a in w.audit if a.rule == "repeated-on-node"]
    assert escalation and "failures of 2 jobs on the node (threshold 2)" in escalation[0].explanation


def test_out_of_memory_failures_of_different_jobs_on_one_node_never_count_against_it() -> None:
    """CUDA OOM, the host's OOM killer and killed dataloader workers follow each job's memory use:
    three jobs running out of memory on node-2 within the window isolate nothing (a transient
    software failure each, retried), while two segfaults of different jobs there do."""
    w = World(n=32)
    host_oom = "Out of memory: Killed process 4242 (python) total-vm:123456kB, anon-rss:98765kB"
    for j, line in enumerate([OOM, OOM, host_oom]):
        job = f"ml/mem-{j}"
        w.place(job, ["node-2", f"node-{20 + j}"])
        fail_with(w, job, "node-2", line)
        w.advance(300)
        assert w.last_incident(job=job).incident_class == "transient_software"
    assert not w.isolated() and not [a for a in w.audit if a.rule == "repeated-on-node"]
    for j in range(2):
        job = f"ml/segv-{j}"
        w.place(job, ["node-2", f"node-{24 + j}"])
        fail_with(w, job, "node-2", SEGV)
        w.advance(300)
    assert w.isolated() == {"node-2"}


def test_a_failure_that_follows_the_job_to_other_nodes_is_a_job_bug() -> None:
    w = World(n=32)
    w.place("ml/tiny", ["node-4"])
    w.fail("ml/tiny", "node-4", [ILLEGAL])
    w.advance(40)
    assert w.last_incident(job="ml/tiny").incident_class == "transient_software"
    w.place("ml/tiny", ["node-9"])  # re-placed elsewhere, and it fails the same way
    w.fail("ml/tiny", "node-9", [ILLEGAL])
    w.advance(40)
    inc = w.last_incident(job="ml/tiny")
    assert inc.incident_class == "job_bug" and "follows the job" in inc.summary
    assert not w.isolated()


def test_failures_a_job_bug_explains_do_not_count_against_the_node_when_another_job_fails_there() -> None:
    w = World(n=32)
    w.place("ml/tiny", ["node-4"])
    w.fail("ml/tiny", "node-4", [ILLEGAL])
    w.advance(40)
    w.place("ml/tiny", ["node-9"])  # it follows the job: its own bug, not node-4's
    w.fail("ml/tiny", "node-9", [ILLEGAL])
    w.advance(40)
    assert w.last_incident(job="ml/tiny").incident_class == "job_bug"
    w.advance(3600)
    w.place("ml/other", ["node-4"])  # hours later another job fails on node-4: the first failure there on record
    w.fail("ml/other", "node-4", [ILLEGAL])
    w.advance(40)
    assert w.last_incident(job="ml/other").incident_class == "transient_software"
    assert not w.isolated() and not [a for a in w.audit if a.rule == "repeated-on-node"]
    w.place("ml/third", ["node-4", "node-12"])  # a second job that is not a job bug: node-4 is escalated
    w.fail("ml/third", "node-4", [ILLEGAL])
    w.advance(60)
    assert w.isolated() == {"node-4"}


def test_transient_retries_are_bounded_then_the_job_is_replaced_elsewhere() -> None:
    w = World(n=32, config="policy: {transient_retry_max: 2, transient_retry_backoff_s: 10, "
                           "escalate_after_failures: 9}")
    w.place(JOB, nodes(0, 8))
    for _ in range(3):
        fail_with(w, JOB, None, timeout_line(0))  # lone timeouts, never a progress in between
        w.advance(120)
    assert [c.params["backoff_s"] for c in w.cmds("retry_in_place")] == ["10", "20"]
    assert len(w.cmds("restart_job", job=JOB)) == 1 and not w.isolated()


def test_early_degradation_isolates_at_the_job_boundary_without_evicting() -> None:
    w = World(n=32)
    w.place(JOB, nodes(0, 8))
    for _ in range(2):  # a lasting condition: the detector reasserts it
        w.finding("node-6", kind="degradation", severity="warning", detector="gpu_drift", summary="SBE rate rising")
        w.advance(600)
    assert [c.action for c in w.cmds(node="node-6")] == ["cordon", "taint"]
    assert not w.cmds("restart_job") and not w.cmds("drain")
    assert w.engine.node_state("node-6") == "quarantined"
    w.progress(JOB)
    w.complete(JOB)
    w.execute()
    assert [c.action for c in w.cmds(node="node-6")][2:] == ["run_diagnostics", "return_to_service"]
    w.place("ml/next", nodes(0, 8))
    assert w.engine.report(w.now)["repeats"]["placements_on_isolated_nodes"] == 0


def test_software_faults_and_job_bugs_isolate_no_node() -> None:
    rng = random.Random(7)
    w = World(n=64)
    lines = [OOM, ILLEGAL, SEGV, KEYERROR, SIGTERM]
    for j in range(12):
        job = f"ml/job-{j}"
        start = rng.randrange(0, 56)
        w.place(job, nodes(start, start + 8))
        bad = rng.choice(w.placements[job])
        line = rng.choice(lines)
        if line == KEYERROR or rng.random() < 0.3:
            fail_with(w, job, None, line)  # every rank hits it: a job bug
        else:
            fail_with(w, job, bad, line)
        w.advance(rng.choice([40, 100]))
        w.complete(job)
    assert not w.isolated()
    classes = {i.incident_class for i in w.incidents}
    assert classes <= {"transient_software", "job_bug"} and "job_bug" in classes


def test_a_job_bug_failing_again_in_its_incident_is_escalated_once() -> None:
    # the job track's escalation id leaves the attempt out (fleetmedic.actions.command_id): the job's
    # next attempt failing the same way merges into the incident and asks no human a second time
    w = World(n=32)
    w.place("ml/a", nodes(0, 8))
    w.advance(60)
    fail_with(w, "ml/a", None, KEYERROR)
    w.advance(60)
    w.place("ml/a", nodes(0, 8), attempt=2)
    w.advance(60)
    fail_with(w, "ml/a", None, KEYERROR)
    w.advance(60)
    assert {i.id for i in w.incidents if i.incident_class == "job_bug"} == {w.last_incident(job="ml/a").id}
    assert [c.id for c in w.cmds("escalate", job="ml/a")] == [f"{w.last_incident(job='ml/a').id}/escalate/ml/a"]


def test_a_telemetry_storm_stays_within_budget_and_trips_the_breaker() -> None:
    w = World(n=64, auto_execute=False, config="safety: {max_quarantined_fraction: 0.25}")
    for i in range(0, 64, 2):  # half the fleet looks bad at once
        w.finding(f"node-{i}", kind="hard_fault", severity="critical", hint="reset_gpu", detector="hard_rules")
    s = w.settings.safety
    isolated = w.isolated()
    assert len(isolated) <= min(s.max_new_isolations, w.engine.gate.max_held(64))
    assert w.engine.breaker_open
    assert w.decisions("breaker_tripped")
    assert any(c.params.get("scope") == "fleet" for c in w.cmds("escalate"))
    assert all("breaker" in a.explanation or "max_" in a.explanation or "rate" in a.explanation
               or "rack" in a.explanation for a in w.decisions("blocked"))
    w.advance(3600)
    w.finding("node-33", kind="hard_fault", severity="critical", hint="isolate")
    assert "node-33" not in w.isolated()  # still open: resume is by command
    w._take(w.engine.resume_breaker(actor="carol", reason="exporter fixed", now=w.now))
    assert w.decisions("breaker_resumed")[0].actor == "carol"
    w.finding("node-35", kind="hard_fault", severity="critical", hint="isolate")
    assert "node-35" in w.isolated()


def test_a_dead_leaf_switch_is_one_incident_and_jobs_move_off_it() -> None:
    w = World(n=32)
    w.place(JOB, nodes(8, 16))
    for n in nodes(8, 16):
        w.finding(n, kind="network", severity="critical", detector="ib_ports", port="mlx5_0",
                  summary="LinkDownedCounter +12")
    w.advance(40)
    incidents = {i.id for i in w.incidents}
    assert len(incidents) == 1
    assert not w.isolated()
    assert set(w.placements[JOB]).isdisjoint(nodes(8, 16))
    assert [c.node for c in w.cmds("escalate")] == ["leaf-1"]


def test_every_true_fault_is_attributed_and_no_healthy_node_is_isolated() -> None:
    rng = random.Random(3)
    w = World(n=64)
    faulty = set()
    for j in range(6):
        job = f"ml/job-{j}"
        w.place(job, nodes(j * 10, j * 10 + 8))
        w.advance(30)
        bad = rng.choice(w.placements[job])
        faulty.add(bad)
        if rng.random() < 0.5:
            w.finding(bad, kind="hard_fault", severity="critical", hint="reset_gpu", detector="hard_rules")
        fail_with(w, job, bad, rng.choice([XID79, "RuntimeError: CUDA error: uncorrectable ECC error encountered"]))
        w.advance(700)  # keep within the isolation rate budget
    assert w.isolated() == faulty
    hardware = [i for i in w.incidents if i.incident_class == "hardware" and i.status == "open"]
    assert {i.suspects[0].name for i in hardware} == faulty


def _port_finding(w: World, device: str, port: str, node: str, peer: str = "") -> None:
    """A link-down finding as the port detector writes it (with the cable's other end for inter-switch links)."""
    w._fid += 1
    evidence = [Evidence(detector="link_state", metric="link_state", port=f"{device}/{port}", ts=w.now)]
    if peer:
        evidence.append(Evidence(detector="link_peer", port=peer, ts=w.now))
    f = Finding(id=f"p{w._fid}", ts=w.now, node=node, detector="link_state", kind="network", severity="critical",
                summary=f"link {device}/{port} went down", evidence=evidence, port=f"{device}/{port}")
    w._take(w.engine.on_finding(f, w.now))


def test_spine_ports_facing_a_dead_leaf_join_the_leafs_incident_not_one_of_their_own() -> None:
    w = World(n=32)
    for n in nodes(8, 16):
        _port_finding(w, "leaf-1", f"swp{n[5:]}", n)
    for spine in ("spine-0", "spine-1"):
        _port_finding(w, spine, "swp2", spine, peer="leaf-1/swp33")  # the spine's side of leaf-1's uplink
    w.advance(40)
    switches = {s.name for i in w.incidents for s in i.suspects if s.kind == "switch"}
    assert switches == {"leaf-1"}
    assert len({i.id for i in w.incidents}) == 1
    assert {"spine-0/swp2", "spine-1/swp2"} <= {s.name for s in w.incidents[-1].suspects if s.kind == "link"}


def test_a_node_cordoned_by_someone_else_for_maintenance_raises_no_incident_while_it_reboots() -> None:
    w = World(n=32)
    w.observe("node-3", cordoned=True, by_fleetmedic=False)  # the operator's cordon before planned maintenance
    _port_finding(w, "leaf-0", "swp3", "node-3")  # the reboot takes its links down
    for _ in range(4):  # and the burn-in after it looks odd
        w.finding("node-3", kind="degradation", severity="warning", detector="gpu_baseline")
        w.advance(120)
    assert w.incidents == [] and not w.isolated()
    assert any("cordoned by someone else" in a.explanation for a in w.decisions("skipped"))
    w.observe("node-3", cordoned=False, by_fleetmedic=False)  # back from maintenance: watched again
    _port_finding(w, "leaf-0", "swp3", "node-3")
    w.advance(40)
    assert [s.name for s in w.last_incident(node="node-3").suspects][:1] == ["node-3"]


def test_an_applications_xids_repeated_on_every_node_of_its_job_isolate_no_node() -> None:
    w = World(n=32)
    w.place(JOB, nodes(0, 8))
    for attempt in range(3):  # a job bug: an illegal memory access (XID 13) on every GPU, every attempt
        for n in nodes(0, 8):
            w.finding(n, kind="hard_fault", severity="info", hint="restart_app", detector="xid_rules",
                      summary="XID 13 (Graphics Engine Exception) on GPU 0")
        if attempt:
            for n in nodes(0, 8):
                w.finding(n, kind="hard_fault", severity="warning", hint="investigate", detector="xid_repeat",
                          summary=f"XID 13 repeated {attempt + 1}x on GPU 0")
        w.advance(400)
    assert not w.isolated() and not [i for i in w.incidents if i.incident_class == "degradation"]
    # the same repetition on one node alone is that GPU's problem
    w.place("ml/other", nodes(16, 24))
    for attempt in range(3):
        w.finding("node-17", kind="hard_fault", severity="info", hint="restart_app", detector="xid_rules")
        if attempt:
            w.finding("node-17", kind="hard_fault", severity="warning", hint="investigate", detector="xid_repeat")
        w.advance(400)
    assert w.last_incident(node="node-17").incident_class == "degradation"


def test_an_oom_on_a_node_behind_a_broken_leaf_is_still_an_oom() -> None:
    w = World(n=32)
    for n in nodes(8, 16):
        w.finding(n, kind="network", severity="critical", detector="ib_ports", port="mlx5_0", gpu=None,
                  summary="LinkDownedCounter +12")
    w.advance(40)
    assert w.incidents[-1].incident_class == "network"
    w.place(JOB, ["node-15", *nodes(20, 27)])  # placed before the leaf's incident moved it
    fail_with(w, JOB, "node-15", OOM)
    w.advance(40)
    assert w.last_incident(job=JOB).incident_class == "transient_software"
    # a bare NCCL timeout there is the leaf's doing
    w.place("ml/b", ["node-14", *nodes(27, 31)])
    fail_with(w, "ml/b", None, timeout_line(0))
    w.advance(40)
    assert w.last_incident(job="ml/b").incident_class == "network"
