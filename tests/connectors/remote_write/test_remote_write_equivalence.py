"""The receiver's one-pass path (:meth:`Assembler.take`: tail decode, label-set lookup, values put
straight into their node's open scrape) against the general path it replaced: every sample decoded
plainly by the protobuf runtime, filtered as remote write filters them, then grouped and mapped by
:meth:`ExpositionReader.read_samples`. For random request sets the records, the skip reasons and
the sample counts are the same, with the commonest series held by the C loop
(``fleetmedic/connectors/remote_write/_remote_write.c``) and without it."""

from __future__ import annotations

import contextlib
import math
import struct
from collections import Counter
from collections.abc import Iterator
from typing import Any

import cramjam
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetmedic import records as r
from fleetmedic.config import Settings
from fleetmedic.connectors.prometheus.text import (
    MAX_LABEL_VALUE_CHARS,
    TS_MAX,
    TS_MIN,
    ExpositionReader,
    Sample,
    count,
    known_name,
)
from fleetmedic.connectors.remote_write.assembler import (
    Assembler,
    LabelCache,
    SampleCounts,
)
from fleetmedic.connectors.remote_write.codec import (
    STALE_NAN_BITS,
    WriteRequest,
    decode_request,
    is_stale_marker,
)

HEADERS = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy"}
LIMITS = (1 << 24, 1 << 26)
T0_MS = 1_760_000_000_000
STALE = struct.unpack("<d", struct.pack("<Q", STALE_NAN_BITS))[0]
GPU_SERIES = ["DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
              "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_XID_ERRORS_total", "DCGM_EXP_XID_ERRORS_COUNT",
              "DCGM_FI_PROF_DRAM_ACTIVE"]
PORT_SERIES = ["node_infiniband_port_errors_received_total", "node_infiniband_port_data_received_bytes_total",
               "node_infiniband_legacy_data_received_bytes_total", "node_infiniband_state_id",
               "node_infiniband_physical_state_id", "node_infiniband_rate_bytes_per_second"]
UNKNOWN = ["up", "node_load1", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]
VALUES = [0.0, 0.0, 1.0, 42.5, 4.0, 5.0, 0.3, 500.0, -3.0, 2.0**63, math.nan, math.inf, STALE]


@st.composite
def series_sets(draw: Any) -> list[tuple[list[tuple[str, str]], list[tuple[float, int]]]]:
    """Series as a sender writes them: labels (in any order) and samples. Nodes are scraped every
    15 s, each at its own offset (a few ms apart within a scrape); some series carry several
    samples, some timestamps are odd (negative, zero, far future)."""
    nodes = draw(st.integers(1, 3))
    scrapes = draw(st.integers(1, 3))
    out = []
    for n in range(nodes):
        offset = draw(st.integers(0, 14_000))
        for k in range(draw(st.integers(1, 12))):
            kind = draw(st.sampled_from(["gpu", "gpu", "gpu", "port", "unknown"]))
            name = draw(st.sampled_from({"gpu": GPU_SERIES, "port": PORT_SERIES, "unknown": UNKNOWN}[kind]))
            job = "dcgm" if kind == "gpu" else "node"
            labels = [("__name__", name), ("instance", f"10.0.0.{n}:9400"), ("job", job)]
            node_label = draw(st.sampled_from(["Hostname", "Hostname", "node", "none"]))
            if node_label != "none":
                labels.append((node_label, f"gpu-node-{n}"))
            if kind == "gpu":
                labels += [("gpu", draw(st.sampled_from(["0", "1", "7", "x", "300"]))), ("UUID", f"GPU-{n}-{k % 2}"),
                           ("modelName", "NVIDIA H100"), ("xid", draw(st.sampled_from(["0", "13", "79"])))]
            elif kind == "port":
                labels += [("device", "mlx5_0"), ("port", draw(st.sampled_from(["1", "2"])))]
            if draw(st.integers(0, 9)) == 0:
                labels.append(("pod", "p" * (MAX_LABEL_VALUE_CHARS + 1)))
            labels = draw(st.permutations(labels))
            samples = []
            for s in range(scrapes):
                ms = T0_MS + 15_000 * s + offset + draw(st.sampled_from([0] * 8 + [1, 7]))
                if draw(st.integers(0, 19)) == 0:
                    ms = draw(st.sampled_from([-1_000, 0, int(TS_MAX * 1000) + 1, 1]))
                samples.append((draw(st.sampled_from(VALUES)), ms))
            # Prometheus writes each sample as its own series entry; other senders batch them
            if draw(st.booleans()):
                out += [(list(labels), [sample]) for sample in samples]
            else:
                out.append((list(labels), samples))
    return out


def _encode(series: list[tuple[list[tuple[str, str]], list[tuple[float, int]]]]) -> bytes:
    request = WriteRequest()
    for labels, points in series:
        ts = request.timeseries.add()
        for key, text in labels:  # in the order given, not sorted
            ts.labels.add(name=key, value=text)
        for value, ms in points:
            ts.samples.add(value=value, timestamp=ms)
    return bytes(cramjam.snappy.compress_raw(request.SerializeToString()))


def _reference(bodies: list[bytes]) -> tuple[list[Any], Counter[str], tuple[int, int, int]]:
    """The general path: each sample decoded by the protobuf runtime, filtered as remote write
    filters them, then every sample in arrival order through read_samples."""
    reader = ExpositionReader.for_settings(Settings(), ignore_unknown=True, source="prometheus-remote-write")
    samples: list[Sample] = []
    ignored = stale = skipped = 0
    for body in bodies:
        request = WriteRequest()
        request.ParseFromString(bytes(cramjam.snappy.decompress_raw(body)))
        for series in request.timeseries:
            labels = {label.name: label.value for label in series.labels}
            name = known_name(labels.pop("__name__", ""))
            if name is None:
                ignored += len(series.samples)
                continue
            too_long = next((k for k, v in labels.items() if len(v) > MAX_LABEL_VALUE_CHARS), None)
            if too_long is not None:
                count(reader.skipped, f"{name}: label {too_long} longer than {MAX_LABEL_VALUE_CHARS} characters",
                      len(series.samples))
                skipped += len(series.samples)
                continue
            for point in series.samples:
                ts = point.timestamp / 1000.0
                if is_stale_marker(point.value):
                    stale += 1
                elif math.isnan(point.value) or math.isinf(point.value):
                    count(reader.skipped, f"{name}: value is {'NaN' if math.isnan(point.value) else 'infinite'}")
                    skipped += 1
                elif not TS_MIN <= ts <= TS_MAX:
                    count(reader.skipped, f"{name}: timestamp out of range")
                    skipped += 1
                else:
                    samples.append((name, labels, point.value, ts))
    records = list(reader.read_samples(samples, flush_lag_s=math.inf))
    return records, reader.skipped, (ignored, stale, skipped)


def _one_pass(bodies: list[bytes], cache: LabelCache) -> tuple[list[Any], Counter[str], tuple[int, int, int]]:
    reader = ExpositionReader.for_settings(Settings(), ignore_unknown=True, source="prometheus-remote-write")
    assembler = Assembler(reader, assemble_s=60.0, max_pending=1_000_000)
    counts = SampleCounts()
    for body in bodies:
        assert assembler.take(decode_request(body, HEADERS, *LIMITS), reader.skipped, counts, cache) is not None
    records = assembler.records(everything=True)
    assert assembler.pending == 0 and assembler.late == 0
    return records, reader.skipped, (counts.ignored, counts.stale, counts.skipped)


@contextlib.contextmanager
def _native(on: bool) -> Iterator[None]:
    """With (the default) or without the C loop of the inline hold."""
    import fleetmedic.connectors.remote_write.assembler as rw

    saved = rw._native_hold_inline
    rw._native_hold_inline = saved if on else None
    try:
        yield
    finally:
        rw._native_hold_inline = saved


@pytest.mark.parametrize("native", [True, False], ids=["with the C loop", "Python only"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(series_sets(), st.randoms(use_true_random=False), st.integers(1, 60))
def test_the_one_pass_path_gives_the_general_paths_records(native: bool, series: Any, rng: Any, batch: int) -> None:
    rng.shuffle(series)  # Prometheus shards series over queues: any series in any request, in any order
    bodies = [_encode(series[i:i + batch]) for i in range(0, len(series), batch)]
    cache = LabelCache()
    # twice through one cache: the second time every label set is known, so the tail fast path
    # and the inline hold do the work (the first time, series are parsed whole)
    for _ in range(2):
        with _native(native):
            got, got_skipped, got_counts = _one_pass(bodies, cache)
        want, want_skipped, want_counts = _reference(bodies)
        assert [r.encode(x) for x in got] == [r.encode(x) for x in want]
        assert got_skipped == want_skipped
        assert got_counts == want_counts


def test_the_fast_path_is_what_reads_a_repeated_request() -> None:
    """Guards the test above: with a warm cache, Prometheus-shaped requests (one sample per
    series, sorted labels) are read without parsing a series whole."""
    import fleetmedic.connectors.remote_write.assembler as rw

    series = [([("__name__", n), ("Hostname", "a"), ("gpu", str(g))], [(v, T0_MS)])
              for n in GPU_SERIES[:3] for g in range(8) for v in (0.0, 41.0)]
    body = _encode(series)
    cache = LabelCache()
    _one_pass([body], cache)
    parsed = 0
    original = rw._parse_series

    def counting(*args: Any) -> Any:
        nonlocal parsed
        parsed += 1
        return original(*args)

    rw._parse_series = counting  # type: ignore[assignment]
    try:
        got, _, _ = _one_pass([body], cache)
    finally:
        rw._parse_series = original  # type: ignore[assignment]
    assert parsed == 0 and len(got) == 1 and len(got[0].gpus) == 8
    assert [r.encode(x) for x in got] == [r.encode(x) for x in _reference([body])[0]]


def test_the_c_loop_is_built_and_holds_a_repeated_request() -> None:
    """The package builds the C loop wherever a C compiler is found (scripts/test installs with
    one); a machine without one runs the Python loop, slower, and fails this test to say so. With
    a warm cache, it holds a Prometheus-shaped request but what must be resolved or opened first."""
    import fleetmedic.connectors.remote_write.assembler as rw

    native = rw._native_hold_inline
    assert native is not None, ("fleetmedic.connectors.remote_write._remote_write is not built: "
                                "pip install -e . with a C compiler")
    series = [([("__name__", n), ("Hostname", "a"), ("gpu", str(g))], [(v, T0_MS + 15_000 * k)])
              for k in range(2) for n in [*GPU_SERIES[:3], "up"] for g in range(8) for v in (0.0, 41.0)]
    bodies = [_encode(series[:64]), _encode(series[64:])]
    cache = LabelCache()
    _one_pass(bodies, cache)
    held = ignored = 0

    def counting(*args: Any) -> Any:
        nonlocal held, ignored
        out = native(*args)
        held, ignored = held + out[1], ignored + out[3]
        return out

    rw._native_hold_inline = counting
    try:
        got, _, counts = _one_pass(bodies, cache)
    finally:
        rw._native_hold_inline = native
    # 96 GPU series and 32 "up" series. In Python: the first series of each of the 24 GPU label sets
    # (a new Assembler resolves them again) and the first series of scrape 1 (which opens the node's
    # new scrape): 25. The other 71 are held in C (making the rows of scrape 1's GPUs but the first),
    # and every "up" series is ignored there (nothing to resolve)
    assert (held, ignored) == (71, 32)
    assert [r.encode(x) for x in got] == [r.encode(x) for x in _reference(bodies)[0]]
    assert counts[0] == 2 * 16


def _gpu_record_per_value(reader: ExpositionReader, by_gpu: dict[int, dict[str, float]], info: dict[str, str]
                          ) -> r.GpuTelemetry | None:
    """gpu_record as it checked values before its columns were checked whole: one at a time."""
    from fleetmedic.connectors.prometheus.text import _GPU_BOUNDS, DCGM_FP64_BLANK, DCGM_INT64_BLANK

    gpus = sorted(by_gpu)
    columns: dict[str, list[float | int | None]] = {}
    for metric in r.GPU_METRICS:
        if not any(metric in by_gpu[g] for g in gpus):
            continue
        integral, lo, hi = _GPU_BOUNDS[metric]
        col: list[float | int | None] = []
        for g in gpus:
            v = by_gpu[g].get(metric)
            if v is not None and (v >= DCGM_INT64_BLANK or (not integral and v >= DCGM_FP64_BLANK)):
                count(reader.skipped, f"{r.DCGM_NAMES[metric]}: DCGM blank value (not supported by the GPU)")
                v = None
            elif v is not None and not lo <= v <= hi:
                count(reader.skipped, f"{r.DCGM_NAMES[metric]}: value out of range")
                v = None
            col.append(None if v is None else int(v) if integral else v)
        if any(v is not None for v in col):
            columns[metric] = col
    if not columns:
        return None
    uuids = [info.get(f"uuid{g}", "") for g in gpus] if any(f"uuid{g}" in info for g in gpus) else []
    return r.convert(r.GpuTelemetry, {"node": "n", "ts": 1.0, "gpus": gpus, "metrics": columns, "uuids": uuids,
                                      "sku": info.get("sku", ""), "driver_version": info.get("driver", ""),
                                      "source": reader.source})


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.integers(0, 7), st.dictionaries(
    st.sampled_from(r.GPU_METRICS), st.sampled_from([0.0, 0.5, 1.0, 42.0, -1.0, 65.0, 101.0, 1e9, 2e9, 9.2e18,
                                                     2.0**63, 140737488355328.0, 1e5, 300.0, -60.5])),
    min_size=1), st.booleans())
def test_gpu_record_checks_columns_as_it_checked_each_value(by_gpu: dict[int, dict[str, float]], uuids: bool) -> None:
    info = {"sku": "NVIDIA H100", "driver": "550", **({f"uuid{g}": f"GPU-{g}" for g in by_gpu} if uuids else {})}
    fast, slow = (ExpositionReader.for_settings(Settings()) for _ in range(2))
    assert fast.gpu_record(("n", 1.0), by_gpu, info) == _gpu_record_per_value(slow, by_gpu, info)
    assert list(fast.skipped.items()) == list(slow.skipped.items())
