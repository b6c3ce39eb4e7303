"""Safety that never abandons a dead node: kinds of isolation (definitive ones never wait
on a budget), a breaker that trips on correlated suspicion (one signature, one failure domain, a
share of the fleet) and not on distinct faults, refused nodes that stay suspect (never healthy by a
timeout), the fleet sized from what is seen, deleted nodes that release their hold. Engine scenarios
with the shipped defaults, and property tests over random event orders."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import hypothesis
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetmedic.config import SafetySettings, Settings
from fleetmedic.records import RemediationResult
from fleetmedic.remediation.engine import DecisionEngine
from fleetmedic.remediation.kinds import Isolation
from fleetmedic.remediation.safety import SafetyGate, allowance_table
from fleetmedic.remediation.topology import Topology
from fleetmedic.remediation.triage import finding_isolation
from tests.remediation.helpers_world import T0, World

DEFAULTS = "safety: {dry_run: false}"  # the shipped defaults (World's own default is a 10 % budget)
DOCS = Path(__file__).resolve().parents[2] / "docs" / "safety.md"


def isolated_fully(w: World, node: str) -> bool:
    return {"cordon", "taint", "drain"} <= {c.action for c in w.cmds(node=node)}


def hard_fault(w: World, kind: str, node: str) -> None:
    if kind == "gpu_lost":
        w.gpu_lost(node)
    elif kind == "dbe":
        w.dbe(node)
    elif kind == "row_remap":
        w.row_remap_failure(node)
    else:
        w.xid(node, int(kind.removeprefix("xid")))


# --- what each piece of evidence is -------------------------------------------------------------------

def test_the_evidence_decides_the_kind_of_isolation() -> None:
    w = World(n=8, auto_execute=False)
    kinds = {}
    for name, send in (("lost", lambda: w.gpu_lost("node-0")), ("dbe", lambda: w.dbe("node-1")),
                       ("remap", lambda: w.row_remap_failure("node-2")), ("xid79", lambda: w.xid("node-3", 79)),
                       ("xid48", lambda: w.xid("node-4", 48)), ("xid74", lambda: w.xid("node-5", 74)),
                       ("slow", lambda: w.degradation("node-6")),
                       ("thermal", lambda: w.finding("node-7", hint="isolate", metric="clocks_event_reasons")),
                       ("nvlink", lambda: w.finding("node-7", hint="isolate", metric="nvlink_links_down"))):
        before = w._fid
        send()
        f = next(f for n in w.engine.triage.state.findings.values() for f in n if f.id == f"f{before + 1}")
        kinds[name] = finding_isolation(f)
    assert kinds["lost"] == Isolation("definitive", "hard_rules:gpu_count", True)
    assert kinds["xid79"] == Isolation("definitive", "xid:79", True)
    assert {k for k, v in kinds.items() if v.kind == "definitive"} == {"lost", "dbe", "remap", "xid79", "xid48",
                                                                       "xid74"}
    assert {k for k, v in kinds.items() if v.device_gone} == {"lost", "xid79"}
    assert kinds["slow"].kind == kinds["thermal"].kind == "preventive"
    assert kinds["nvlink"].kind == "uncertain"


# --- distinct hard faults on a small fleet: every dead node isolated ------------------------------------

SPREAD = ["gpu_lost", "dbe", "row_remap", "xid95", "xid74"]


@pytest.mark.parametrize(("n", "faults"), [(16, 3), (16, 5), (32, 3), (32, 5)])
def test_distinct_hard_faults_at_once_on_a_small_fleet_are_all_isolated(n: int, faults: int) -> None:
    w = World(n=n, config=DEFAULTS, auto_execute=False)
    sick = [f"node-{i * (n // faults)}" for i in range(faults)]  # different nodes, racks of 4
    for kind, node in zip(SPREAD, sick, strict=False):
        hard_fault(w, kind, node)
    for node in sick:
        assert isolated_fully(w, node), (node, [a.explanation for a in w.decisions("blocked")])
    assert not w.engine.breaker_open and not w.decisions("blocked")
    r = w.engine.report(w.now)
    assert r["budget"]["definitive_held"] == faults and r["budget"]["held"] == 0  # none of them uses the budget
    assert r["budget"]["definitive_isolations"] == faults
    # the budget is still whole for what is preventive or uncertain (once the breaker's window passed:
    # a sixth candidate within it reaches the fleet-share level of small fleets)
    w.advance(310)
    w.finding(f"node-{n - 1}", hint="reset_gpu", metric="x")
    assert isolated_fully(w, f"node-{n - 1}")


def test_a_32_node_fleet_without_a_topology_isolates_every_dead_gpu() -> None:
    """No topology given, three hard faults at once on 32 nodes: every dead GPU's node is isolated, none
    refused for a fleet size of 0, and none returns to healthy 640 s later."""
    engine = DecisionEngine(Settings())
    nodes = [f"gpu-node-{i:04d}" for i in range(32)]
    engine.nodes_seen(nodes, T0)  # telemetry: stage 1's summaries
    assert engine.fleet_size == 32
    w = World(n=32)
    w.engine, w.settings = engine, engine.settings
    w.gpu_lost(nodes[3])
    w.dbe(nodes[12])
    w.row_remap_failure(nodes[25])
    for node in (nodes[3], nodes[12], nodes[25]):
        assert isolated_fully(w, node)
    w.advance(700)
    assert not engine.nodes_in("healthy", "suspect") and not w.decisions("blocked")


def test_faults_spread_over_fifty_minutes_each_isolate_too() -> None:
    w = World(n=32, config=DEFAULTS, verdicts={f"node-{i}": "fail" for i in (1, 9, 17, 25)})
    for i, kind in zip((1, 9, 17, 25), ("gpu_lost", "dbe", "row_remap", "xid48"), strict=True):
        hard_fault(w, kind, f"node-{i}")
        assert isolated_fully(w, f"node-{i}")
        w.advance(1000)
    assert w.engine.report(w.now)["budget"]["held"] == 0


# --- the breaker: correlated suspicion ----------------------------------------------------------------

def storm_nodes(n: int, share: float) -> list[str]:
    k = round(n * share)
    return [f"node-{(i * 7) % n}" for i in range(k)]  # spread over racks: only the signature is shared


def test_one_degradation_signature_on_40_percent_of_the_fleet_trips_the_breaker_and_isolates_nothing() -> None:
    w = World(n=32, config=DEFAULTS, auto_execute=False)
    storm = storm_nodes(32, 0.4)
    for _ in range(2):  # degradation acts once confirmed: seen twice, 300 s apart
        for node in storm:
            w.degradation(node, metric="sm_clock")
        w.advance(310)
    assert w.engine.breaker_open
    (trip,) = w.decisions("breaker_tripped")
    assert "same evidence (gpu_baseline:sm_clock)" in trip.explanation
    assert not w.cmds("cordon") and not w.cmds("drain")  # nothing preventive happened
    assert set(w.engine.nodes_in("suspect")) == set(storm)
    w.advance(3600)  # waits for an operator: nobody is dropped back to healthy
    assert set(w.engine.nodes_in("suspect")) == set(storm) and not w.cmds("cordon")
    assert all(w.engine.state.nodes[n].blocked_reason == "breaker_open" for n in storm)
    w._take(w.engine.resume_breaker(actor="carol", reason="exporter fixed", now=w.now))
    w.advance(20)
    gate = w.engine.gate
    budget = gate.preventive_limit(32, gate.max_held_distinct(32))  # one signature: below its breaker level
    assert 0 < len(w.isolated()) <= budget  # after the resume: within the budget, the rest still wait


def test_a_definitive_storm_trips_on_its_signature_and_the_rest_wait_for_an_operator() -> None:
    w = World(n=32, config=DEFAULTS)
    storm = storm_nodes(32, 0.4)
    for node in storm:
        w.xid(node, 48)
    level = w.engine.gate.breaker.signature_level(32)
    assert w.engine.breaker_open and len(w.isolated()) == level - 1  # isolated before the trip, at once
    waiting = [n for n in storm if n not in w.isolated()]
    assert all(w.engine.state.nodes[n].state == "suspect" for n in waiting)
    r = w.engine.report(w.now + 600)
    assert r["refused_now"]["definitive"] == len(waiting)
    assert r["node_time"]["refused_definitive_s"] == pytest.approx(600 * len(waiting))


def test_lost_devices_pass_an_open_breaker_unless_it_tripped_on_their_evidence_across_domains() -> None:
    w = World(n=32, config=DEFAULTS)
    for node in ("node-4", "node-5", "node-6"):  # a rack's power fails: three of its four nodes at once
        w.xid(node, 48)
    assert w.engine.breaker_open
    assert "rack r1" in w.decisions("breaker_tripped")[0].explanation
    w.gpu_lost("node-20")  # elsewhere, a GPU falls off the bus: its device is gone, it passes
    assert isolated_fully(w, "node-20")
    w.dbe("node-28")  # definitive, its device not gone, outside the tripped rack: the breaker does not stop it
    assert isolated_fully(w, "node-28")
    w.dbe("node-7")  # the tripped rack's fourth node: waits for the operator
    assert not w.cmds("cordon", node="node-7") and w.engine.node_state("node-7") == "suspect"
    everything = World(n=32, config="safety: {breaker: {scope: all}}")
    for node in ("node-4", "node-5", "node-6"):
        everything.xid(node, 48)
    everything.gpu_lost("node-20")
    assert isolated_fully(everything, "node-20")
    everything.dbe("node-28")  # with scope all, definitive evidence whose device is not gone waits
    assert not everything.cmds("cordon", node="node-28")
    assert everything.engine.node_state("node-28") == "suspect"
    w2 = World(n=32, config=DEFAULTS)
    for node in ("node-0", "node-9", "node-18", "node-27"):  # one signature everywhere: likelier the telemetry
        w2.gpu_lost(node)
    assert w2.engine.breaker_open
    assert not w2.cmds("cordon", node="node-27") and w2.engine.node_state("node-27") == "suspect"
    off = World(n=32, config="safety: {breaker: {pass_lost_devices: false, scope: all}}")
    for node in ("node-4", "node-5", "node-6"):
        off.xid(node, 48)
    off.gpu_lost("node-20")
    assert not off.cmds("cordon", node="node-20")


def test_distinct_faults_on_different_domains_do_not_trip_it_at_small_shares() -> None:
    w = World(n=64, config=DEFAULTS)
    for i, kind in enumerate(SPREAD):
        hard_fault(w, kind, f"node-{i * 12}")
    assert not w.engine.breaker_open


# --- refused nodes stay suspect; the clock runs ---------------------------------------------------------

def test_a_refused_node_stays_suspect_is_escalated_again_and_its_clock_runs() -> None:
    w = World(n=16, config="safety: {max_quarantined_count: 0, retry_blocked_s: 600}")
    w.finding("node-3", hint="reset_gpu", metric="x")  # uncertain: budgeted, and the budget is 0
    assert w.engine.node_state("node-3") == "suspect"
    w.advance(3 * 3600)
    assert w.engine.node_state("node-3") == "suspect"
    assert not [a for a in w.audit if a.state_from == "suspect" and a.state_to == "healthy"]
    assert [c.params["reason"] for c in w.cmds("escalate", node="node-3")] == ["blocked", "refused_long"]
    r = w.engine.report(w.now)
    assert r["refused_now"]["uncertain"] == 1
    assert r["node_time"]["refused_uncertain_s"] == pytest.approx(3 * 3600, abs=20)
    w._take(w.engine.clear_node("node-3", actor="dave", reason="checked by hand", now=w.now))
    assert w.engine.report(w.now + 100)["refused_now"]["uncertain"] == 0


# --- the fleet: from what is seen; deleted nodes release their hold --------------------------------------

def test_without_a_node_list_or_topology_the_fleet_is_what_telemetry_shows() -> None:
    engine = DecisionEngine(Settings())
    assert engine.fleet_size == 0
    engine.nodes_seen([f"n{i}" for i in range(40)], T0)
    assert engine.fleet_size == 40 and engine.fleet_source == "telemetry"
    assert engine.gate.max_held(engine.fleet_size) == 2
    assert engine.report(T0)["budget"]["fleet_size"] == 40
    restored = DecisionEngine.from_bytes(engine.to_bytes(), engine.settings)
    assert restored.fleet_size == 40
    engine.tick(T0 + 1000)
    engine.nodes_seen([f"n{i}" for i in range(10)], T0 + 1000)
    engine.tick(T0 + Settings().safety.fleet_forget_after_s + 10)  # the others fell silent
    assert engine.fleet_size == 10


def test_the_node_watch_list_is_the_fleet_whatever_telemetry_or_a_topology_name() -> None:
    engine = DecisionEngine(Settings(), Topology.from_dict({f"n{i}": {"rack": "r0"} for i in range(64)}))
    engine.nodes_seen([f"n{i}" for i in range(40)], T0)
    for i in range(30, 50):  # the node watch lists 20 nodes (overlapping telemetry)
        engine.node_observed(f"n{i}", cordoned=False, cordoned_by_fleetmedic=False, now=T0)
    assert engine.fleet_size == 20 and engine.fleet_source == "cluster"
    assert engine.report(T0)["budget"]["fleet_source"] == "cluster"
    assert DecisionEngine.from_bytes(engine.to_bytes(), engine.settings).fleet_size == 20
    engine.node_removed("n30", T0 + 1)
    assert engine.fleet_size == 19


def test_a_given_topology_is_the_fleet_without_a_node_watch() -> None:
    topo = Topology.from_dict({f"n{i}": {"rack": f"r{i // 4}"} for i in range(32)})
    engine = DecisionEngine(Settings(), topo)
    engine.nodes_seen([f"n{i}" for i in range(40)], T0)
    assert engine.fleet_size == 32 and engine.fleet_source == "topology"
    # a cordon the executor saw is not the node list: it changes neither the fleet nor the topology
    engine.node_observed("elsewhere", cordoned=True, cordoned_by_fleetmedic=False, now=T0, listed=False)
    assert engine.fleet_size == 32 and "elsewhere" not in engine.topology


def test_two_thousand_ghost_names_in_telemetry_leave_a_32_node_budget_unchanged() -> None:
    """Telemetry is unauthenticated: names only it carries must not grow the budget (they took
    ``max_held`` from 1 to 64 and 16 of 32 real nodes were then held)."""
    w = World(n=32, config=DEFAULTS)
    before = (w.engine.fleet_size, w.engine.gate.max_held(w.engine.fleet_size))
    w.engine.nodes_seen([f"ghost-{i}" for i in range(2000)], w.now)
    assert (w.engine.fleet_size, w.engine.gate.max_held(w.engine.fleet_size)) == before == (32, 1)
    for i in range(0, 32, 4):  # one degradation per rack, minutes apart: none of them confirmed yet
        w.finding(f"node-{i}", hint="reset_gpu", metric="x")
        w.advance(700)
    assert len(w.engine.gate.budgeted()) <= w.engine.gate.max_held_distinct(32) == 5


def test_a_deleted_node_releases_its_hold_and_leaves_the_fleet() -> None:
    w = World(n=16, config="safety: {max_quarantined_count: 1}", auto_execute=False)  # budget: 1 budgeted node
    w.finding("node-3", hint="reset_gpu", metric="x")
    w.gpu_lost("node-9")
    w.finding("node-5", hint="reset_gpu", metric="x")
    assert w.engine.node_state("node-5") == "suspect"  # the budget is full
    assert w.engine.gate.holds("node-3") and w.engine.gate.holds("node-9")
    for node in ("node-3", "node-9"):
        out = w._take(w.engine.node_removed(node, w.now))
        assert "released its" in out.audit[0].explanation
    assert not w.engine.gate.holds("node-3") and not w.engine.gate.holds("node-9")
    assert "node-3" not in w.engine.state.nodes and w.engine.fleet_size == 14
    assert w.engine.report(w.now)["budget"]["held"] == 0
    w.advance(20)
    assert w.engine.node_state("node-5") == "quarantined"  # the released budget goes to the one waiting


# --- the defaults, documented ------------------------------------------------------------------------

def test_the_docs_table_of_what_the_defaults_allow_is_the_computed_one() -> None:
    text = DOCS.read_text(encoding="utf-8")
    table = re.search(r"<!-- allowance table.*?-->\n(.*?)<!-- end -->", text, re.S)
    assert table is not None, "docs/safety.md lost its generated table"
    assert table.group(1) == allowance_table(SafetySettings()), (
        "docs/safety.md is stale: paste allowance_table(SafetySettings()) between the markers")


def test_the_defaults_isolate_distinct_dead_nodes_from_8_to_10000_nodes() -> None:
    gate = SafetyGate(SafetySettings())
    for n in (8, 16, 32, 64, 512, 4096, 10_000):
        a = gate.allowance(n)
        assert a.trip_fleet >= min(6, n) and a.trip_signature >= 3  # 5 distinct faults never trip it
        assert a.max_held >= 1 and a.trip_signature <= max(4, n // 100)  # a storm is caught under 1 %


# --- property tests ----------------------------------------------------------------------------------

FLEET = 24
KINDS = ("definitive", "lost", "preventive", "uncertain")
EVENT = st.one_of(
    st.tuples(st.just("fault"), st.integers(0, FLEET - 1), st.sampled_from(KINDS)),
    st.tuples(st.just("storm"), st.integers(0, FLEET - 1), st.integers(3, 10), st.sampled_from(KINDS)),
    st.tuples(st.just("wait"), st.integers(1, 900)),
    st.tuples(st.just("result"), st.integers(0, 10_000), st.sampled_from(["pass", "fail"])),
    st.tuples(st.just("clear"), st.integers(0, FLEET - 1)),
    st.tuples(st.just("resume"),),
    st.tuples(st.just("delete"), st.integers(0, FLEET - 1)),
)


def _send(w: World, node: str, kind: str) -> None:
    if kind == "definitive":
        w.dbe(node)
    elif kind == "lost":
        w.gpu_lost(node)
    elif kind == "preventive":
        w.degradation(node, severity="critical")  # critical degradation: isolates once confirmed
    else:
        w.finding(node, hint="reset_gpu", metric="x")


@settings(max_examples=120, deadline=None)
@given(events=st.lists(EVENT, min_size=3, max_size=40))
def test_budgets_bound_preventive_isolation_never_definitive_and_no_refusal_times_out(
        events: list[tuple[Any, ...]]) -> None:
    w = World(n=FLEET, auto_execute=False, config="""
safety:
  max_quarantined_fraction: 0.25
  max_new_isolations: 3
  preventive_share: 0.5
  settle_s: 30
  retry_blocked_s: 300
""")
    gate, s = w.engine.gate, w.settings.safety
    pending: list[Any] = []
    cleared: set[str] = set()
    for ev in events:
        before = len(w.commands)
        if ev[0] == "fault":
            was_open, node = w.engine.breaker_open, f"node-{ev[1]}"
            _send(w, node, ev[2])
            if ev[2] in ("definitive", "lost") and not was_open and node not in w.engine.state.muted:
                # definitive isolation never waits on a budget: held at once unless the breaker opened now
                assert gate.holds(node) or w.engine.breaker_open or w.engine.node_state(node) in (
                    "repair_needed", "quarantined", "diagnosing"), w.decisions("blocked")[-1:]
        elif ev[0] == "storm":
            for k in range(ev[2]):
                _send(w, f"node-{(ev[1] + k * 5) % FLEET}", ev[3])
        elif ev[0] == "wait":
            w.advance(ev[1])
        elif ev[0] == "result" and pending:
            c = pending.pop(ev[1] % len(pending))
            w._take(w.engine.on_result(RemediationResult(command_id=c.id, action=c.action, outcome="applied",
                                                         ts=w.now, node=c.node, details={"verdict": ev[2]}), w.now))
        elif ev[0] == "clear":
            cleared.add(f"node-{ev[1]}")
            w._take(w.engine.clear_node(f"node-{ev[1]}", actor="prop", reason="test", now=w.now))
        elif ev[0] == "resume":
            w._take(w.engine.resume_breaker(actor="prop", reason="test", now=w.now))
        elif ev[0] == "delete":
            w._take(w.engine.node_removed(f"node-{ev[1]}", w.now))
        pending += [c for c in w.commands[before:] if c.track == "node" and c.action != "escalate"]
        preventive = [n for n in gate.state.preventive if n in gate.state.held]
        assert len(preventive) <= gate.preventive_limit(FLEET)
        assert len(gate.budgeted()) <= gate.max_held(FLEET)
        assert len(gate.state.isolations) <= s.max_new_isolations
    dropped = [a for a in w.audit if a.state_from == "suspect" and a.state_to == "healthy"]
    assert not dropped, "a refused node went back to healthy by a timeout"
    hypothesis.event(f"definitive isolations: {min(gate.state.definitive_isolations, 3)}")
    hypothesis.event(f"breaker trips: {min(gate.breaker.state.trips, 2)}")
    hypothesis.event(f"refused: {bool(w.decisions('blocked'))}")


def test_a_snapshot_from_before_the_kinds_still_loads() -> None:
    """EngineState only gained fields with defaults (STATE_VERSION unchanged): an older snapshot, without
    them, restores; its holds count against the budget (uncertain or preventive), as they did."""
    import msgspec

    w = World(n=16, auto_execute=False)
    w.finding("node-3", hint="reset_gpu", metric="x")
    w.gpu_lost("node-7")
    old = msgspec.to_builtins(w.engine.state)
    del old["seen"]
    for key in ("definitive", "definitive_isolations"):
        del old["safety"][key]
    for key in ("signatures", "domains", "tripped_signatures", "tripped_domains"):
        del old["safety"]["breaker"][key]
    for key in ("refused_s", "refused_since"):
        del old["accounting"][key]
    for rec in old["nodes"].values():
        for key in ("isolation", "signature", "device_gone"):
            del rec[key]
    engine = DecisionEngine.from_bytes(msgspec.msgpack.encode(old), w.settings)
    assert engine.gate.holds("node-7") and engine.gate.kind_held("node-7") == "uncertain"
    assert engine.report(w.now)["budget"]["held"] == 2


# --- the budget bounds unconfirmed holds; small fleets agree with the breaker ---------------------------

def test_a_hold_confirmed_by_failed_diagnostics_leaves_the_budget_and_the_next_is_isolated() -> None:
    w = World(n=32, config="safety: {max_quarantined_count: 1}", verdicts={"node-3": "fail"})
    w.finding("node-3", hint="reset_gpu", metric="x")  # budgeted; diagnostics fail: the fault is real
    assert w.engine.gate.holds("node-3") and w.engine.gate.confirmed_held() == 1
    r = w.engine.report(w.now)["budget"]
    assert (r["held"], r["confirmed_held"]) == (0, 1)
    w.advance(700)  # past the rate window
    w.finding("node-9", hint="reset_gpu", metric="y")
    assert w.cmds("cordon", node="node-9") and not w.decisions("blocked")


def test_an_unconfirmed_hold_still_fills_the_budget() -> None:
    w = World(n=32, config="safety: {max_quarantined_count: 1}", auto_execute=False)
    w.finding("node-3", hint="reset_gpu", metric="x")
    w.finding("node-9", hint="reset_gpu", metric="y")
    assert w.engine.gate.holds("node-3") and w.engine.node_state("node-9") == "suspect"
    assert w.engine.gate.confirmed_held() == 0 and w.engine.report(w.now)["budget"]["held"] == 1


def test_distinct_degradations_on_a_32_node_fleet_are_all_isolated_with_the_defaults() -> None:
    """Three distinct signatures on three racks: below every breaker level, so all three are held,
    though 5 % of 32 is one node."""
    w = World(n=32, config=DEFAULTS, auto_execute=False)
    for node, metric in (("node-1", "pcie_replay_rate"), ("node-9", "sm_clock"), ("node-17", "ecc_sbe_rate")):
        for _ in range(2):  # a warning acts once confirmed: seen twice, 300 s apart
            w.degradation(node, metric=metric)
            w.advance(310)
    w.finding("node-25", hint="reset_gpu", metric="link_errors")  # and an uncertain one
    w.advance(120)
    held = {n for n in ("node-1", "node-9", "node-17", "node-25") if w.engine.gate.holds(n)}
    assert w.engine.gate.max_held(32) == 1 and not w.engine.breaker_open
    assert len(held) >= 3, [a.explanation for a in w.decisions("blocked")]
