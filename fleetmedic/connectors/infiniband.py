"""``fleetmedic exporter infiniband``: InfiniBand port counters from ``perfquery`` -> PortTelemetry.

``perfquery`` (infiniband-diags) prints one block per port, in two formats:

- default: ``# Port counters: Lid 1 port 1 (CapMask: 0x5A00)`` then ``Name:.....value`` lines
  (32-bit data counters, error counters);
- ``-x`` extended: ``# Port extended counters: Lid 1719 port 1 (CapMask: 0x5300 CapMask2: ...)``
  with 64-bit data counters and, on ports that support it, the error counters after
  ``CounterSelect2``.

Both count data in 4-byte words, as :class:`~fleetmedic.records.PortSample` does (node-exporter's
infiniband collector reports bytes; :mod:`~fleetmedic.connectors.prometheus_text` divides by 4).
Which switch or HCA a block belongs to, and which node it faces, comes from the topology in
``exporters.infiniband.topology``: a switch port by its LID and port number, a local HCA port by
its device name (``-C mlx5_0 -P 1``). One PortTelemetry per device per interval; a block no
topology entry names, or a value that is not a number, is counted as skipped with the reason.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from fleetmedic import records as r
from fleetmedic.config import InfinibandExporterSettings, InfinibandPortLink, Settings
from fleetmedic.connectors.runtime import ConnectorMetrics, Outbox, sleep_or_stop, telemetry_outgoing

_HEADER = re.compile(r"^# Port (?P<ext>extended )?counters: Lid (?P<lid>\d+) port (?P<port>\d+|ALL|255)")
_LINE = re.compile(r"^(?P<name>[A-Za-z0-9]+):\.*(?P<value>\S*)\s*$")

#: perfquery counter -> PortSample field
PERFQUERY_FIELDS: dict[str, str] = {
    "SymbolErrorCounter": "symbol_error_counter",
    "LinkErrorRecoveryCounter": "link_error_recovery_counter",
    "LinkDownedCounter": "link_downed_counter",
    "PortRcvErrors": "port_rcv_errors",
    "PortRcvRemotePhysicalErrors": "port_rcv_remote_physical_errors",
    "PortXmitDiscards": "port_xmit_discards",
    "LocalLinkIntegrityErrors": "local_link_integrity_errors",
    "ExcessiveBufferOverrunErrors": "excessive_buffer_overrun_errors",
    "PortXmitWait": "port_xmit_wait",
    "PortXmitData": "port_xmit_data",
    "PortRcvData": "port_rcv_data",
}


@dataclass
class PerfqueryBlock:
    lid: int
    port: int
    extended: bool
    counters: dict[str, int] = field(default_factory=dict)


def parse_perfquery(text: str, skipped: Counter[str]) -> list[PerfqueryBlock]:
    """Blocks of perfquery output (default or ``-x``); bad lines counted in ``skipped``."""
    blocks: list[PerfqueryBlock] = []
    current: PerfqueryBlock | None = None
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        header = _HEADER.match(line)
        if header:
            port = header.group("port")
            current = PerfqueryBlock(int(header.group("lid")), int(port) if port.isdigit() else 255,
                                     bool(header.group("ext")))
            blocks.append(current)
            continue
        if line.startswith(("#", "ibwarn", "timestamp")):
            continue
        m = _LINE.match(line)
        if m is None or current is None:
            skipped["perfquery: unparsable line"] += 1
            continue
        name, value = m.group("name"), m.group("value")
        if name not in PERFQUERY_FIELDS:
            continue
        try:
            current.counters[name] = int(value, 0)
        except ValueError:
            skipped[f"perfquery {name}: value is not a number"] += 1
    return blocks


@dataclass
class Topology:
    """Topology entries by (LID, port) for switch ports and (device, port) for HCA ports."""

    by_lid: dict[tuple[int, int], InfinibandPortLink]
    by_device: dict[tuple[str, int], InfinibandPortLink]

    @classmethod
    def of(cls, links: Iterable[InfinibandPortLink]) -> Topology:
        links = list(links)
        return cls({(x.lid, x.port): x for x in links if x.lid is not None},
                   {(x.device, x.port): x for x in links if x.device})


def device_of(link: InfinibandPortLink) -> tuple[str, str]:
    """(PortTelemetry.device, port name): a switch keeps its ports; a host's HCA port is
    ``<hca>/<port>`` on the node, as node-exporter's ports are."""
    if link.device_kind == "host":
        return link.node or link.device, f"{link.device or 'lid' + str(link.lid)}/{link.port}"
    return link.device or f"lid-{link.lid}", str(link.port)


def port_records(readings: Iterable[tuple[InfinibandPortLink, PerfqueryBlock]], ts: float,
                 skipped: Counter[str]) -> list[r.PortTelemetry]:
    """One PortTelemetry per device from (topology entry, perfquery block) pairs."""
    per_device: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for link, block in readings:
        device, port = device_of(link)
        sample: dict[str, Any] = {"port": port, "node": link.node, "peer": link.peer}
        sample.update({PERFQUERY_FIELDS[k]: v for k, v in block.counters.items()})
        per_device[(device, link.device_kind)].append(sample)
    out = []
    for (device, kind), samples in sorted(per_device.items()):
        try:
            out.append(r.convert(r.PortTelemetry, {"device": device, "device_kind": kind, "ts": ts,
                                                   "ports": samples, "source": "perfquery"}))
        except r.InvalidRecord as exc:
            skipped[f"PortTelemetry {exc.path}: {exc.reason}"] += 1
    return out


def perfquery_argv(cfg: InfinibandExporterSettings, link: InfinibandPortLink) -> list[str]:
    if link.lid is not None:
        return [*cfg.perfquery_command, str(link.lid), str(link.port)]
    return [*cfg.perfquery_command, "-C", link.device, "-P", str(link.port)]


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
