"""The NVML seam: every NVML call the exporter makes, in one class over a ``pynvml``-like module.

:class:`NvmlSeam` takes the module object (the real ``pynvml`` from nvidia-ml-py, or a fake with
the same function names, constants and ``NVMLError``) and turns NVML's answers into plain values:

- :meth:`NvmlSeam.read_gpu` reads one GPU's fields into a :class:`GpuReading`. A field the GPU does
  not support (``NVML_ERROR_NOT_SUPPORTED``, ``INVALID_ARGUMENT`` / ``FUNCTION_NOT_FOUND`` on
  older drivers) is left out, not an error; one the process may not read (``NO_PERMISSION``) is left
  out and noted in ``problems``; ``GPU_IS_LOST`` raises :class:`GpuLost` (the caller reports it).
- :meth:`NvmlSeam.init` raises :class:`NvmlUnavailable` with what to do when the library or the
  driver is missing or the process lacks permission.
- XID events: :meth:`NvmlSeam.xid_event_set` registers ``nvmlEventTypeXidCriticalError`` on every
  GPU that supports it; :meth:`NvmlSeam.wait_xid` waits for one event.

Units: temperatures Celsius, power W (NVML: mW), clocks MHz, memory MiB (NVML: bytes), violation
times microseconds (NVML: ns; dcgm-exporter's POWER/THERMAL_VIOLATION are µs).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from fleetmedic.connectors.errors import SourceUnavailable

# NVML_ERROR_FUNCTION_NOT_FOUND: an older driver without the call (pynvml's value)
_FUNCTION_NOT_FOUND = 13


class NvmlUnavailable(SourceUnavailable):
    """NVML cannot be used on this machine; the message says why and what to do."""


class GpuLost(RuntimeError):
    """NVML_ERROR_GPU_IS_LOST: the GPU fell off the bus (XID 79 territory)."""

    def __init__(self, index: int, detail: str) -> None:
        self.index = index
        super().__init__(f"GPU {index} is lost ({detail})")


@dataclass
class GpuReading:
    """One GPU's fields at one time: ``values`` by fleetmedic metric name (only what NVML gave),
    ``extra`` for fields without a wire-record column (aggregate ECC, NVLink state per link),
    ``problems`` per field that could not be read for a reason worth reporting."""

    index: int
    uuid: str = ""
    name: str = ""
    values: dict[str, float | int] = field(default_factory=dict)
    extra: dict[str, float | int] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)


class NvmlSeam:
    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self._skip = {nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_INVALID_ARGUMENT, _FUNCTION_NOT_FOUND}

    # --- lifecycle --------------------------------------------------------------------------------

    def init(self) -> None:
        n = self.nvml
        try:
            n.nvmlInit()
        except n.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code == n.NVML_ERROR_LIBRARY_NOT_FOUND:
                raise NvmlUnavailable("NVML library (libnvidia-ml.so.1) not found: is the NVIDIA driver installed, "
                                      "and is the container started with the NVIDIA runtime?") from None
            if code == n.NVML_ERROR_DRIVER_NOT_LOADED:
                raise NvmlUnavailable("NVIDIA driver not loaded: check `nvidia-smi` and `lsmod | grep nvidia`"
                                      ) from None
            if code == n.NVML_ERROR_NO_PERMISSION:
                raise NvmlUnavailable("no permission to use NVML: run with access to /dev/nvidia* "
                                      "(the device plugin's devices, or privileged)") from None
            raise NvmlUnavailable(f"nvmlInit failed: {exc}") from None

    def shutdown(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError:
            return

    def driver_version(self) -> str:
        return _text(self.nvml.nvmlSystemGetDriverVersion())

    def handles(self) -> tuple[list[tuple[int, Any]], dict[int, str]]:
        """Handles of the GPUs to sample (a lost GPU included, to be reported as lost), and the
        GPUs that cannot be opened at all with the reason (e.g. no permission)."""
        n = self.nvml
        out: list[tuple[int, Any]] = []
        unusable: dict[int, str] = {}
        for i in range(n.nvmlDeviceGetCount()):
            try:
                out.append((i, n.nvmlDeviceGetHandleByIndex(i)))
            except n.NVMLError as exc:
                if getattr(exc, "value", None) == n.NVML_ERROR_GPU_IS_LOST:
                    out.append((i, _LostHandle(str(exc))))
                else:
                    unusable[i] = str(exc) or f"NVML error {getattr(exc, 'value', '?')}"
        return out, unusable

    # --- fields -----------------------------------------------------------------------------------

    def read_gpu(self, index: int, handle: Any) -> GpuReading:
        n = self.nvml
        if isinstance(handle, _LostHandle):
            raise GpuLost(index, handle.detail)
        reading = GpuReading(index)
        reading.uuid = self._get(reading, "uuid", lambda: _text(n.nvmlDeviceGetUUID(handle))) or ""
        reading.name = self._get(reading, "name", lambda: _text(n.nvmlDeviceGetName(handle))) or ""
        for metric, read in self._readers(handle).items():
            value = self._get(reading, metric, read)
            if value is not None:
                reading.values[metric] = value
        for group, read_many in self._group_readers(handle).items():
            values = self._get(reading, group, read_many)
            if values is not None:
                reading.values.update(values)
        self._ecc(reading, handle)
        self._nvlink(reading, handle)
        return reading

    def _readers(self, h: Any) -> dict[str, Callable[[], float | int]]:
        n = self.nvml
        return {
            "gpu_temp": lambda: float(n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)),
            "memory_temp": lambda: self._field_value(h, n.NVML_FI_DEV_MEMORY_TEMP),
            "power_usage": lambda: n.nvmlDeviceGetPowerUsage(h) / 1000.0,
            "sm_clock": lambda: float(n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)),
            "mem_clock": lambda: float(n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM)),
            "clocks_event_reasons": lambda: int(self._clock_reasons(h)),
            "power_violation": lambda: int(n.nvmlDeviceGetViolationStatus(h, n.NVML_PERF_POLICY_POWER).violationTime
                                           // 1000),
            "thermal_violation": lambda: int(
                n.nvmlDeviceGetViolationStatus(h, n.NVML_PERF_POLICY_THERMAL).violationTime // 1000),
            "retired_sbe": lambda: len(n.nvmlDeviceGetRetiredPages(
                h, n.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)),
            "retired_dbe": lambda: len(n.nvmlDeviceGetRetiredPages(
                h, n.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)),
            "retired_pending": lambda: int(n.nvmlDeviceGetRetiredPagesPendingStatus(h)),
            "pcie_replay_counter": lambda: int(n.nvmlDeviceGetPcieReplayCounter(h)),
            "pcie_link_gen": lambda: int(n.nvmlDeviceGetCurrPcieLinkGeneration(h)),
            "pcie_link_width": lambda: int(n.nvmlDeviceGetCurrPcieLinkWidth(h)),
        }

    def _group_readers(self, h: Any) -> dict[str, Callable[[], dict[str, float | int]]]:
        """Calls that answer several metrics at once (one NVML call each)."""
        n = self.nvml

        def utilization() -> dict[str, float | int]:
            u = n.nvmlDeviceGetUtilizationRates(h)
            return {"gpu_util": float(u.gpu), "mem_copy_util": float(u.memory)}

        def memory() -> dict[str, float | int]:
            m = n.nvmlDeviceGetMemoryInfo(h)
            return {"fb_used": m.used / 2**20, "fb_free": m.free / 2**20}

        def remapped_rows() -> dict[str, float | int]:
            corr, unc, pending, failure = n.nvmlDeviceGetRemappedRows(h)
            return {"correctable_remapped_rows": int(corr), "uncorrectable_remapped_rows": int(unc),
                    "row_remap_pending": int(pending), "row_remap_failure": int(failure)}

        return {"utilization": utilization, "memory": memory, "remapped_rows": remapped_rows}

    def _clock_reasons(self, h: Any) -> int:
        """Clock event reasons (drivers >= 535), else the older throttle-reasons call."""
        n = self.nvml
        getter = getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None)
        if getter is not None:
            try:
                return int(getter(h))
            except n.NVMLError as exc:
                if getattr(exc, "value", None) != _FUNCTION_NOT_FOUND:
                    raise
        return int(n.nvmlDeviceGetCurrentClocksThrottleReasons(h))

    def _field_value(self, h: Any, field_id: int) -> float:
        n = self.nvml
        (fv,) = n.nvmlDeviceGetFieldValues(h, [field_id])
        if fv.nvmlReturn != 0:
            raise n.NVMLError(fv.nvmlReturn)
        kind = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}[fv.valueType]
        return float(getattr(fv.value, kind))

    def _ecc(self, reading: GpuReading, h: Any) -> None:
        n = self.nvml
        for name, error_type, counter in (
            ("ecc_sbe_vol_total", n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_VOLATILE_ECC),
            ("ecc_dbe_vol_total", n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC),
            ("ecc_sbe_agg_total", n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_AGGREGATE_ECC),
            ("ecc_dbe_agg_total", n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_AGGREGATE_ECC),
        ):
            value = self._get(reading, name, partial(n.nvmlDeviceGetTotalEccErrors, h, error_type, counter))
            if value is not None:
                (reading.values if "_vol_" in name else reading.extra)[name] = int(value)

    def _nvlink(self, reading: GpuReading, h: Any) -> None:
        """Sum the error counters over the GPU's NVLinks; count links that are down. A GPU without
        NVLink answers NOT_SUPPORTED on link 0: nothing is reported."""
        n = self.nvml
        counters = {
            "nvlink_replay_error_count_total": n.NVML_NVLINK_ERROR_DL_REPLAY,
            "nvlink_recovery_error_count_total": n.NVML_NVLINK_ERROR_DL_RECOVERY,
            "nvlink_crc_flit_error_count_total": n.NVML_NVLINK_ERROR_DL_CRC_FLIT,
            "nvlink_crc_data_error_count_total": n.NVML_NVLINK_ERROR_DL_CRC_DATA,
        }
        totals: dict[str, int] = {}
        links = down = 0
        for link in range(n.NVML_NVLINK_MAX_LINKS):
            state = self._get(reading, f"nvlink_state[{link}]", partial(n.nvmlDeviceGetNvLinkState, h, link))
            if state is None:
                continue
            links += 1
            if state != n.NVML_FEATURE_ENABLED:
                down += 1
                continue
            for name, counter in counters.items():
                value = self._get(reading, name, partial(n.nvmlDeviceGetNvLinkErrorCounter, h, link, counter))
                if value is not None:
                    totals[name] = totals.get(name, 0) + int(value)
        if links:
            reading.values["nvlink_links_down"] = down
            reading.values.update(totals)
            reading.extra["nvlink_links"] = links

    def _get(self, reading: GpuReading, name: str, read: Callable[[], Any]) -> Any:
        n = self.nvml
        try:
            return read()
        except n.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code == n.NVML_ERROR_GPU_IS_LOST:
                raise GpuLost(reading.index, str(exc)) from None
            if code in self._skip:
                return None
            if code == n.NVML_ERROR_NO_PERMISSION:
                reading.problems[_base(name)] = "no permission"
            else:
                reading.problems[_base(name)] = str(exc) or f"NVML error {code}"
            return None

    # --- XID events -------------------------------------------------------------------------------

    def xid_event_set(self, handles: list[tuple[int, Any]]) -> tuple[Any, list[int]]:
        """An event set with XID events registered on every GPU that supports them."""
        n = self.nvml
        event_set = n.nvmlEventSetCreate()
        registered = []
        for index, h in handles:
            if isinstance(h, _LostHandle):
                continue
            try:
                n.nvmlDeviceRegisterEvents(h, n.nvmlEventTypeXidCriticalError, event_set)
                registered.append(index)
            except n.NVMLError:
                continue
        return event_set, registered

    def wait_xid(self, event_set: Any, timeout_ms: int) -> tuple[int, int] | None:
        """(GPU index, XID) of the next XID event, or None after ``timeout_ms``."""
        n = self.nvml
        try:
            data = n.nvmlEventSetWait_v2(event_set, timeout_ms)
        except n.NVMLError as exc:
            if getattr(exc, "value", None) == n.NVML_ERROR_TIMEOUT:
                return None
            raise
        if not data.eventType & n.nvmlEventTypeXidCriticalError:
            return None
        return int(n.nvmlDeviceGetIndex(data.device)), int(data.eventData)

    def free_event_set(self, event_set: Any) -> None:
        try:
            self.nvml.nvmlEventSetFree(event_set)
        except self.nvml.NVMLError:
            return


@dataclass(frozen=True)
class _LostHandle:
    detail: str


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _base(name: str) -> str:
    return name.split("[", 1)[0]
