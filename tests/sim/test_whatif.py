"""``fleetmedic whatif``: histories read with their bad rows named, mappings checked, and each
policy's mechanics on tiny histories computed by hand (one DBE on a node of the big job), the real
decision engine in the fleetmedic policy (a changed config changes the outcome), and both shipped
histories end to end."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from dataclasses import replace
from datetime import UTC
from pathlib import Path

import pytest

from fleetmedic.config import parse_config
from fleetmedic.sim.whatif import world as world_module
from fleetmedic.sim.whatif.history import HistoryError, parse_history
from fleetmedic.sim.whatif.mapping import MappingError, load_mapping, parse_mapping
from fleetmedic.sim.whatif.policies import Fleetmedic, Manual, NpdDraino
from fleetmedic.sim.whatif.replay import PolicySpec, decision_interval_s, replay
from fleetmedic.sim.whatif.shipped import llama3_csv, shipped_history
from fleetmedic.sim.whatif.world import Assumptions, Job, World, shuffle

GPUS = 9 * 8  # the big job: 9 of 10 nodes, 8 GPUs each
MIN = 60.0


def one_dbe(repair_h: float = 2.0) -> str:
    return (f"node,start,end,category\n"
            f"n9,2025-01-01T00:00:00Z,2025-01-01T00:00:01Z,Fan: Redundancy Lost\n"  # the history's start
            f"n0,2025-01-01T00:45:00Z,{_iso(45 * MIN + repair_h * 3600)},GPU: GPU DBE(Double Bit ECC) > Threshold\n"
            f"n9,2025-01-01T23:00:00Z,2025-01-01T23:00:01Z,Fan: Redundancy Lost\n")


def _iso(offset_s: float) -> str:
    from datetime import datetime
    return datetime.fromtimestamp(1735689600 + offset_s, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def tiny(**kw: object) -> Assumptions:
    base: dict[str, object] = dict(nodes=10, big_job_fraction=0.9, small_job_fraction=0.0, human_spread=0.0,
                                   nodes_per_leaf=8, nodes_per_rack=4, seed=0)
    base.update(kw)
    return Assumptions(**base)  # type: ignore[arg-type]


def play(policy: object, text: str = "", assumptions: Assumptions | None = None) -> World:
    h = parse_history(text or one_dbe())
    w = World(h, load_mapping("stepfun"), assumptions or tiny(), policy, 105.0, 600.0)  # type: ignore[arg-type]
    w.run()
    return w


def minutes(w: World, bucket: str) -> float:
    return round(w.jobs[0].buckets[bucket] / GPUS / MIN, 2)


class TestHistories:
    def test_a_csv_history_names_each_bad_row_with_its_line_and_reason(self) -> None:
        text = ("node,start,end,category\n"
                "n1,2025-01-01T00:00:00Z,,GPU: GPU Lost\n"
                "n2,yesterday,,GPU: GPU Lost\n"
                "n3,1735689600,1735680000,GPU: GPU Lost\n"
                ",1735689600,,GPU: GPU Lost\n")
        with pytest.raises(HistoryError) as err:
            parse_history(text)
        msg = str(err.value)
        assert "3 bad row(s)" in msg and "line 3: start 'yesterday' is neither ISO 8601 nor epoch seconds" in msg
        assert "line 4: end is before start" in msg and "line 5: node is missing or empty" in msg
        h = parse_history(text, max_bad=3)
        assert [(f.node, f.end) for f in h.faults] == [("n1", None)] and [b.line for b in h.bad] == [3, 4, 5]

    def test_the_format_is_told_from_the_content_and_a_stepfun_trace_pairs_starts_with_ends(self) -> None:
        events = [{"node_id": "a", "event_time": 1.0, "event_type": "fault_start",
                   "fault_type": {"Level": "Hardware Failure", "Class": "GPU", "Desc": "GPU Lost"}},
                  {"node_id": "a", "event_time": 1.5, "event_type": "fault_end",
                   "fault_type": {"Level": "Hardware Failure", "Class": "GPU", "Desc": "GPU Lost"}},
                  {"node_id": "b", "event_time": 2.0, "event_type": "fault_start",
                   "fault_type": {"Level": "Hardware Failure", "Class": "NIC", "Desc": "NIC Lost"}},
                  {"node_id": "c", "event_time": "x", "event_type": "fault_start", "fault_type": {}}]
        h = parse_history(json.dumps(events), max_bad=1)
        assert h.format == "stepfun"
        assert [(f.node, f.category, f.repair_s) for f in h.faults] == [("a", "GPU: GPU Lost", 43200.0),
                                                                         ("b", "NIC: NIC Lost", None)]
        assert h.bad[0].line == 4 and "event_time" in h.bad[0].reason

    def test_the_stepfun_trace_in_its_published_json_layout_reads_whole(self) -> None:
        # the packaged copy written back as the published fault_trace.json's events
        packaged = shipped_history("stepfun")
        events = []
        for f in packaged.faults:
            cls, _, desc = f.category.partition(": ")
            kind = {"Level": f.detail, "Class": cls, "Desc": desc}
            for t, what in ((f.start, "fault_start"), (f.end, "fault_end")):
                events.append({"node_id": f.node, "event_time": round((t - packaged.start) / 86400, 6),
                               "event_type": what, "fault_type": kind})
        events.sort(key=lambda e: e["event_time"])
        h = parse_history(json.dumps(events))
        assert (h.format, len(h.faults), len(h.nodes), h.bad) == ("stepfun", 584, 231, [])
        assert sorted(round(f.repair_s or 0) for f in h.faults) == sorted(round(f.repair_s or 0)
                                                                          for f in packaged.faults)

    def test_the_packaged_llama3_history_is_what_its_generator_gives(self) -> None:
        from importlib import resources
        text = resources.files("fleetmedic.sim").joinpath("data/whatif-llama3.csv").read_text("utf-8")
        assert text == llama3_csv(0)
        h = shipped_history("llama3")
        assert len(h.faults) == 419 and round(h.days) == 54


class TestMappings:
    def test_every_category_of_both_shipped_histories_is_mapped_with_a_reason(self) -> None:
        for name in ("stepfun", "llama3"):
            mapping, h = load_mapping(name), shipped_history(name)
            assert {f.category for f in h.faults if mapping.lookup(f.category) is None} == set()
            assert all(e.reason for e in mapping.entries.values())
        assert len(load_mapping("llama3").entries) == 18

    def test_a_bad_entry_is_named_with_its_field(self) -> None:
        with pytest.raises(MappingError, match="category 'X': evidence: xid needs its code"):
            parse_mapping("categories: {X: {evidence: xid, effect: crash, reason: r}}")
        with pytest.raises(MappingError, match="reason is required"):
            parse_mapping("categories: {X: {evidence: 'xid:79', effect: crash}}")
        with pytest.raises(MappingError, match="unknown field"):
            parse_mapping("categories: {X: {evidence: 'xid:79', reason: r, colour: red}}")

    def test_unmapped_categories_are_counted_not_dropped_silently(self) -> None:
        h = parse_history("node,start,end,category\nn0,1735689600,1735693200,Gremlins\n"
                          "n1,1735689600,1735693200,Gremlins\n")
        res = replay(h, load_mapping("stepfun"), tiny(), [PolicySpec("manual", "manual")])
        assert res["unmapped"] == {"Gremlins": 2}


class TestMechanics:
    """One DBE at 0:45 on a node of the big job (last checkpoint 0:30), repaired in 2 h; the on-call
    person reacts in exactly 30 min; restart overhead 10 min; the job controller restarts after 30 s
    and a job placed on the faulty node dies 60 s into its start."""

    def test_the_fault_hits_the_big_job(self) -> None:
        w = play(Manual())
        assert w.jobs[0].big and w.index["n0"] in w.jobs[0].prev_nodes + w.jobs[0].nodes

    def test_manual_crash_loops_until_the_person_on_call_cordons_the_node(self) -> None:
        w = play(Manual())
        # 0:45 fails; the controller puts it back on n0 six times (30 s wait, 60 s to die), then gives up
        # (backoff 6) at 0:54; at 1:15 a person cordons n0 and restarts it elsewhere: running at 1:25
        assert minutes(w, "lost_since_checkpoint") == 15.0
        assert minutes(w, "waiting_to_detect") == 24.0  # 6 x 0.5 min + 0:54 -> 1:15
        assert minutes(w, "restart_overhead") == 16.0  # 6 x 1 min of crashed starts + 10 min
        assert w.tally.placements_on_faulty == 6 and w.tally.mttr_phases["total"] == [40 * MIN]
        assert w.jobs[0].interruptions == 1

    def test_npd_draino_cordons_the_xid_within_a_minute(self) -> None:
        w = play(NpdDraino())
        # XID at 0:45:04.3, cordoned at 0:45:34.3; the controller's restart at 0:45:30 still lands on n0,
        # where the drain kills it at 0:46:04.3; the next restart (0:46:34.3) avoids it: running at 0:56:34.3
        assert minutes(w, "lost_since_checkpoint") == 15.0
        assert minutes(w, "waiting_to_detect") == 1.0
        assert minutes(w, "restart_overhead") == 10.57
        assert w.tally.placements_on_faulty == 1 and round(w.tally.mttr_phases["total"][0], 1) == 694.3

    def test_fleetmedic_cordons_the_node_before_the_controllers_restart(self) -> None:
        w = play(Fleetmedic(parse_config("{}")))
        # XID at 0:45:04.3, cordoned 2 s later; the controller's restart at 0:45:30 avoids n0 (fleetmedic's
        # own restart_job, after the failure's 30 s settle, finds the job already restarted without it)
        assert minutes(w, "lost_since_checkpoint") == 15.0
        assert minutes(w, "waiting_to_detect") == 0.5
        assert minutes(w, "restart_overhead") == 10.0
        assert w.tally.placements_on_faulty == 0 and w.tally.mttr_phases["total"] == [10.5 * MIN]
        assert w.tally.dangerous_past_decision_s == 0.0
        assert w.tally.false_held_s == 0.0 and w.tally.repairs >= 1

    def test_the_engine_decides_in_dry_run_only_the_person_on_call_acts(self) -> None:
        live = play(Fleetmedic(parse_config("{}")))
        dry_policy = Fleetmedic(parse_config("safety: {dry_run: true}"))
        dry = play(dry_policy)
        assert dry_policy.commands.get("cordon", 0) >= 1  # decided, then skipped by the executor
        assert dry.tally.placements_on_faulty > 0 and dry.tally.dangerous_s > live.tally.dangerous_s + 1800
        assert dry.tally.mttr_phases["total"][0] > live.tally.mttr_phases["total"][0] + 1800

    def test_a_fault_whose_diagnostics_pass_is_dangerous_and_counted_apart(self) -> None:
        # the same DBE, but dcgmi diag misses it: fleetmedic resets the GPU, sees diagnostics pass and
        # returns the node; it stays schedulable with its fault until the repair (2 h after 0:45)
        w = play(Fleetmedic(parse_config("policy: {definitive_return: diagnostics}")), one_dbe(),
                 tiny(diag_false_pass=1.0))
        assert w.tally.dangerous_past_decision_s > 3600
        assert w.tally.dangerous_after_passed_diagnostics_s == w.tally.dangerous_past_decision_s
        caught = play(Fleetmedic(parse_config("policy: {definitive_return: diagnostics}")), one_dbe(),
                      tiny(diag_false_pass=0.0))
        assert caught.tally.dangerous_past_decision_s == 0.0 == caught.tally.dangerous_after_passed_diagnostics_s
        # definitive_return: repair (the default) sends it to repair after the passing diagnostic: it
        # never goes back faulty
        repair = play(Fleetmedic(parse_config("{}")), one_dbe(), tiny(diag_false_pass=1.0))
        assert repair.tally.dangerous_past_decision_s == 0.0 and repair.tally.repairs >= 1

    def test_a_read_only_filesystem_keeps_the_node_out_until_it_is_repaired(self) -> None:
        text = ("node,start,end,category\n"
                "n9,2025-01-01T00:00:00Z,2025-01-01T00:00:01Z,Fan: Redundancy Lost\n"
                "n0,2025-01-01T01:00:00Z,2025-01-01T05:00:00Z,File System: FS Readonly\n")
        w = play(Fleetmedic(parse_config("{}")), text)
        # GPU diagnostics pass on a read-only filesystem: the node waits for its repair, not for a job
        assert w.tally.dangerous_past_decision_s == 0.0 and w.tally.repairs >= 1

    def test_a_degradation_is_isolated_by_fleetmedic_before_it_turns_hard(self) -> None:
        text = ("node,start,end,category\n"
                "n9,2025-01-01T00:00:00Z,2025-01-01T00:00:01Z,Fan: Redundancy Lost\n"
                "n0,2025-01-01T01:00:00Z,2025-01-04T01:00:00Z,GPU: GPU PCI link width low\n")
        manual = play(Manual(), text)
        fm = play(Fleetmedic(parse_config("{}")), text)
        # manual leaves it schedulable until the link fails (a day later); fleetmedic isolates it once the
        # detector reasserted it (600 s) and the preventive settle passed (60 s)
        assert manual.tally.degraded_s > 20 * 3600
        assert fm.tally.degraded_s < 700 and fm.tally.degraded_past_decision_s == 0.0


def test_decision_interval_is_the_longest_settle_plus_a_tick() -> None:
    assert decision_interval_s(parse_config("{}"), 10.0) == 60.0 + 10.0 + 5.0


def test_the_cli_replays_a_csv_and_refuses_bad_rows_without_a_traceback(tmp_path: Path) -> None:
    history = tmp_path / "h.csv"
    history.write_text(one_dbe() + "n5,not-a-time,,GPU: GPU Lost\n", encoding="utf-8")
    cmd = [sys.executable, "-m", "fleetmedic.cli.main", "whatif", str(history), "--nodes", "10",
           "--small-job-fraction", "0"]
    bad = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "line 5: start 'not-a-time'" in bad.stderr and "Traceback" not in bad.stderr
    out = tmp_path / "r.json"
    ok = subprocess.run([*cmd, "--max-bad", "1", "--json", str(out), "--report", str(tmp_path / "r.html")],
                        capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    res = json.loads(out.read_text())
    assert set(res["policies"]) == {"manual", "npd-draino", "fleetmedic"} and "line 5" in ok.stderr
    assert res["policies"]["fleetmedic"]["ettr"] > res["policies"]["manual"]["ettr"]
    assert "<svg" in (tmp_path / "r.html").read_text()


@pytest.mark.chromium
def test_the_html_report_renders_in_a_real_browser_with_a_plot_per_policy(tmp_path: Path) -> None:
    from fleetmedic.sim.whatif.report import html_report
    from tests.evaluation.helpers_browser import dump_dom

    res = replay(parse_history(one_dbe()), load_mapping("stepfun"), tiny(),
                 [PolicySpec("manual", "manual"), PolicySpec("fleetmedic", "fleetmedic", parse_config("{}"))])
    page = tmp_path / "whatif.html"
    page.write_text(html_report(res), encoding="utf-8")
    dom = dump_dom(page, 900)
    table = dom[dom.index('<table id="outcomes">'):]
    assert "<th>manual</th><th>fleetmedic</th>" in table[:400]
    assert dom.count("<polyline") == 4  # schedulable nodes and useful GPUs, per policy
    assert "ETTR, big job" in dom and "Gremlins" not in dom


def test_a_software_bug_fails_the_job_once_and_leaves_the_node_healthy() -> None:
    text = "node,start,end,category\nn0,2025-01-01T01:00:00Z,2025-01-01T01:00:00Z,Software Bug\n"
    w = World(parse_history(text), load_mapping("llama3"), tiny(), Manual(), 105.0, 600.0)
    w.run()
    assert w.jobs[0].interruptions == 1 and w.tally.silent_schedulable_s == 0.0
    assert w.tally.dangerous_s == 0.0 and w.tally.isolations == 0


def test_a_link_still_down_when_diagnostics_pass_keeps_the_node_out_until_its_repair() -> None:
    text = ("node,start,end,category\n"
            "n9,2025-01-01T00:00:00Z,2025-01-01T00:00:01Z,Fan: Redundancy Lost\n"
            "n0,2025-01-01T01:00:00Z,2025-01-02T01:00:00Z,Parameter Plane Cable: Link Down\n")
    w = play(Fleetmedic(parse_config("{}")), text)
    # the port detector reports the link down every reassert_s while the engine holds the node: GPU
    # diagnostics pass, and the node waits for its repair instead of going back with the link down
    assert w.tally.dangerous_past_decision_s == 0.0 and w.tally.repairs >= 1


def test_a_repair_asked_for_while_one_is_under_way_is_answered_when_it_ends() -> None:
    w = World(parse_history(one_dbe()), load_mapping("stepfun"), tiny(), Manual(), 105.0, 600.0)
    told: list[tuple[str, float]] = []
    start = w.history.start
    w.send_to_repair(3, start, "planned", lambda at: told.append(("first", at)))
    w.send_to_repair(3, start + 60, "fleetmedic", lambda at: told.append(("second", at)))
    w.run()
    end = start + w.a.repair_no_fault_s
    assert told == [("first", end), ("second", end)]


def test_a_restarts_exclusions_stay_in_the_template_for_the_controllers_next_restart() -> None:
    w = World(parse_history(one_dbe()), load_mapping("stepfun"), tiny(nodes=12, big_job_fraction=0.5),
              Manual(), 105.0, 600.0)
    w.policy.start(w, w.t)
    job = w.jobs[0]
    spare = next(n.index for n in w.nodes if n.job is None)
    job.exclude = {spare}  # a restart wrote it (a required NotIn on the pod template)
    w.fail_job(job, job.nodes[0], w.t, "a crash")
    w.request_restart(job, set(), w.t + 30, "controller", job.attempt)
    assert job.state == "restart_overhead" and spare not in job.nodes and job.exclude == {spare}


def test_a_lock_step_job_placed_again_without_a_node_keeps_every_other_rank_where_it_ran() -> None:
    w = World(parse_history(one_dbe()), load_mapping("stepfun"), tiny(nodes=12, big_job_fraction=0.5),
              Manual(), 105.0, 600.0)
    w.policy.start(w, w.t)
    job = w.jobs[0]
    before = list(job.nodes)
    lost = before[2]
    w.fail_job(job, lost, w.t, "a crash")
    w.request_restart(job, {lost}, w.t + 30, "fleetmedic")
    assert job.state == "restart_overhead" and len(job.nodes) == len(before)
    # rank i keeps its node but for rank 2, whose node is excluded: it took a free node
    assert [n for i, n in enumerate(job.nodes) if i != 2] == [n for i, n in enumerate(before) if i != 2]
    assert job.nodes[2] not in before


@pytest.mark.parametrize(("why", "taken_out"), [("preempted by the big job", False), ("stopped by fleetmedic", False),
                                                ("Unknown Error on n5", True)])
def test_the_person_on_call_suspects_a_node_for_its_failures_not_for_preemptions(why: str, taken_out: bool) -> None:
    # two stops of a small job on one node: failures make the person take the node out
    # (human_suspect_after), a preemption or a restart's stop says nothing of the node
    w = World(parse_history(one_dbe()), load_mapping("stepfun"),
              tiny(nodes=12, big_job_fraction=0.5, small_job_fraction=0.25), Manual(), 105.0, 600.0)
    assert w.a.human_suspect_after == 2
    small = next(j for j in w.jobs if not j.big and j.nodes[0] != 0)
    node = small.nodes[0]
    w.fail_job(small, node, w.t, why)
    w.request_restart(small, set(), w.t + 10, "controller")
    assert small.nodes == [node]  # back where it ran
    w.fail_job(small, node, w.t + 20, why)
    w.run()
    assert w.tally.false_isolations == (1 if taken_out else 0)  # (the DBE's node is isolated too, rightly)


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("batch", [0, 1, 2, 5])
def test_the_fast_shuffle_gives_the_permutation_random_shuffle_gives(batch: int, native: bool,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    if native:  # the test suite requires the C loops (README): a missing build fails here
        assert world_module._native_shuffle is not None, "fleetmedic.sim.whatif._shuffle is not built"
    if not native:
        monkeypatch.setattr(world_module, "_native_shuffle", None)
    for n in (0, 1, 2, 3, 4, 5, 8, 9, 17, 100, 1000, 4097):
        for seed in range(5):
            expected, got = list(range(n)), list(range(n))
            random.Random(f"{seed}:{n}").shuffle(expected)
            shuffle(random.Random(f"{seed}:{n}"), got, batch)
            assert got == expected, (n, seed, batch)


class _Checked(World):
    """A world that checks, at every placement, the sets it keeps against a scan of its nodes (and
    that each node's job is the job holding it)."""

    checks = 0

    def _place(self, job: Job, t: float) -> None:
        assert self.free_now() == {n.index for n in self.nodes if n.job is None and n.schedulable}
        assert self.free_count() == len(self.free_now())
        parked = self.parking.job
        if parked is not None:  # its nodes are not in ``free``; those not schedulable are ``out``
            own = {n.index for n in self.nodes if n._job is parked}
            assert not parked.nodes and own == parked.owned - parked.lost and self.free.isdisjoint(own)
            assert self.parking.out == own & self.blocked
        assert self.blocked == {n.index for n in self.nodes if not n.schedulable}
        assert self.faulty == {n.index for n in self.nodes if n.fault() is not None}
        assert self.crashing == {n.index: f for n in self.nodes
                                 if (f := n.fault()) is not None and f.entry.effect == "crash"}
        assert set(self._excluding) >= {j.index for j in self.jobs if j.exclude}
        assert self._small == {n for j in self.jobs if not j.big for n in j.nodes}
        assert all(self.nodes[n].job is j for j in self.jobs for n in j.nodes)
        assert {n.index for n in self.nodes if n.job is not None} == {n for j in self.jobs for n in j.nodes}
        assert set(self._waiting) == {j.index for j in self.jobs if j.state == "waiting_for_capacity"}
        assert set(self._waiting_big) == {j.index for j in self.jobs if j.state == "waiting_for_capacity" and j.big}
        _Checked.checks += 1
        super()._place(job, t)


@pytest.mark.parametrize("policy", [Manual, NpdDraino, lambda: Fleetmedic(parse_config(""))])
def test_the_free_faulty_and_waiting_sets_agree_with_the_nodes_at_every_placement(policy: object) -> None:
    h = shipped_history("llama3")  # its first 60 faults, on the nodes they name
    faults = h.faults[:60]
    h = replace(h, faults=faults, end=faults[-1].start + 86400.0, nodes=list(dict.fromkeys(f.node for f in faults)))
    _Checked.checks = 0
    w = _Checked(h, load_mapping("llama3"), tiny(nodes=40, small_job_fraction=0.2), policy(),  # type: ignore[operator]
                 105.0, 600.0)
    w.run()
    assert _Checked.checks > 20
