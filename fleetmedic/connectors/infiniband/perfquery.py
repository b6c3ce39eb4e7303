"""Pure part of the InfiniBand connector: perfquery output (default and ``-x``) -> counters, and
counters + topology -> PortTelemetry (see :mod:`fleetmedic.connectors.infiniband.exporter`).

:func:`parse_perfquery` never raises: line lengths and digit counts are checked before any regex or
``int()``, and what cannot be read is counted per reason.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from fleetmedic import records as r
from fleetmedic.config import InfinibandExporterSettings, InfinibandPortLink
from fleetmedic.connectors.prometheus.text import ascii_index, count

_HEADER = re.compile(r"^# Port (?P<ext>extended )?counters: Lid (?P<lid>[0-9]+) port (?P<port>[0-9]+|ALL)")
_LINE = re.compile(r"^(?P<name>[A-Za-z0-9]+):\.*(?P<value>\S*)\s*$")
#: perfquery's lines are under 80 characters; longer ones are skipped before any regex
MAX_LINE_CHARS = 4096
#: a 64-bit counter is at most 20 decimal digits ("0x" + 16 hex digits in hex)
_MAX_VALUE_CHARS = 24
_COUNTER_MAX = 2**63 - 1  # the records' Counter range

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
        if len(line) > MAX_LINE_CHARS:
            count(skipped, f"perfquery: line longer than {MAX_LINE_CHARS} characters")
            current = None  # it may have been a header: what follows is no longer the block's
            continue
        line = line.strip()
        if not line:
            continue
        if line.startswith("# Port"):
            current = _header(line, skipped)
            if current is not None:
                blocks.append(current)
            continue
        if line.startswith(("#", "ibwarn", "timestamp")):
            continue
        m = _LINE.match(line)
        if m is None or current is None:
            count(skipped, "perfquery: unparsable line")
            continue
        name, value = m.group("name"), m.group("value")
        if name not in PERFQUERY_FIELDS:
            continue
        number = _counter(value)
        if number is None:
            count(skipped, f"perfquery {name}: value is not a number")
        elif not 0 <= number <= _COUNTER_MAX:
            count(skipped, f"perfquery {name}: value out of range")
        else:
            current.counters[name] = number
    return blocks


def _header(line: str, skipped: Counter[str]) -> PerfqueryBlock | None:
    """The block a header line starts; None (counted) when it cannot be read, so that the counters
    under it are not taken for the previous block's."""
    header = _HEADER.match(line)
    if header is None:
        count(skipped, "perfquery: unparsable header")
        return None
    lid, port = ascii_index(header.group("lid"), 5), header.group("port")
    port_number = 255 if port == "ALL" else ascii_index(port, 3)
    if lid is None or port_number is None:
        count(skipped, "perfquery: header LID or port out of range")
        return None
    return PerfqueryBlock(lid, port_number, bool(header.group("ext")))


def _counter(text: str) -> int | None:
    """A counter's text (decimal or 0x hex) as an int; None when it is not one."""
    if not text or len(text) > _MAX_VALUE_CHARS or not text.isascii():
        return None
    try:
        return int(text, 0)
    except ValueError:
        return None


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
