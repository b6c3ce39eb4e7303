"""A fake ``pynvml`` module: the NVML functions, constants and errors the exporter uses, with the
real module's names, values and calling conventions (test_nvml.py checks them against nvidia-ml-py).

The only fake in the connector tests: NVML is the hardware edge. A :class:`FakeGpu` holds one GPU's
state; tests change it between samples (warm a GPU, add ECC errors, lose it, raise XIDs)."""

from __future__ import annotations

import queue
from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_FI_DEV_MEMORY_TEMP = 82
NVML_VALUE_TYPE_DOUBLE = 0
NVML_VALUE_TYPE_UNSIGNED_INT = 1
NVML_PERF_POLICY_POWER = 0
NVML_PERF_POLICY_THERMAL = 1
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0
NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1
NVML_NVLINK_MAX_LINKS = 36
NVML_NVLINK_ERROR_DL_REPLAY = 0
NVML_NVLINK_ERROR_DL_RECOVERY = 1
NVML_NVLINK_ERROR_DL_CRC_FLIT = 2
NVML_NVLINK_ERROR_DL_CRC_DATA = 3
NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1
nvmlEventTypeXidCriticalError = 8

_MESSAGES = {
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_TIMEOUT: "Timeout",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        self.value = value
        super().__init__(value)

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, f"Unknown Error {self.value}")


@dataclass
class FakeGpu:
    index: int
    uuid: str = ""
    name: str = "NVIDIA H100 80GB HBM3"
    temp: int = 40
    memory_temp: float | None = 45.0
    power_mw: int = 310_500
    sm_clock: int = 1980
    mem_clock: int = 2619
    util_gpu: int = 97
    util_mem: int = 40
    fb_used: int = 60 * 2**30
    fb_free: int = 20 * 2**30
    reasons: int = 0
    power_violation_ns: int = 0
    thermal_violation_ns: int = 0
    ecc: dict[tuple[int, int], int] = field(default_factory=dict)  # (error type, counter type) -> count
    retired: dict[int, list[int]] = field(default_factory=dict)
    retired_pending: int = 0
    remapped: tuple[int, int, int, int] = (0, 0, 0, 0)
    pcie_replay: int = 0
    pcie_gen: int = 5
    pcie_width: int = 16
    nvlink_states: list[int] = field(default_factory=lambda: [NVML_FEATURE_ENABLED] * 18)
    nvlink_errors: dict[tuple[int, int], int] = field(default_factory=dict)  # (link, counter) -> count
    lost: bool = False
    unsupported: set[str] = field(default_factory=set)  # function names answering NOT_SUPPORTED
    forbidden: set[str] = field(default_factory=set)  # function names answering NO_PERMISSION
    missing: set[str] = field(default_factory=set)  # functions an older driver lacks (FUNCTION_NOT_FOUND)

    def __post_init__(self) -> None:
        self.uuid = self.uuid or f"GPU-00000000-0000-4000-8000-{self.index:012d}"


class FakeNvml:
    """Module-like: ``FakeNvml(gpus)`` has the pynvml functions as methods and the constants above."""

    def __init__(self, gpus: list[FakeGpu], init_error: int | None = None, driver: str = "550.54.15") -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.driver = driver
        self.initialised = False
        self.event_sets: list[queue.Queue[tuple[FakeGpu, int]]] = []
        self.registered: dict[int, list[queue.Queue[tuple[FakeGpu, int]]]] = {}
        self.handle_errors: dict[int, int] = {}
        self.calls: Counter[str] = Counter()
        for name, value in globals().items():
            if name.startswith(("NVML_", "nvmlEventType")):
                setattr(self, name, value)
        self.NVMLError = NVMLError

    # test controls
    def raise_xid(self, index: int, xid: int) -> None:
        for q in self.registered.get(index, []):
            q.put((self.gpus[index], xid))

    def _check(self, gpu: FakeGpu, fn: str) -> FakeGpu:
        if not self.initialised:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        if gpu.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        if fn in gpu.unsupported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if fn in gpu.forbidden:
            raise NVMLError(NVML_ERROR_NO_PERMISSION)
        if fn in gpu.missing:
            raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
        self.calls[fn] += 1
        return gpu

    # --- the pynvml functions ---------------------------------------------------------------------
    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.initialised = False

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        if index in self.handle_errors:
            raise NVMLError(self.handle_errors[index])
        return self.gpus[index]

    def nvmlDeviceGetIndex(self, h: FakeGpu) -> int:
        return h.index

    def nvmlDeviceGetUUID(self, h: FakeGpu) -> str:
        return self._check(h, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetName(self, h: FakeGpu) -> str:
        return self._check(h, "nvmlDeviceGetName").name

    def nvmlDeviceGetTemperature(self, h: FakeGpu, sensor: int) -> int:
        assert sensor == NVML_TEMPERATURE_GPU
        return self._check(h, "nvmlDeviceGetTemperature").temp

    def nvmlDeviceGetFieldValues(self, h: FakeGpu, field_ids: list[int]) -> list[Any]:
        g = self._check(h, "nvmlDeviceGetFieldValues")
        out = []
        for fid in field_ids:
            if fid == NVML_FI_DEV_MEMORY_TEMP and g.memory_temp is not None:
                out.append(SimpleNamespace(fieldId=fid, nvmlReturn=NVML_SUCCESS, valueType=NVML_VALUE_TYPE_UNSIGNED_INT,
                                           value=SimpleNamespace(uiVal=int(g.memory_temp))))
            else:
                out.append(SimpleNamespace(fieldId=fid, nvmlReturn=NVML_ERROR_NOT_SUPPORTED, valueType=0,
                                           value=SimpleNamespace(dVal=0.0)))
        return out

    def nvmlDeviceGetPowerUsage(self, h: FakeGpu) -> int:
        return self._check(h, "nvmlDeviceGetPowerUsage").power_mw

    def nvmlDeviceGetClockInfo(self, h: FakeGpu, clock: int) -> int:
        g = self._check(h, "nvmlDeviceGetClockInfo")
        return g.sm_clock if clock == NVML_CLOCK_SM else g.mem_clock

    def nvmlDeviceGetUtilizationRates(self, h: FakeGpu) -> Any:
        g = self._check(h, "nvmlDeviceGetUtilizationRates")
        return SimpleNamespace(gpu=g.util_gpu, memory=g.util_mem)

    def nvmlDeviceGetMemoryInfo(self, h: FakeGpu) -> Any:
        g = self._check(h, "nvmlDeviceGetMemoryInfo")
        return SimpleNamespace(total=g.fb_used + g.fb_free, used=g.fb_used, free=g.fb_free)

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: FakeGpu) -> int:
        return self._check(h, "nvmlDeviceGetCurrentClocksEventReasons").reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: FakeGpu) -> int:
        return self._check(h, "nvmlDeviceGetCurrentClocksThrottleReasons").reasons

    def nvmlDeviceGetViolationStatus(self, h: FakeGpu, policy: int) -> Any:
        g = self._check(h, "nvmlDeviceGetViolationStatus")
        ns = g.power_violation_ns if policy == NVML_PERF_POLICY_POWER else g.thermal_violation_ns
        return SimpleNamespace(referenceTime=0, violationTime=ns)

    def nvmlDeviceGetTotalEccErrors(self, h: FakeGpu, error_type: int, counter_type: int) -> int:
        return self._check(h, "nvmlDeviceGetTotalEccErrors").ecc.get((error_type, counter_type), 0)

    def nvmlDeviceGetRetiredPages(self, h: FakeGpu, cause: int) -> list[int]:
        return list(self._check(h, "nvmlDeviceGetRetiredPages").retired.get(cause, []))

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: FakeGpu) -> int:
        return self._check(h, "nvmlDeviceGetRetiredPagesPendingStatus").retired_pending

    def nvmlDeviceGetRemappedRows(self, h: FakeGpu) -> tuple[int, int, int, int]:
        return self._check(h, "nvmlDeviceGetRemappedRows").remapped

    def nvmlDeviceGetPcieReplayCounter(self, h: FakeGpu) -> int:
        return self._check(h, "nvmlDeviceGetPcieReplayCounter").pcie_replay

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: FakeGpu) -> int:
        return self._check(h, "nvmlDeviceGetCurrPcieLinkGeneration").pcie_gen

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: FakeGpu) -> int:
        return self._check(h, "nvmlDeviceGetCurrPcieLinkWidth").pcie_width

    def nvmlDeviceGetNvLinkState(self, h: FakeGpu, link: int) -> int:
        g = self._check(h, "nvmlDeviceGetNvLinkState")
        if link >= len(g.nvlink_states):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return g.nvlink_states[link]

    def nvmlDeviceGetNvLinkErrorCounter(self, h: FakeGpu, link: int, counter: int) -> int:
        return self._check(h, "nvmlDeviceGetNvLinkErrorCounter").nvlink_errors.get((link, counter), 0)

    def nvmlEventSetCreate(self) -> queue.Queue[tuple[FakeGpu, int]]:
        q: queue.Queue[tuple[FakeGpu, int]] = queue.Queue()
        self.event_sets.append(q)
        return q

    def nvmlDeviceRegisterEvents(self, h: FakeGpu, event_types: int, event_set: Any) -> None:
        self._check(h, "nvmlDeviceRegisterEvents")
        assert event_types == nvmlEventTypeXidCriticalError
        self.registered.setdefault(h.index, []).append(event_set)

    def nvmlEventSetWait_v2(self, event_set: queue.Queue[tuple[FakeGpu, int]], timeout_ms: int) -> Any:
        try:
            gpu, xid = event_set.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise NVMLError(NVML_ERROR_TIMEOUT) from None
        return SimpleNamespace(device=gpu, eventType=nvmlEventTypeXidCriticalError, eventData=xid,
                               gpuInstanceId=0, computeInstanceId=0)

    def nvmlEventSetFree(self, event_set: Any) -> None:
        return
