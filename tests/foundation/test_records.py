"""Wire records: encode/decode round-trips, tolerance of unknown fields, and rejection of malformed
input with an error that names the field and the reason."""

from __future__ import annotations

import json
import math
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetmedic import records as r


def gpu_telemetry(**over: Any) -> r.GpuTelemetry:
    base: dict[str, Any] = dict(
        node="gpu-node-7",
        ts=1_790_000_000.5,
        sku="H100-SXM5-80GB",
        boot_id="b1",
        gpus=list(range(8)),
        uuids=[f"GPU-{i}" for i in range(8)],
        metrics=r.GpuMetrics(
            gpu_temp=[55.0 + i for i in range(8)],
            power_usage=[640.5] * 7 + [None],
            sm_clock=[1980.0] * 8,
            clocks_event_reasons=[0x4] * 8,
            ecc_sbe_vol_total=[3] * 8,
            ecc_dbe_vol_total=[0] * 8,
            xid_errors=[0] * 8,
            prof_pipe_tensor_active=[0.61] * 8,
        ),
        xids=[r.XidEvent(gpu=3, xid=79, ts=1_790_000_000.1, message="GPU has fallen off the bus.")],
    )
    base.update(over)
    return r.GpuTelemetry(**base)


SAMPLES: list[r.Record] = [
    gpu_telemetry(),
    r.PortTelemetry(
        device="leaf-03",
        device_kind="switch",
        ts=1.0,
        ports=[r.PortSample(port="swp12", node="gpu-node-7", link_state="up", symbol_error_counter=12,
                            effective_ber=1e-13)],
    ),
    r.JobEvent(
        job="research/llama-70b",
        event="failure",
        ts=2.0,
        attempt=1,
        rank=3,
        node="gpu-node-7",
        exit_code=1,
        reason="NCCL watchdog timeout",
        log_excerpt=["[Rank 3] Watchdog caught collective operation timeout"],
    ),
    r.JobEvent(job="a/b", event="placement", ts=1.0, placement=[r.RankPlacement(rank=0, node="n0", gpus=[0, 1])]),
    r.Finding(
        id="f1", ts=3.0, node="gpu-node-7", detector="xid_rules", kind="hard_fault", severity="critical",
        summary="XID 79 on GPU 3", evidence=[r.Evidence(detector="xid_rules", metric="xid", value=79, gpu=3)],
        gpu=3, action_hint="RESTART_BM",
    ),
    r.Incident(
        id="inc-1", incident_class="hardware", suspects=[r.Suspect(kind="node", name="gpu-node-7")],
        confidence=0.93, evidence=[r.Evidence(detector="xid_rules", metric="xid", value=79)],
        first_seen=3.0, status="open",
    ),
    r.RemediationCommand(
        id="cmd-1", action="cordon", incident_id="inc-1", reason="XID 79", issued_at=4.0,
        expires_at=304.0, node="gpu-node-7",
    ),
    r.RemediationResult(command_id="cmd-1", action="cordon", outcome="applied", ts=5.0, node="gpu-node-7"),
    r.DeadLetter(ts=6.0, topic="fleetmedic.telemetry.gpu", stage="detect", error="$.ts: Expected `float`",
                 original=b"\x00\xffnot json", partition=3, offset=42, key="gpu-node-7"),
]


@pytest.mark.parametrize("record", SAMPLES, ids=lambda rec: type(rec).__name__)
def test_every_record_round_trips_through_json(record: r.Record) -> None:
    wire = r.encode(record)
    assert r.decode(type(record), wire) == record
    doc = json.loads(wire)
    assert doc["schema_version"] == r.SCHEMA_VERSION
    assert "type" in doc


def test_incident_class_is_spelled_class_on_the_wire() -> None:
    doc = json.loads(r.encode(SAMPLES[5]))
    assert doc["class"] == "hardware"
    assert "incident_class" not in doc


@pytest.mark.parametrize("record", SAMPLES, ids=lambda rec: type(rec).__name__)
def test_unknown_fields_are_tolerated(record: r.Record) -> None:
    doc = json.loads(r.encode(record))
    doc["added_by_a_newer_producer"] = {"x": [1, 2]}
    assert r.decode(type(record), json.dumps(doc)) == record


def test_a_future_schema_version_is_rejected_naming_the_field() -> None:
    doc = json.loads(r.encode(gpu_telemetry()))
    doc["schema_version"] = r.SCHEMA_VERSION + 1
    with pytest.raises(r.InvalidRecord) as err:
        r.decode(r.GpuTelemetry, json.dumps(doc))
    assert err.value.path == "$.schema_version"


@pytest.mark.parametrize(
    ("mutate", "path", "reason"),
    [
        (lambda d: d.pop("node"), "$", "missing required field `node`"),
        (lambda d: d.__setitem__("ts", "yesterday"), "$.ts", "Expected `float`, got `str`"),
        (lambda d: d["gpus"].__setitem__(2, 999), "$.gpus[2]", "<= 255"),
        (lambda d: d["metrics"]["gpu_temp"].__setitem__(1, 1e300), "$.metrics.gpu_temp[1]", "<= 300.0"),
        (lambda d: d["metrics"]["ecc_sbe_vol_total"].__setitem__(0, -1), "$.metrics.ecc_sbe_vol_total[0]", ">= 0"),
        (lambda d: d["metrics"]["sm_clock"].pop(), "$", "`metrics.sm_clock` has 7 values for 8 GPUs"),
        (lambda d: d["gpus"].__setitem__(1, 0), "$", "duplicate"),
        (lambda d: d.__setitem__("gpus", {"0": {}}), "$.gpus", "Expected `array`"),
        (lambda d: d["xids"][0].__setitem__("xid", "79"), "$.xids[0].xid", "Expected `int`"),
        (lambda d: d.__setitem__("type", "port_telemetry"), "$.type", "Invalid value"),
    ],
)
def test_malformed_gpu_telemetry_names_field_and_reason(mutate: Any, path: str, reason: str) -> None:
    doc = json.loads(r.encode(gpu_telemetry()))
    mutate(doc)
    with pytest.raises(r.InvalidRecord) as err:
        r.decode(r.GpuTelemetry, json.dumps(doc))
    assert err.value.path == path
    assert reason in err.value.reason
    assert path in str(err.value)


def test_a_gpu_record_needs_at_least_one_gpu() -> None:
    # schema-valid before, it crashed stage 1 (IndexError on an empty GPU axis), and replay crash-looped
    doc = {"type": "gpu_telemetry", "node": "gpu-node-7", "ts": 1.0, "gpus": [], "metrics": {}}
    for record_type in (r.GpuTelemetry, r.DetectionTelemetry):
        with pytest.raises(r.InvalidRecord) as err:
            r.decode(record_type, json.dumps(doc))
        assert err.value.path == "$.gpus" and "length >= 1" in err.value.reason
        assert "$.gpus" in str(err.value)


def test_json_with_nan_or_infinity_tokens_is_rejected() -> None:
    for token in ("NaN", "Infinity", "-Infinity"):
        raw = r.encode(gpu_telemetry()).replace(b'"gpu_temp":[55.0', f'"gpu_temp":[{token}'.encode(), 1)
        assert raw != r.encode(gpu_telemetry())
        with pytest.raises(r.InvalidRecord):
            r.decode(r.GpuTelemetry, raw)


def test_nan_and_infinity_from_python_objects_are_rejected() -> None:
    doc = msgspec.to_builtins(gpu_telemetry())
    for bad in (math.nan, math.inf, -math.inf):
        doc["metrics"]["power_usage"][0] = bad
        with pytest.raises(r.InvalidRecord) as err:
            r.convert(r.GpuTelemetry, doc)
        assert err.value.path == "$.metrics.power_usage[0]"


def test_a_command_without_target_is_rejected() -> None:
    doc = json.loads(r.encode(SAMPLES[6]))
    doc["node"] = ""
    with pytest.raises(r.InvalidRecord, match="needs a target"):
        r.decode(r.RemediationCommand, json.dumps(doc))


def test_a_job_reference_must_be_namespace_slash_name() -> None:
    doc = json.loads(r.encode(SAMPLES[2]))
    doc["job"] = "no-namespace"
    with pytest.raises(r.InvalidRecord) as err:
        r.decode(r.JobEvent, json.dumps(doc))
    assert err.value.path == "$.job"


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=512))
def test_random_bytes_never_crash_the_decoder(data: bytes) -> None:
    for record_type in r.RECORD_TYPES:
        try:
            r.decode(record_type, data)
        except r.InvalidRecord as exc:
            assert exc.path.startswith("$")
            assert exc.reason


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(field=st.sampled_from(["node", "ts", "gpus", "metrics", "xids", "sku", "boot_id"]), value=json_values)
def test_any_value_in_any_field_is_either_accepted_or_rejected_with_that_field(field: str, value: Any) -> None:
    doc = json.loads(r.encode(gpu_telemetry()))
    doc[field] = value
    try:
        decoded = r.decode(r.GpuTelemetry, json.dumps(doc))
    except r.InvalidRecord as exc:
        assert exc.path.startswith(f"$.{field}") or exc.path == "$"
    else:
        assert r.decode(r.GpuTelemetry, r.encode(decoded)) == decoded


@settings(max_examples=200, deadline=None)
@given(
    temp=st.floats(min_value=-60, max_value=300),
    sbe=st.integers(min_value=0, max_value=2**63 - 1),
    huge=st.integers(min_value=2**63, max_value=2**80),
)
def test_huge_counters_are_rejected_while_values_in_range_round_trip(temp: float, sbe: int, huge: int) -> None:
    rec = gpu_telemetry(gpus=[0], uuids=[], metrics=r.GpuMetrics(gpu_temp=[temp], ecc_sbe_vol_total=[sbe]))
    assert r.decode(r.GpuTelemetry, r.encode(rec)) == rec
    doc = json.loads(r.encode(rec))
    doc["metrics"]["ecc_sbe_vol_total"][0] = huge
    with pytest.raises(r.InvalidRecord) as err:
        r.decode(r.GpuTelemetry, json.dumps(doc))
    assert err.value.path == "$.metrics.ecc_sbe_vol_total[0]"


def test_a_gpu_can_be_read_as_one_row() -> None:
    row = gpu_telemetry().gpu_values(7)
    assert row["gpu_temp"] == 62.0
    assert row["power_usage"] is None
    assert "memory_temp" not in row


def test_a_numpy_scalar_in_a_field_encodes_as_its_number_and_other_objects_are_refused() -> None:
    # a detector's float64 that slipped into evidence must not stop a worker from publishing it
    import numpy as np

    ev = r.Evidence(detector="d", metric="m", value=np.float64(1.5), score=np.int64(3), ts=1.0)  # type: ignore[arg-type]
    f = r.Finding(id="x", ts=1.0, node="n", detector="d", kind="degradation", severity="warning", summary="s",
                  evidence=[ev])
    doc = json.loads(r.encode(f))
    assert doc["evidence"][0]["value"] == 1.5 and doc["evidence"][0]["score"] == 3
    bad = r.Finding(id="x", ts=1.0, node="n", detector="d", kind="degradation", severity="warning", summary="s",
                    evidence=[r.Evidence(detector="d", metric="m", value=object(), ts=1.0)])  # type: ignore[arg-type]
    with pytest.raises(NotImplementedError, match="cannot encode a object"):
        r.encode(bad)
