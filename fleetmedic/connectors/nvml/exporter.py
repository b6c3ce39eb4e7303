"""``fleetmedic exporter nvml``: this node's GPUs through NVML -> one GpuTelemetry per interval.

Runs on every GPU node (a DaemonSet). Each ``exporters.nvml.interval_s`` it reads every GPU's
fields through :class:`~fleetmedic.connectors.nvml.seam.NvmlSeam` and publishes one record keyed by
the node, with the XID events NVML delivered since the previous record (a thread waits on an NVML
event set and stamps each event when it arrives).

Reports, never crashes:

- a field a GPU does not support is absent from the record (``null`` for that GPU);
- a field NVML refuses (no permission) is absent and counted as skipped ("<field>: no permission"),
  logged once per GPU and field;
- a lost GPU (``NVML_ERROR_GPU_IS_LOST``) stays in ``gpus`` with no values, and the record carries a
  synthesised XID 79 event ("fallen off the bus") once, when the loss is first seen, so the
  detectors treat it as the hard fault it is; it is counted as error ``gpu_lost``;
- a missing library, an unloaded driver or no permission to use NVML at all stop the exporter at
  start with a message saying what to do (exit 3).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from fleetmedic import records as r
from fleetmedic.config import Settings
from fleetmedic.connectors.nvml.record import build_record
from fleetmedic.connectors.nvml.seam import GpuLost, GpuReading, NvmlSeam, NvmlUnavailable
from fleetmedic.connectors.runtime import ConnectorMetrics, Outbox, sleep_or_stop, telemetry_outgoing

log = logging.getLogger("fleetmedic.connectors.nvml")

XID_GPU_LOST = 79  # "GPU has fallen off the bus": what NVML_ERROR_GPU_IS_LOST means for the fleet


def import_pynvml() -> Any:
    try:
        import pynvml
    except ImportError:
        raise NvmlUnavailable("pynvml is not installed: pip install 'fleetmedic[nvml]' (nvidia-ml-py)") from None
    return pynvml


def node_name(configured: str) -> str:
    return configured or os.environ.get("NODE_NAME", "") or socket.gethostname()


def read_boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            return fh.read().strip()
    except OSError:
        return ""


class NvmlSource:
    """The sampling loop. ``nvml`` is the pynvml module (or a fake with the same names)."""

    def __init__(self, nvml: Any, settings: Settings, outbox: Outbox, metrics: ConnectorMetrics,
                 clock: Callable[[], float] = time.time) -> None:
        self.seam = NvmlSeam(nvml)
        self.settings = settings
        self.cfg = settings.exporters.nvml
        self.outbox = outbox
        self.metrics = metrics
        self.clock = clock
        self.node = node_name(self.cfg.node_name)
        self.lost: dict[int, str] = {}
        self._xids: deque[r.XidEvent] = deque(maxlen=10_000)
        self._reported: set[tuple[int, str]] = set()
        self._stop_thread = threading.Event()

    async def run(self, stop: asyncio.Event) -> None:
        await asyncio.to_thread(self.seam.init)
        try:
            handles, unusable = self.seam.handles()
            for index, reason in unusable.items():
                log.error("GPU %d cannot be opened: %s", index, reason)
                self.metrics.error("gpu_unusable")
            driver, boot_id = self.seam.driver_version(), read_boot_id()
            event_set, registered = self.seam.xid_event_set(handles)
            log.info("NVML: %d GPUs on %s, driver %s; XID events on GPUs %s",
                     len(handles), self.node, driver, registered)
            watcher = threading.Thread(target=self._watch_xids, args=(event_set,), name="nvml-xid", daemon=True)
            watcher.start()
            try:
                while not stop.is_set():
                    started = time.monotonic()
                    record = await asyncio.to_thread(self.sample, handles, driver, boot_id)
                    self.outbox.offer(telemetry_outgoing(record, self.settings))
                    if await sleep_or_stop(stop, self.cfg.interval_s - (time.monotonic() - started)):
                        break
            finally:
                self._stop_thread.set()
                await asyncio.to_thread(watcher.join, 5.0)
                self.seam.free_event_set(event_set)
        finally:
            self.seam.shutdown()

    def sample(self, handles: list[tuple[int, Any]], driver: str, boot_id: str) -> r.GpuTelemetry:
        """Read every GPU once and build the node's record (blocking NVML calls)."""
        ts = self.clock()
        readings: list[GpuReading] = []
        new_xids: list[r.XidEvent] = []
        for index, handle in handles:
            try:
                reading = self.seam.read_gpu(index, handle)
            except GpuLost as exc:
                if index not in self.lost:
                    self.lost[index] = str(exc)
                    log.error("%s: %s; reporting it as XID %d", self.node, exc, XID_GPU_LOST)
                    new_xids.append(r.XidEvent(gpu=index, xid=XID_GPU_LOST, ts=ts,
                                               message=f"NVML: {exc} (fallen off the bus)"))
                self.metrics.error("gpu_lost")
                continue
            if index in self.lost:
                log.warning("%s: GPU %d answers again after being lost", self.node, index)
                del self.lost[index]
            for name, problem in reading.problems.items():
                self.metrics.skipped(f"{name}: {problem}")
                if (index, name) not in self._reported:
                    self._reported.add((index, name))
                    log.warning("%s GPU %d: %s not read: %s", self.node, index, name, problem)
            readings.append(reading)
        xids = self._drain_xids() + new_xids
        return build_record(self.node, ts, readings, self.lost, xids, driver, boot_id, self.metrics.skipped)

    def _drain_xids(self) -> list[r.XidEvent]:
        out = []
        while self._xids:
            out.append(self._xids.popleft())
        return out

    def _watch_xids(self, event_set: Any) -> None:
        wait_ms = self.cfg.xid_wait_ms
        while not self._stop_thread.is_set():
            try:
                got = self.seam.wait_xid(event_set, wait_ms)
            except Exception as exc:  # an NVML error while waiting: report, back off, go on
                self.metrics.error("xid_wait")
                log.warning("waiting for XID events failed: %s", exc)
                self._stop_thread.wait(1.0)
                continue
            if got is not None:
                gpu, xid = got
                log.warning("%s: XID %d on GPU %d", self.node, xid, gpu)
                self._xids.append(r.XidEvent(gpu=gpu, xid=min(xid, 100_000), ts=self.clock(),
                                             message="NVML event nvmlEventTypeXidCriticalError"))
