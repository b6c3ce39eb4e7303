"""The decision engine as a whole: its state round-trips through bytes mid-scenario without
changing any later decision, replays give the same command ids, every command is explained by an
audit record, dry-run flags every command, the job track is never blocked by node budgets, and under
any order of events the isolation budgets and the breaker hold (property test)."""

from __future__ import annotations

from typing import Any

import hypothesis
import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetmedic.records import AuditRecord, RemediationResult, decode, encode
from fleetmedic.remediation.engine import DecisionEngine
from tests.remediation.helpers_world import ECC, OOM, World, timeout_line

NODES = [f"node-{i}" for i in range(8)]


def script(w: World, upto: int | None = None, start: int = 0) -> None:
    """A scenario in steps, so that it can be cut anywhere."""
    steps = [
        lambda: w.place("ml/a", NODES),
        lambda: w.place("ml/b", [f"node-{i}" for i in range(8, 16)]),
        lambda: w.finding("node-9", kind="degradation", severity="warning", detector="gpu_baseline"),
        lambda: [w.fail("ml/a", n, [ECC] if n == "node-3" else [timeout_line(i)]) for i, n in enumerate(NODES)],
        lambda: w.advance(60),
        lambda: w.fail("ml/b", "node-12", [OOM]),
        lambda: w.advance(200),
        lambda: w.progress("ml/a"),
        lambda: w.complete("ml/b"),
        lambda: w.advance(100),
    ]
    for step in steps[start:upto]:
        step()


def outputs(w: World) -> list[Any]:
    return [msgspec.to_builtins(x) for x in (*w.incidents, *w.commands, *w.audit)]


def test_replaying_the_same_inputs_gives_the_same_ids_and_records() -> None:
    a, b = World(), World()
    script(a)
    script(b)
    assert outputs(a) == outputs(b)
    assert len({c.id for c in a.commands}) == len(a.commands)


def test_state_round_trips_through_bytes_mid_scenario_without_changing_later_decisions() -> None:
    whole = World()
    script(whole)
    cut = World()
    script(cut, upto=5)
    data = cut.engine.to_bytes()
    cut.engine = DecisionEngine.from_bytes(data, cut.settings)
    assert cut.engine.to_bytes() == data
    script(cut, start=5)
    assert outputs(cut) == outputs(whole)


def test_every_command_is_explained_by_an_audit_record() -> None:
    w = World(verdicts={"node-3": "fail"})
    script(w)
    named = {cid for a in w.audit for cid in a.command_ids}
    assert {c.id for c in w.commands} <= named
    assert all(a.explanation for a in w.audit)


def test_audit_records_and_commands_are_valid_wire_records() -> None:
    w = World()
    script(w)
    for record in (*w.audit, *w.commands, *w.incidents):
        assert decode(type(record), encode(record)) == record


def test_dry_run_marks_every_command_and_audit_record() -> None:
    w = World(config="safety: {dry_run: true}")
    script(w)
    assert w.commands and all(c.dry_run for c in w.commands)
    assert all(a.dry_run for a in w.audit)


def test_the_job_track_is_never_blocked_by_node_budgets() -> None:
    w = World(config="safety: {max_quarantined_count: 0}")
    w.place("ml/a", NODES)
    w.finding("node-3", kind="hard_fault", severity="critical", hint="isolate")
    assert w.cmds("restart_job", job="ml/a")[0].exclude_nodes == ["node-3"]
    assert not w.cmds("cordon")
    blocked = w.decisions("blocked")
    assert blocked and blocked[0].budget is not None and blocked[0].budget.max_held == 0
    assert "max_quarantined_count 0" in blocked[0].explanation
    assert w.cmds("escalate", node="node-3")
    assert w.engine.node_state("node-3") == "suspect"


def test_a_refusal_on_a_full_budget_stands_at_every_tick_until_a_hold_is_released() -> None:
    w = World(auto_execute=False, config="safety: {max_quarantined_fraction: 0.04}")  # a budget of 1 node
    for n in (3, 12, 20, 29):  # one a rack (beyond the budget, distinct evidence may use a little more)
        w.finding(f"node-{n}", kind="hard_fault", severity="critical", hint="isolate")
        w.advance(600)  # outside one another's isolation window
    assert w.engine.node_state("node-29") == "suspect" and not w.cmds("cordon", node="node-29")
    assert "max_quarantined" in w.decisions("blocked")[-1].explanation
    w.advance(300)  # retried at every tick, refused on the same holds
    assert w.engine.node_state("node-29") == "suspect" and not w.cmds("cordon", node="node-29")
    w._take(w.engine.clear_node("node-3", actor="oncall", reason="vouched for", now=w.now))
    w.advance(10)
    assert w.engine.node_state("node-29") == "quarantined" and w.cmds("cordon", node="node-29")
    assert any("budget available again" in a.explanation for a in w.audit)


def test_a_budget_refusal_is_retried_and_never_dropped_by_a_timeout() -> None:
    def blocked_world(window: int, retry: int) -> World:
        w = World(auto_execute=False, config=f"safety: {{max_new_isolations: 1, isolation_window_s: {window}, "
                                             f"retry_blocked_s: {retry}, max_quarantined_fraction: 0.5}}")
        w.finding("node-3", kind="hard_fault", severity="critical", hint="isolate")
        w.finding("node-20", kind="hard_fault", severity="critical", hint="isolate")
        assert w.engine.node_state("node-20") == "suspect" and not w.cmds("cordon", node="node-20")
        w.advance(120)
        return w

    fresh = blocked_world(window=100, retry=600)
    assert fresh.engine.node_state("node-20") == "quarantined"
    assert any("budget available again" in a.explanation for a in fresh.audit)
    stale = blocked_world(window=1000, retry=100)
    # refused longer than retry_blocked_s: still suspect (never healthy by a timeout), escalated once more
    assert stale.engine.node_state("node-20") == "suspect" and not stale.cmds("cordon", node="node-20")
    assert any("stays suspect" in a.explanation for a in stale.decisions("escalated"))
    assert [c.params["reason"] for c in stale.cmds("escalate", node="node-20")] == ["blocked", "refused_long"]
    stale.advance(900)  # the window slid on: the refused isolation proceeds at last
    assert stale.engine.node_state("node-20") == "quarantined" and stale.cmds("cordon", node="node-20")


def test_results_for_unknown_commands_are_ignored() -> None:
    w = World()
    out = w.engine.on_result(RemediationResult(command_id="nope", action="cordon", outcome="applied", ts=w.now),
                             w.now)
    assert not out.commands


def test_time_never_runs_backwards_inside_the_engine() -> None:
    w = World()
    w.engine.tick(w.now + 100)
    out = w.engine.tick(w.now)  # an older timestamp is treated as "now"
    assert w.engine.state.clock == w.now + 100 and not out.commands


def test_the_report_has_separate_denominators_and_the_budget() -> None:
    w = World()
    script(w)
    r = w.engine.report(w.now)
    assert r["job_failures"]["attempts"] >= 2 and r["node_failures"]["node_days"] > 0
    assert set(r["mttr_s"]) == {"detect", "isolate", "wait_for_capacity", "restore", "first_good_step"}
    assert r["budget"]["fleet_size"] == 32


# --- property test: budgets and breaker under any event order ------------------------------------------

FLEET = 24
LINES = [[ECC], [OOM], [timeout_line(0)], ["KeyError: 'x'"]]

event = st.one_of(
    st.tuples(st.just("hard"), st.integers(0, FLEET - 1)),
    st.tuples(st.just("degrade"), st.integers(0, FLEET - 1)),
    st.tuples(st.just("net"), st.integers(0, FLEET - 1)),
    st.tuples(st.just("fail"), st.integers(0, 2), st.integers(0, 7), st.integers(0, len(LINES) - 1)),
    st.tuples(st.just("result"), st.integers(0, 10_000), st.sampled_from(["applied", "failed", "skipped"])),
    st.tuples(st.just("observe"), st.integers(0, FLEET - 1), st.booleans(), st.booleans()),
    st.tuples(st.just("wait"), st.integers(1, 700)),
    st.tuples(st.just("clear"), st.integers(0, FLEET - 1)),
    st.tuples(st.just("storm"), st.integers(0, FLEET - 1), st.integers(3, 12)),
)


@settings(max_examples=200, deadline=None)
@given(events=st.lists(event, min_size=5, max_size=60), scope=st.sampled_from(["evidence", "all"]))
def test_no_event_order_exceeds_the_budgets_or_isolates_through_an_open_breaker(events: list[tuple[Any, ...]],
                                                                                 scope: str) -> None:
    """With ``scope: all`` nothing but a lost device is isolated while the breaker is open; with
    ``scope: evidence`` an isolation while it is open is a lost device or says why its evidence is
    outside what the breaker stops (which the gate's own property test checks against its counts)."""
    w = World(n=FLEET, auto_execute=False, config=f"""
safety:
  max_quarantined_count: 5
  max_quarantined_fraction: 0.5
  max_new_isolations: 3
  isolation_window_s: 600
  max_per_rack: 2
  max_per_switch: 3
  breaker: {{trip_suspect_fraction: 0.25, trip_min_nodes: 3, window_s: 300, scope: {scope}}}
""")
    for j in range(3):
        w.place(f"ml/j{j}", [f"node-{(j * 8 + i) % FLEET}" for i in range(8)])
    s = w.settings.safety
    starts: list[float] = []
    pending: list[Any] = []
    for ev in events:
        before = len(w.commands)
        was_open = w.engine.breaker_open
        kind = ev[0]
        if kind == "hard":
            w.finding(f"node-{ev[1]}", kind="hard_fault", severity="critical", hint="isolate")
        elif kind == "degrade":
            w.finding(f"node-{ev[1]}", kind="degradation", severity="warning", detector="gpu_baseline")
        elif kind == "net":
            w.finding(f"node-{ev[1]}", kind="network", severity="critical", detector="ib_ports", port="p1")
        elif kind == "fail":
            job = f"ml/j{ev[1]}"
            w.fail(job, w.placements[job][ev[2]], LINES[ev[3]])
        elif kind == "result" and pending:
            c = pending.pop(ev[1] % len(pending))
            w._take(w.engine.on_result(RemediationResult(command_id=c.id, action=c.action, outcome=ev[2], ts=w.now,
                                                         node=c.node, details={"verdict": "pass"}), w.now))
        elif kind == "observe":
            w.observe(f"node-{ev[1]}", cordoned=ev[2], by_fleetmedic=ev[3])
        elif kind == "wait":
            w.advance(ev[1])
        elif kind == "storm":  # many nodes look bad at once
            for k in range(ev[2]):
                w.finding(f"node-{(ev[1] + k) % FLEET}", kind="hard_fault", severity="critical", hint="reset_gpu")
        elif kind == "clear":
            w._take(w.engine.clear_node(f"node-{ev[1]}", actor="prop", reason="test", now=w.now))
        new = w.commands[before:]
        pending += [c for c in new if c.track == "node" and c.action != "escalate"]
        firsts = [c for c in new if c.action == "cordon" and c.id.endswith(".1") and "/e" in c.id
                  and c.id.rsplit("/", 1)[1].split(".")[1] == "1"]
        gate = w.engine.gate
        # definitive isolations (here: an uncorrectable-ECC log line) use no budget
        starts += [c.issued_at for c in firsts if gate.kind_held(c.node) != "definitive"]
        held = set(gate.budgeted())
        topo = w.topology
        assert len(held) <= w.engine.gate.max_held(FLEET)
        assert sum(1 for t in starts if t > w.now - s.isolation_window_s) <= s.max_new_isolations
        for rack in {topo.rack_of(n) for n in held}:
            assert sum(1 for n in held if topo.rack_of(n) == rack) <= s.max_per_rack
        for leaf in {topo.leaf_of(n) for n in held}:
            assert sum(1 for n in held if topo.leaf_of(n) == leaf) <= s.max_per_switch
        for c in firsts:
            assert gate.holds(c.node), "a cordon was issued for a node the gate does not count"
            if not was_open or w.engine.state.nodes[c.node].device_gone:
                continue
            assert scope == "evidence", "a new isolation was issued while the breaker was open on all isolation"
            why = " ".join(a.explanation for a in w.audit if c.id in a.command_ids)
            assert "outside it" in why, f"a new isolation through the open breaker without saying why: {why}"
    audited = {cid for a in w.audit for cid in a.command_ids}
    assert {c.id for c in w.commands} <= audited
    hypothesis.event(f"isolations: {min(len(starts), 4)}")
    hypothesis.event(f"breaker open: {w.engine.breaker_open}")
    hypothesis.event(f"blocked: {bool(w.decisions('blocked'))}")


def test_audit_records_carry_the_budget_for_budget_decisions() -> None:
    w = World()
    w.finding("node-3", kind="hard_fault", severity="critical", hint="isolate")
    with_budget = [a for a in w.audit if a.budget is not None]
    assert with_budget and all(isinstance(a, AuditRecord) for a in with_budget)


def test_an_isolated_node_under_remediation_does_not_open_new_incidents() -> None:
    """Links going down while we reboot or diagnose a node are the echo of our own actions."""
    from tests.remediation.helpers_world import XID79, World

    w = World(n=16, auto_execute=False)
    w.place("ml/train", ["node-2", "node-3"])
    w.finding("node-2", hint="reboot_node", summary=XID79)
    for c in list(w.commands):  # the isolation is applied; diagnostics have not reported yet
        if c.action in ("cordon", "taint", "drain"):
            w._executed.add(c.id)
            w._apply(c)
    assert w.engine.node_state("node-2") in ("quarantined", "diagnosing")
    before = len({i.id for i in w.incidents})
    for _ in range(3):
        w.finding("node-2", kind="network", severity="critical", detector="link_state", gpu=None,
                  port="node-2/mlx5_0", summary="link node-2/mlx5_0 went down")
    assert len({i.id for i in w.incidents}) == before
    muted = [a for a in w.decisions("skipped") if "not triaged" in a.explanation]
    assert len(muted) == 1 and muted[0].node == "node-2"


def test_a_restart_excludes_every_node_fleetmedic_suspects_whatever_safety_decides() -> None:
    """Refused by the budget, settling, evidence still being confirmed: none of them may take the job."""
    w = World(config="safety: {max_quarantined_count: 0}", auto_execute=False)
    w.finding("node-20", kind="hard_fault", severity="critical", hint="isolate")  # refused: the budget is 0
    assert w.engine.node_state("node-20") == "suspect"
    w.degradation("node-21")  # a warning seen once: watched, not yet confirmed
    assert w.engine.node_state("node-21") == "healthy"
    w.place("ml/a", NODES)
    w.finding("node-3", kind="hard_fault", severity="critical", hint="isolate")
    (restart,) = w.cmds("restart_job", job="ml/a")
    assert {"node-3", "node-20", "node-21"} <= set(restart.exclude_nodes)
    assert w.engine.suspected_nodes() >= {"node-3", "node-20", "node-21"}
    assert not w.engine.suspected_nodes() & (set(NODES) - {"node-3"})


def test_a_restart_excludes_at_most_max_soft_exclusions_nodes_only_suspected_its_own_first() -> None:
    """Excluding every suspect of a large fleet can leave a large job no room: held nodes are
    unschedulable anyway and always excluded; of the nodes only suspected, the job's own come first."""
    w = World(n=64, config="policy: {max_soft_exclusions: 3}", auto_execute=False)
    w.place("ml/big", [f"node-{i}" for i in range(40)])
    for i in (30, 31, 50, 51, 52):  # warnings seen once: watched, not isolated, still schedulable
        w.degradation(f"node-{i}")
    w.finding("node-3", kind="hard_fault", severity="critical", hint="isolate")
    (restart,) = w.cmds("restart_job", job="ml/big")
    assert {"node-3", "node-30", "node-31"} <= set(restart.exclude_nodes)
    assert len(set(restart.exclude_nodes) & {"node-50", "node-51", "node-52"}) == 1
    assert w.engine.suspected_nodes() >= {"node-30", "node-31", "node-50", "node-51", "node-52"}


def test_a_waiting_restart_with_no_room_for_soft_exclusions_learns_only_nodes_held_or_worked_on_since() -> None:
    """With ``max_soft_exclusions`` used up, a node only suspected since is not added to a waiting
    restart's exclusions at the following ticks, and one fleetmedic takes out since is."""
    w = World(n=64, config="policy: {max_soft_exclusions: 1}", auto_execute=False)
    w.place("ml/a", [f"node-{i}" for i in range(40)])
    w.degradation("node-30")  # watched, not isolated: a soft exclusion
    w.finding("node-3", kind="hard_fault", severity="critical", hint="isolate")
    (restart,) = w.cmds("restart_job", job="ml/a")
    assert {"node-3", "node-30"} <= set(restart.exclude_nodes)
    w.degradation("node-31")  # only suspected: no room for it
    w.advance(10)
    w.advance(10)
    assert len(w.cmds("restart_job", job="ml/a")) == 1
    assert "node-31" in w.engine.suspected_nodes()
    w.finding("node-50", kind="hard_fault", severity="critical", hint="isolate")  # held since
    w.advance(10)
    (follow,) = [c for c in w.cmds("restart_job", job="ml/a") if c.id != restart.id]
    assert follow.params.get("only_if_waiting") == "true"
    assert "node-50" in follow.exclude_nodes and "node-31" not in follow.exclude_nodes


def test_a_restart_waiting_for_capacity_also_excludes_nodes_suspected_since() -> None:
    w = World(auto_execute=False)
    w.place("ml/a", NODES)
    w.finding("node-3", kind="hard_fault", severity="critical", hint="isolate")
    (restart,) = w.cmds("restart_job", job="ml/a")
    assert "node-20" not in restart.exclude_nodes
    w.degradation("node-20")  # suspected after the restart was issued, while the job waits
    w.advance(10)
    (follow,) = [c for c in w.cmds("restart_job", job="ml/a") if c.id != restart.id]
    assert follow.params.get("only_if_waiting") == "true"
    assert set(follow.exclude_nodes) >= {"node-3", "node-20"}
    w.advance(10)
    assert len(w.cmds("restart_job", job="ml/a")) == 2  # nothing new suspected: nothing more
    w.place("ml/a", [f"node-{i}" for i in range(8, 16)])  # placed: it no longer follows
    w.degradation("node-21")
    w.advance(10)
    assert len(w.cmds("restart_job", job="ml/a")) == 2
