"""NVML exporter: fields mapped with their units, unsupported fields omitted, permission problems
and lost GPUs reported, XID events delivered, startup failures explained; the fake at the NVML seam
matches the real nvidia-ml-py module's names and constants; the device-check helper reads the
exporter's JSONL output."""

from __future__ import annotations

import asyncio
import importlib.util
import io
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from fleetmedic import records as r
from fleetmedic.config import Settings, parse_config
from fleetmedic.connectors.nvml.exporter import XID_GPU_LOST, NvmlSource
from fleetmedic.connectors.nvml.record import build_record
from fleetmedic.connectors.nvml.seam import GpuReading, NvmlSeam, NvmlUnavailable
from fleetmedic.connectors.runtime import ConnectorMetrics, JsonlSink, Outbox, PumpSettings, run_until_stopped
from tests.connectors.nvml import helpers_fake_pynvml as fake
from tests.connectors.nvml.helpers_fake_pynvml import FakeGpu, FakeNvml

ROOT = Path(__file__).resolve().parents[3]


def _source(nvml: FakeNvml, settings: Settings | None = None) -> tuple[NvmlSource, CollectorRegistry]:
    settings = settings or parse_config("exporters: {nvml: {node_name: gpu-node-3, interval_s: 0.2, xid_wait_ms: 20}}")
    registry = CollectorRegistry()
    metrics = ConnectorMetrics(registry, "nvml")
    return NvmlSource(nvml, settings, Outbox(100, metrics), metrics, clock=lambda: 1_700_000_000.0), registry


def _sample(src: NvmlSource) -> r.GpuTelemetry:
    src.seam.init()
    handles, _ = src.seam.handles()
    return src.sample(handles, "550.54.15", "boot-1")


def _skipped(registry: CollectorRegistry, reason: str) -> float:
    return registry.get_sample_value("fleetmedic_connector_skipped_total", {"connector": "nvml", "reason": reason}) or 0


def _errors(registry: CollectorRegistry, kind: str) -> float:
    return registry.get_sample_value("fleetmedic_connector_errors_total", {"connector": "nvml", "kind": kind}) or 0


def test_the_fake_has_the_real_pynvml_names_values_and_error_type() -> None:
    import pynvml  # nvidia-ml-py, in the test extra: pure Python, importable without a GPU

    names = [n for n in vars(fake) if n.startswith(("NVML_", "nvmlEventType"))]
    assert names and {n: getattr(pynvml, n) for n in names} == {n: getattr(fake, n) for n in names}
    functions = [n for n in vars(FakeNvml) if n.startswith("nvml")]
    missing = [n for n in functions if not callable(getattr(pynvml, n, None))]
    assert not missing, f"the fake has functions the real module lacks: {missing}"
    assert pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST).value == fake.NVMLError(fake.NVML_ERROR_GPU_IS_LOST).value
    assert str(pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)) == str(fake.NVMLError(fake.NVML_ERROR_NO_PERMISSION))


def test_one_record_per_node_with_every_field_in_dcgm_units() -> None:
    hot = FakeGpu(1, temp=83, power_mw=699_000, reasons=0x20 | 0x40, thermal_violation_ns=2_500_000,
                  ecc={(0, 0): 12, (1, 0): 1, (0, 1): 40}, retired={0: [0x1000, 0x2000], 1: [0x3000]},
                  remapped=(3, 1, 1, 0), pcie_replay=7, pcie_width=8,
                  nvlink_errors={(0, fake.NVML_NVLINK_ERROR_DL_CRC_FLIT): 5, (4, fake.NVML_NVLINK_ERROR_DL_CRC_FLIT): 2,
                                 (2, fake.NVML_NVLINK_ERROR_DL_REPLAY): 9})
    hot.nvlink_states[17] = fake.NVML_FEATURE_DISABLED
    src, _ = _source(FakeNvml([FakeGpu(0), hot]))
    rec = _sample(src)
    m = rec.metrics
    assert (rec.node, rec.ts, rec.gpus, rec.source, rec.driver_version, rec.boot_id) == (
        "gpu-node-3", 1_700_000_000.0, [0, 1], "nvml", "550.54.15", "boot-1")
    assert rec.uuids == [FakeGpu(0).uuid, hot.uuid] and rec.sku == "NVIDIA H100 80GB HBM3"
    assert m.gpu_temp == [40.0, 83.0] and m.memory_temp == [45.0, 45.0] and m.power_usage == [310.5, 699.0]
    assert m.sm_clock == [1980.0, 1980.0] and m.gpu_util == [97.0, 97.0] and m.fb_used == [61440.0, 61440.0]
    assert m.clocks_event_reasons == [0, 0x60] and m.thermal_violation == [0, 2500]  # ns -> µs, as dcgm
    assert m.ecc_sbe_vol_total == [0, 12] and m.ecc_dbe_vol_total == [0, 1]
    assert m.retired_sbe == [0, 2] and m.retired_dbe == [0, 1] and m.retired_pending == [0, 0]
    assert m.correctable_remapped_rows == [0, 3] and m.uncorrectable_remapped_rows == [0, 1]
    assert m.row_remap_pending == [0, 1] and m.row_remap_failure == [0, 0]
    assert m.pcie_replay_counter == [0, 7] and m.pcie_link_gen == [5, 5] and m.pcie_link_width == [16, 8]
    assert m.nvlink_crc_flit_error_count_total == [0, 7] and m.nvlink_replay_error_count_total == [0, 9]
    assert m.nvlink_links_down == [0, 1]
    assert m.xid_errors is None, "NVML gives XID events (rec.xids), not dcgm's last-XID gauge"


def test_unsupported_fields_are_omitted_per_gpu_not_errors() -> None:
    pcie_card = FakeGpu(0, memory_temp=None, nvlink_states=[], unsupported={
        "nvmlDeviceGetRemappedRows", "nvmlDeviceGetNvLinkState", "nvmlDeviceGetViolationStatus"})
    src, registry = _source(FakeNvml([pcie_card, FakeGpu(1)]))
    rec = _sample(src)
    m = rec.metrics
    assert m.memory_temp == [None, 45.0] and m.uncorrectable_remapped_rows == [None, 0]
    assert m.nvlink_links_down == [None, 0] and m.power_violation == [None, 0]
    assert m.gpu_temp == [40.0, 40.0]
    assert _errors(registry, "gpu_lost") == 0
    only_pcie, _ = _source(FakeNvml([FakeGpu(0, nvlink_states=[], unsupported={"nvmlDeviceGetNvLinkState"})]))
    assert _sample(only_pcie).metrics.nvlink_links_down is None, "no GPU has NVLink: no column at all"


def test_each_nvml_call_is_made_once_per_gpu_and_older_drivers_fall_back() -> None:
    nvml = FakeNvml([FakeGpu(0, reasons=0x4, missing={"nvmlDeviceGetCurrentClocksEventReasons"}), FakeGpu(1)])
    src, _ = _source(nvml)
    rec = _sample(src)
    assert rec.metrics.clocks_event_reasons == [0x4, 0], "a driver before 535 answers the throttle-reasons call"
    assert nvml.calls["nvmlDeviceGetRemappedRows"] == 2 and nvml.calls["nvmlDeviceGetUtilizationRates"] == 2
    assert nvml.calls["nvmlDeviceGetMemoryInfo"] == 2


def test_a_field_without_permission_is_left_out_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    src, registry = _source(FakeNvml([FakeGpu(0, forbidden={"nvmlDeviceGetRetiredPages"})]))
    rec = _sample(src)
    rec = src.sample(src.seam.handles()[0], "550.54.15", "")
    assert rec.metrics.retired_sbe is None and rec.metrics.retired_pending == [0]
    assert _skipped(registry, "retired_sbe: no permission") == 2
    assert sum("retired_sbe not read: no permission" in m for m in caplog.messages) == 1, "logged once"


def test_a_lost_gpu_stays_in_the_record_and_is_reported_as_xid_79_once() -> None:
    nvml = FakeNvml([FakeGpu(0), FakeGpu(1)])
    src, registry = _source(nvml)
    _sample(src)
    nvml.gpus[1].lost = True
    handles = src.seam.handles()[0]
    first, second = src.sample(handles, "", ""), src.sample(handles, "", "")
    assert first.gpus == [0, 1] and first.metrics.gpu_temp == [40.0, None]
    assert [(x.gpu, x.xid) for x in first.xids] == [(1, XID_GPU_LOST)] and "GPU is lost" in first.xids[0].message
    assert second.xids == [], "reported when first seen, not every interval"
    assert _errors(registry, "gpu_lost") == 2
    nvml.gpus[1].lost = False
    assert src.sample(handles, "", "").metrics.gpu_temp == [40.0, 40.0] and not src.lost


def test_a_gpu_lost_before_its_handle_is_opened_is_reported_too() -> None:
    nvml = FakeNvml([FakeGpu(0), FakeGpu(1)])
    nvml.handle_errors[0] = fake.NVML_ERROR_GPU_IS_LOST
    src, _ = _source(nvml)
    rec = _sample(src)
    assert rec.gpus == [0, 1] and rec.metrics.gpu_temp == [None, 40.0] and rec.xids[0].xid == XID_GPU_LOST


@pytest.mark.parametrize(("error", "says"), [
    (fake.NVML_ERROR_DRIVER_NOT_LOADED, "NVIDIA driver not loaded"),
    (fake.NVML_ERROR_LIBRARY_NOT_FOUND, "libnvidia-ml.so.1"),
    (fake.NVML_ERROR_NO_PERMISSION, "no permission to use NVML"),
])
def test_startup_failures_say_what_to_do(error: int, says: str) -> None:
    with pytest.raises(NvmlUnavailable, match=says):
        NvmlSeam(FakeNvml([], init_error=error)).init()


def test_the_cli_exits_3_with_the_reason_on_a_machine_without_nvidia_driver(tmp_path: Path) -> None:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this machine has a working NVIDIA driver (scripts/device/nvml_check.sh covers it)")
    proc = subprocess.run([sys.executable, "-m", "fleetmedic.cli.exporter", "nvml", "--output", str(tmp_path / "o"),
                           "--duration", "1", "--metrics-port", "-1"], capture_output=True, text=True, timeout=60,
                          cwd=ROOT)
    assert proc.returncode == 3, proc.stderr
    assert "error: NVML library (libnvidia-ml.so.1) not found" in proc.stderr or "driver not loaded" in proc.stderr


def test_the_exporter_loop_writes_records_with_xid_events_and_the_check_summarises_them(tmp_path: Path) -> None:
    nvml = FakeNvml([FakeGpu(0), FakeGpu(1)])
    settings = parse_config("exporters: {nvml: {node_name: gpu-node-3, interval_s: 0.2, xid_wait_ms: 20}}")
    registry = CollectorRegistry()
    metrics = ConnectorMetrics(registry, "nvml")
    outbox = Outbox(100, metrics)
    src = NvmlSource(nvml, settings, outbox, metrics)
    out = tmp_path / "nvml.jsonl"

    async def main() -> None:
        stop = asyncio.Event()

        async def drive() -> None:
            while 1 not in nvml.registered:
                await asyncio.sleep(0.02)
            nvml.raise_xid(1, 48)
            nvml.gpus[0].temp = 71
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                text = out.read_text() if out.exists() else ""
                if '"xid":48' in text.replace(" ", "") and '"gpu_temp":[71.0' in text.replace(" ", ""):
                    break
                await asyncio.sleep(0.05)
            stop.set()

        driving = asyncio.create_task(drive())
        await run_until_stopped(src.run, outbox, JsonlSink(str(out)), metrics, PumpSettings(), stop,
                                handle_signals=False)
        await driving

    asyncio.run(main())
    docs = [json.loads(line) for line in out.read_text().splitlines()]
    assert all(d["topic"] == "fleetmedic.telemetry.gpu" and d["key"] == "gpu-node-3" for d in docs)
    xids = [x for d in docs for x in d["record"]["xids"]]
    assert [(x["gpu"], x["xid"]) for x in xids] == [(1, 48)], "each XID event once, in the next record"
    assert not nvml.initialised, "NVML shut down on stop"
    summary = _load_summary()
    text = io.StringIO()
    assert summary.summary(out.open(), text) == 0
    report = text.getvalue()
    assert f"{len(docs)} record(s)" in report and "gpu-node-3 GPU 1:" in report
    assert "gpu_temp" in report and "max 71" in report and "XID 48" in report
    probe = io.StringIO()
    assert summary.probe(FakeNvml([FakeGpu(0, ecc={(0, 1): 40})]), probe) == 0
    assert "ecc_sbe_agg_total                    40   (not on the wire record)" in probe.getvalue()


def test_a_value_out_of_physical_range_is_dropped_not_the_record() -> None:
    skipped: list[str] = []
    good = GpuReading(0, values={"gpu_temp": 50.0, "power_usage": 300.0})
    bad = GpuReading(1, values={"gpu_temp": 4000.0, "power_usage": 310.0})
    rec = build_record("n", 1.0, [good, bad], [], [], skipped=skipped.append)
    assert rec.metrics.gpu_temp == [50.0, None] and rec.metrics.power_usage == [300.0, 310.0]
    assert len(skipped) == 1 and skipped[0].startswith("gpu_temp:")


def _load_summary() -> Any:
    spec = importlib.util.spec_from_file_location("nvml_summary", ROOT / "scripts" / "device" / "nvml_summary.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
