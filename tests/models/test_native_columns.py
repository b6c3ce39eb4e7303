"""The compiled column conversion (fleetmedic/models/_columns.c) against the Python path it
replaces: bit-identical arrays for any mix of floats, ints and missing values, and a refusal (then
the Python path) for anything else."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetmedic.models import sample_columns as sc
from fleetmedic.records import GPU_METRICS

try:
    from fleetmedic.models import _columns as native
except ImportError:  # every test below then fails (test_the_native_loop_is_built says why); none skips
    native = None

VALUES = st.one_of(
    st.floats(allow_nan=False),
    st.integers(min_value=-(2**64), max_value=2**64),
    st.none(),
)


def test_the_native_loop_is_built() -> None:
    # the package builds it wherever a C compiler is found (scripts/test installs with one); a
    # machine without one runs the Python path, slower, and fails this test to say so
    assert native is not None and sc.NATIVE_COLUMNS, \
        "fleetmedic.models._columns is not built: pip install -e . with a C compiler"


def _both(rows: list[tuple[Any, ...]], names: tuple[str, ...], g: int) -> tuple[np.ndarray, np.ndarray]:
    out = np.empty((len(rows), len(names), g))
    native.columns_into(rows, tuple(GPU_METRICS.index(n) for n in names), g, out)
    return out, sc._python_columns(rows, names, g)


@settings(max_examples=300, deadline=None)
@given(data=st.data(), n=st.integers(1, 6), g=st.integers(0, 9),
       picks=st.lists(st.sampled_from(GPU_METRICS), min_size=1, max_size=8, unique=True))
def test_equals_the_python_path_bit_for_bit(data: st.DataObject, n: int, g: int, picks: list[str]) -> None:
    names = tuple(picks)
    width = len(GPU_METRICS)
    rows = []
    for _ in range(n):
        row: list[Any] = [None] * width
        for name in names:
            row[GPU_METRICS.index(name)] = data.draw(st.none() | st.lists(VALUES, min_size=g, max_size=g))
        rows.append(tuple(row))
    got, want = _both(rows, names, g)
    assert got.view(np.int64).tolist() == want.view(np.int64).tolist()  # NaN's bits and -0.0 too


def test_missing_values_and_columns_are_nan_and_ints_round_as_float_does() -> None:
    names = ("gpu_temp", "ecc_sbe_vol_total")
    rows = [tuple([40.5, None] if n == "gpu_temp" else [2**53 + 1, 2**63 - 1] if n == "ecc_sbe_vol_total" else None
                  for n in GPU_METRICS),
            tuple(None for _ in GPU_METRICS)]
    got, want = _both(rows, names, 2)
    assert got[0, 0, 0] == 40.5 and np.isnan(got[0, 0, 1])
    assert got[0, 1].tolist() == [float(2**53 + 1), float(2**63 - 1)]
    assert np.isnan(got[1]).all()
    assert np.array_equal(got, want, equal_nan=True)


@pytest.mark.parametrize(("column", "error"), [
    ([1.0], ValueError),  # one value for two GPUs
    ((1.0, 2.0), TypeError),  # not a list
    ([1.0, "2"], TypeError),  # not a number
    ([1.0, True], TypeError),  # a bool is no metric value
    ([1.0, 10**400], OverflowError),  # beyond a double
])
def test_what_decoded_telemetry_never_holds_is_refused(column: Any, error: type[Exception]) -> None:
    row = tuple(column if n == "gpu_temp" else None for n in GPU_METRICS)
    with pytest.raises(error):
        native.columns_into([row], (GPU_METRICS.index("gpu_temp"),), 2, np.empty((1, 1, 2)))


def test_the_output_buffer_is_checked() -> None:
    row = tuple([1.0, 2.0] if n == "gpu_temp" else None for n in GPU_METRICS)
    pick = (GPU_METRICS.index("gpu_temp"),)
    for out in (np.empty((1, 1, 3)), np.empty((1, 1, 2), dtype=np.int64), np.empty((1, 1, 4))[:, :, ::2]):
        with pytest.raises((ValueError, TypeError, BufferError)):
            native.columns_into([row], pick, 2, out)
    with pytest.raises(BufferError):
        native.columns_into([row], pick, 2, b"0" * 16)  # read-only
    with pytest.raises(IndexError):
        native.columns_into([()], pick, 2, np.empty((1, 1, 2)))  # a row shorter than the pick
    with pytest.raises(ValueError):
        native.columns_into([row], (-1,), 2, np.empty((1, 1, 2)))


def test_columns_takes_the_python_path_when_the_native_loop_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    from fleetmedic.records import DetectionMetrics, DetectionTelemetry

    msgs = [DetectionTelemetry(node=f"n{i}", ts=1.0, gpus=[0, 1],
                               metrics=DetectionMetrics(gpu_temp=[40.0 + i, None], ecc_sbe_vol_total=[i, 2**60]))
            for i in range(3)]
    names = ("ecc_sbe_vol_total", "gpu_temp", "power_usage")
    fast = sc.columns(msgs, names)

    def refuse(*args: Any) -> None:
        raise TypeError("refused")

    monkeypatch.setattr(sc, "_native_columns_into", refuse)
    slow = sc.columns(msgs, names)
    assert fast.view(np.int64).tolist() == slow.view(np.int64).tolist()
    assert slow[2].tolist()[0] == [2.0, float(2**60)] and np.isnan(slow[:, 2]).all()
