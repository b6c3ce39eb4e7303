"""A node fleetmedic holds out of service mutes what is the echo of the work on it, but hardware
evidence of a further fault is triaged: its incident is published, a hold on weaker evidence is
upgraded, and a node waiting for repair has the new fault added to its repair ticket."""

from __future__ import annotations

from fleetmedic.records import RemediationCommand
from tests.remediation.helpers_world import World, answer

NODES = [f"node-{i}" for i in range(8)]


def power_brake(w: World, node: str) -> None:
    """A PSU fault as the GPU detector reports it: a node-level power brake."""
    w.finding(node, hint="isolate", detector="power_brake", gpu=None, metric="clocks_event_reasons", value=6.0,
              summary="HW power brake on 6 of 8 GPUs: power delivery (PSU) fault")


def in_repair(node: str) -> tuple[World, RemediationCommand]:
    """``node`` isolated for a link down, its diagnostics failed: it waits for repair."""
    w = World(verdicts={node: "fail"})
    w.finding(node, metric="ib_port_state", summary="IB port 1 down")
    w.advance(3600)  # diagnostics fail, the ladder's reset and reboot too
    assert w.engine.node_state(node) == "repair_needed", [c.action for c in w.cmds(node=node)]
    (ticket,) = [c for c in w.cmds("escalate", node=node) if c.params.get("escalation") == "repair"]
    w.auto_execute = False
    return w, ticket


def test_a_further_hardware_fault_on_a_node_awaiting_repair_is_published_and_added_to_its_ticket() -> None:
    w, first = in_repair("node-3")
    incidents = len(w.incidents)
    w.now += 3600
    power_brake(w, "node-3")
    inc = w.last_incident("node-3")
    assert len(w.incidents) > incidents and inc.incident_class == "hardware"
    tickets = w.cmds("escalate", node="node-3")
    assert len(tickets) == 2 and tickets[1].id != first.id
    added = tickets[1]
    assert added.params == {"reason": "evidence", "escalation": "repair"}
    assert inc.id in added.reason and "power_brake:clocks_event_reasons" in added.reason
    assert w.engine.node_state("node-3") == "repair_needed" and not w.cmds("uncordon", node="node-3")
    # the detector reasserting the same fault adds nothing more; a repair completed answers either ticket
    w.now += 600
    power_brake(w, "node-3")
    assert len(w.cmds("escalate", node="node-3")) == 2
    answer(w, added, repair="completed")
    assert w.engine.node_state("node-3") != "repair_needed"


def test_the_echo_of_the_work_on_a_held_node_stays_muted() -> None:
    w, _ = in_repair("node-3")
    incidents = len(w.incidents)
    w.now += 600
    w.finding("node-3", metric="ib_port_state", summary="IB port 1 down")  # what the hold rests on
    w.degradation("node-3", metric="sm_clock")  # not hardware evidence
    w.finding("node-3", kind="network", severity="warning", detector="port_detector", gpu=None, port="mlx5_0/1",
              metric="symbol_error_counter", summary="symbol errors")
    assert len(w.incidents) == incidents and len(w.cmds("escalate", node="node-3")) == 1
    assert any("findings are not triaged" in a.explanation for a in w.decisions("skipped"))


def test_a_gpu_reset_in_flight_explains_what_its_gpu_reports() -> None:
    w = World(auto_execute=False)
    w.xid("node-5", 48, gpu=2)  # a DBE XID: reset the GPU
    for action in ("cordon", "taint", "drain"):
        for c in w.cmds(action, node="node-5"):
            answer(w, c)
    assert w.cmds("reset_gpu", node="node-5"), [c.action for c in w.cmds(node="node-5")]
    incidents = len(w.incidents)
    w.now += 5
    w.gpu_lost("node-5", gpu=4)  # during the reset every GPU may drop out of the records
    assert len(w.incidents) == incidents


def test_a_definitive_fault_on_a_node_held_on_preventive_evidence_upgrades_its_hold() -> None:
    """A node cordoned for a slow GPU, its diagnostics waiting for the job's boundary, gets a DBE on
    another GPU: the hold now rests on the DBE, the job is drained at once, and passing diagnostics
    send the node to repair (``definitive_return: repair``) instead of back to service."""
    w = World()
    w.place("ml/a", NODES)
    w.degradation("node-2", gpu=1)
    w.advance(600)
    w.degradation("node-2", gpu=1)
    w.advance(60)
    assert [c.action for c in w.cmds(node="node-2")] == ["cordon", "taint"]
    assert w.engine.state.nodes["node-2"].isolation == "preventive"
    w.dbe("node-2", gpu=5)
    rec = w.engine.state.nodes["node-2"]
    assert rec.isolation == "definitive" and rec.signature == "hard_rules:ecc_dbe_vol_total"
    assert any(i.incident_class == "hardware" and "node-2/gpu5" in {s.name for s in i.suspects} for i in w.incidents)
    w.advance(600)
    assert w.cmds("drain", node="node-2") and w.cmds("run_diagnostics", node="node-2")
    assert w.engine.node_state("node-2") == "repair_needed"
    assert not w.cmds("return_to_service", node="node-2")
