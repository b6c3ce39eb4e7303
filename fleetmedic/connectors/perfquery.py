"""Pure part of the InfiniBand connector: perfquery output (default and ``-x``) -> counters, and
counters + topology -> PortTelemetry (see :mod:`fleetmedic.connectors.infiniband`).
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from fleetmedic import records as r
from fleetmedic.config import InfinibandExporterSettings, InfinibandPortLink

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
