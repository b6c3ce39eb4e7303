"""The batched per-sample reductions equal their one-message definitions exactly (multivariate
windows: fleetmedic.models.sample_columns and NodeWindowFeatures.add_batch)."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetmedic import records as r
from fleetmedic.models.gpu_signals import THROTTLE_MASK, median, reported
from fleetmedic.models.multivariate import _RATES, BUSY_UTIL, NodeWindowFeatures, _sample_features
from fleetmedic.models.stages import stage1_batch, summarise, summarise_batch


def _reference(msg: r.GpuTelemetry) -> tuple[list[float], bool, list[float]]:
    """The one-message definition (plain Python over the reported values)."""
    def spread(vals: list[float]) -> float:
        return max(vals) - min(vals) if vals else math.nan

    reasons = reported(msg, "clocks_event_reasons")
    throttled = sum(1 for v in reasons if int(v) & THROTTLE_MASK) / len(reasons) if reasons else math.nan
    row = [spread(reported(msg, n)) for n in ("gpu_temp", "memory_temp", "power_usage", "sm_clock")] + [throttled]
    util = reported(msg, "gpu_util")
    busy = not util or median(util) >= BUSY_UTIL
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
            assert all(_same(a, b) for a, b in zip(rows[i], ref_row, strict=True)), (rows[i], ref_row)
            assert busy[i] == ref_busy and totals[i] == ref_totals


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
        assert batched.export_node(node) == shared.export_node(node) == single.export_node(node)


@settings(max_examples=200, deadline=None)
@given(messages())
def test_batched_summaries_equal_one_message_summaries(msgs: list[r.GpuTelemetry]) -> None:
    want = [summarise(m) for m in msgs]
    assert summarise_batch(msgs) == want
    assert summarise_batch(msgs, stage1_batch(msgs)) == want  # from stage 1's shared columns
