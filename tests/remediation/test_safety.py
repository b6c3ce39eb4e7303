"""Safety as small pure objects: the isolation budget (count, fraction, rate, per rack, per switch),
cooldowns and the circuit breaker. Property tests drive random event orders and check the bounds
are never exceeded; unit tests check each refusal names its reason."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fleetmedic.config import BreakerSettings, SafetySettings
from fleetmedic.remediation.safety import CircuitBreaker, SafetyGate

FLEET = 40


def rack_of(node: str) -> str:
    return f"r{int(node.split('-')[1]) // 4}"


def leaf_of(node: str) -> str:
    return f"leaf-{int(node.split('-')[1]) // 8}"


def leaves_of(node: str) -> set[str]:
    return {leaf_of(node)}


def gate(**over: object) -> SafetyGate:
    base: dict[str, object] = dict(max_quarantined_fraction=0.25, max_quarantined_count=6, max_new_isolations=3,
                                   isolation_window_s=600.0, max_per_rack=2, max_per_switch=3, node_cooldown_s=900.0,
                                   breaker=BreakerSettings(trip_suspect_fraction=0.2, trip_min_nodes=3, window_s=300.0))
    base.update(over)
    return SafetyGate(SafetySettings(**base))  # type: ignore[arg-type]


def test_each_limit_refuses_with_its_own_reason() -> None:
    g = gate(max_new_isolations=10)
    for n in ("node-0", "node-1"):
        assert g.check_isolation(n, 0.0, FLEET, rack_of, leaves_of).allowed
        g.record_isolation(n, 0.0)
    assert g.check_isolation("node-2", 0.0, FLEET, rack_of, leaves_of).reason == "rack"
    g.record_isolation("node-4", 0.0)
    assert g.check_isolation("node-5", 0.0, FLEET, rack_of, leaves_of).reason == "switch"
    g2 = gate(max_new_isolations=1)
    g2.record_isolation("node-0", 0.0)
    verdict = g2.check_isolation("node-20", 10.0, FLEET, rack_of, leaves_of)
    assert verdict.reason == "rate" and "max_new_isolations 1" in verdict.explanation
    assert g2.check_isolation("node-20", 700.0, FLEET, rack_of, leaves_of).allowed  # the window slid on


def test_the_fraction_limit_allows_at_least_one_node_and_the_count_limit_zero_allows_none() -> None:
    assert gate(max_quarantined_fraction=0.01).max_held(10) == 1
    assert gate(max_quarantined_count=0).max_held(1000) == 0
    assert gate(max_quarantined_fraction=0.25, max_quarantined_count=100).max_held(40) == 10


def test_a_node_already_held_is_always_allowed() -> None:
    g = gate(max_quarantined_count=1)
    g.record_isolation("node-0", 0.0)
    assert g.check_isolation("node-0", 1.0, FLEET, rack_of, leaves_of).allowed
    assert g.check_isolation("node-9", 1.0, FLEET, rack_of, leaves_of).reason == "max_held"


def test_cooldown_holds_back_only_non_critical_isolation_after_a_return() -> None:
    g = gate()
    g.record_isolation("node-0", 0.0)
    g.release("node-0", 100.0)
    assert g.check_isolation("node-0", 200.0, FLEET, rack_of, leaves_of).reason == "cooldown"
    assert g.check_isolation("node-0", 200.0, FLEET, rack_of, leaves_of, critical=True).allowed
    assert g.check_isolation("node-0", 1001.0, FLEET, rack_of, leaves_of).allowed


def test_preventive_holds_leave_budget_for_hardware_faults() -> None:
    g = gate(max_new_isolations=10, max_per_rack=10, max_per_switch=10)  # budget: 6 nodes
    for i in range(3):
        assert g.check_isolation(f"node-{i * 10}", 0.0, FLEET, rack_of, leaves_of).allowed
        g.record_isolation(f"node-{i * 10}", 0.0, critical=False)
    assert g.check_isolation("node-31", 0.0, FLEET, rack_of, leaves_of).reason == "preventive_share"
    assert g.check_isolation("node-31", 0.0, FLEET, rack_of, leaves_of, critical=True).allowed
    g.record_isolation("node-0", 1.0, critical=True)  # its evidence turned critical: it no longer counts
    assert g.check_isolation("node-31", 1.0, FLEET, rack_of, leaves_of).allowed


def test_each_reset_or_reboot_runs_once_per_node_per_cooldown() -> None:
    g = gate()
    g.record_disruptive("node-0", "reset_gpu", 0.0)
    assert not g.check_disruptive("node-0", "reset_gpu", 10.0).allowed
    assert g.check_disruptive("node-0", "reboot_node", 10.0).allowed  # the ladder may climb at once
    assert g.check_disruptive("node-0", "reset_gpu", 901.0).allowed


def test_the_breaker_trips_on_mass_suspicion_and_refuses_isolation() -> None:
    g = gate()
    assert not g.breaker.note_suspicion("node-0", 0.0, FLEET)
    assert g.breaker.trip_level(FLEET) == 8
    tripped = [g.breaker.note_suspicion(f"node-{i}", float(i), FLEET) for i in range(1, 8)]
    assert tripped == [False] * 6 + [True]
    verdict = g.check_isolation("node-30", 10.0, FLEET, rack_of, leaves_of)
    assert verdict.reason == "breaker_open" and "8 nodes became suspect within 300s" in verdict.explanation


def test_suspicions_outside_the_window_do_not_count() -> None:
    b = CircuitBreaker(BreakerSettings(trip_suspect_fraction=0.1, trip_min_nodes=3, window_s=60.0))
    for i in range(10):
        assert not b.note_suspicion(f"node-{i}", i * 40.0, 20)  # never more than 2 in a 60 s window
    assert not b.state.open


def test_the_breaker_resumes_by_rule_only_after_the_delay_and_when_suspicion_dropped() -> None:
    b = CircuitBreaker(BreakerSettings(trip_suspect_fraction=0.1, trip_min_nodes=3, window_s=60.0, resume="auto",
                                       auto_resume_after_s=600.0))
    for i in range(3):
        b.note_suspicion(f"node-{i}", 0.0, 10)
    assert b.state.open
    assert not b.poll(300.0, 10)  # too early
    for i in range(3, 6):
        b.note_suspicion(f"node-{i}", 590.0, 10)
    assert not b.poll(600.0, 10)  # still a storm
    assert b.poll(700.0, 10)
    assert not b.state.open


def test_with_resume_by_command_only_a_command_closes_the_breaker() -> None:
    b = CircuitBreaker(BreakerSettings(trip_min_nodes=3, trip_suspect_fraction=0.0, resume="command"))
    for i in range(3):
        b.note_suspicion(f"node-{i}", 0.0, 10)
    assert b.state.open and not b.poll(1.0e6, 10)
    b.close()
    assert not b.state.open


# --- property tests ---------------------------------------------------------------------------------

ops = st.lists(
    st.one_of(
        st.tuples(st.just("isolate"), st.integers(0, FLEET - 1), st.booleans()),
        st.tuples(st.just("suspect"), st.integers(0, FLEET - 1), st.booleans()),
        st.tuples(st.just("release"), st.integers(0, FLEET - 1), st.booleans()),
        st.tuples(st.just("confirm"), st.integers(0, FLEET - 1), st.booleans()),
        st.tuples(st.just("wait"), st.integers(0, 400), st.booleans()),
        st.tuples(st.just("resume"), st.integers(0, 0), st.booleans()),
    ),
    max_size=120,
)


class RacksAndLeaves:
    """The failure domains of :func:`rack_of` and :func:`leaf_of` (4 nodes a rack, 8 a leaf)."""

    def domains_of(self, node: str) -> set[str]:
        return {f"rack:{rack_of(node)}", f"leaf:{leaf_of(node)}"}

    def domain_size(self, domain: str) -> int:
        return 4 if domain.startswith("rack:") else 8


DOMAINS = RacksAndLeaves()


def signature_of(node: str) -> str:
    return f"sig-{int(node.split('-')[1]) % 3}"  # three kinds of evidence across the fleet


@settings(max_examples=300, deadline=None)
@given(ops=ops, max_new=st.integers(0, 5), max_count=st.integers(0, 12), fraction=st.floats(0.0, 0.5),
       trip=st.integers(1, 12), sig_level=st.integers(1, 6), scope=st.sampled_from(["evidence", "all"]))
def test_no_event_order_exceeds_any_budget(ops: list[tuple[str, int, bool]], max_new: int, max_count: int,
                                           fraction: float, trip: int, sig_level: int, scope: str) -> None:
    g = gate(max_new_isolations=max_new, max_quarantined_count=max_count, max_quarantined_fraction=fraction,
             breaker=BreakerSettings(trip_suspect_fraction=0.0, trip_min_nodes=trip, signature_min_nodes=sig_level,
                                     window_s=300.0, scope=scope))  # type: ignore[arg-type]
    now = 0.0
    admitted: list[float] = []
    for op, arg, critical in ops:
        node = f"node-{arg}"
        if op == "wait":
            now += arg
            g.breaker.poll(now, FLEET)
        elif op == "release":
            g.release(node, now)
        elif op == "confirm":
            g.confirm(node)
        elif op == "resume":
            g.breaker.close()
        else:
            if op == "suspect":
                g.breaker.note_suspicion(node, now, FLEET, signature_of(node), DOMAINS)
            was_open = g.breaker.state.open
            stopped = g.breaker.stops(signature_of(node), DOMAINS.domains_of(node))
            held_before = g.holds(node)
            verdict = g.check_isolation(node, now, FLEET, rack_of, leaves_of, critical, signature=signature_of(node),
                                        domains=DOMAINS)
            if verdict.allowed:
                assert not stopped or held_before, "the breaker stops this evidence but a new isolation was allowed"
                assert not was_open or held_before or scope == "evidence", "the breaker is open on all isolation"
                if was_open and not held_before:  # outside the storm: its signature and domains did not trip
                    st_ = g.breaker.state
                    assert not st_.tripped_fleet and signature_of(node) not in st_.tripped_signatures
                    assert not DOMAINS.domains_of(node) & set(st_.tripped_domains)
                if not held_before:
                    admitted.append(now)
                g.record_isolation(node, now, critical, signature=signature_of(node))
        budgeted = g.budgeted()
        assert set(budgeted) | set(g.state.confirmed) == set(g.state.held)  # a confirmed hold stays held
        assert len(budgeted) <= g.max_held_distinct(FLEET) <= max(g.max_held(FLEET), min(max_count, trip - 1))
        if len(budgeted) > g.max_held(FLEET):  # beyond the fraction: below every breaker level among the holds
            for sig in {signature_of(n) for n in budgeted}:
                assert sum(1 for n in budgeted if signature_of(n) == sig) < g.breaker.signature_level(FLEET)
            for d in {d for n in budgeted for d in DOMAINS.domains_of(n)}:
                members = sum(1 for n in budgeted if d in DOMAINS.domains_of(n))
                assert members < g.breaker.domain_level(DOMAINS.domain_size(d))
        assert sum(1 for t in admitted if t > now - 600.0) <= max_new
        for rack in {rack_of(n) for n in budgeted}:
            assert sum(1 for n in budgeted if rack_of(n) == rack) <= 2
        for leaf in {leaf_of(n) for n in budgeted}:
            assert sum(1 for n in budgeted if leaf_of(n) == leaf) <= 3


def test_a_confirmed_hold_leaves_the_budget_and_stays_held() -> None:
    g = gate(max_quarantined_fraction=0.025, max_quarantined_count=6)  # 1 of 40
    assert g.check_isolation("node-0", 0.0, FLEET, rack_of, leaves_of).allowed
    g.record_isolation("node-0", 0.0, False)
    assert g.check_isolation("node-9", 0.0, FLEET, rack_of, leaves_of).reason == "max_held"
    assert g.confirm("node-0") and not g.confirm("node-0")
    assert g.holds("node-0") and g.confirmed_held() == 1 and not g.budgeted()
    assert g.snapshot(0.0, FLEET).held == 0
    assert g.check_isolation("node-9", 0.0, FLEET, rack_of, leaves_of).allowed
    g.release("node-0", 10.0)
    assert g.confirmed_held() == 0 and not g.state.confirmed


def test_beyond_the_fraction_only_evidence_below_every_breaker_level_is_held() -> None:
    """Fraction 1 of 40; the breaker accepts 5 (trip 6), 3 of one signature (level 4), 2 of a rack of 4
    (level 3 with domain_fraction 0.5 and min 3? here min 2)."""
    g = gate(max_quarantined_fraction=0.025, max_quarantined_count=10, max_new_isolations=10, max_per_rack=4,
             max_per_switch=8, breaker=BreakerSettings(trip_suspect_fraction=0.0, trip_min_nodes=6,
                                                       signature_min_nodes=3, domain_min_nodes=2))
    assert (g.max_held(FLEET), g.max_held_distinct(FLEET)) == (1, 5)

    def hold(node: str, sig: str) -> str:
        v = g.check_isolation(node, 0.0, FLEET, rack_of, leaves_of, signature=sig, domains=DOMAINS, kind="uncertain")
        if v.allowed:
            g.record_isolation(node, 0.0, kind="uncertain", signature=sig)
        return v.reason

    assert hold("node-0", "a") == ""  # within the fraction
    assert hold("node-8", "a") == ""  # another leaf and rack; 2 of signature a (level 3)
    assert hold("node-16", "a") == "max_held"  # a third of signature a would reach its level
    assert "same evidence (a)" in g.check_isolation("node-16", 0.0, FLEET, rack_of, leaves_of, signature="a",
                                                    domains=DOMAINS).explanation
    assert hold("node-1", "b") == "max_held"  # rack r0 (and leaf-0) already has one: 2 would reach level 2
    assert hold("node-16", "b") == "" and hold("node-24", "c") == "" and hold("node-32", "d") == ""
    assert hold("node-36", "e") == "max_held"  # 5 held: the breaker's fleet-share level less one


@settings(max_examples=200, deadline=None)
@given(times=st.lists(st.floats(0.0, 5000.0), max_size=60), nodes=st.lists(st.integers(0, 99), max_size=60))
def test_the_breaker_is_open_exactly_when_the_window_held_the_trip_level(times: list[float], nodes: list[int]
                                                                         ) -> None:
    s = BreakerSettings(trip_suspect_fraction=0.05, trip_min_nodes=3, window_s=120.0)
    b = CircuitBreaker(s)
    seen: list[tuple[float, str]] = []
    for t, n in zip(sorted(times), nodes, strict=False):
        was_open = b.state.open
        tripped = b.note_suspicion(f"node-{n}", t, 100)
        seen.append((t, f"node-{n}"))
        distinct = {name for ts, name in seen if ts > t - 120.0}
        if tripped:
            assert not was_open and len(distinct) >= 5
        if not was_open and len(distinct) >= 5:
            assert tripped


# --- kinds of isolation and the correlated-suspicion breaker -------------------------------

class Racks:
    """Racks of 4, leaves of 8 (the domains the breaker counts)."""

    def domains_of(self, node: str) -> set[str]:
        return {f"rack:{rack_of(node)}", f"leaf:{leaf_of(node)}"}

    def domain_size(self, domain: str) -> int:
        return 4 if domain.startswith("rack:") else 8


def test_definitive_isolation_never_waits_on_a_budget_but_is_counted() -> None:
    g = gate(max_quarantined_count=1, max_new_isolations=1, max_per_rack=1, max_per_switch=1)
    g.record_isolation("node-0", 0.0, kind="uncertain")
    assert g.check_isolation("node-1", 1.0, FLEET, rack_of, leaves_of, kind="uncertain").reason == "max_held"
    for n in ("node-1", "node-2", "node-3"):  # same rack, same leaf, past every limit
        v = g.check_isolation(n, 1.0, FLEET, rack_of, leaves_of, kind="definitive", signature="xid:48")
        assert v.allowed and v.reason == "definitive"
        g.record_isolation(n, 1.0, kind="definitive")
    assert g.snapshot(1.0, FLEET).held == 1 and g.definitive_held() == 3 and g.state.definitive_isolations == 3
    g.record_isolation("node-0", 2.0, kind="definitive")  # its evidence became definitive: the budget frees
    assert g.snapshot(2.0, FLEET).held == 0
    assert g.check_isolation("node-9", 700.0, FLEET, rack_of, leaves_of, kind="uncertain").allowed


def test_the_breaker_trips_on_one_signature_and_on_one_rack_not_on_distinct_faults() -> None:
    s = BreakerSettings(trip_suspect_fraction=0.02, trip_min_nodes=6, signature_min_nodes=3, signature_fraction=0.0,
                        domain_min_nodes=3, domain_fraction=0.5, window_s=300.0)
    distinct = CircuitBreaker(s)
    for i, sig in enumerate(("xid:79", "xid:48", "hard_rules:row_remap_failure", "xid:95", "xid:74")):
        assert not distinct.note_suspicion(f"node-{i * 9}", float(i), FLEET, sig, Racks())
    same = CircuitBreaker(s)
    assert [same.note_suspicion(f"node-{i * 9}", float(i), FLEET, "xid:48", Racks()) for i in range(3)] == \
        [False, False, True]
    assert "same evidence (xid:48)" in same.state.opened_reason and same.state.tripped_signatures == ["xid:48"]
    rack = CircuitBreaker(s)
    assert [rack.note_suspicion(f"node-{i}", 0.0, FLEET, f"sig{i}", Racks()) for i in (4, 5, 6)] == \
        [False, False, True]
    assert "3 of the 4 nodes of rack r1" in rack.state.opened_reason
    assert rack.blames("", {"rack:r1"}) is False


def test_lost_devices_pass_the_open_breaker_unless_it_blames_their_evidence() -> None:
    """With ``scope: all`` the open breaker stops every isolation but of lost devices (unless it tripped
    on their very evidence); with ``scope: evidence`` other evidence outside the storm's domains passes."""
    def tripped(scope: str) -> SafetyGate:
        g = gate(breaker=BreakerSettings(trip_min_nodes=100, signature_min_nodes=3, signature_fraction=0.0,
                                         domain_min_nodes=3, domain_fraction=0.5, scope=scope))  # type: ignore[arg-type]
        for n in ("node-0", "node-9", "node-18"):
            g.breaker.note_suspicion(n, 0.0, FLEET, "hard_rules:gpu_count", Racks())
        assert g.breaker.state.open
        return g

    lost = {"kind": "definitive", "device_gone": True}
    for scope in ("all", "evidence"):
        g = tripped(scope)
        blamed = g.check_isolation("node-27", 1.0, FLEET, rack_of, leaves_of, signature="hard_rules:gpu_count", **lost)  # type: ignore[arg-type]
        assert blamed.reason == "breaker_open" and "this very evidence" in blamed.explanation
    g = tripped("all")
    elsewhere = g.check_isolation("node-27", 1.0, FLEET, rack_of, leaves_of, signature="xid:79", **lost)  # type: ignore[arg-type]
    assert elsewhere.allowed and elsewhere.reason == "lost_device"
    dbe = g.check_isolation("node-27", 1.0, FLEET, rack_of, leaves_of, kind="definitive", signature="xid:48")
    assert dbe.reason == "breaker_open"
    g = tripped("evidence")
    dbe = g.check_isolation("node-27", 1.0, FLEET, rack_of, leaves_of, kind="definitive", signature="xid:48")
    assert dbe.allowed and dbe.reason == "definitive"  # other evidence, other domains: outside the storm
    in_rack = g.check_isolation("node-1", 1.0, FLEET, rack_of, leaves_of, kind="definitive", signature="xid:48")
    assert in_rack.allowed  # rack r0 has one suspect: below its level, so not a tripped domain


def test_the_open_breaker_stops_the_evidence_it_tripped_on_and_everything_once_the_fleet_share_trips() -> None:
    """Three nodes of one signature in three racks trip the signature level: that signature stops
    everywhere; other evidence outside the tripped domains is isolated within the budgets; evidence
    without a signature waits; a rack at its level stops every node of it; the fleet share stops all."""
    g = gate(max_quarantined_count=10, max_quarantined_fraction=0.25, max_new_isolations=10, max_per_rack=4,
             max_per_switch=8, breaker=BreakerSettings(trip_suspect_fraction=0.0, trip_min_nodes=10,
                                                       signature_min_nodes=3, signature_fraction=0.0,
                                                       domain_min_nodes=3, domain_fraction=0.5, window_s=300.0))
    for n in ("node-0", "node-9", "node-18"):
        g.breaker.note_suspicion(n, 0.0, FLEET, "network:link_state", Racks())
    assert g.breaker.state.open and g.breaker.state.tripped_signatures == ["network:link_state"]
    assert g.breaker.scope_text() == "isolation on evidence network:link_state"

    def check(node: str, sig: str, kind: str = "preventive") -> str:
        g.breaker.note_suspicion(node, 1.0, FLEET, sig, Racks())
        v = g.check_isolation(node, 1.0, FLEET, rack_of, leaves_of, kind=kind, signature=sig,  # type: ignore[arg-type]
                              domains=Racks())
        if v.allowed:
            g.record_isolation(node, 1.0, kind=kind, signature=sig)  # type: ignore[arg-type]
        return v.reason

    assert check("node-27", "network:link_state", "uncertain") == "breaker_open"
    assert check("node-36", "power_brake:clocks_event_reasons") == "outside_breaker"
    assert check("node-37", "") == "breaker_open"  # no signature: it cannot be told apart from the storm
    assert check("node-1", "xid:119", "definitive") == "definitive"  # rack r0 has 1 suspect of its 4: below 3
    assert check("node-2", "gpu_baseline:sm_clock") == "breaker_open"  # rack r0 now has 3 of 4: it tripped
    assert g.breaker.state.tripped_domains == ["rack:r0"] and not g.breaker.state.tripped_fleet
    assert check("node-3", "xid:48", "definitive") == "breaker_open"  # rack r0 stops every node of it
    assert check("node-12", "gpu_baseline:power") == "breaker_open"  # the 10th suspect: the fleet share trips
    assert g.breaker.state.tripped_fleet and "then 10 nodes became suspect" in g.breaker.state.opened_reason
    assert g.breaker.scope_text() == "all isolation"
    assert check("node-20", "xid:95", "definitive") == "breaker_open"
    g.breaker.close()
    assert not g.breaker.state.tripped_fleet and not g.breaker.stops("xid:95", {"rack:r5"})


def test_auto_resume_waits_until_every_rule_is_below_its_level() -> None:
    s = BreakerSettings(trip_min_nodes=100, signature_min_nodes=3, signature_fraction=0.0, window_s=60.0,
                        resume="auto", auto_resume_after_s=600.0)
    b = CircuitBreaker(s)
    for i in range(3):
        b.note_suspicion(f"node-{i * 9}", 0.0, FLEET, "xid:79")
    assert b.state.open
    for i in range(3):
        b.note_suspicion(f"node-{i * 9 + 1}", 590.0, FLEET, "xid:79")
    assert not b.poll(600.0, FLEET)  # the same signature still storms
    assert b.poll(700.0, FLEET) and not b.state.tripped_signatures


kinds = st.sampled_from(["definitive", "preventive", "uncertain"])


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["isolate", "release", "wait"]), st.integers(0, FLEET - 1), kinds),
                    max_size=120),
       max_count=st.integers(0, 8), fraction=st.floats(0.0, 0.5), share=st.floats(0.0, 1.0))
def test_preventive_holds_never_exceed_their_budget_and_definitive_ones_never_wait_on_it(
        ops: list[tuple[str, int, str]], max_count: int, fraction: float, share: float) -> None:
    g = gate(max_quarantined_count=max_count, max_quarantined_fraction=fraction, preventive_share=share,
             max_new_isolations=4)
    now = 0.0
    for op, arg, kind in ops:
        node = f"node-{arg}"
        if op == "wait":
            now += arg * 10
        elif op == "release":
            g.release(node, now)
        else:
            v = g.check_isolation(node, now, FLEET, rack_of, leaves_of, kind=kind)  # type: ignore[arg-type]
            if kind == "definitive":
                assert v.allowed, v.explanation  # the breaker is closed: no budget refuses it
            if v.allowed:
                g.record_isolation(node, now, kind=kind)  # type: ignore[arg-type]
        held_preventive = [n for n in g.state.preventive if n in g.state.held]
        assert len(held_preventive) <= g.preventive_limit(FLEET)
        assert len(g.budgeted()) <= g.max_held(FLEET)
        for rack in {rack_of(n) for n in g.budgeted()}:
            assert sum(1 for n in g.budgeted() if rack_of(n) == rack) <= 2


def test_the_allowance_reports_what_check_isolation_enforces() -> None:
    """Released holds free the held limit at once: with fast diagnostics a 16-node fleet isolates up to
    the rate in one window, and the allowance says so (it said min(rate, held) = 1)."""
    s = SafetySettings()
    g = SafetyGate(s)
    a = g.allowance(16)
    assert (a.max_held, a.new_per_window) == (1, s.max_new_isolations)
    isolated = 0
    for k in range(20):
        node = f"node-{k % 16}"
        if g.check_isolation(node, 10.0 * k, 16, lambda n: "", lambda n: (), signature="s").allowed:
            g.record_isolation(node, 10.0 * k, signature="s")
            isolated += 1
        g.release(node, 10.0 * k + 5)  # diagnostics passed within seconds
    assert isolated == a.new_per_window
