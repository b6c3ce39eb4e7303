"""``--faults`` specs parse as documented and plan deterministically; unknown kinds and nodes are
refused; ``xid<N>`` follows the XID catalog's bucket; the StepFun trace replay maps every fault of
the real trace to a kind, keeps the trace's per-node fault rate, and compresses time as documented."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fleetmedic.sim.fault_spec import default_mix_count, parse_spec, plan_faults
from fleetmedic.sim.faults import KINDS, kind_info
from fleetmedic.sim.fleet import FleetSpec, build_fleet
from fleetmedic.sim.trace import TRACE_SERVERS, TraceWindow, _choices, load_trace, plan_from_trace
from fleetmedic.sim.units import format_duration, parse_duration

FLEET = build_fleet(FleetSpec(nodes=32), seed=1)


@pytest.mark.parametrize(("text", "seconds"), [("90", 90), ("90s", 90), ("15m", 900), ("6h", 21600), ("1h30m", 5400),
                                                ("1.5h", 5400), ("2d", 172800), ("500ms", 0.5)])
def test_durations_parse(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


def test_durations_format_and_reject_garbage() -> None:
    assert format_duration(5400) == "1h30m" and format_duration(0) == "0s"
    for bad in ("", "h", "5x", "1h2q", "-3m"):
        with pytest.raises(ValueError):
            parse_duration(bad)


def test_spec_items_parse() -> None:
    items = parse_spec("xid79:2, straggler@30m+2h/gpu-node-0003/5, leaf_switch@1h, mix:7, trace:speedup=50;offset=10d")
    assert [(i.kind, i.count) for i in items] == [("xid79", 2), ("straggler", 1), ("leaf_switch", 1), ("mix", 7),
                                                 ("trace", 1)]
    s = items[1]
    assert (s.at_s, s.duration_s, s.node, s.sub) == (1800, 7200, "gpu-node-0003", 5)
    assert items[4].options == {"speedup": "50", "offset": "10d"}


@pytest.mark.parametrize("bad", ["nosuchkind", "xid79:x", "trace:warp=9", "trace:speedup"])
def test_bad_specs_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_spec(bad)


def test_unknown_node_is_refused() -> None:
    with pytest.raises(ValueError, match="not in the fleet"):
        plan_faults("xid79/gpu-node-9999", FLEET, 3600, 1)


def test_plans_are_deterministic_and_pinned_items_stay_put() -> None:
    a = plan_faults("mix:12,xid48@20m/gpu-node-0007/6", FLEET, 6 * 3600, 3)
    b = plan_faults("mix:12,xid48@20m/gpu-node-0007/6", FLEET, 6 * 3600, 3)
    assert a == b and len(a) == 13
    pinned = next(p for p in a if p.pinned)
    assert (pinned.kind, pinned.onset_s, pinned.node, pinned.gpu) == ("xid48", 1200, 7, 6)
    rand = [p for p in a if not p.pinned]
    assert all(1200 <= p.onset_s <= 6 * 3600 - 1800 for p in rand)
    nodes = [p.node for p in rand if p.node >= 0]
    assert len(nodes) == len(set(nodes))  # distinct nodes while there are enough


def test_all_and_negatives_and_default_mix_sizes() -> None:
    assert [p.kind for p in plan_faults("all", FLEET, 3600, 1)].count("xid79") == 1
    assert len(plan_faults("all", FLEET, 3600, 1)) == len(KINDS)
    negs = plan_faults("negatives", FLEET, 3600, 1)
    assert {p.kind for p in negs} == {k for k, v in KINDS.items() if v.fault_class == "negative_control"}
    assert len(plan_faults("mix", FLEET, 6 * 3600, 1)) == default_mix_count(32, 6 * 3600) == 8


def test_generic_xids_follow_their_catalog_bucket() -> None:
    assert kind_info("xid62").fault_class == "hardware" and kind_info("xid62").expected == "isolate_node"
    assert kind_info("xid8").fault_class == "negative_control" and kind_info("xid8").expected == "no_action"
    assert kind_info("xid79").remedy == "reboot" and kind_info("xid48").remedy == "reset_gpu"


def test_packaged_trace_has_the_papers_counts() -> None:
    tr = load_trace()
    assert len(tr) == 584 and len({f.node for f in tr}) == 231
    assert sum(f.desc == "GPU DBE(Double Bit ECC) > Threshold" for f in tr) == 60
    assert sum(f.desc == "Link Down" for f in tr) == 40
    assert all(f.end_day >= f.start_day for f in tr)


def test_the_original_json_layout_reads_as_the_packaged_trace(tmp_path: Path) -> None:
    """The trace's own JSON (fault_start/fault_end events by node UUID, an end closing the oldest
    open fault of its kind on that node) written from the packaged CSV reads back as that CSV."""
    packaged = load_trace()
    kind = [{"Level": f.level, "Class": f.cls, "Desc": f.desc} for f in packaged]
    events = [{"node_id": f"uuid-{f.node}", "event_time": f.start_day, "event_type": "fault_start",
               "fault_type": k} for f, k in zip(packaged, kind, strict=True)]
    events += [{"node_id": f"uuid-{f.node}", "event_time": f.end_day, "event_type": "fault_end",
                "fault_type": k} for f, k in zip(packaged, kind, strict=True)]
    events.sort(key=lambda e: (e["event_time"], e["event_type"] == "fault_end"))  # in time, as the trace
    path = tmp_path / "fault_trace.json"
    path.write_text(json.dumps(events), encoding="utf-8")
    assert load_trace(path) == packaged


def test_every_trace_fault_maps_to_a_known_kind() -> None:
    for f in load_trace():
        c = _choices(f.cls, f.desc)
        kinds = [c] if isinstance(c, str) else [k for k, _ in c]
        for k in kinds:
            kind_info(k)


def test_trace_replay_keeps_the_per_node_rate_and_compresses_time() -> None:
    tr = load_trace()
    window = TraceWindow(speedup=400.0)  # 348 trace days fit in one simulated day
    full = plan_from_trace(tr, TRACE_SERVERS, 86_400.0, window, np.random.default_rng(0))
    assert len(full) == 584  # 348 days / 400 < 1 day: everything, on the 400 servers
    small = plan_from_trace(tr, 40, 86_400.0, window, np.random.default_rng(0))
    assert 20 < len(small) < 100  # about a tenth of the servers, a tenth of the faults
    first = min(full, key=lambda p: p.onset_s)
    assert first.onset_s == pytest.approx(min(f.start_day for f in tr) * 86_400 / 400, rel=1e-6)
    assert all(600 <= p.duration_s <= 12 * 3600 for p in full)


def test_trace_spec_builds_pinned_faults_in_the_run() -> None:
    plan = plan_faults("trace:speedup=2000;offset=100d", FLEET, 6 * 3600, 1)
    assert plan and all(p.source.startswith("trace:") and p.pinned for p in plan)
    assert all(0 <= p.onset_s < 6 * 3600 for p in plan)
