"""The compiled signals and baseline step (fleetmedic/models/_baselines.c) against the numpy
functions they replace (gpu_signals.compute_signals with the watched values' update, and
gpu_signals.step_baselines): equal results for any metric and signal values over the states the
detector reaches, a refusal before any write for what they cannot take (then numpy runs), and
the same findings and node states from the whole detector either way, the C loops taking every
micro-batch."""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetmedic.config import Settings
from fleetmedic.models import gpu_signals as gs
from fleetmedic.models.gpu_signals import (
    CUSUM_DOWN,
    CUSUM_UP,
    PLANES,
    STREAK,
    WATCHED,
    WATCHED_ROWS,
    BaselineParams,
    SignalPlan,
    StepResult,
)
from fleetmedic.models.stages import NodeDetection, stage1_batch
from fleetmedic.records import DetectionTelemetry, decoder_for, encode
from fleetmedic.sim.engine import SimConfig, Simulator
from fleetmedic.sim.fleet import FleetSpec

try:
    from fleetmedic.models import _baselines as native
except ImportError:  # every test below but the fallback test then fails (the first says why); none skips
    native = None

SIGNAL = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(-50, 50),  # mostly values near a baseline: warm, learning, exceeding
    st.sampled_from([0.0, -0.0, 1.0, -1.0]),
)
FIELDS = ("z", "deviation", "baseline", "exceeded", "critical", "persistent", "drifting")


def test_the_native_loop_is_built() -> None:
    # the package builds it wherever a C compiler is found (scripts/test installs with one); a
    # machine without one runs the numpy path, slower, and fails this test to say so
    assert native is not None and gs.NATIVE_BASELINES, \
        "fleetmedic.models._baselines is not built: pip install -e . with a C compiler"


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal bit for bit, except a zero's sign (numpy's own maximum/minimum give either) and NaN's payload."""
    if a.dtype == np.bool_:
        return bool(np.array_equal(a, b))
    same_bits = a.view(np.int64) == b.view(np.int64)
    return bool(np.all(same_bits | ((a == 0) & (b == 0)) | (np.isnan(a) & np.isnan(b))))


def _plan(data: st.DataObject, s: int, min_std: float) -> SignalPlan:
    def column(strategy: st.SearchStrategy[float]) -> np.ndarray:
        return np.array(data.draw(st.lists(strategy, min_size=s, max_size=s)), dtype=np.float64)[:, None]

    z_warning = column(st.floats(0.5, 6))
    min_delta = column(st.floats(0, 20))
    return SignalPlan(
        names=tuple(f"s{i}" for i in range(s)), residual_idx=np.zeros(0, dtype=np.intp), n_residual=0,
        rate_groups=(), sign=column(st.sampled_from([1.0, -1.0, 0.0])), z_warning=z_warning,
        z_critical=z_warning + column(st.floats(0, 4)), min_delta=min_delta,
        std_floor=np.maximum(min_std, min_delta / z_warning))


def _params(data: st.DataObject) -> BaselineParams:
    return BaselineParams(alpha=data.draw(st.floats(0.001, 1.0)), warmup=data.draw(st.integers(1, 6)),
                          min_std=data.draw(st.floats(0.01, 5)), protect_z=data.draw(st.floats(0.5, 8)),
                          continuity=data.draw(st.integers(1, 5)), cusum_k=data.draw(st.floats(0, 2)),
                          cusum_h=data.draw(st.floats(0.5, 30)))


def _numpy(y: np.ndarray, slab: np.ndarray, idx: np.ndarray, plan: SignalPlan, params: BaselineParams) -> StepResult:
    planes = slab[idx]
    with np.errstate(all="ignore"):  # inf and NaN signals: numpy warns, the C loop does not
        res = gs.step_baselines(y, planes, plan, params)
    slab[idx] = planes
    return res


@settings(max_examples=300, deadline=None)
@given(data=st.data(), b=st.integers(1, 5), s=st.integers(1, 4), g=st.integers(1, 4), steps=st.integers(1, 12))
def test_equals_the_numpy_path_step_after_step(data: st.DataObject, b: int, s: int, g: int, steps: int) -> None:
    params = _params(data)
    plan = _plan(data, s, params.min_std)
    rows = b + data.draw(st.integers(0, 3))
    slab = np.zeros((rows, PLANES, s, g))  # the detector's start: a new node's planes are zeros
    mine = slab.copy()
    for _ in range(steps):  # the states the step itself leads to, from any signal values
        idx = np.array(data.draw(st.permutations(range(rows)))[:b], dtype=np.intp)
        y = np.array(data.draw(st.lists(SIGNAL, min_size=b * s * g, max_size=b * s * g))).reshape(b, s, g)
        want = _numpy(y, slab, idx, plan, params)
        got = gs.step_baselines_at(y, mine, idx, plan, params)
        for name in FIELDS:
            assert _same(getattr(got, name), getattr(want, name)), name
        assert _same(mine, slab)  # the rows stepped, and the others untouched


@settings(max_examples=200, deadline=None)
@given(data=st.data(), s=st.integers(1, 3), g=st.integers(1, 3))
def test_equals_the_numpy_path_from_any_reachable_state(data: st.DataObject, s: int, g: int) -> None:
    # states drawn directly (count, EWMA, CUSUMs within their cap, streaks) rather than stepped to
    params = _params(data)
    plan = _plan(data, s, params.min_std)
    n = 3 * s * g
    slab = np.zeros((3, PLANES, s, g))
    slab[:, 0] = np.array(data.draw(st.lists(st.integers(0, 8), min_size=n, max_size=n))).reshape(3, s, g)
    slab[:, 1] = np.array(data.draw(st.lists(st.floats(-1e6, 1e6), min_size=n, max_size=n))).reshape(3, s, g)
    slab[:, 2] = np.array(data.draw(st.lists(st.floats(0, 1e6), min_size=n, max_size=n))).reshape(3, s, g)
    cap = 2 * params.cusum_h
    for plane in (CUSUM_UP, CUSUM_DOWN):
        slab[:, plane] = np.array(data.draw(st.lists(st.floats(0, cap), min_size=n, max_size=n))).reshape(3, s, g)
    slab[:, STREAK] = np.array(data.draw(st.lists(st.integers(0, 9), min_size=n, max_size=n))).reshape(3, s, g)
    y = np.array(data.draw(st.lists(SIGNAL, min_size=2 * s * g, max_size=2 * s * g))).reshape(2, s, g)
    idx = np.array([2, 0], dtype=np.intp)
    mine = slab.copy()
    want, got = _numpy(y, slab, idx, plan, params), gs.step_baselines_at(y, mine, idx, plan, params)
    for name in FIELDS:
        assert _same(getattr(got, name), getattr(want, name)), name
    assert _same(mine, slab)


def _call(y: Any, slab: Any, idx: Any, s: int = 2, shape: tuple[int, int, int] | None = None) -> None:
    b, g = len(idx), 3
    floats, flags = np.empty((3, b, s, g)), np.empty((4, b, s, g), dtype=np.bool_)
    col = np.ones(s)
    native.step_baselines_at(shape or (b, s, g), len(slab), y, slab, idx, col, col, col, col, col, 0.1, 3.0, 0.5,
                             4.0, 4.0, 0.5, 20.0, floats[0], floats[1], floats[2], flags)


@pytest.mark.parametrize(("change", "error"), [
    (dict(idx=np.array([1, 1])), ValueError),  # a row twice
    (dict(idx=np.array([0, 4])), IndexError),  # not a row
    (dict(idx=np.array([0, -1])), IndexError),
    (dict(idx=np.array([0, 1], dtype=np.int32)), TypeError),
    (dict(y=np.zeros((2, 2, 3), dtype=np.float32)), TypeError),
    (dict(y=np.zeros((2, 2, 4))), ValueError),  # another shape
    (dict(y=np.zeros((2, 3, 2)).transpose(0, 2, 1)), (ValueError, BufferError)),  # not C-contiguous
    (dict(slab=np.zeros((4, PLANES, 2, 3)), shape=(2, 3, 3)), ValueError),
])
def test_what_it_cannot_take_is_refused_before_any_write(change: dict[str, Any], error: Any) -> None:
    args: dict[str, Any] = dict(y=np.ones((2, 2, 3)), slab=np.full((4, PLANES, 2, 3), 7.0), idx=np.array([0, 1]))
    args.update(change)
    before = args["slab"].copy()
    with pytest.raises(error):
        _call(**args)
    assert np.array_equal(args["slab"], before)


def test_a_read_only_slab_is_refused() -> None:
    slab = np.zeros((4, PLANES, 2, 3))
    slab.flags.writeable = False
    with pytest.raises((ValueError, BufferError)):
        _call(np.ones((2, 2, 3)), slab, np.array([0, 1]))


def test_a_refused_step_takes_the_numpy_path() -> None:
    # a signal array that is not C-contiguous: the C loop refuses it, numpy steps the same rows
    params = BaselineParams(alpha=0.1, warmup=2, min_std=0.5, protect_z=4.0, continuity=2, cusum_k=0.5, cusum_h=5.0)
    plan = SignalPlan(names=("a", "b"), residual_idx=np.zeros(0, dtype=np.intp), n_residual=0, rate_groups=(),
                      sign=np.array([[1.0], [0.0]]), z_warning=np.array([[3.0], [3.0]]),
                      z_critical=np.array([[5.0], [5.0]]), min_delta=np.array([[1.0], [1.0]]),
                      std_floor=np.array([[0.5], [0.5]]))
    rng = np.random.default_rng(3)
    slab, mine = np.zeros((3, PLANES, 2, 4)), np.zeros((3, PLANES, 2, 4))
    for _ in range(6):
        y = np.asfortranarray(rng.normal(size=(2, 2, 4)))
        want = _numpy(y, slab, np.array([2, 0]), plan, params)
        got = gs.step_baselines_at(y, mine, np.array([2, 0]), plan, params)
        for name in FIELDS:
            assert _same(getattr(got, name), getattr(want, name)), name
    assert _same(mine, slab) and slab[:, 0].sum() > 0


METRIC = st.one_of(st.floats(allow_nan=True, allow_infinity=False), st.sampled_from([0.0, -0.0, 1.0, 5.0, 2.0**60]))


@settings(max_examples=300, deadline=None)
@given(data=st.data(), b=st.integers(1, 5), g=st.integers(1, 4), r=st.integers(0, 3), rates=st.integers(0, 4),
       strided=st.booleans())
def test_signals_equal_the_numpy_path(data: st.DataObject, b: int, g: int, r: int, rates: int, strided: bool) -> None:
    m, w = int(WATCHED_ROWS.max()) + 1, len(WATCHED)
    groups = tuple(np.array(data.draw(st.lists(st.integers(0, w - 1), min_size=1, max_size=4)), dtype=np.intp)
                   for _ in range(rates))
    residual = np.array(data.draw(st.lists(st.integers(0, m - 1), min_size=r, max_size=r)), dtype=np.intp)
    plan = SignalPlan(names=tuple(f"s{i}" for i in range(r + rates)), residual_idx=residual, n_residual=r,
                      rate_groups=groups, sign=np.zeros((r + rates, 1)), z_warning=np.ones((r + rates, 1)),
                      z_critical=np.ones((r + rates, 1)), min_delta=np.ones((r + rates, 1)),
                      std_floor=np.ones((r + rates, 1)))
    n = b * (m + 2) * g
    wide = np.array(data.draw(st.lists(METRIC, min_size=n, max_size=n))).reshape(b, m + 2, g)
    x = wide[:, 1:m + 1, :] if strided else np.ascontiguousarray(wide[:, 1:m + 1, :])  # a batch's view, or a copy
    rows = b + data.draw(st.integers(0, 2))
    slab = np.array(data.draw(st.lists(METRIC, min_size=rows * w * g, max_size=rows * w * g))).reshape(rows, w, g)
    idx = np.array(data.draw(st.permutations(range(rows)))[:b], dtype=np.intp)
    dt = np.array(data.draw(st.lists(st.sampled_from([np.nan, 0.0, -1.0, 1.0, 10.0, 59.9, 60.0, 61.0, 1e-3]),
                                     min_size=b, max_size=b)))
    reset = np.array(data.draw(st.lists(st.booleans(), min_size=b, max_size=b)))
    medians = None if data.draw(st.booleans()) else np.array(
        data.draw(st.lists(METRIC, min_size=b * r, max_size=b * r))).reshape(b, r)
    mine = slab.copy()
    with np.errstate(all="ignore"):
        want = gs.compute_signals(x, slab[idx], dt, reset, plan, 60.0,
                                  medians if medians is not None or not r else None)
        watched = x[:, WATCHED_ROWS, :]
        slab[idx] = np.where(np.isfinite(watched), watched, slab[idx])
        got = gs.signals_at(x, mine[idx], mine, idx, dt, reset, plan, 60.0, medians)
    assert _same(got, want)
    assert _same(mine, slab)


def test_signals_refuse_before_any_write() -> None:
    b, g, w = 2, 3, len(WATCHED)
    m = int(WATCHED_ROWS.max()) + 1
    x, slab = np.ones((b, m, g)), np.full((4, w, g), 7.0)
    good: dict[str, Any] = dict(shape=(b, m, g, 2, w), rows=4, x=x, prev=slab, idx=np.array([0, 1]),
                                dt=np.ones(b), reset=np.zeros(b, dtype=bool), medians=np.ones((b, 1)),
                                residual_rows=np.array([0]), watched_rows=WATCHED_ROWS,
                                group_starts=np.array([0, 1]), group_members=np.array([0]), max_gap_s=60.0,
                                out=np.empty((b, 2, g)))
    native.signals_at(*good.values())  # accepted as it is
    assert not np.array_equal(slab, np.full((4, w, g), 7.0))
    for change, error in [
        (dict(idx=np.array([1, 1])), ValueError),
        (dict(residual_rows=np.array([m])), IndexError),
        (dict(group_members=np.array([w])), IndexError),
        (dict(group_starts=np.array([0, 2])), ValueError),
        (dict(medians=np.ones((b, 2))), ValueError),
        (dict(out=np.empty((b, 3, g))), ValueError),
        (dict(x=np.ones((b, m, g), dtype=np.float32)), TypeError),
    ]:
        slab = np.full((4, w, g), 7.0)
        with pytest.raises(error):
            native.signals_at(*{**good, "prev": slab, **change}.values())
        assert np.array_equal(slab, np.full((4, w, g), 7.0)), change


def _simulated() -> list[bytes]:
    sim = Simulator(SimConfig(fleet=FleetSpec(nodes=8, nodes_per_su=4, spines=2), duration_s=2 * 3600, seed=11,
                              faults="hbm_degradation@20m/2/5,nvlink_errors@30m/5/1,fan_failure@40m/6,xid79@50m/3/3"))
    return [encode(m) for out in sim.run() if out.gpu is not None for m in out.gpu.to_records()]


def test_the_detector_finds_and_learns_the_same_either_way(monkeypatch: pytest.MonkeyPatch) -> None:
    wire = _simulated()
    decode = decoder_for(DetectionTelemetry).decode

    def run() -> tuple[list[bytes], list[bytes | None]]:
        stage = NodeDetection(Settings().detection)
        found = []
        for i in range(0, len(wire), 16):
            msgs = [decode(b) for b in wire[i:i + 16]]
            found.append(msgspec.json.encode(stage.on_gpu(msgs, stage1_batch(msgs))))
        return found, [stage.gpu.node_bytes(n) for n in sorted(stage.gpu.nodes())]

    calls = {"C": 0, "numpy": 0}

    def counted(fn: Any, kind: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            calls[kind] += 1
            return fn(*args, **kwargs)
        return call

    monkeypatch.setattr(gs, "_native_signals", counted(gs._native_signals, "C"))
    monkeypatch.setattr(gs, "_native_step", counted(gs._native_step, "C"))
    monkeypatch.setattr(gs, "compute_signals", counted(gs.compute_signals, "numpy"))
    monkeypatch.setattr(gs, "step_baselines", counted(gs.step_baselines, "numpy"))
    with_c = run()
    assert calls["C"] > 100 and calls["numpy"] == 0  # the C loops took every micro-batch
    monkeypatch.setattr(gs, "_native_signals", None)
    monkeypatch.setattr(gs, "_native_step", None)
    with_numpy = run()
    assert calls["numpy"] > 100
    assert sum(f.count(b'"detector"') for f in with_c[0]) > 10  # the faults were found
    assert with_c == with_numpy


def test_shapes_whose_sizes_overflow_are_refused() -> None:
    one, flags = np.ones(1), np.ones(1, dtype=np.bool_)
    with pytest.raises(ValueError, match="shape out of range"):
        native.step_baselines_at((2**62, 2, 3), 4, one, one, one, *[np.ones(2)] * 5, 0.1, 3.0, 0.5, 4.0, 4.0, 0.5,
                                 20.0, one, one, one, flags)
    with pytest.raises(ValueError, match="shape out of range"):
        native.signals_at((2, 2**40, 2**30, 2, 2), 4, *[one] * 10, 60.0, one)
