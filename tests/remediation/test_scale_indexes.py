"""The decision engine's per-event work must not grow with the fleet, so its indexes are
kept up to date as it goes instead of being rebuilt. These tests hold the incremental indexes to
what a rebuild from scratch gives, over random sequences of the events that change them:

- the topology's leaf and rack indexes under place/relabel/remove;
- the fleet size under node observations, telemetry sightings, deletions and the forgetting of
  silent nodes; the sightings' order with placements seen again in bulk against a walk over every node;
- triage's pending groups, kept in deadline order so that the due ones are a prefix;
- the history rule's failed jobs, kept once a failure, against a table of each node's jobs;
- the incident book's subject index and its queue of closed incidents; the open incidents queued for
  closing by their evidence's time;
- triage's node -> jobs index under placements, status changes, restores and forgetting;
- the housekeeping's record sets (the node track's records for the tick, the forgetting and its
  remembered definitive returns, the unhealthy nodes and those in probation; the issuer's commands
  in issue order; triage's finished jobs): an engine keeping them decides as one that rebuilds them
  before every call, the return rules' deadlines (``boundary_wait_s``, ``evidence_quiet_s``,
  ``definitive_recurrence_s``) included; so does one reading the open incidents' suspects (and the
  open incidents) again at every call.

The timing itself is measured in ``bench/bench_decide_scale.py``, never asserted here."""

from __future__ import annotations

import copy
import functools

import msgspec
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fleetmedic.config import parse_config
from fleetmedic.records import JobEvent, RankPlacement
from fleetmedic.remediation.engine import DecisionEngine, Decisions
from fleetmedic.remediation.node_track import NodeTrack
from fleetmedic.remediation.placements import changed_at, swapped
from fleetmedic.remediation.sightings import Sightings
from fleetmedic.remediation.topology import Placement, Topology
from fleetmedic.remediation.triage.history import FailedJobs
from fleetmedic.remediation.triage.jobs import JobBoard
from fleetmedic.remediation.triage.records import PendingGroup, TriageState, file_group, order_groups
from tests.remediation.helpers_world import ECC, OOM, T0, XID79, World, timeout_line

NODES = [f"n{i}" for i in range(12)]
node = st.sampled_from(NODES)
placement = st.builds(Placement, rack=st.sampled_from(["", "r0", "r1"]), leaf=st.sampled_from(["", "l0", "l1", "l2"]),
                      rails=st.sampled_from([{}, {"mlx5_0": "l3"}, {"mlx5_0": "l0", "mlx5_1": "l4"}]))


def _indexes(topo: Topology) -> tuple[dict[str, frozenset[str]], dict[str, frozenset[str]]]:
    leaves = {leaf: topo.behind_leaf(leaf) for leaf in topo.leaves()}
    racks = {p.rack: topo.in_rack(p.rack) for p in topo.nodes.values() if p.rack}
    return leaves, racks


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(st.tuples(st.just("place"), node, placement), st.tuples(st.just("remove"), node)),
                max_size=40))
def test_the_topology_indexes_kept_in_place_equal_a_rebuild(ops: list[tuple]) -> None:  # type: ignore[type-arg]
    topo = Topology()
    for op in ops:
        if op[0] == "place":
            topo.place(op[1], op[2])
        else:
            topo.remove(op[1])
        rebuilt = Topology(topo.nodes)
        assert _indexes(topo) == _indexes(rebuilt)
        assert all(topo.domain_size(d) == rebuilt.domain_size(d) for n in topo.nodes for d in topo.domains_of(n))
    assert "" not in topo.leaves()


def test_with_node_leaves_the_topology_it_was_called_on_as_it_was() -> None:
    topo = Topology.from_dict({"a": {"rack": "r1", "leaf": "l1"}})
    moved = topo.with_node("a", Placement(rack="r2", leaf="l2"))
    assert topo.behind_leaf("l1") == {"a"} and topo.in_rack("r2") == frozenset()
    assert moved.behind_leaf("l2") == {"a"} and moved.behind_leaf("l1") == frozenset()
    assert topo.place("a", Placement(rack="r1", leaf="l1")) is False  # already there: nothing changes


event = st.one_of(
    st.tuples(st.just("observe"), node, st.sampled_from(["", "r0", "r1"])),
    st.tuples(st.just("seen"), st.lists(node, max_size=4)),
    st.tuples(st.just("seen_late"), st.lists(node, max_size=4)),  # a sighting stamped before the last one
    st.tuples(st.just("removed"), node),
    st.tuples(st.just("wait"), st.sampled_from([10.0, 40_000.0, 60_000.0, 100_000.0])),
)


@settings(max_examples=120, deadline=None)
@given(st.lists(event, max_size=30))
def test_the_fleet_size_equals_a_recount_of_its_source_after_a_restore(events: list[tuple]) -> None:  # type: ignore[type-arg]
    engine = DecisionEngine(parse_config("safety: {fleet_forget_after_s: 86400}"))
    now = T0
    for e in events:
        if e[0] == "observe":
            labels = {"fleetmedic.io/rack": e[2]} if e[2] else {}
            engine.node_observed(e[1], cordoned=False, cordoned_by_fleetmedic=False, labels=labels, now=now)
        elif e[0] == "seen":
            engine.nodes_seen(e[1], now)
        elif e[0] == "seen_late":
            engine.nodes_seen(e[1], now - 30_000.0)
        elif e[0] == "removed":
            engine.node_removed(e[1], now)
        else:
            now += e[1]
            engine.tick(now)
        recount = len(engine.state.cluster) or len(engine.topology) or len(engine.state.seen)
        assert engine.fleet_size == recount
        restored = DecisionEngine.from_bytes(engine.to_bytes(), engine.settings)
        assert restored.fleet_size == recount


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abcdefgh"), st.integers(0, 50)), max_size=25))
def test_pending_groups_stay_in_deadline_order_however_they_are_filed(filed: list[tuple[str, int]]) -> None:
    table: dict[str, PendingGroup] = {}
    for key, deadline in filed:
        if key not in table:
            file_group(table, PendingGroup(key=key, first_ts=0.0, deadline=float(deadline)))
    order = [(g.deadline, k) for k, g in table.items()]
    assert order == sorted(order)
    scrambled = dict(reversed(list(table.items())))
    order_groups(scrambled)
    assert list(scrambled) == list(table)


def test_due_groups_are_decided_in_deadline_order_and_the_rest_wait() -> None:
    w = World(n=32, per_leaf=8, config="triage: {network_settle_s: 30}\nsafety: {max_quarantined_fraction: 0.1}")
    for node in ("node-0", "node-9", "node-17"):  # three leaves: three groups, 10 s apart
        w.finding(node, kind="network", severity="critical", detector="port_rules", gpu=None, port=f"{node}/mlx5_0",
                  metric="link_down")
        w.now += 10
    triage = w.engine.triage
    assert list(triage.state.network) == ["leaf:leaf-0", "leaf:leaf-1", "leaf:leaf-2"]
    assert triage.next_deadline() == T0 + 30
    due = triage.due(T0 + 45)
    assert [sorted(a.suspect_nodes) for a in due] == [["node-0"], ["node-9"]]
    assert list(triage.state.network) == ["leaf:leaf-2"] and triage.next_deadline() == T0 + 50


def test_closed_incidents_are_forgotten_after_the_merge_window_without_a_scan_of_the_open_ones() -> None:
    w = World(n=32, config="triage: {incident_merge_s: 600}\nsafety: {max_quarantined_fraction: 0.1}")
    w.dbe("node-1")
    book = w.engine.triage.book
    (inc_id,) = [i for i, inc in w.engine.triage.state.incidents.items() if inc.status != "dismissed"][:1]
    book.set_status(inc_id, "resolved", w.now)
    assert inc_id not in w.engine.triage.state.open_by_subject.values()
    book.forget_closed(w.now + 599)
    assert inc_id in w.engine.triage.state.incidents
    # a restored book rebuilds its queue from the state: the incident still leaves on time
    restored = DecisionEngine.from_bytes(w.engine.to_bytes(), w.settings)
    restored.triage.book.forget_closed(w.now + 601)
    assert inc_id not in restored.triage.state.incidents
    book.forget_closed(w.now + 601)
    assert inc_id not in w.engine.triage.state.incidents


def test_stale_incidents_close_once_their_latest_evidence_is_stale_not_their_first() -> None:
    w = World(n=32, config="triage: {incident_merge_s: 600, warning_confirmations: 3}")  # watched, not acted on
    w.degradation("node-1")
    w.degradation("node-2")
    incidents = w.engine.triage.state.incidents
    first = {inc.suspects[0].name: inc.id for inc in incidents.values()}
    w.advance(500)
    w.degradation("node-2")  # renewed: its evidence is 500 s later than node-1's
    w.advance(200)
    assert incidents[first["node-1"]].status == "dismissed"
    assert incidents[first["node-2"]].status == "open"
    w.advance(500)
    assert incidents[first["node-2"]].status == "dismissed"


def test_an_incident_kept_open_by_its_track_closes_once_the_track_empties() -> None:
    w = World(n=32, config="triage: {incident_merge_s: 600, warning_confirmations: 3}")
    w.degradation("node-1")
    (inc_id,) = w.engine.triage.state.incidents
    w.engine.incidents.track(inc_id, node="node-1")  # waits for the node
    w.advance(700)
    assert w.engine.triage.state.incidents[inc_id].status == "open"  # stale, but waited for
    w.engine.incidents.stop_waiting_for(inc_id, "node-1")
    w.advance(10)
    assert w.engine.triage.state.incidents[inc_id].status == "dismissed"


job_event = st.tuples(
    st.sampled_from(["a/j0", "a/j1", "a/j2", "a/j3"]),
    st.sampled_from(["placement", "start", "progress", "completion", "restart", "failure"]),
    st.lists(node, min_size=1, max_size=4),  # the ranks' nodes, for a placement
    st.integers(0, 2),  # attempt
    st.sampled_from([0, 0, 1]),  # the first rank's number
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(job_event, st.just("forget"), st.just("restore")), max_size=40))
def test_the_node_to_jobs_index_kept_as_events_come_equals_a_rebuild(ops: list) -> None:  # type: ignore[type-arg]
    tri = parse_config("").triage
    state = TriageState()
    board = JobBoard(tri, state)
    board.jobs_on("n0")  # built now, then only updated
    made: dict[tuple[str, ...], list[RankPlacement]] = {}  # the same nodes: the same records, as a replay sends
    for k, op in enumerate(ops):
        now = T0 + k
        if op == "forget":
            board.forget_finished(now)
        elif op == "restore":  # a restored engine builds it from the state
            board = JobBoard(tri, state)
        else:
            job, kind, nodes, attempt, first = op
            ranks = made.setdefault((*nodes, first), [RankPlacement(rank=r, node=n)
                                                      for r, n in enumerate(nodes, first)]) \
                if kind == "placement" else []
            board.add_event(JobEvent(job=job, event=kind, ts=now, attempt=attempt, placement=ranks), now)
            if job in board._read_from:  # a placement read whole or as a change of the last: the same ranks
                assert state.jobs[job].ranks == {p.rank: p.node for p in board._read_from[job][1]}, op
        for n in NODES:
            every = tuple(sorted(j for j, rec in state.jobs.items() if n in rec.nodes))
            live = tuple(j for j in every if state.jobs[j].status in ("placed", "running"))
            assert (board.jobs_placed_on(n), board.jobs_on(n)) == (every, live), (n, op)
        for rec in state.jobs.values():
            assert rec.nodes == sorted(set(rec.ranks.values())), op


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.lists(st.tuples(st.integers(0, 4), node), min_size=5, max_size=5),
                          st.sampled_from(["a/j0", "a/j1"])), min_size=1, max_size=12),
       st.lists(node, min_size=5, max_size=5))
def test_a_placement_read_as_a_change_of_the_last_equals_one_read_whole(changes: list, first: list) -> None:  # type: ignore[type-arg]
    """A lock-step job placed again with a few ranks moved is read as a change of its last placement
    (a rank's number changed, or a rank named twice, is read whole): its ranks, nodes and the
    node -> jobs index are those a board reading every placement whole has."""
    tri = parse_config("").triage
    state, whole = TriageState(), TriageState()
    board, rebuilt = JobBoard(tri, state), JobBoard(tri, whole)
    board.jobs_on("n0")
    last = {job: [RankPlacement(rank=r, node=n) for r, n in enumerate(first)] for job in ("a/j0", "a/j1")}
    for k, (moves, job) in enumerate([([], "a/j0"), ([], "a/j1"), *changes]):
        ranks = list(last[job])
        for i, n in moves:  # the records that do not move are the same objects, as a replay sends them
            ranks[i] = RankPlacement(rank=i if n != "n11" else 9, node=n)
        last[job] = ranks
        board.add_event(JobEvent(job=job, event="start", ts=T0 + k, placement=ranks), T0 + k)
        rebuilt = JobBoard(tri, whole)  # reads every placement whole
        rebuilt.add_event(JobEvent(job=job, event="start", ts=T0 + k, placement=[
            RankPlacement(rank=p.rank, node=p.node) for p in ranks]), T0 + k)
        for j in ("a/j0", "a/j1"):
            if j in whole.jobs:
                assert (state.jobs[j].ranks, state.jobs[j].nodes) == (whole.jobs[j].ranks, whole.jobs[j].nodes)
                assert board.node_set(state.jobs[j]) == frozenset(whole.jobs[j].nodes)
        for n in NODES:
            assert board.jobs_placed_on(n) == rebuilt.jobs_placed_on(n), n


def test_a_placement_decoded_again_is_compared_by_value_not_by_identity() -> None:
    """Records decoded from a message are new objects each time: the changed positions are those
    whose values differ, and too many of them read the placement whole."""
    last = [RankPlacement(rank=r, node=f"n{r}") for r in range(200)]
    again = msgspec.json.decode(msgspec.json.encode(last), type=list[RankPlacement])
    again[7] = RankPlacement(rank=7, node="n999")
    assert changed_at(last, again) == [7]
    assert changed_at(last, last[:199]) is None  # another size
    assert changed_at(last, [RankPlacement(rank=r, node=f"m{r}") for r in range(200)]) is None  # 200 > 64 changed
    assert swapped(["a", "b", "c"], ["a", "x", "c"], [1], {"a", "b", "c"}) == ({"b"}, {"x"})
    assert swapped(["a", "b", "c"], ["a", "c", "c"], [1], {"a", "b", "c"}) is None  # "c" twice


failure = st.tuples(st.sampled_from(["a/j0", "a/j1", "a/j2"]), st.lists(node, min_size=1, max_size=8, unique=True),
                    st.sampled_from([0.0, 5.0, 10.0]))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.tuples(st.just("fail"), failure), st.tuples(st.just("again")),
                          st.tuples(st.just("restore")), st.tuples(st.just("trim"), st.sampled_from([0.0, 5.0, 20.0]))),
                max_size=25),
       st.lists(node, min_size=1, max_size=8, unique=True), st.sampled_from([0.0, 5.0, 10.0, 40.0]),
       st.integers(1, 3))
def test_failed_jobs_kept_once_a_failure_say_what_one_entry_a_node_and_job_says(
        ops: list[tuple], nodes: list[str], horizon: float, enough: int) -> None:  # type: ignore[type-arg]
    """Rule 6's failed jobs, recorded once a failure (its nodes shared) and restored from their
    serialised form, name for each node the jobs a table of each node's latest failure per job names
    (the table the serialised form is)."""
    state = TriageState()
    failed = FailedJobs(state)
    table: dict[str, dict[str, float]] = {}  # node -> job -> its latest failure there
    clock, last = 0.0, None
    for op in ops:
        if op[0] in ("fail", "again"):
            if op[0] == "again" and last is None:
                continue
            if op[0] == "fail":
                job, names, dt = op[1]
                listed = sorted(names)
            else:  # the same job failing again on the same nodes (the same list)
                job, listed, dt = last
            clock += dt
            failed.note(job, listed, clock)
            last = (job, listed, dt)
            for n in listed:
                table.setdefault(n, {})[job] = max(clock, table.get(n, {}).get(job, clock))
        elif op[0] == "restore":
            failed.write()
            assert state.node_failed_jobs == {n: sorted((t, j) for j, t in jobs.items())
                                              for n, jobs in sorted(table.items())}
            failed = FailedJobs(state)
            last = None
        else:
            failed.trim(clock - op[1])  # what a trim drops is out of every window read after it
            table = {n: kept for n, jobs in table.items() if (kept := {j: t for j, t in jobs.items()
                                                                       if t >= clock - op[1]})}
            horizon = max(horizon, clock - op[1])
    asked = sorted(nodes)
    expected = [(n, {j for j, t in table.get(n, {}).items() if t >= horizon}) for n in asked]
    assert list(failed.jobs_of(asked, set(asked), horizon, enough)) == [(n, js) for n, js in expected
                                                                         if len(js) >= enough]
    if last is not None:  # asked for the nodes of the latest failure itself (the list it was noted with)
        listed = last[1]
        expected = [(n, {j for j, t in table.get(n, {}).items() if t >= horizon}) for n in listed]
        assert list(failed.jobs_of(listed, set(listed), horizon, enough)) == [(n, js) for n, js in expected
                                                                               if len(js) >= enough]


SHORT = ("safety: {max_quarantined_fraction: 0.1}\n"
         "policy: {action_timeout_s: 60, diagnostics_timeout_s: 120, probation_s: 1800, flap_window_s: 3000,\n"
         "  definitive_return: diagnostics, definitive_recurrence_s: 5400, boundary_wait_s: 2400,\n"
         "  evidence_quiet_s: 300}\n"
         "signing: {command_ttl_s: 60}")
WNODES = [f"node-{i}" for i in range(16)]
engine_op = st.one_of(
    st.tuples(st.just("xid"), st.sampled_from(WNODES), st.sampled_from([79, 48, 94, 13])),
    st.tuples(st.just("dbe"), st.sampled_from(WNODES)),
    st.tuples(st.just("degradation"), st.sampled_from(WNODES)),
    st.tuples(st.just("fail"), st.sampled_from(["a/big", "a/small"]), st.integers(0, 7),
              st.sampled_from([[ECC], [XID79], [OOM], [timeout_line(0)], []])),
    st.tuples(st.just("place"), st.sampled_from(["a/big", "a/small"]), st.integers(0, 8)),
    st.tuples(st.just("observe"), st.sampled_from(WNODES), st.booleans(), st.booleans()),
    st.tuples(st.just("advance"), st.sampled_from([10.0, 120.0, 900.0, 3600.0])),
    st.tuples(st.just("restore")),
    st.tuples(st.just("executor"), st.booleans()),  # the executor answers (or leaves commands to time out)
)


def _every_record_tick(track: NodeTrack, now: float, out: Decisions) -> None:
    """The node track's tick walking every record, whatever it waits for."""
    window = track.settings.policy.flap_window_s
    for name in sorted(track.state.nodes):
        rec = track.state.nodes[name]
        if rec.state == "suspect" and rec.blocked_reason:
            track._retry_blocked(rec, now, out)
        elif rec.state in ("healthy", "probation") and not rec.plan and not rec.inflight and (
                rec.state == "healthy" or now < rec.probation_until):
            if rec.returns and now - rec.returns[0] >= window:
                rec.returns = [t for t in rec.returns if now - t < window]
        elif rec.state != "healthy" or rec.inflight or rec.plan or rec.returns:
            track.apply(track.lifecycle.tick(rec, now, track.busy(name), track.issuer.node_commands(now, out)),
                        now, out)


def _rebuild_indexes(engine: DecisionEngine) -> None:
    """Make ``engine`` look at everything again, as a fresh one does, and tick every record."""
    nodes = engine.nodes
    nodes._for_tick = nodes._for_forget = nodes._for_commands = nodes._for_unhealthy = None
    nodes.tick = functools.partial(_every_record_tick, nodes)  # type: ignore[method-assign]
    engine.issuer._issued = None
    engine.triage.job_board._done_since = float("-inf")
    engine.triage._suspects = (None, {})  # the suspects read from every open incident again
    engine._suspected = (None, frozenset())
    engine.triage.book._order_open()
    tracker = engine.incidents  # every open incident looked at for closing, as a walk over them does
    tracker._queue, tracker._queued, tracker._held, tracker._released, tracker._version = [], set(), set(), set(), -1


def _apply(w: World, op: tuple, rebuild: bool) -> None:  # type: ignore[type-arg]
    if rebuild:
        _rebuild_indexes(w.engine)
    kind = op[0]
    if kind == "xid":
        w.xid(op[1], op[2])
    elif kind == "dbe":
        w.dbe(op[1])
    elif kind == "degradation":
        w.degradation(op[1])
    elif kind == "fail" and op[1] in w.placements:
        nodes = w.placements[op[1]]
        if nodes:
            w.fail(op[1], nodes[op[2] % len(nodes)], op[3])
    elif kind == "place":
        start = 0 if op[1] == "a/big" else 12
        w.place(op[1], WNODES[start + op[2] % 4:start + op[2] % 4 + (8 if op[1] == "a/big" else 1)])
    elif kind == "observe":
        w.observe(op[1], op[2], op[3])
    elif kind == "advance":
        if rebuild:  # every tick as a fresh engine would see it
            end = w.now + op[1]
            while w.now < end:
                _rebuild_indexes(w.engine)
                w.advance(min(10.0, end - w.now))
        else:
            w.advance(op[1])
    elif kind == "restore":
        w.engine = DecisionEngine.from_bytes(w.engine.to_bytes(), w.settings)
    elif kind == "executor":
        w.auto_execute = op[1]


@settings(max_examples=80, deadline=None)
@given(st.lists(engine_op, max_size=25))
def test_an_engine_keeping_its_housekeeping_sets_decides_as_one_rebuilding_them(ops: list) -> None:  # type: ignore[type-arg]
    kept, rebuilt = World(16, config=SHORT), World(16, config=SHORT)
    for op in [("place", "a/big", 0), ("place", "a/small", 0), ("advance", 10.0), *ops, ("advance", 3600.0)]:
        _apply(kept, op, rebuild=False)
        _apply(rebuilt, op, rebuild=True)
        assert [c.id for c in kept.commands] == [c.id for c in rebuilt.commands], op
        assert [(a.ts, a.decision, a.explanation) for a in kept.audit] == \
            [(a.ts, a.decision, a.explanation) for a in rebuilt.audit], op
        assert kept.state_bytes() == rebuilt.state_bytes(), op
        engine, track = kept.engine, kept.engine.nodes
        records = engine.state.nodes
        assert track.unhealthy() == {n for n, r in records.items() if r.state not in ("healthy", "probation")}
        assert track.in_probation() == {n: r.since for n, r in records.items() if r.state == "probation"}
        assert list(engine.triage.book.open_ids) == [i for i, inc in engine.triage.state.incidents.items()
                                                     if inc.status in ("open", "mitigating")], op
        suspected = engine.suspected_nodes()
        engine.triage._suspects = (None, {})
        engine._suspected = (None, frozenset())
        assert suspected == engine.suspected_nodes(), op  # as read from every open incident again
        if track._for_tick is not None:  # every record the tick has something to do for is looked at, sleeps,
            # or waits for what its standing refusal was decided on to change
            standing = {n for _, names in track._standing.values() for n in names}
            assert {n for n, r in records.items() if r.plan or (r.state == "suspect" and r.blocked_reason)
                    or r.inflight or r.state == "probation" or (r.state == "healthy" and r.returns)} \
                <= track._for_tick | {n for _, n in track._sleeping} | standing, op
        if track._for_forget is not None:  # every record the forgetting may drop is looked at
            assert {n for n, r in records.items() if r.state == "healthy" and not (
                r.plan or r.inflight or r.returns or r.opted_out or r.foreign_cordon or r.cordon_owned
                or r.conditions)} <= track._for_forget | track._remembering, op


@settings(max_examples=120, deadline=None)
@given(st.lists(event, max_size=30))
@example([("seen", ["n0"]), ("wait", 40_000.0), ("seen", ["n1"]), ("seen_late", ["n2"]), ("wait", 60_000.0)])
def test_the_nodes_seen_are_forgotten_as_a_walk_over_all_of_them_forgets_them(events: list) -> None:  # type: ignore[type-arg]
    after = 86400.0
    engine = DecisionEngine(parse_config(f"safety: {{fleet_forget_after_s: {after:g}}}"))
    walked: dict[str, float] = {}  # what a walk over every node seen keeps (none is held in this test)
    due = float("-inf")  # when the walk looks next: when the oldest sighting expires
    now = T0
    for e in events:
        if e[0] in ("seen", "seen_late"):
            at = now if e[0] == "seen" else now - 30_000.0
            engine.nodes_seen(e[1], at)
            walked.update(dict.fromkeys(e[1], at))
        elif e[0] == "removed":
            engine.node_removed(e[1], now)
            walked.pop(e[1], None)
        elif e[0] == "wait":
            now += e[1]
            engine.tick(now)
            if now >= due:
                due = min(walked.values(), default=now) + after
                if due <= now:
                    walked = {n: t for n, t in walked.items() if t >= now - after}
                    due = min(walked.values(), default=now) + after
        assert list(engine.state.seen.items()) == list(walked.items()), e


# the same list object while a placement stays; of six nodes, some differ from others in a few positions
# (read as a change), one names a node twice (read whole)
PLACEMENTS = [NODES[:6], NODES[3:9], NODES[:6][::-1], NODES[6:], [*NODES[:5], NODES[7]], [*NODES[:5], NODES[0]]]
sighting = st.one_of(
    st.tuples(st.just("seen"), st.lists(node, max_size=4)),
    st.tuples(st.just("seen_late"), st.lists(node, max_size=4)),
    st.tuples(st.just("placed"), st.sampled_from(["a/j0", "a/j1"]), st.integers(0, len(PLACEMENTS) - 1)),
    st.tuples(st.just("removed"), node),
    st.tuples(st.just("written"),),
    st.tuples(st.just("wait"), st.sampled_from([10.0, 40_000.0, 60_000.0, 100_000.0])),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(sighting, max_size=40))
@example([("placed", "a/j0", 0), ("wait", 40_000.0), ("placed", "a/j0", 0), ("wait", 60_000.0),
          ("placed", "a/j0", 1), ("wait", 60_000.0), ("wait", 40_000.0)])
@example([("wait", 10.0), ("placed", "a/j0", 0), ("removed", "n1"), ("placed", "a/j0", 0)])
@example([("wait", 10.0), ("placed", "a/j0", 0), ("wait", 40_000.0), ("placed", "a/j0", 4), ("wait", 40_000.0),
          ("placed", "a/j0", 0), ("wait", 60_000.0), ("placed", "a/j0", 5), ("wait", 40_000.0), ("wait", 60_000.0)])
@example([("wait", 10.0), ("placed", "a/j0", 0), ("placed", "a/j0", 0), ("wait", 40_000.0), ("placed", "a/j0", 1),
          ("wait", 60_000.0), ("placed", "a/j0", 2), ("wait", 40_000.0), ("wait", 100_000.0)])
def test_sightings_with_placements_seen_again_in_bulk_forget_as_a_walk_over_every_node(events: list) -> None:  # type: ignore[type-arg]
    """A placement seen again whole is one bulk of the sightings' order; what they keep, once written,
    and when they forget, are a walk's over every node's latest sighting (n0 is held: renewed, never
    forgotten)."""
    after = 86400.0
    seen: dict[str, float] = {}
    sightings = Sightings(seen, bulk_min=2)
    walked: dict[str, float] = {}
    due, now = float("-inf"), T0

    def may_forget(n: str) -> bool:
        return n != "n0"

    for e in events:
        if e[0] in ("seen", "seen_late"):
            at = now if e[0] == "seen" else now - 30_000.0
            sightings.nodes(e[1], at)
            walked.update(dict.fromkeys(e[1], at))
        elif e[0] == "placed":
            sightings.placement(e[1], PLACEMENTS[e[2]], now)
            walked.update(dict.fromkeys(PLACEMENTS[e[2]], now))
        elif e[0] == "removed":
            sightings.remove(e[1])
            walked.pop(e[1], None)
        elif e[0] == "written":
            sightings.write()
        else:
            now += e[1]
            sightings.forget(now, after, may_forget)
            if now >= due:
                due = min(walked.values(), default=now) + after
                if due <= now:
                    walked = {n: (t if t >= now - after else now) for n, t in walked.items()
                              if t >= now - after or not may_forget(n)}
                    due = min(walked.values(), default=now) + after
        assert sorted(seen) == sorted(walked), e  # the nodes seen, without writing the bulks
        written = copy.deepcopy(sightings)
        written.write()
        assert written.seen == walked, e
