"""When a node isolated by fleetmedic goes back to service, and what a restart avoids meanwhile: the
evidence still reported keeps it out, definitive evidence that recurs after a passing diagnostic
sends it to repair, a step waiting for a job boundary does not wait forever, a node returned after
passing diagnostics is no longer suspected, and retries in place and waiting restarts avoid every
node fleetmedic suspects."""

from __future__ import annotations

from fleetmedic.records import RemediationCommand
from tests.remediation.helpers_world import SEGV, World, answer

NODES = [f"node-{i}" for i in range(8)]


def isolate_to_diagnostics(w: World, node: str) -> RemediationCommand:
    """A link-down-like hard finding on ``node``, its quick steps answered: the diagnostics it waits for."""
    w.finding(node, metric="ib_port_state", summary="IB port 1 down")
    for action in ("cordon", "taint", "drain"):
        for c in w.cmds(action, node=node):
            answer(w, c)
    (diag,) = w.cmds("run_diagnostics", node=node)
    return diag


def test_evidence_still_reported_when_diagnostics_pass_sends_the_node_to_repair_not_back() -> None:
    w = World(auto_execute=False)
    diag = isolate_to_diagnostics(w, "node-3")
    w.now += 600
    w.finding("node-3", metric="ib_port_state", summary="IB port 1 down")  # the detector reasserts it
    w.now += 900
    answer(w, diag, verdict="pass")
    assert w.engine.node_state("node-3") == "repair_needed" and not w.cmds("return_to_service", node="node-3")
    (ticket,) = w.cmds("escalate", node="node-3")
    assert "hard_rules:ib_port_state was reported again 900s ago" in ticket.reason
    # a different finding on the held node is not its evidence; nor is a repeat older than evidence_quiet_s
    other = World(auto_execute=False)
    diag = isolate_to_diagnostics(other, "node-3")
    other.now += 60
    other.finding("node-3", metric="ib_port_state", summary="IB port 1 down")
    other.finding("node-3", metric="pcie_replay_rate", summary="PCIe replays")
    other.now += 1600
    answer(other, diag, verdict="pass")
    assert other.engine.node_state("node-3") == "probation" and other.cmds("return_to_service", node="node-3")


def test_definitive_evidence_that_recurs_after_passing_diagnostics_sends_the_node_to_repair() -> None:
    """With ``definitive_return: diagnostics`` (the default sends it to repair at the first pass)."""
    w = World(config="safety: {max_quarantined_fraction: 0.1}\npolicy: {definitive_return: diagnostics}")
    w.dbe("node-4")
    w.advance(600)
    assert w.engine.node_state("node-4") == "probation"
    w.advance(10 * 86_400)  # past probation and the flap window: healthy, nothing else remembers it
    assert w.engine.node_state("node-4") == "healthy"
    w.dbe("node-4")
    w.advance(600)
    assert w.engine.node_state("node-4") == "repair_needed"
    assert len(w.cmds("return_to_service", node="node-4")) == 1
    (ticket,) = w.cmds("escalate", node="node-4")
    assert "definitive_recurrence_s" in ticket.reason
    # remembered while nothing else marks the record, forgotten once definitive_recurrence_s has passed
    kept = World(config="safety: {max_quarantined_fraction: 0.1}\npolicy: {definitive_return: diagnostics}")
    kept.dbe("node-4")
    kept.advance(10 * 86_400)
    assert kept.engine.state.nodes["node-4"].returned_signature
    kept.advance(21 * 86_400)  # no input meanwhile: the forgetting looks at it when its return expires
    assert "node-4" not in kept.engine.state.nodes
    off = World(config="safety: {max_quarantined_fraction: 0.1}\n"
                       "policy: {definitive_recurrence_s: 0, definitive_return: diagnostics}")
    off.dbe("node-4")
    off.advance(10 * 86_400)
    off.dbe("node-4")
    off.advance(600)
    assert off.engine.node_state("node-4") == "probation" and len(off.cmds("return_to_service", node="node-4")) == 2


def test_a_step_waiting_for_the_job_boundary_returns_the_node_once_the_job_ran_long_enough() -> None:
    w = World()
    w.place("ml/a", NODES)
    w.degradation("node-2")
    w.advance(600)
    w.degradation("node-2")  # the detector reasserts: a preventive isolation at the job boundary
    w.advance(60)
    assert [c.action for c in w.cmds(node="node-2")] == ["cordon", "taint"]
    w.advance(43_200)
    assert w.cmds("return_to_service", node="node-2") and w.engine.node_state("node-2") == "probation"
    assert not w.cmds("run_diagnostics", node="node-2")
    # the evidence still reported while it waits: a human is told, the node stays held
    held = World()
    held.place("ml/a", NODES)
    held.degradation("node-2")
    held.advance(600)
    held.degradation("node-2")
    for _ in range(80):
        held.advance(600)
        held.degradation("node-2")
    assert held.engine.node_state("node-2") == "quarantined" and not held.cmds("return_to_service", node="node-2")
    assert any("still reported" in c.reason for c in held.cmds("escalate", node="node-2"))


def test_a_node_back_after_passing_diagnostics_is_no_longer_suspected_by_its_incident() -> None:
    w = World(config="safety: {max_quarantined_fraction: 0.1}\npolicy: {definitive_return: diagnostics}")
    w.place("ml/a", NODES)
    w.dbe("node-4")
    w.advance(60)
    assert w.engine.node_state("node-4") == "probation"
    inc = next(i for i in w.incidents if any(s.name.startswith("node-4") for s in i.suspects))
    assert w.engine.triage.state.incidents[inc.id].status in ("open", "mitigating")  # its job has not recovered
    assert "node-4" not in w.engine.suspected_nodes()
    w.dbe("node-4")  # new evidence after the return: suspected again
    assert "node-4" in w.engine.suspected_nodes()


def test_a_retry_in_place_excludes_the_nodes_fleetmedic_suspects_when_it_is_due() -> None:
    w = World(auto_execute=False)
    w.place("ml/a", NODES)
    w.finding("node-12", metric="ib_port_state")  # being isolated: suspected
    w.fail("ml/a", "node-5", [SEGV])
    w.advance(200)
    (retry,) = w.cmds("retry_in_place", job="ml/a")
    assert "node-12" in retry.exclude_nodes and "node-5" not in retry.exclude_nodes
    # its pods wait: a node suspected since is added to their exclusions, never a new restart
    out = w.finding("node-20", metric="ib_port_state")
    follow = [c for c in out.commands if c.job == "ml/a"]
    assert [(c.action, c.params.get("only_if_waiting")) for c in follow] == [("restart_job", "true")]
    assert {"node-12", "node-20"} <= set(follow[0].exclude_nodes)


def test_a_restart_waiting_for_capacity_learns_a_new_suspect_in_the_same_decision() -> None:
    w = World(auto_execute=False)
    w.place("ml/a", NODES)
    w.dbe("node-3")
    w.now += 60
    w._take(w.engine.tick(w.now))
    assert w.cmds("restart_job", job="ml/a")  # not placed yet: it waits for capacity
    out = w.finding("node-12", metric="ib_port_state")
    follow = [c for c in out.commands if c.job == "ml/a" and c.params.get("only_if_waiting") == "true"]
    assert follow and "node-12" in follow[0].exclude_nodes


def test_a_decision_widens_waiting_restarts_before_it_restarts_a_job_off_a_suspect() -> None:
    """Restarting a job frees its nodes at once; a restart waiting for capacity must already exclude
    the suspect among them, or the scheduler refills it with the waiting job."""
    w = World(auto_execute=False)
    w.place("ml/a", NODES)
    w.place("ml/b", [f"node-{i}" for i in range(8, 16)])
    w.dbe("node-3")
    w.advance(60)
    assert w.cmds("restart_job", job="ml/a")  # never placed: it waits for capacity
    w.fail("ml/b", "node-9", ["RuntimeError: CUDA error: uncorrectable ECC error encountered"])
    out = w.advance(60)
    order = [(c.action, c.job, c.params.get("only_if_waiting", "")) for c in out.commands if c.job]
    follow = order.index(("restart_job", "ml/a", "true"))
    assert follow < order.index(("restart_job", "ml/b", "")), order
