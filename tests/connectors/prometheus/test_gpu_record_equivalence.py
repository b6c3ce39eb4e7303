""":meth:`ExpositionReader.gpu_record` with its common columns made in C
(``fleetmedic/connectors/prometheus/_gpu_record.c``) and without: for random per-GPU values (in range, out of
range, DCGM blanks, integral fields, ints, non-finite values, GPUs missing a metric, keys that are
not GPU metrics) the same record and the same skip reasons, with the same counts."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetmedic import records as r
from fleetmedic.config import Settings
from fleetmedic.connectors.prometheus import text as pt
from fleetmedic.connectors.prometheus.text import DCGM_FP64_BLANK, DCGM_INT64_BLANK, ExpositionReader

# integral and float fields, ratios (0..1), counters, temperatures: each with its own bounds
METRICS = ["gpu_temp", "power_usage", "ecc_dbe_vol_total", "prof_dram_active", "sm_clock", "fb_used",
           "pcie_replay_counter", "row_remap_failure", "gpu_util"]
VALUES = st.one_of(
    st.sampled_from([0.0, 1.0, 0.5, 41.0, 42.7, 100.0, 1500.0, -1.0, -0.0, 2.0**40,
                     float(DCGM_INT64_BLANK), float(DCGM_FP64_BLANK), 1e300, math.nan, math.inf, -math.inf]),
    st.floats(allow_nan=False, allow_infinity=False, min_value=-10.0, max_value=1e4),
    st.integers(-5, 200),  # a reader could hold ints: not the C case, the Python loop takes them
)
ROW = st.dictionaries(st.sampled_from([*METRICS, "_state", "not_a_metric"]), VALUES, max_size=len(METRICS) + 2)


@contextlib.contextmanager
def _native(on: bool) -> Iterator[None]:
    saved = pt._native_common_columns
    pt._native_common_columns = saved if on else None
    try:
        yield
    finally:
        pt._native_common_columns = saved


def _record(by_gpu: dict[int, dict[str, Any]], native: bool) -> tuple[bytes | None, list[tuple[str, int]]]:
    reader = ExpositionReader.for_settings(Settings(), source="t")
    info = {"sku": "NVIDIA H100", "driver": "580.1", **{f"uuid{g}": f"GPU-{g}" for g in by_gpu}}
    with _native(native):
        rec = reader.gpu_record(("gpu-node-1", 1_760_000_000.0), by_gpu, info)
    return (None if rec is None else r.encode(rec)), list(reader.skipped.items())  # in the order counted


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.integers(0, 15), ROW, min_size=1, max_size=8))
def test_the_c_columns_give_the_python_loops_record_and_reasons(by_gpu: dict[int, dict[str, Any]]) -> None:
    if pt._native_common_columns is None:
        pytest.skip("fleetmedic.connectors.prometheus._gpu_record is not built (the test below fails for that)")
    assert _record(by_gpu, True) == _record(by_gpu, False)


def test_the_c_columns_are_built_and_take_the_common_case() -> None:
    """The package builds the C columns wherever a C compiler is found (scripts/test installs with
    one); without one gpu_record runs the Python loop, slower, and this test fails to say so."""
    common = pt._native_common_columns
    assert common is not None, ("fleetmedic.connectors.prometheus._gpu_record is not built: "
                                "pip install -e . with a C compiler")
    per_gpu = [{"gpu_temp": 40.0 + g, "ecc_dbe_vol_total": 3.0, "prof_dram_active": 0.25 if g else 7.0,
                "fb_used": 100.0, "_state": 1.0} for g in range(4)]
    del per_gpu[2]["fb_used"]
    columns, rest = common(per_gpu, pt._GPU_CHECKS)
    assert columns == {"gpu_temp": [40.0, 41.0, 42.0, 43.0], "ecc_dbe_vol_total": [3, 3, 3, 3]}
    assert all(type(v) is int for v in columns["ecc_dbe_vol_total"])  # an integral field: ints
    assert sorted(rest) == ["fb_used", "prof_dram_active"]  # a GPU without it; a ratio out of range
    assert per_gpu[0]["gpu_temp"] is columns["gpu_temp"][0]  # the very floats, not copies
    with pytest.raises(TypeError):
        common([{"gpu_temp": 1.0}, "not a dict"], pt._GPU_CHECKS)  # type: ignore[list-item]
