"""Missing data is not a fault: a GPU absent from a record or two (a partial scrape, a
scrape split in two because one GPU's series were stamped a millisecond apart) keeps its baselines
and gives no finding; a GPU absent for ``gpu_missing_after_samples`` records over
``gpu_missing_after_s`` is lost, at once with XID 79 (NVML's lost-GPU error); a node that went
silent is a ``telemetry`` finding, never a hardware one."""

from __future__ import annotations

import numpy as np

from fleetmedic import records as r
from fleetmedic.config import parse_config
from fleetmedic.devenv.synth import blank_gpu, gpu_message, only_gpus
from fleetmedic.models.gpu_detector import GpuDetector
from fleetmedic.models.gpu_signals import COUNT, PLANES
from fleetmedic.models.gpu_state import NodeGpuState
from fleetmedic.models.stages import NodeDetection, stage1_batch

DT = 10.0
ALL = list(range(8))
NO_3 = [0, 1, 2, 4, 5, 6, 7]


def detector(yaml: str = "") -> GpuDetector:
    return GpuDetector(parse_config(yaml).detection)


def counters(k: int) -> dict[str, list[int]]:
    """Counters that climb on every GPU alike (NVLink, SBE): a rate over a wrong interval would show."""
    return {"nvlink_crc_flit_error_count_total": [k] * 8, "ecc_sbe_vol_total": [2 * k] * 8}


def msg(k: int, rng: np.random.Generator, node: str = "n0", **kw: object) -> r.GpuTelemetry:
    return gpu_message(node, 1000 + DT * k, rng, counters=counters(k), **kw)  # type: ignore[arg-type]


def counts(det: GpuDetector, node: str = "n0") -> np.ndarray:
    """The baselines' sample counts ``[signals, GPUs]`` (how much each has learnt)."""
    st = msgspec_decode(det.node_bytes(node) or b"")
    return np.frombuffer(st.planes, dtype=np.float64).reshape(PLANES, len(st.signals), len(st.gpus))[COUNT]


def msgspec_decode(data: bytes) -> NodeGpuState:
    import msgspec

    return msgspec.msgpack.decode(data, type=NodeGpuState)


def test_one_record_without_a_gpu_then_all_eight_gives_no_finding_and_the_gpu_keeps_its_baseline() -> None:
    det, rng = detector(), np.random.default_rng(1)
    found = [f for k in range(60) for f in det.observe(msg(k, rng))]
    before = counts(det)
    names = det.names
    temp, nvlink = names.index("gpu_temp"), names.index("nvlink_error_rate")
    assert found == [] and before[temp, 3] == 60
    found += det.observe(only_gpus(msg(60, rng), NO_3))  # a partial scrape
    found += [f for k in range(61, 120) for f in det.observe(msg(k, rng))]
    assert found == []
    after = counts(det)
    assert det.node_bytes("n0") is not None and msgspec_decode(det.node_bytes("n0") or b"").gpus == tuple(ALL)
    # GPU 3 continued from what it had learnt: one sample fewer than its siblings for the residuals
    # (the record it missed), two for the rates (its first rate after the gap is not computed either)
    assert after[temp, 3] == after[temp, 0] - 1 == before[temp, 3] + 59
    assert after[nvlink, 3] == after[nvlink, 0] - 2


def test_a_hot_gpu_is_still_found_across_a_partial_scrape() -> None:
    det, rng = detector(), np.random.default_rng(2)
    for k in range(80):
        det.observe(msg(k, rng))
    found = det.observe(only_gpus(msg(80, rng, hot={3: 9.0}), NO_3))
    found += [f for k in range(81, 90) for f in det.observe(msg(k, rng, hot={3: 9.0}))]
    assert {(f.detector, f.gpu) for f in found} == {("gpu_baseline", 3)}


def test_a_gpu_absent_longer_than_the_threshold_is_one_gpu_missing_finding() -> None:
    det, rng = detector(), np.random.default_rng(3)
    for k in range(40):
        det.observe(msg(k, rng))
    found = [(k, f) for k in range(40, 60) for f in det.observe(only_gpus(msg(k, rng), NO_3))]
    # absent from 3 records in a row spanning 20 s (the defaults): the third record without it
    assert [(k, f.detector, f.kind, f.severity, f.gpu, f.action_hint) for k, f in found] == [
        (42, "hard_rules", "hard_fault", "critical", 3, "reboot_node")]
    (_, f), = found
    assert f.evidence[0].metric == "gpu_count" and f.evidence[0].value == 7 and f.evidence[0].baseline == 8
    assert "3 records" in f.evidence[0].note


def test_gpu_missing_needs_both_the_records_and_the_time() -> None:
    det, rng = detector("detection: {gpu_missing_after_samples: 5, gpu_missing_after_s: 30}"), np.random.default_rng(4)
    for k in range(40):
        det.observe(msg(k, rng))
    found = [(k, f.gpu) for k in range(40, 50) for f in det.observe(only_gpus(msg(k, rng), NO_3))]
    assert found == [(44, 3)]  # the 5th record (40 s after the first) ; 30 s alone was not enough
    # records a second apart (a burst of split scrapes): 5 of them are not 30 s
    det2, rng = detector("detection: {gpu_missing_after_samples: 5, gpu_missing_after_s: 30}"), np.random.default_rng(4)
    for k in range(40):
        det2.observe(msg(k, rng))
    t0 = 1000 + DT * 40
    burst = [only_gpus(msg(40, rng), NO_3, ts=t0 + j) for j in range(40)]
    when = [m.ts - t0 for m in burst for f in det2.observe(m) if f.detector == "hard_rules"]
    assert when == [30.0]


def test_xid_79_for_a_missing_gpu_confirms_it_lost_at_once() -> None:
    det, rng = detector(), np.random.default_rng(5)
    for k in range(40):
        det.observe(msg(k, rng))
    xid = r.XidEvent(gpu=3, xid=79, ts=1000 + DT * 40 - 0.5, message="GPU has fallen off the bus")
    found = det.observe(only_gpus(msg(40, rng), NO_3, xids=[xid]))
    assert {(f.detector, f.gpu, f.severity) for f in found} == {("hard_rules", 3, "critical"),
                                                                ("xid_rules", 3, "critical")}
    assert "XID 79" in next(f for f in found if f.detector == "hard_rules").evidence[0].note


def test_xid_79_just_before_the_gpu_vanishes_confirms_it_at_once_too() -> None:
    det, rng = detector(), np.random.default_rng(6)
    for k in range(40):
        det.observe(msg(k, rng))
    xid = r.XidEvent(gpu=3, xid=79, ts=1000 + DT * 40, message="GPU has fallen off the bus")
    assert [f.detector for f in det.observe(msg(40, rng, xids=[xid]))] == ["xid_rules"]
    assert [f.detector for f in det.observe(only_gpus(msg(41, rng), NO_3))] == ["hard_rules"]


def test_nvmls_lost_gpu_a_gpu_listed_with_no_values_and_xid_79_is_lost_at_once() -> None:
    det, rng = detector(), np.random.default_rng(7)
    for k in range(40):
        det.observe(msg(k, rng))
    first = det.observe(blank_gpu(msg(40, rng), 3, xid=True))
    assert {(f.detector, f.gpu) for f in first} == {("hard_rules", 3), ("xid_rules", 3)}
    # the exporter keeps listing it with no values: one condition, reported again only after reassert_s
    later = [f for k in range(41, 60) for f in det.observe(blank_gpu(msg(k, rng), 3))]
    assert later == []
    # and without the XID (a GPU listed with no values) it is missing data until it stays away
    det2, rng = detector(), np.random.default_rng(7)
    for k in range(40):
        det2.observe(msg(k, rng))
    assert det2.observe(blank_gpu(msg(40, rng), 3)) == []
    assert [(f.detector, f.gpu) for k in range(41, 43) for f in det2.observe(blank_gpu(msg(k, rng), 3))] == [
        ("hard_rules", 3)]


def test_a_scrape_split_in_two_records_a_millisecond_apart_gives_no_finding() -> None:
    """One GPU's series stamped 1 ms apart from the rest: two records, 7 GPUs then GPU 3 alone. No
    GPU is missing, and GPU 3's counters over 1 ms are no rate spike."""
    det, rng = detector(), np.random.default_rng(8)
    found = []
    for k in range(300):
        m = msg(k, rng)
        other = msg(k, rng, node="n1")
        if k > 40 and k % 7 == 0:
            found += det.observe_batch([only_gpus(m, NO_3), other, only_gpus(m, [3], ts=m.ts + 0.001)])
        else:
            found += det.observe_batch([m, other])
    assert found == []


def test_a_record_of_a_few_gpus_teaches_no_residual() -> None:
    """A record holding GPU 3 alone: its temperature minus the median of itself is 0, not its offset
    from its siblings; the baseline does not learn it."""
    det, rng = detector(), np.random.default_rng(9)
    for k in range(60):
        det.observe(msg(k, rng))
    before = counts(det)
    det.observe(only_gpus(msg(60, rng), [3]))
    after = counts(det)
    temp = det.names.index("gpu_temp")
    assert after[temp, 3] == before[temp, 3]


def test_batches_with_partial_and_split_records_find_what_one_message_at_a_time_finds() -> None:
    rng = np.random.default_rng(10)
    msgs: list[r.GpuTelemetry] = []
    for k in range(160):
        for n in range(5):
            m = gpu_message(f"n{n}", 1000 + DT * k, rng, counters=counters(k), hot={2: 9.0} if n == 1 and k > 100
                            else None)
            if n == 2 and k % 11 == 0:
                msgs += [only_gpus(m, NO_3), only_gpus(m, [3], ts=m.ts + 0.001)]
            elif n == 3 and k > 120:
                msgs.append(only_gpus(m, NO_3))  # GPU 3 gone for good
            elif n == 4 and 50 <= k < 52:
                msgs.append(only_gpus(m, [0, 1, 2, 3]))
            else:
                msgs.append(m)
    single, batched, shared = detector(), detector(), detector()
    one_by_one = [f for m in msgs for f in single.observe(m)]
    in_batches = [f for i in range(0, len(msgs), 64) for f in batched.observe_batch(msgs[i: i + 64])]
    assert sorted(f.id for f in one_by_one) == sorted(f.id for f in in_batches)
    assert {(f.node, f.detector, f.gpu) for f in one_by_one} == {("n1", "gpu_baseline", 2), ("n3", "hard_rules", 3)}
    ticks: dict[float, list[r.GpuTelemetry]] = {}
    for m in msgs:
        ticks.setdefault(round(m.ts), []).append(m)
    from_shared = [f for tick in ticks.values() for f in shared.observe_batch(tick, stage1_batch(tick))]
    assert sorted(f.id for f in from_shared) == sorted(f.id for f in one_by_one)


def test_state_saved_while_a_gpu_is_absent_continues_exactly() -> None:
    rng = np.random.default_rng(11)
    stream = [msg(k, rng) for k in range(80)]
    stream = [only_gpus(m, NO_3) if 60 <= k < 62 or k >= 70 else m for k, m in enumerate(stream)]
    a, b = detector(), detector()
    for m in stream[:61]:
        a.observe(m)
        b.observe(m)
    restored = detector()
    restored.load_node("n0", b.node_bytes("n0") or b"")
    rest_a = [f.id for m in stream[61:] for f in a.observe(m)]
    assert rest_a == [f.id for m in stream[61:] for f in restored.observe(m)]
    assert len(rest_a) == 1 and ":gpu_missing:3:" in rest_a[0]


def test_a_node_gap_is_missing_data_never_a_hardware_finding() -> None:
    for boot in ("b1", "b2"):  # the node came back with or without a reboot
        stage = NodeDetection(parse_config("detection: {multivariate: {enabled: false}}").detection)
        rng = np.random.default_rng(12)
        found = []
        for k in range(60):
            found += stage.on_gpu([gpu_message("n0", 1000 + DT * k, rng, counters=counters(k), boot_id="b1")])
        assert found == []
        # 30 minutes of nothing; the first record after it lacks GPU 3, then all are back
        back = 60 + 180
        first = only_gpus(gpu_message("n0", 1000 + DT * back, rng, counters=counters(back), boot_id=boot), NO_3)
        found += stage.on_gpu([first])
        for k in range(back + 1, back + 60):
            found += stage.on_gpu([gpu_message("n0", 1000 + DT * k, rng, counters=counters(k), boot_id=boot)])
        assert [(f.detector, f.kind, f.severity) for f in found] == [("telemetry_gap", "telemetry", "info")]
        assert found[0].evidence[0].value == 1800.0 + DT
