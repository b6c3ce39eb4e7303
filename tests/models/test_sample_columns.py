"""The batched per-sample reductions equal their one-message definitions exactly (multivariate
windows: fleetmedic.models.sample_columns and NodeWindowFeatures.add_batch)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetmedic import records as r
from fleetmedic.config import MultivariateSettings, PeerSettings
from fleetmedic.models.gpu_signals import THROTTLE_MASK, median, reported
from fleetmedic.models.multivariate import _RATES, NodeWindowFeatures, _sample_features
from fleetmedic.models.stages import stage1_batch, summarise, summarise_batch


def _reference(msg: r.GpuTelemetry) -> tuple[list[float], bool, list[float]]:
    """The one-message definition (plain Python over the reported values)."""
    def spread(vals: list[float]) -> float:
        return max(vals) - min(vals) if vals else math.nan

    reasons = reported(msg, "clocks_event_reasons")
    throttled = sum(1 for v in reasons if int(v) & THROTTLE_MASK) / len(reasons) if reasons else math.nan
    row = [spread(reported(msg, n)) for n in ("gpu_temp", "memory_temp", "power_usage", "sm_clock")] + [throttled]
    util = reported(msg, "gpu_util")
    busy = not util or median(util) >= MultivariateSettings().busy_util
    totals = [float(sum(sum(reported(msg, name)) for name in counters)) for counters in _RATES.values()]
    return row, busy, totals


def _column(draw: st.DrawFn, g: int, lo: float, hi: float, integer: bool = False) -> list[float | None] | None:
    if draw(st.integers(0, 5)) == 0:
        return None  # no GPU reported it
    value = st.integers(int(lo), int(hi)) if integer else st.floats(lo, hi, allow_nan=False)
    return [draw(st.one_of(st.none(), value)) if draw(st.integers(0, 6)) == 0 else draw(value) for _ in range(g)]


@st.composite
def messages(draw: st.DrawFn) -> list[r.GpuTelemetry]:
    out = []
    for i in range(draw(st.integers(1, 12))):
        g = draw(st.sampled_from([0, 1, 4, 8]))
        metrics = r.GpuMetrics(
            gpu_temp=_column(draw, g, 20, 95), memory_temp=_column(draw, g, 20, 105),
            power_usage=_column(draw, g, 50, 800), sm_clock=_column(draw, g, 200, 2000),
            mem_clock=_column(draw, g, 500, 3000),
            clocks_event_reasons=_column(draw, g, 0, 2 ** 12, integer=True),
            gpu_util=_column(draw, g, 0, 100),
            ecc_sbe_vol_total=_column(draw, g, 0, 10 ** 6, integer=True),
            pcie_replay_counter=_column(draw, g, 0, 10 ** 6, integer=True),
            nvlink_crc_flit_error_count_total=_column(draw, g, 0, 10 ** 6, integer=True),
            nvlink_replay_error_count_total=_column(draw, g, 0, 10 ** 6, integer=True),
        )
        out.append(r.GpuTelemetry(node=f"n{draw(st.integers(0, 3))}", ts=1000.0 + 30 * i, gpus=list(range(g)),
                                  metrics=metrics, sku=draw(st.sampled_from(["", "H100"]))))
    return out


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


@settings(max_examples=200, deadline=None)
@given(messages())
def test_batched_sample_features_equal_the_one_message_definition(msgs: list[r.GpuTelemetry]) -> None:
    for batch in (None, stage1_batch(msgs)):  # own columns, or stage 1's shared ones
        rows, busy, totals = _sample_features(msgs, batch)
        for i, msg in enumerate(msgs):
            ref_row, ref_busy, ref_totals = _reference(msg)
            assert all(_same(a, b) for a, b in zip(rows[i].tolist(), ref_row, strict=True)), (rows[i], ref_row)
            assert bool(busy[i]) == ref_busy and totals[i].tolist() == ref_totals


@settings(max_examples=100, deadline=None)
@given(messages())
def test_windows_accumulate_the_one_message_definition(msgs: list[r.GpuTelemetry]) -> None:
    # the open windows (one per node: the messages span less than window_s) hold, per gauge, the
    # sum and count of the finite values of the busy samples, and the first and last counter totals
    windows = NodeWindowFeatures(window_s=1e6)
    assert windows.add_batch(msgs, stage1_batch(msgs)) == [None] * len(msgs)
    for node in {m.node for m in msgs}:
        mine = [m for m in msgs if m.node == node]
        sums, finite, rows = [0.0] * 5, [0] * 5, 0
        for m in mine:
            row, busy, _ = _reference(m)
            if busy:
                rows += 1
                for j, v in enumerate(row):
                    if math.isfinite(v):
                        sums[j] += v
                        finite[j] += 1
        w = windows.window(node)
        assert w is not None
        assert (w.samples, w.rows, w.sums, w.finite) == (len(mine), rows, sums, finite)
        assert w.first_counters == dict(zip(_RATES, _reference(mine[0])[2], strict=True))
        assert w.last_counters == dict(zip(_RATES, _reference(mine[-1])[2], strict=True))


@settings(max_examples=50, deadline=None)
@given(messages())
def test_a_batch_gives_the_windows_of_one_message_at_a_time(msgs: list[r.GpuTelemetry]) -> None:
    batched, shared, single = (NodeWindowFeatures(window_s=60.0) for _ in range(3))
    got, got_shared = batched.add_batch(msgs), shared.add_batch(msgs, stage1_batch(msgs))
    want = [single.add(m) for m in msgs]
    for a, c, b in zip(got, got_shared, want, strict=True):
        for x in (a, c):
            assert (x is None) == (b is None)
            assert x is None or np.array_equal(x, b, equal_nan=True)
    for node in {m.node for m in msgs}:
        assert batched.node_bytes(node) == shared.node_bytes(node) == single.node_bytes(node)


@settings(max_examples=200, deadline=None)
@given(messages())
def test_batched_summaries_equal_one_message_summaries(msgs: list[r.GpuTelemetry]) -> None:
    want = [summarise(m) for m in msgs]
    assert summarise_batch(msgs) == want
    assert summarise_batch(msgs, stage1_batch(msgs)) == want  # from stage 1's shared columns


def test_columns_convert_ints_and_floats_exactly_and_never_truncate() -> None:
    from fleetmedic.models.sample_columns import columns

    def msg(sbe: list[int | float | None] | None, temp: list[float | None] | None) -> r.GpuTelemetry:
        return r.GpuTelemetry(node="n", ts=1.0, gpus=[0, 1], metrics=r.GpuMetrics(
            ecc_sbe_vol_total=sbe, gpu_temp=temp))  # type: ignore[arg-type]

    names = ("ecc_sbe_vol_total", "gpu_temp")  # int-valued first: the result keeps this order
    cases = [
        ([3, 2**63 - 1], [40.5, 41.0]),  # float(2**63 - 1) rounds as Python rounds it
        ([3, None], [40.5, None]),  # a GPU not reporting: NaN
        ([3.7, 1], [40.5, 41.0]),  # not an int (only a message built in code can hold it): as it is
        ([2**53 + 1, 0], [1e308, -0.0]),
        (None, [40.5, 41.0]),  # a metric no GPU reported (an exporter without it): NaN
        ([3, 4], None),
        (None, None),
        (None, [40.5, None]),  # both kinds of holes in one message
    ]
    for sbe, temp in cases:
        x = columns([msg(sbe, temp), msg([0, 0], [1.0, 2.0])], names)
        want = np.array([[[np.nan if v is None else float(v) for v in sbe or [None, None]],
                          [np.nan if v is None else float(v) for v in temp or [None, None]]],
                         [[0.0, 0.0], [1.0, 2.0]]])
        assert x.dtype == np.float64 and np.array_equal(x, want, equal_nan=True), (sbe, temp, x)


class _ReferenceWindows:
    """The window accumulation one sample at a time in plain Python (the definition)."""

    def __init__(self, window_s: float) -> None:
        self.window_s, self.open = window_s, {}  # type: ignore[var-annotated]

    def add(self, msg: r.GpuTelemetry) -> np.ndarray | None:  # type: ignore[type-arg]
        from fleetmedic.models.multivariate import _Window

        row, busy, totals = _reference(msg)
        w, done = self.open.get(msg.node), None
        if w is not None and msg.ts - w.start >= self.window_s:
            done, w = NodeWindowFeatures._close(w), None
        if w is None:
            w = self.open[msg.node] = _Window(start=float(msg.ts))
        w.samples += 1
        if busy:
            w.rows += 1
            for j, v in enumerate(row):
                if math.isfinite(v):
                    w.sums[j] += v
                    w.finite[j] += 1
        for feature, total in zip(_RATES, totals, strict=True):
            w.first_counters.setdefault(feature, total)
            w.last_counters[feature] = total
        w.last_ts = float(msg.ts)
        return done


@settings(max_examples=100, deadline=None)
@given(messages(), st.integers(1, 4), st.sampled_from([45.0, 60.0, 100.0]))
def test_windows_close_as_the_reference_over_batches_and_a_restore(msgs: list[r.GpuTelemetry], cut: int,
                                                                    window_s: float) -> None:
    import msgspec

    ref, mine = _ReferenceWindows(window_s), NodeWindowFeatures(window_s=window_s)
    want = [ref.add(m) for m in msgs]
    got = mine.add_batch(msgs[:cut], stage1_batch(msgs[:cut]))
    moved = NodeWindowFeatures(window_s=window_s)  # the nodes' windows saved and loaded mid-stream
    for node in {m.node for m in msgs}:
        moved.load_node(node, mine.node_bytes(node))
    got += moved.add_batch(msgs[cut:], stage1_batch(msgs[cut:])) if msgs[cut:] else []
    for a, b in zip(got, want, strict=True):
        assert (a is None) == (b is None) and (a is None or np.array_equal(a, b, equal_nan=True))
    for node in {m.node for m in msgs}:
        assert moved.node_bytes(node) == msgspec.msgpack.encode(ref.open[node])


def test_summary_columns_round_trip_and_a_malformed_batch_is_refused() -> None:
    import msgspec

    from fleetmedic.models.stages import SummaryColumns, summary_columns

    msgs = [r.GpuTelemetry(node=f"n{i}", ts=10.0 + i, gpus=[0, 1], sku="H100",
                           metrics=r.GpuMetrics(gpu_temp=[40.0, 42.0 + i], gpu_util=[95.0, 99.0] if i else [1.0, 2.0]))
            for i in range(3)] + [r.GpuTelemetry(node="empty", ts=20.0, gpus=[], metrics=r.GpuMetrics())]
    wire = msgspec.msgpack.encode(summary_columns(msgs))
    back = msgspec.msgpack.decode(wire, type=SummaryColumns).summaries()
    assert back == [summarise(m) for m in msgs]
    assert [s.band for s in back] == ["idle", "busy", "busy", ""] and back[3].values == {}
    assert back[1].values == {"gpu_temp": 41.5}  # not reported: left out
    # a row flagged as complete keeps what it has (a NaN there reads as not reported downstream)
    assert SummaryColumns(["n"], [1.0], [""], [""], ["gpu_temp"], [[40.0]], [False]).summaries()[0].values == {
        "gpu_temp": 40.0}
    short = msgspec.msgpack.encode(["n1", "n2"])
    with pytest.raises(msgspec.ValidationError):
        msgspec.msgpack.decode(short, type=SummaryColumns)
    ragged = msgspec.msgpack.encode((["n1"], [1.0], [""], [""], ["gpu_temp"], [[40.0, 41.0]], [False]))
    with pytest.raises(msgspec.ValidationError, match="a row of `values`"):
        msgspec.msgpack.decode(ragged, type=SummaryColumns)
    uneven = msgspec.msgpack.encode((["n1", "n2"], [1.0], ["", ""], ["", ""], ["gpu_temp"], [[40.0], [41.0]],
                                     [False, False]))
    with pytest.raises(msgspec.ValidationError, match="`ts` has 1 entries for 2 nodes"):
        msgspec.msgpack.decode(uneven, type=SummaryColumns)


def test_bit_masks_at_the_records_bounds_read_as_python_reads_them_and_warn_nothing() -> None:
    """A record's largest mask (2^63 - 1) is 2^63 as a float, past int64: the cast once warned
    ("invalid value encountered in cast") and gave INT64_MIN. Now it, a non-finite value and a
    negative one read as no bit, and the share still counts every finite value, as the
    one-message definition (``int(v) & mask``) does."""
    import warnings

    from fleetmedic.models.sample_columns import bit_fields, share_with_bits

    values = [0.0, float(0x40), float(0x40 | 0x1), float(2**63 - 1), 2.0**64, math.inf, -math.inf, math.nan, -8.0]
    x = np.array([values])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        bits = bit_fields(x)
        share = share_with_bits(x, THROTTLE_MASK)
    assert bits.tolist() == [[0, 0x40, 0x41, 0, 0, 0, 0, 0, 0]]
    finite = [v for v in values if math.isfinite(v) and v >= 0]
    assert share[0] == sum(1 for v in finite if int(v) & THROTTLE_MASK) / len([v for v in values if math.isfinite(v)])
    msg = r.GpuTelemetry(node="n0", ts=1000.0, gpus=[0, 1, 2],
                         metrics=r.GpuMetrics(clocks_event_reasons=[2**63 - 1, 0x40, 0]))
    ref_row, _, _ = _reference(msg)
    assert ref_row[-1] == 1 / 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for batch in (None, stage1_batch([msg])):
            rows, _, _ = _sample_features([msg], batch)
            assert all(_same(a, b) for a, b in zip(rows[0].tolist(), ref_row, strict=True)), (rows[0], ref_row)
        assert summarise_batch([msg]) == [summarise(msg)]


def test_load_bands_and_busy_samples_follow_the_configured_utilisation_thresholds() -> None:
    msg = r.GpuTelemetry(node="n0", ts=1000.0, gpus=[0, 1], metrics=r.GpuMetrics(gpu_util=[30.0, 30.0]))
    assert summarise(msg).band == ""
    assert summarise(msg, PeerSettings(idle_below_util=40.0)).band == "idle"
    assert summarise_batch([msg], peers=PeerSettings(busy_above_util=20.0, idle_below_util=5.0))[0].band == "busy"
    assert _sample_features([msg])[1].tolist() == [False]  # under multivariate.busy_util (50)
    assert _sample_features([msg], busy_util=25.0)[1].tolist() == [True]
    with pytest.raises(ValueError, match="idle_below_util"):
        PeerSettings(idle_below_util=95.0)
