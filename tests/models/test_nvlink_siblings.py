"""NVLink degradation: error counters rising on one GPU while its siblings stay flat are
found, bursts at once and slow rises too, even a rise the GPU's own baseline has learnt as normal
(``gpu_siblings``: the GPU's smoothed rate against the median of its node's GPUs); errors on every
GPU of a node, single stray errors and a GPU reset are not."""

from __future__ import annotations

import numpy as np

from fleetmedic import records as r
from fleetmedic.config import parse_config
from fleetmedic.devenv.synth import gpu_message
from fleetmedic.models.gpu_detector import GpuDetector
from fleetmedic.models.gpu_signals import WATCHED, M, W, compute_signals

DT = 10.0
NVLINK = ("nvlink_crc_flit_error_count_total", "nvlink_crc_data_error_count_total",
          "nvlink_replay_error_count_total", "nvlink_recovery_error_count_total")


def detector(yaml: str = "") -> GpuDetector:
    return GpuDetector(parse_config(yaml).detection)


class Link:
    """NVLink counters of a node's 8 GPUs, advanced by a per-GPU CRC flit error rate (per second),
    data, replay and recovery errors in proportion (Poisson)."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.c = np.zeros((4, 8), dtype=np.int64)

    def step(self, flit_per_s: np.ndarray) -> dict[str, list[int]]:
        lam = np.outer([1.0, 0.1, 0.25, 0.005], flit_per_s) * DT
        self.c += self.rng.poisson(lam)
        return {name: self.c[i].tolist() for i, name in enumerate(NVLINK)}

    def reset(self, gpu: int) -> None:
        self.c[:, gpu] = 0


def feed(det: GpuDetector, link: Link, rates: list[np.ndarray], start: int = 0, node: str = "n0",
         resets: dict[int, int] | None = None) -> list[tuple[int, r.Finding]]:
    rng = np.random.default_rng(start + 99)
    out = []
    for k, rate in enumerate(rates, start=start):
        if resets and k in resets:
            link.reset(resets[k])
        counters = link.step(rate)
        out += [(k, f) for f in det.observe(gpu_message(node, 1000 + DT * k, rng, counters=counters))]
    return out


def flat(n: int, per_s: float = 0.0) -> list[np.ndarray]:
    return [np.full(8, per_s) for _ in range(n)]


def with_gpu(rates: list[np.ndarray], gpu: int, per_s: list[float]) -> list[np.ndarray]:
    out = [x.copy() for x in rates]
    for x, v in zip(out, per_s, strict=True):
        x[gpu] = v
    return out


def test_a_slow_rise_on_one_gpu_is_found_and_its_siblings_are_not() -> None:
    det, link = detector(), Link(1)
    warm = feed(det, link, flat(60))
    # from nothing to 0.2 CRC errors/s (about 16 errors a minute in all) over two hours
    ramp = [0.2 * k / 720 for k in range(720)]
    found = feed(det, link, with_gpu(flat(720), 5, ramp), start=60)
    assert warm == []
    assert {f.gpu for _, f in found} == {5}
    first = min(k for k, f in found if f.detector == "gpu_siblings") - 60
    # found once its smoothed errors exceed min_excess (3/min): ~0.035 flit errors/s, 2 h x 0.035 / 0.2
    assert first * DT < 40 * 60, f"found after {first * DT:.0f} s"
    f = next(f for _, f in found if f.detector == "gpu_siblings")
    assert (f.kind, f.severity, f.evidence[0].metric) == ("degradation", "warning", "nvlink_error_rate")
    assert f.evidence[0].value is not None and f.evidence[0].value >= 3.0 and f.evidence[0].baseline == 0.0


def test_a_rise_the_gpus_own_baseline_learnt_as_normal_is_found_against_its_siblings() -> None:
    """The link was already bad when the GPU's baseline started (a repair that did not fix it: the
    baselines start again; a new deployment): its noisy error rate is the GPU's normal, and it keeps
    rising slowly. Only the comparison with its siblings tells."""
    det, link = detector(), Link(2)
    rising = [0.3 + 0.3 * k / 1080 for k in range(1080)]  # 18 -> 36 CRC errors a minute over 3 h
    found = feed(det, link, with_gpu(flat(1080), 2, rising))
    assert {f.gpu for _, f in found} == {2}
    mine = [k for k, f in found if f.detector == "gpu_siblings"]
    assert mine[0] == min(k for k, _ in found) and mine[0] * DT <= 120  # first, as soon as the smoothing shows it
    assert len(mine) >= 1080 * DT / 600 - 1  # and for as long as it lasts (once per reassert_s)
    # the GPU's own baseline hardly sees it: its noisy rate is its normal
    assert len([f for _, f in found if f.detector in ("gpu_baseline", "gpu_drift")]) <= 1


def test_a_burst_is_found_at_once_and_critical() -> None:
    det, link = detector(), Link(3)
    feed(det, link, flat(60))
    burst = [200.0] * 6 + [0.0] * 120  # a minute of 200 CRC errors/s, then quiet
    found = feed(det, link, with_gpu(flat(126), 6, burst), start=60)
    assert {f.gpu for _, f in found} == {6}
    k, f = min(((k, f) for k, f in found if f.detector == "gpu_siblings"), key=lambda kf: kf[0])
    assert k == 60 and f.severity == "critical"  # the first sample of the burst
    assert any(f.detector == "gpu_baseline" and f.severity == "critical" for _, f in found)
    # once quiet, the smoothing decays (by half every halflife_samples): not reported for long after
    assert max(k for k, f in found if f.detector == "gpu_siblings") < 60 + 6 + 120


def test_errors_on_every_gpu_of_a_node_are_no_sibling_finding() -> None:
    """An NVSwitch or a baseboard problem shows on every GPU: that is the node's, not one GPU's link."""
    det, link = detector(), Link(4)
    feed(det, link, flat(60))
    found = feed(det, link, [np.full(8, 0.2 * min(1.0, k / 360)) for k in range(720)], start=60)
    assert not [f for _, f in found if f.detector == "gpu_siblings"]


def test_stray_errors_are_no_finding() -> None:
    det, link = detector(), Link(5)
    rates = flat(2000)
    for k in range(0, 2000, 97):  # an error or a few now and then on one GPU or another
        rates[k][k % 8] = 0.1
    assert feed(det, link, rates) == []


def test_a_gpu_reset_clears_the_smoothed_rate() -> None:
    """After a repair (the GPU reset: its counters start from zero) the errors it had are history."""
    det, link = detector("detection: {reassert_s: 30}"), Link(6)
    feed(det, link, flat(60))
    feed(det, link, with_gpu(flat(60), 1, [20.0] * 60), start=60)
    after = feed(det, link, flat(30), start=120, resets={120: 1})
    assert not [f for _, f in after if f.detector == "gpu_siblings"]


def test_the_comparison_is_configured() -> None:
    link, rates = Link(7), with_gpu(flat(200), 4, [0.1] * 200)  # about 8 errors a minute
    assert any(f.detector == "gpu_siblings" for _, f in feed(detector(), link, rates))
    link = Link(7)
    quiet = detector("detection: {siblings: {min_excess: 20}}")
    assert not any(f.detector == "gpu_siblings" for _, f in feed(quiet, link, rates))
    link = Link(7)
    off = detector("detection: {siblings: {signals: []}}")
    assert not any(f.detector == "gpu_siblings" for _, f in feed(off, link, rates))


def test_the_smoothed_rates_survive_a_state_round_trip() -> None:
    a, link_a = detector(), Link(8)
    rates = with_gpu(flat(120), 3, [0.0] * 60 + [0.1] * 60)
    first = feed(a, link_a, rates[:80])
    restored = detector()
    restored.load_node("n0", a.node_bytes("n0") or b"")
    link_b = Link(8)
    feed(detector(), link_b, rates[:80])  # the same counters up to here
    rest_a = [f.id for _, f in feed(a, link_a, rates[80:], start=80)]
    rest_b = [f.id for _, f in feed(restored, link_b, rates[80:], start=80)]
    assert rest_a == rest_b and (first or rest_a)


def test_with_only_the_crc_flit_counter_a_rising_gpu_among_flat_siblings_is_found() -> None:
    """dcgm-exporter users often enable only DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: the
    composite rate sums the counters present, so one rising 40-90 per 30 s beside 7 flat GPUs is found."""
    det, rng = detector(), np.random.default_rng(7)
    absent: dict[str, list[object] | None] = {name: None for name in NVLINK[1:]}
    flit = [0] * 8
    found: list[tuple[int, r.Finding]] = []
    for k in range(240):  # 40 min at 10 s; the rise starts after 10 min
        if k >= 60:
            flit[3] += int(rng.integers(40, 91)) // 3
        msg = gpu_message("n0", 1000 + DT * k, rng, counters={NVLINK[0]: list(flit)}, gauges=absent)  # type: ignore[dict-item]
        found += [(k, f) for f in det.observe(msg)]
    assert found and {f.gpu for _, f in found} == {3}
    assert any(f.evidence[0].metric == "nvlink_error_rate" for _, f in found)
    assert min(k for k, _ in found) >= 60


def test_a_composite_rate_sums_the_counters_present_and_none_when_one_went_down() -> None:
    det = detector()
    plan, names = det.plan, det.plan.names
    j = names.index("nvlink_error_rate")
    x = np.full((1, len(M), 2), np.nan)
    prev = np.full((1, len(WATCHED), 2), np.nan)
    x[0, M[NVLINK[0]]], prev[0, W[NVLINK[0]]] = [10.0, 4.0], [4.0, 6.0]  # GPU 1's counter went down
    x[0, M[NVLINK[2]]], prev[0, W[NVLINK[2]]] = [3.0, 1.0], [1.0, 1.0]
    out = compute_signals(x, prev, np.array([60.0]), np.array([False]), plan, 120.0)
    assert out[0, j, 0] == 8.0 and np.isnan(out[0, j, 1])
    x[0, M[NVLINK[0]]] = np.nan  # no NVLink counter but the replay one: its rate alone
    prev[0, W[NVLINK[0]]] = np.nan
    out = compute_signals(x, prev, np.array([60.0]), np.array([False]), plan, 120.0)
    assert list(out[0, j]) == [2.0, 0.0]
    x[0, M[NVLINK[2]]] = np.nan  # none present: no rate
    assert np.isnan(compute_signals(x, prev, np.array([60.0]), np.array([False]), plan, 120.0)[0, j]).all()
