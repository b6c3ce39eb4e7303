"""GPU detector: hard faults within one sample, XID semantics (catalog actions, repetition, trend,
dcgm's last-value gauge), degradation against per-GPU baselines with continuity, immunity to
workload swings and counter resets, and a batch path identical to the one-message path."""

from __future__ import annotations

import numpy as np
import pytest

from fleetmedic import records as r
from fleetmedic.config import Settings, parse_config
from fleetmedic.devenv.synth import gpu_message
from fleetmedic.models.gpu_detector import GpuDetector
from fleetmedic.models.stages import stage1_batch

DT = 10.0


def run(det: GpuDetector, n: int, start: int = 0, seed: int = 1, **per_step):  # type: ignore[no-untyped-def]
    """Feed ``n`` samples of node n0; ``per_step`` maps kwarg -> function(step) -> value."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(start, start + n):
        kwargs = {name: fn(k) for name, fn in per_step.items()}
        out.extend(det.observe(gpu_message("n0", 1000 + DT * k, rng, **kwargs)))
    return out


def detector(yaml: str = "") -> GpuDetector:
    return GpuDetector(parse_config(yaml).detection)


def test_healthy_steady_telemetry_gives_no_findings() -> None:
    assert run(detector(), 400) == []


def test_workload_swings_shared_by_all_gpus_give_no_findings() -> None:
    # idle -> busy -> checkpoint dip every few minutes: every GPU moves together
    load = lambda k: 0.05 if (k // 30) % 4 == 0 else (0.4 if k % 17 < 2 else 1.0)  # noqa: E731
    assert run(detector(), 600, load=load) == []


def test_a_gpu_that_runs_hot_against_its_siblings_is_found_after_the_continuity_window() -> None:
    det = detector()
    run(det, 100)
    found = run(det, 20, start=100, hot=lambda k: {5: 7.0})
    temp = [f for f in found if f.evidence[0].metric == "gpu_temp"]
    assert temp, found
    first = temp[0]
    assert first.gpu == 5 and first.kind == "degradation" and first.node == "n0"
    assert first.ts - (1000 + DT * 100) <= DT * det.settings.continuity_samples
    assert first.evidence[0].baseline is not None and first.evidence[0].score is not None


def test_a_persisting_condition_is_reported_once_per_reassert_interval() -> None:
    det = detector("detection: {reassert_s: 300}")
    run(det, 100)
    found = run(det, 200, start=100, hot=lambda k: {2: 9.0})
    temp = [f for f in found if f.evidence[0].metric == "gpu_temp"]
    assert 5 <= len(temp) <= 8  # 2000 s of condition / 300 s


def test_an_anomaly_does_not_poison_the_baseline() -> None:
    from fleetmedic.models.gpu_signals import MEAN

    det = detector()
    run(det, 100)
    sig = det.names.index("gpu_temp")
    before = det.states.live["n0"].planes[MEAN, sig, 5]
    run(det, 60, start=100, hot=lambda k: {5: 10.0})
    after = det.states.live["n0"].planes[MEAN, sig, 5]
    assert abs(after - before) < 1.0  # the +10 degC residual was not learned
    found = run(det, 61, start=160, hot=lambda k: {5: 10.0})
    assert any(f.gpu == 5 and f.evidence[0].metric == "gpu_temp" for f in found)  # still judged anomalous


def test_dbe_is_a_hard_fault_in_the_sample_it_appears() -> None:
    det = detector()
    run(det, 50)
    dbe = lambda k: {"ecc_dbe_vol_total": [0, 0, 0, 2, 0, 0, 0, 0]}  # noqa: E731
    found = run(det, 1, start=50, counters=dbe)
    assert [(f.detector, f.kind, f.gpu, f.severity) for f in found] == [("hard_rules", "hard_fault", 3, "critical")]
    assert run(det, 5, start=51, counters=dbe) == []  # the same count is not a new fault


def test_hw_thermal_slowdown_is_a_hard_fault_in_the_sample_it_appears_and_one_while_it_lasts() -> None:
    # the GPU's own over-temperature protection halved its clocks: cooling failed (fan, heatsink)
    det = detector()
    run(det, 50)
    hot = lambda k: {"clocks_event_reasons": [0, 0, 0, 0x60 | (0x4 if k % 2 else 0), 0, 0, 0, 0]}  # noqa: E731
    first = run(det, 1, start=50, gauges=hot)
    assert [(f.detector, f.kind, f.gpu, f.action_hint) for f in first if f.kind == "hard_fault"] == [
        ("hard_rules", "hard_fault", 3, "isolate")]
    # the other bits (a power cap coming and going) do not make it a new fault every sample
    assert not any(f.kind == "hard_fault" for f in run(det, 20, start=51, gauges=hot))
    # software thermal slowdown alone (0x20) is the GPU managing its heat: no hard fault
    assert not _hard_faults_in(detector(), [0, 0, 0, 0x20, 0, 0, 0, 0])
    assert not _hard_faults_in(detector("detection: {hw_thermal_is_hard: false}"), [0, 0, 0, 0x60, 0, 0, 0, 0])


def _hard_faults_in(det: GpuDetector, reasons: list[int]) -> list[str]:
    """The detectors of the hard faults found in 60 samples with these clocks_event_reasons."""
    return [f.detector for f in run(det, 60, gauges=lambda k: {"clocks_event_reasons": reasons})
            if f.kind == "hard_fault"]


def test_power_brake_on_most_gpus_of_a_node_is_one_hard_fault_on_the_node_at_once() -> None:
    det = detector()
    run(det, 50)
    brake = lambda k: {"clocks_event_reasons": [0x88] * 6 + [0, 0]}  # noqa: E731
    found = run(det, 1, start=50, gauges=brake)
    assert [(f.detector, f.kind, f.gpu, f.severity) for f in found] == [("power_brake", "hard_fault", None, "critical")]
    assert found[0].evidence[0].value == 6.0 and "0,1,2,3,4,5" in found[0].evidence[0].note
    assert not any(f.detector == "power_brake" for f in run(det, 20, start=51, gauges=brake))
    # one GPU braking is that GPU's power trouble (a straggler), not the node's power delivery
    assert not _hard_faults_in(detector(), [0x84, 0, 0, 0, 0, 0, 0, 0])
    assert not _hard_faults_in(detector("detection: {power_brake_min_gpu_fraction: 1.0}"), [0x88] * 6 + [0, 0])
    assert not _hard_faults_in(detector("detection: {power_brake_min_gpu_fraction: 0.0}"), [0x88] * 6 + [0, 0])


def test_counter_reset_on_reboot_is_not_a_fault_or_a_rate_spike() -> None:
    det = detector()
    high = {"ecc_sbe_vol_total": [500] * 8, "pcie_replay_counter": [900] * 8}
    run(det, 60, counters=lambda k: high)
    found = run(det, 60, start=60, counters=lambda k: {"ecc_sbe_vol_total": [0] * 8}, boot_id=lambda k: "boot-2")
    assert found == []


@pytest.mark.parametrize(
    ("xid", "action", "severity"),
    [(79, "reboot_node", "critical"), (48, "reset_gpu", "critical"), (74, "isolate", "critical"),
     (13, "restart_app", "info"), (43, "ignore", "info"), (63, "ignore", "info"), (999, "investigate", "warning")],
)
def test_xid_events_carry_the_catalog_action(xid: int, action: str, severity: str) -> None:
    det = detector()
    run(det, 5)
    found = run(det, 1, start=5, xids=lambda k: [r.XidEvent(gpu=2, xid=xid, ts=1000 + DT * k)])
    assert [(f.detector, f.action_hint, f.severity, f.gpu) for f in found] == [("xid_rules", action, severity, 2)]


def test_config_overrides_an_xids_action() -> None:
    det = detector("detection: {xid: {action_overrides: {13: isolate}}}")
    found = run(det, 1, xids=lambda k: [r.XidEvent(gpu=0, xid=13, ts=1000.0)])
    assert found[0].action_hint == "isolate" and found[0].severity == "critical"


def test_xid_13_twice_on_the_same_gpu_within_the_window_is_escalated() -> None:
    det = detector()
    once = run(det, 1, xids=lambda k: [r.XidEvent(gpu=4, xid=13, ts=1000.0)])
    assert [f.detector for f in once] == ["xid_rules"]
    other_gpu = run(det, 1, start=1, xids=lambda k: [r.XidEvent(gpu=5, xid=13, ts=1010.0)])
    assert [f.detector for f in other_gpu] == ["xid_rules"]
    twice = run(det, 1, start=2, xids=lambda k: [r.XidEvent(gpu=4, xid=13, ts=1020.0)])
    assert sorted(f.detector for f in twice) == ["xid_repeat", "xid_rules"]


def test_xid_13_on_every_gpu_at_once_is_the_applications_and_never_a_repeat() -> None:
    """A job bug's illegal memory access faults every rank: XID 13 on all 8 GPUs in the same second,
    again on each retry in place. That is the application's doing; the same XID twice on one GPU
    alone is that GPU's."""
    det = detector()
    every_gpu = lambda ts: (lambda k: [r.XidEvent(gpu=g, xid=13, ts=ts + 0.01 * g) for g in range(8)])  # noqa: E731
    found = []
    for attempt in range(4):  # the job retried in place, failing the same way each time
        found += run(det, 1, start=attempt * 40, xids=every_gpu(1000 + attempt * 400.0))
    found = [f for f in found if f.kind != "telemetry"]  # the samples are 400 s apart: gaps, reported as such
    assert found and {f.detector for f in found} == {"xid_rules"}
    lone = [f for f in run(det, 1, start=200, xids=lambda k: [r.XidEvent(gpu=3, xid=13, ts=3000.0)])
            if f.kind != "telemetry"]
    assert [f.detector for f in lone] == ["xid_rules"]  # the bursts before it do not count
    again = [f for f in run(det, 1, start=210, xids=lambda k: [r.XidEvent(gpu=3, xid=13, ts=3100.0)])
             if f.kind != "telemetry"]
    assert sorted(f.detector for f in again) == ["xid_repeat", "xid_rules"]
    assert [f.evidence[0].value for f in again if f.detector == "xid_repeat"] == [2.0]


def test_how_many_gpus_at_once_make_an_xid_the_applications_is_configured() -> None:
    det = detector("detection: {xid: {repeat_max_gpus: 8}}")
    every_gpu = lambda ts: (lambda k: [r.XidEvent(gpu=g, xid=13, ts=ts) for g in range(8)])  # noqa: E731
    run(det, 1, xids=every_gpu(1000.0))
    found = run(det, 1, start=40, xids=every_gpu(1400.0))
    assert sorted({f.gpu for f in found if f.detector == "xid_repeat"}) == list(range(8))


def test_a_single_xid_63_is_not_a_trend_but_three_are() -> None:
    det = detector()
    found = []
    for i in range(3):
        found += run(det, 1, start=i * 30, xids=lambda k: [r.XidEvent(gpu=1, xid=63, ts=1000 + DT * k)])
        if i == 0:
            assert [f.detector for f in found] == ["xid_rules"]
    assert "xid_trend" in [f.detector for f in found]


def test_the_dcgm_xid_gauge_reports_a_change_of_value_not_a_standing_value() -> None:
    det = detector()
    run(det, 3)
    g = lambda code: (lambda k: {"xid_errors": [0, 0, 0, 0, 0, 0, code, 0]})  # noqa: E731
    first = run(det, 1, start=3, gauges=g(79))
    assert [(f.detector, f.gpu, f.evidence[0].value) for f in first] == [("xid_rules", 6, 79.0)]
    assert run(det, 10, start=4, gauges=g(79)) == []  # the gauge keeps its last value
    assert [f.evidence[0].value for f in run(det, 1, start=14, gauges=g(48))] == [48.0]


def test_a_gpu_that_stops_reporting_is_a_hard_fault() -> None:
    # once absent from gpu_missing_after_samples records over gpu_missing_after_s (3, 20 s): one record
    # without it is missing data (tests/models/test_missing_data.py)
    det = detector()
    run(det, 5)
    found = run(det, 3, start=5, gpus=lambda k: 7)
    assert [(f.detector, f.gpu, f.action_hint, f.ts) for f in found] == [("hard_rules", 7, "reboot_node", 1070.0)]


def test_nvlink_down_row_remap_failure_and_pcie_width_drop_are_found() -> None:
    det = detector()
    run(det, 5)
    bad = {"nvlink_links_down": [0, 2, 0, 0, 0, 0, 0, 0], "row_remap_failure": [0, 0, 1, 0, 0, 0, 0, 0],
           "pcie_link_width": [16, 16, 16, 8, 16, 16, 16, 16]}
    found = run(det, 1, start=5, gauges=lambda k: bad)
    got = {(f.detector, f.gpu) for f in found}
    assert got == {("hard_rules", 1), ("hard_rules", 2), ("pcie_width", 3)}


def test_one_pending_row_remap_is_evidence_not_a_finding_to_act_on() -> None:
    # one remap (XID 63) is normal HBM wear: recorded as info for triage, never a degradation warning
    det = detector()
    run(det, 5)
    found = run(det, 3, start=5, gauges=lambda k: {"row_remap_pending": [0, 0, 0, 0, 0, 1, 0, 0]})
    assert [(f.detector, f.gpu, f.severity) for f in found] == [("hbm_rows", 5, "info")]
    rows = run(det, 1, start=8, counters=lambda k: {"uncorrectable_remapped_rows": [0, 0, 0, 0, 0, 1, 0, 0]})
    assert [(f.detector, f.gpu, f.severity) for f in rows] == [("hbm_rows", 5, "warning")]


def test_a_rising_sbe_rate_is_degradation() -> None:
    det = detector()
    run(det, 100, counters=lambda k: {"ecc_sbe_vol_total": [k // 10] * 8})
    found = run(det, 30, start=100,
                counters=lambda k: {"ecc_sbe_vol_total": [k // 10] * 7 + [k // 10 + 5 * (k - 100)]})
    assert any(f.evidence[0].metric == "ecc_sbe_rate" and f.gpu == 7 for f in found)


def test_throttling_is_found() -> None:
    det = detector()
    found = run(det, 100, gauges=lambda k: {"clocks_event_reasons": [0, 0, 0, 0x40 if k % 2 else 0, 0, 0, 0, 0]})
    assert any(f.detector == "gpu_throttle" and f.gpu == 3 for f in found)


def test_throttling_before_a_repair_is_not_reported_after_it() -> None:
    # a GPU throttled for hours, then the node was away for repair (hours without samples, a new boot)
    hot = {"clocks_event_reasons": [0, 0, 0, 0x40, 0, 0, 0, 0]}
    for boot in ("boot-1", "boot-2"):  # whether or not the boot id tells
        det = detector()
        assert any(f.detector == "gpu_throttle" for f in run(det, 300, gauges=lambda k: hot))
        back = run(det, 200, start=300 + 3 * 3600 // int(DT), boot_id=lambda k, b=boot: b)
        assert not any(f.detector == "gpu_throttle" for f in back)


def test_throttling_that_stopped_is_not_reported_while_its_share_decays() -> None:
    det = detector()
    hot = {"clocks_event_reasons": [0, 0, 0, 0x40, 0, 0, 0, 0]}
    assert any(f.detector == "gpu_throttle" for f in run(det, 300, gauges=lambda k: hot))
    cool = run(det, 300, start=300)  # the share is still above the fraction for ~45 min
    assert not any(f.detector == "gpu_throttle" for f in cool)


def test_missing_metrics_and_missing_values_are_tolerated() -> None:
    det = detector()
    rng = np.random.default_rng(0)
    for k in range(40):
        holes = {"gpu_temp": [None] * 8, "power_usage": [650.0] * 7 + [None]}
        msg = gpu_message("n0", 1000 + DT * k, rng, gauges=holes)
        sparse = r.GpuTelemetry(node="n1", ts=1000 + DT * k, gpus=[0, 1], metrics=r.GpuMetrics(gpu_temp=[50.0, 51.0]))
        assert det.observe_batch([msg, sparse]) == []


def test_the_batch_path_finds_exactly_what_one_message_at_a_time_finds() -> None:
    single, batched = detector(), detector()
    rng = np.random.default_rng(7)
    msgs = []
    for k in range(150):
        for n in range(6):
            hot = {n: 8.0} if (n in (1, 4) and k > 90) else None
            dbe = {"ecc_dbe_vol_total": [1] * 8} if (n == 2 and k > 120) else None
            msgs.append(gpu_message(f"n{n}", 1000 + DT * k, rng, hot=hot, counters=dbe))
    one_by_one = [f for m in msgs for f in single.observe(m)]
    in_batches = [f for i in range(0, len(msgs), 64) for f in batched.observe_batch(msgs[i : i + 64])]
    assert sorted(f.id for f in one_by_one) == sorted(f.id for f in in_batches)
    assert len(one_by_one) >= 3
    # one message per node (the usual micro-batch) from stage 1's shared columns: the same again
    shared = detector()
    per_tick = [msgs[i : i + 6] for i in range(0, len(msgs), 6)]
    from_shared = [f for tick in per_tick for f in shared.observe_batch(tick, stage1_batch(tick))]
    assert [f.id for f in from_shared] == [f.id for f in one_by_one]


def test_state_restored_from_bytes_continues_exactly() -> None:
    a, b = detector(), detector()
    rng_a, rng_b = np.random.default_rng(3), np.random.default_rng(3)
    stream_a = [gpu_message("n0", 1000 + DT * k, rng_a, hot={1: 8.0} if k > 80 else None) for k in range(120)]
    stream_b = [gpu_message("n0", 1000 + DT * k, rng_b, hot={1: 8.0} if k > 80 else None) for k in range(120)]
    for m in stream_b[:70]:
        b.observe(m)
    restored = GpuDetector(Settings().detection)
    restored.load_node("n0", b.node_bytes("n0") or b"")
    for m in stream_a[:70]:
        a.observe(m)
    assert [f.id for m in stream_a[70:] for f in a.observe(m)] == [f.id for m in stream_b[70:]
                                                                   for f in restored.observe(m)]


def test_state_per_gpu_stays_under_4_kb() -> None:
    det = detector()
    run(det, 50)
    assert len(det.node_bytes("n0") or b"") / 8 <= 4096


def test_an_unknown_signal_in_the_config_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown signal"):
        detector("detection: {metrics: {gpu_tmp: {direction: up}}}")


def test_a_long_fault_that_is_repaired_stops_being_reported_soon_after() -> None:
    """The drift sum is capped, so hours of a fault do not keep a repaired GPU flagged for hours."""
    det = detector("detection: {reassert_s: 60}")
    run(det, 100)
    run(det, 720, start=100, hot=lambda k: {5: 9.0})  # two hours of a hot GPU
    after = run(det, 120, start=820)  # repaired
    late = [f for f in after if f.ts > 1000 + DT * (820 + 60)]
    assert late == []
