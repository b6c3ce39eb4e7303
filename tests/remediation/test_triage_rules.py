"""Triage rules as a table: for each hand-built situation, the incident class, the top suspect and
which nodes end up isolated. The rules the issue names: the same failure on many healthy nodes is a
job bug; a failure on one node with hardware evidence is hardware; a node in K failed jobs becomes
suspect; errors on one leaf's ports are one switch incident; a lone timeout is transient."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetmedic.remediation.engine import DecisionEngine
from fleetmedic.remediation.topology import Topology
from fleetmedic.remediation.triage.history import chance_by_jobs
from tests.remediation.helpers_world import (
    CHILD,
    ECC,
    IB,
    ILLEGAL,
    KEYERROR,
    OOM,
    SIGTERM,
    XID79,
    World,
    timeout_line,
)

JOB = "ml/llama"
NODES = [f"node-{i}" for i in range(8)]  # rack r0/r1, leaf-0


def fail_all(w: World, lines_for: Callable[[int, str], list[str]]) -> None:
    for i, n in enumerate(NODES):
        w.fail(JOB, n, lines_for(i, n))


@dataclass(frozen=True)
class Case:
    name: str
    setup: Callable[[World], None]
    klass: str
    suspect: str
    isolated: frozenset[str] = frozenset()


def one_bad(line: str, bad: str = "node-3") -> Callable[[int, str], list[str]]:
    return lambda i, n: [line, CHILD] if n == bad else [timeout_line(i), CHILD]


def hw_finding_then_fail(w: World) -> None:
    w.finding("node-5", kind="hard_fault", severity="critical", hint="isolate", detector="hard_rules")
    fail_all(w, one_bad(ILLEGAL, "node-5"))


def late_finding_within_settle(w: World) -> None:
    fail_all(w, lambda i, n: [timeout_line(i)])
    w.advance(10)
    w.finding("node-6", kind="hard_fault", severity="critical", hint="reboot_node", detector="xid_rules")


def two_failed_jobs_share_a_node(w: World) -> None:
    w.place("ml/other", ["node-3", "node-20", "node-21"])
    fail_all(w, lambda i, n: [timeout_line(i)])
    w.advance(40)
    w.fail("ml/other", "node-20", [timeout_line(1)])


def leaf_ports(w: World) -> None:
    for i in range(8, 13):  # 5 of the 8 nodes behind leaf-1
        w.finding(f"node-{i}", kind="network", severity="warning", detector="ib_ports", port="mlx5_0")


def job_on_a_bad_leaf_findings(w: World) -> None:
    for i in range(2, 7):
        w.finding(f"node-{i}", kind="network", severity="critical", detector="ib_ports", port="mlx5_0")
    w.advance(40)


def job_on_a_bad_leaf(w: World) -> None:
    job_on_a_bad_leaf_findings(w)
    fail_all(w, lambda i, n: [timeout_line(i)])


def restarted_by_its_owner_behind_a_bad_leaf(w: World) -> None:
    """A planned restart (``kubectl delete pods``) of a job whose leaf has an open network incident: the
    controller reports the attempt Terminated (exit 143) for the whole job, with no node."""
    for i in range(2, 7):
        w.finding(f"node-{i}", kind="network", severity="critical", detector="ib_ports", port="mlx5_0")
    w.advance(40)
    w.fail(JOB, "", ["attempt stopped for restart: user requested restart (kubectl delete pods)"], exit_code=143,
           reason="Terminated")


def congestion(w: World, node: str) -> None:
    """An incast burst: PortXmitWait rose past its threshold on one of the node's NICs."""
    w.finding(node, kind="network", severity="warning", detector="ib_counters", port=f"{node}/mlx5_2",
              metric="port_xmit_wait", gpu=None)


def failed_with_congestion_on_a_node(w: World) -> None:
    congestion(w, "node-3")
    w.advance(300)
    congestion(w, "node-3")
    w.advance(60)
    fail_all(w, lambda i, n: [timeout_line(i)])


def hardware_on_many_nodes(w: World) -> None:
    fail_all(w, lambda i, n: [ECC])


CASES = [
    Case("same OOM on every node is a job bug", lambda w: fail_all(w, lambda i, n: [OOM, CHILD]), "job_bug", JOB),
    Case("same illegal access on 5 of 8 nodes is a job bug",
         lambda w: fail_all(w, lambda i, n: [ILLEGAL] if i < 5 else [timeout_line(i)]), "job_bug", JOB),
    Case("a KeyError in the job's code is a job bug", lambda w: fail_all(w, one_bad(KEYERROR)), "job_bug", JOB),
    Case("failure on one node with a hard-fault finding is hardware", hw_finding_then_fail, "hardware", "node-5",
         frozenset({"node-5"})),
    Case("an uncorrectable ECC line on one node is hardware", lambda w: fail_all(w, one_bad(ECC)), "hardware",
         "node-3", frozenset({"node-3"})),
    Case("an XID 79 line on one node is hardware", lambda w: fail_all(w, one_bad(XID79)), "hardware", "node-3",
         frozenset({"node-3"})),
    Case("a hard fault arriving while reports settle is attributed", late_finding_within_settle, "hardware", "node-6",
         frozenset({"node-6"})),
    Case("a lone timeout with no other evidence is transient", lambda w: fail_all(w, lambda i, n: [timeout_line(i)]),
         "transient_software", JOB),
    Case("OOM on one node is transient, blames the job and isolates nothing", lambda w: fail_all(w, one_bad(OOM)),
         "transient_software", JOB),
    Case("a preempted job is transient", lambda w: fail_all(w, lambda i, n: [SIGTERM]), "transient_software", JOB),
    Case("a node in two failed jobs becomes suspect (jobs of 8 and 3 of 32 nodes share 0.75 by chance)",
         two_failed_jobs_share_a_node, "unknown", "node-3", frozenset({"node-3"})),
    Case("IB retry-exceeded errors on one node point at its link", lambda w: fail_all(w, one_bad(IB)), "network",
         "node-3", frozenset({"node-3"})),
    Case("errors behind one leaf are one switch incident, not node incidents", leaf_ports, "network", "leaf-1"),
    Case("a job failing behind a leaf with an open incident blames the switch", job_on_a_bad_leaf, "network",
         "leaf-0"),
    Case("a job its owner terminated behind a bad leaf is preempted, not a network failure",
         restarted_by_its_owner_behind_a_bad_leaf, "transient_software", JOB),
    Case("SIGTERM on every rank behind a bad leaf is a preemption, not a network failure",
         lambda w: (job_on_a_bad_leaf_findings(w), fail_all(w, lambda i, n: [SIGTERM])), "transient_software", JOB),
    Case("a job failing with congestion on one of its nodes is not a link failure",
         failed_with_congestion_on_a_node, "transient_software", JOB),
    Case("hardware errors on every node are not pinned on any node", hardware_on_many_nodes, "unknown", JOB),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_triage_rule(case: Case) -> None:
    w = World(n=32)
    w.place(JOB, NODES)
    case.setup(w)
    w.advance(45)
    inc = w.last_incident(node=case.suspect) if case.suspect != JOB else w.last_incident(job=JOB)
    if case.name.startswith("OOM"):
        assert [s.name for s in inc.suspects] == [JOB, "node-3"]
    assert (inc.incident_class, inc.suspects[0].name) == (case.klass, case.suspect), inc.summary
    assert w.isolated() == case.isolated


def test_a_switch_incident_is_one_incident_and_escalates_without_isolating() -> None:
    w = World(n=32)
    leaf_ports(w)
    w.advance(45)
    assert {i.id for i in w.incidents} == {w.incidents[0].id}
    assert [c.node for c in w.cmds("escalate")] == ["leaf-1"]
    assert not w.isolated()


def test_a_dead_leafs_links_reported_still_down_node_by_node_join_its_switch_incident() -> None:
    """A dead leaf's host links are reported down by each node's exporter on its own schedule: after
    the switch incident opened, a few nodes at a time report them still down. Those are the switch's,
    not link incidents of their own that would isolate healthy nodes."""
    w = World(n=32)
    leaf_ports(w)
    w.advance(45)
    switch = w.incidents[-1]
    assert {i.id for i in w.incidents} == {switch.id}
    for batch in (range(8, 10), range(10, 12), range(12, 13)):
        w.advance(600)
        for i in batch:
            w.finding(f"node-{i}", kind="network", severity="critical", detector="link_state", port="mlx5_0",
                      metric="link_state")
        w.advance(45)
    assert {i.id for i in w.incidents} == {switch.id} and not w.isolated()
    assert len(w.last_incident(node="leaf-1").finding_ids) > len(switch.finding_ids)
    w.advance(3700)  # the switch replaced: no evidence for incident_merge_s, its incident closes
    assert not w.engine.triage.book.is_open("network", "switch:leaf-1")
    for _ in range(2):  # then one node's link errors are its own again
        w.finding("node-9", kind="network", severity="warning", detector="ib_ports", port="mlx5_0")
        w.advance(600)
    assert w.last_incident(node="node-9").suspects[0].name == "node-9"


def test_a_single_node_with_port_errors_is_a_link_incident_isolated_at_the_job_boundary() -> None:
    w = World(n=32)
    w.place(JOB, NODES)
    for _ in range(2):
        w.finding("node-9", kind="network", severity="warning", detector="ib_ports", port="mlx5_0")
        w.advance(600)
    inc = w.incidents[-1]
    assert inc.incident_class == "network" and [s.name for s in inc.suspects] == ["node-9", "node-9:mlx5_0"]
    assert w.isolated() == {"node-9"} and not w.cmds("drain")


def test_congestion_on_a_single_node_isolates_nothing_but_with_port_errors_it_is_evidence() -> None:
    w = World(n=32)
    w.place(JOB, NODES)
    for _ in range(3):  # congestion bursts that persist: the node's own traffic, not a broken link
        congestion(w, "node-9")
        w.advance(600)
    assert not w.incidents and not w.isolated()
    for _ in range(2):  # symbol errors on the same NIC are a link problem; the congestion is evidence
        congestion(w, "node-9")
        w.finding("node-9", kind="network", severity="warning", detector="ib_counters", port="node-9/mlx5_2",
                  metric="symbol_error_counter", gpu=None)
        w.advance(600)
    inc = w.last_incident(node="node-9")
    assert inc.incident_class == "network" and {e.metric for e in inc.evidence} >= {"port_xmit_wait",
                                                                                   "symbol_error_counter"}
    assert w.isolated() == {"node-9"}


def test_congestion_behind_most_of_a_leaf_is_still_one_switch_incident() -> None:
    w = World(n=32)
    for i in range(8, 13):
        congestion(w, f"node-{i}")
    w.advance(45)
    assert [s.name for s in w.incidents[-1].suspects][:1] == ["leaf-1"] and not w.isolated()


def test_findings_about_the_switch_itself_blame_the_switch() -> None:
    w = World(n=32)
    w.finding("leaf-2", kind="network", severity="critical", detector="switch_ports", port="swp12")
    w.advance(45)
    assert w.incidents[-1].suspects[0].name == "leaf-2"


def test_failure_reports_of_one_attempt_are_decided_once_after_settling() -> None:
    w = World(n=32)
    w.place(JOB, NODES)
    fail_all(w, lambda i, n: [OOM])
    assert not w.incidents  # still gathering
    w.advance(45)
    assert len({i.id for i in w.incidents}) == 1
    w.fail(JOB, "node-1", [OOM])  # a late report of the same attempt
    w.advance(45)
    assert len({i.id for i in w.incidents}) == 1
    assert any("late failure report" in a.explanation for a in w.decisions("skipped"))


def test_the_evidence_chain_names_the_log_lines_and_findings() -> None:
    w = World(n=32)
    w.place(JOB, NODES)
    hw_finding_then_fail(w)
    w.advance(45)
    inc = w.last_incident(job=JOB)
    detectors = {e.detector for e in inc.evidence}
    assert {"triage", "hard_rules", "log_patterns"} <= detectors
    assert any("[node-5]" in e.note and "illegal memory access" in e.note for e in inc.evidence)
    assert inc.confidence >= 0.9


def test_a_single_warning_is_watched_but_not_acted_on_until_it_repeats() -> None:
    w = World(n=32)
    w.finding("node-9", kind="degradation", severity="warning", detector="gpu_drift")
    w.advance(45)
    assert not w.incidents and not w.commands  # nothing published yet: the audit says why
    assert any("watching, no incident published" in a.explanation for a in w.decisions("skipped"))
    w.advance(3600)
    w.finding("node-9", kind="degradation", severity="warning", detector="gpu_drift")  # too late to confirm
    assert not w.commands


def rail_world() -> World:
    """16 nodes, two rails: NIC mlx5_0 on leaf-r0-<su>, mlx5_1 on leaf-r1-<su>, 8 nodes per unit."""
    w = World(n=16)
    w.topology = Topology.from_dict({f"node-{i}": {"rack": f"r{i // 4}", "pool": "h100", "rails": {
        "mlx5_0": f"leaf-r0-{i // 8}", "mlx5_1": f"leaf-r1-{i // 8}"}} for i in range(16)})
    w.engine = DecisionEngine(w.settings, w.topology)
    return w


def link_down(w: World, i: int, rail: int) -> None:
    w.finding(f"node-{i}", kind="network", severity="critical", detector="link_state", port=f"leaf-r{rail}-0/{i}",
              metric="link_state", gpu=None)


def test_a_node_whose_every_link_goes_down_at_once_is_down_itself() -> None:
    w = rail_world()
    link_down(w, 5, 0)
    link_down(w, 5, 1)
    w.advance(45)
    inc = w.last_incident(node="node-5")
    assert inc.incident_class == "hardware" and [s.name for s in inc.suspects] == ["node-5"]
    assert "went down at once" in inc.summary and w.isolated() == {"node-5"}
    # one link of a node going down is that link's problem
    link_down(w, 9, 0)
    w.advance(45)
    assert w.last_incident(node="node-9").incident_class == "network"


def test_a_node_going_down_behind_a_troubled_leaf_is_its_own_incident_not_the_leafs() -> None:
    w = rail_world()
    for i in (1, 2, 3, 4):  # the leaf of rail 0 has trouble on half its ports
        w.finding(f"node-{i}", kind="network", severity="warning", detector="ib_counters", port=f"leaf-r0-0/{i}",
                  metric="symbol_error_counter", gpu=None)
    link_down(w, 6, 0)  # and node-6 crashes meanwhile
    link_down(w, 6, 1)
    w.advance(45)
    leaf = [i for i in w.incidents if any(s.name == "leaf-r0-0" for s in i.suspects)]
    assert leaf and "4 of 8 nodes" in leaf[-1].summary
    node = w.last_incident(node="node-6")
    assert node.incident_class == "hardware" and node.suspects[0].name == "node-6"


def test_a_job_failing_with_network_errors_on_nodes_without_a_leaf_label_does_not_crash() -> None:
    """Network findings on more nodes than ``max_hardware_suspects`` whose topology names no
    leaf switch gave an empty leaf count, and deciding the failure raised ``IndexError``."""
    w = World(n=16)
    w.topology = Topology.from_dict({f"node-{i}": {"rack": f"r{i // 4}", "pool": "h100"} for i in range(16)})
    w.engine = DecisionEngine(w.settings, w.topology)
    w.place(JOB, NODES)
    for n in ("node-2", "node-3", "node-4"):  # 3 > max_hardware_suspects (2), and no leaf to blame
        w.finding(n, kind="network", severity="warning", detector="ib_ports", port="mlx5_0", gpu=None)
    fail_all(w, lambda i, n: [timeout_line(i)])
    w.advance(45)
    inc = w.last_incident(job=JOB)
    assert inc.incident_class == "transient_software" and [s.name for s in inc.suspects] == [JOB]
    assert not any(s.kind == "switch" for i in w.incidents for s in i.suspects) and not w.isolated()


@pytest.mark.parametrize(("sizes", "suspect"), [((2, 2), True), ((16, 16, 16), True), ((32, 64), False),
                                                 ((64, 64, 64), False), ((16, 17), False)])
def test_a_node_in_failed_jobs_is_suspect_when_chance_explains_it_poorly(sizes: tuple[int, ...],
                                                                          suspect: bool) -> None:
    """On 256 nodes: jobs of 2 nodes share 0.016 nodes by chance, three of 16 nodes 0.06: node-0 in
    all of them is evidence; jobs of 32 and 64 nodes share 8 nodes by chance, three of 64 nodes 4,
    jobs of 16 and 17 nodes 1.06 (just above ``suspect_max_chance_nodes`` 1): node-0 in all of them
    is scheduling, not evidence."""
    w = World(n=256, per_rack=4, per_leaf=32)
    for j, size in enumerate(sizes):
        nodes = ["node-0", *[f"node-{1 + 100 * j + i}" for i in range(size - 1)]]
        w.place(f"ml/j{j}", nodes)
        for i, n in enumerate(nodes):
            w.fail(f"ml/j{j}", n, [timeout_line(i)])
        w.advance(45)
    found = [i for i in w.incidents if "failed jobs within" in i.summary]
    assert bool(found) is suspect, [i.summary for i in w.incidents]
    assert (w.isolated() == {"node-0"}) is suspect
    if suspect:
        assert [s.name for s in found[-1].suspects] == ["node-0"]


@pytest.mark.parametrize(("failed_elsewhere", "suspect"), [(0, True), (40, False)])
def test_a_node_hosting_short_jobs_one_after_another_is_suspect_only_beyond_the_fleets_failure_rate(
        failed_elsewhere: int, suspect: bool) -> None:
    """64 nodes each run four one-node jobs one after another; two of node-0's fail with a timeout.
    Alone, that is evidence (a node shared by two one-node jobs is 0.016 nodes by chance). With 40 of
    the other 252 jobs failing the same way, job failures strike jobs whatever their size: a node
    that hosted four jobs is in two of them by chance on 7.5 nodes of the fleet."""
    w = World(n=64, per_rack=4, per_leaf=16, config="safety: {max_quarantined_fraction: 0.5}")
    failing = {f"ml/n{i}-{k}" for i, k in ((1 + j % 63, j // 63) for j in range(failed_elsewhere))}
    failing |= {"ml/n0-1", "ml/n0-3"}
    for k in range(4):
        for i in range(64):
            job = f"ml/n{i}-{k}"
            w.place(job, [f"node-{i}"])
            if job in failing:
                w.fail(job, f"node-{i}", [timeout_line(0)])
            else:
                w.complete(job)
        w.advance(600)
    found = [i for i in w.incidents if "failed jobs within" in i.summary]
    assert bool(found) is suspect, [i.summary for i in found]
    assert ("node-0" in w.isolated()) is suspect


@given(st.lists(st.integers(0, 12), max_size=40), st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.integers(2, 5))
def test_chance_by_jobs_is_the_binomial_upper_tail_summed_over_nodes(hosted: list[int], a: float, b: float,
                                                                     k: int) -> None:
    def upper(h: int, q: float) -> float:
        return sum(math.comb(h, i) * q**i * (1 - q) ** (h - i) for i in range(k, h + 1))

    lo, hi = sorted((a, b))
    chance = chance_by_jobs(Counter(hosted), lo, k)
    assert chance == pytest.approx(sum(upper(h, lo) for h in hosted), abs=1e-9)
    assert 0.0 <= chance <= sum(1 for h in hosted if h >= k) + 1e-9
    assert chance <= chance_by_jobs(Counter(hosted), hi, k) + 1e-9  # a higher failure rate explains more
