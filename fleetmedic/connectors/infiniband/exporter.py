"""``fleetmedic exporter infiniband``: InfiniBand port counters from ``perfquery`` -> PortTelemetry.

``perfquery`` (infiniband-diags) prints one block per port, in two formats:

- default: ``# Port counters: Lid 1 port 1 (CapMask: 0x5A00)`` then ``Name:.....value`` lines
  (32-bit data counters, error counters);
- ``-x`` extended: ``# Port extended counters: Lid 1719 port 1 (CapMask: 0x5300 CapMask2: ...)``
  with 64-bit data counters and, on ports that support it, the error counters after
  ``CounterSelect2``.

Both count data in 4-byte words, as :class:`~fleetmedic.records.PortSample` does (node-exporter's
infiniband collector reports bytes; :mod:`~fleetmedic.connectors.prometheus.text` divides by 4).
Which switch or HCA a block belongs to, and which node it faces, comes from the topology in
``exporters.infiniband.topology``: a switch port by its LID and port number, a local HCA port by
its device name (``-C mlx5_0 -P 1``). One PortTelemetry per device per interval; a block no
topology entry names, or a value that is not a number, is counted as skipped with the reason.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable

from fleetmedic.config import InfinibandPortLink, Settings
from fleetmedic.connectors.infiniband.perfquery import parse_perfquery, perfquery_argv, port_records
from fleetmedic.connectors.runtime import ConnectorMetrics, Outbox, sleep_or_stop, telemetry_outgoing


class PerfquerySource:
    def __init__(self, settings: Settings, outbox: Outbox, metrics: ConnectorMetrics,
                 clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.cfg = settings.exporters.infiniband
        if not self.cfg.topology:
            raise ValueError("exporters.infiniband.topology: list the ports to read (lid or device, port, node)")
        self.outbox = outbox
        self.metrics = metrics
        self.clock = clock

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            started = time.monotonic()
            await self.tick()
            if await sleep_or_stop(stop, self.cfg.interval_s - (time.monotonic() - started)):
                return

    async def tick(self) -> int:
        skipped: Counter[str] = Counter()
        ts = self.clock()
        outputs = await asyncio.gather(*(self._perfquery(link) for link in self.cfg.topology))
        readings = []
        for link, text in zip(self.cfg.topology, outputs, strict=True):
            if text is None:
                continue
            blocks = parse_perfquery(text, skipped)
            match = [b for b in blocks if b.port == link.port and (link.lid is None or b.lid == link.lid)]
            if not match:
                skipped["perfquery: no block for the requested port"] += 1
                continue
            readings.append((link, match[0]))
        records = port_records(readings, ts, skipped)
        for reason, n in skipped.items():
            self.metrics.skipped(reason, n)
        for rec in records:
            self.outbox.offer(telemetry_outgoing(rec, self.settings))
        return len(records)

    async def _perfquery(self, link: InfinibandPortLink) -> str | None:
        argv = perfquery_argv(self.cfg, link)
        try:
            proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE,
                                                        stderr=asyncio.subprocess.PIPE)
        except OSError as exc:
            self.metrics.error(f"perfquery_{type(exc).__name__}")
            return None
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), self.cfg.timeout_s)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            self.metrics.error("perfquery_timeout")
            return None
        if proc.returncode != 0:
            self.metrics.error("perfquery_exit")
            return None
        return out.decode(errors="replace")
