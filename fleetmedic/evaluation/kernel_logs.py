"""Recorded kernel logs as backtest input: the lines of a ``kern.log``, a saved ``dmesg -T``, a
``journalctl -k -o json`` export or a ``cat /dev/kmsg`` capture -> the ``KernelEvent`` and port
records ``fleetmedic exporter kmsg`` would have published, in time order.

- **Which files**: ``*.kmsg``, ``*.dmesg``, ``*.journal`` (``journalctl -o json``), ``*.log``
  (syslog: ``kern.log``, ``syslog``); each line is told apart as the exporter's reader does
  (:class:`~fleetmedic.connectors.kernel.kmsg_map.RecordReader`), with the time and host read from its stamp
  (:mod:`fleetmedic.connectors.kernel.log_lines`).
- **Which node**: the host the line names (a syslog or ``short-iso`` stamp's, the journal's
  ``_HOSTNAME``), else the file's name without its suffix (``gpu-node-7.dmesg`` -> ``gpu-node-7``).
- **Which GPU**: an XID line names a PCI address; ``pci_map`` (``--pci-map``, the exporter's format)
  maps it to a GPU index, the same map for every node (nodes of one model share their PCI
  layout). Without it XID lines are counted as not published, as the exporter counts them.
- **Which time**: the line's stamp; a stamp without a zone is UTC; BSD syslog stamps have no year
  (``year``, else the file's modification year); the kernel's uptime stamps and kmsg records need
  ``boot_time``. A line without a time that can be placed is counted per file and skipped.

The classified lines go through the exporter's mapper
(:class:`~fleetmedic.connectors.kernel.kmsg_map.KmsgMapper`: the log pattern library, the XID joiner), one
per node, with each line's own time as the clock. Only lines of device faults become records, so
what is held until the file ends is small whatever the log's size.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from fleetmedic import records as r
from fleetmedic.connectors.kernel.kmsg_map import BadRecord, KmsgMapper, RecordReader, parse_pci_map
from fleetmedic.remediation.log_patterns import PatternLibrary, default_library

KERNEL_SUFFIXES = (".kmsg", ".dmesg", ".journal", ".log")
KernelRecords = r.KernelEvent | r.PortTelemetry


@dataclass
class KernelLogOptions:
    """``fleetmedic backtest``'s options for kernel logs."""

    pci_map: dict[str, int] = field(default_factory=dict)  # pci_key -> GPU index
    year: int | None = None  # of BSD syslog stamps (None: each file's modification year)
    boot_time: float | None = None  # Unix seconds: for uptime stamps and kmsg records
    xid_window_s: float = 30.0
    library: PatternLibrary = field(default_factory=default_library)

    @staticmethod
    def read_pci_map(path: str) -> dict[str, int]:
        """A ``--pci-map`` file; ValueError naming the option and the reason."""
        try:
            with open(path, encoding="utf-8") as fh:
                return parse_pci_map(fh.read())
        except OSError as exc:
            raise ValueError(f"--pci-map {path}: cannot read: {exc.strerror}") from None
        except ValueError as exc:
            raise ValueError(f"--pci-map {path}: {exc}") from None


def node_of_file(path: Path) -> str:
    """``gpu-node-7.dmesg`` -> ``gpu-node-7`` (every known suffix removed: ``a.kmsg.log`` -> ``a``,
    ``a.dmesg.gz`` -> ``a``)."""
    name = path.name.removesuffix(".gz")
    while (suffix := Path(name).suffix) in KERNEL_SUFFIXES and suffix:
        name = name[: -len(suffix)]
    return name


def kernel_log_records(path: Path, lines: Iterable[str], options: KernelLogOptions,
                       problems: Counter[str], unpublished: Counter[str]) -> list[KernelRecords]:
    """The records of one recorded kernel log, sorted by time. ``problems``: lines that could not
    be read or placed in time, per reason; ``unpublished``: lines read but not published (not a
    device fault, an XID without a GPU for its address...), per reason."""
    year = options.year
    if year is None:
        year = time.gmtime(path.stat().st_mtime).tm_year
    reader = RecordReader(options.boot_time, stamped=True, year=year)
    default_node = node_of_file(path)
    mappers: dict[str, KmsgMapper] = {}
    out: list[KernelRecords] = []
    for rec in reader.read_all(lines):
        if isinstance(rec, BadRecord):
            problems[str(rec)] += 1
            continue
        if rec.ts is None or not math.isfinite(rec.ts):
            problems[_no_time(rec.seq is not None)] += 1
            continue
        node = rec.host or default_node
        mapper = mappers.get(node)
        if mapper is None:
            mapper = mappers[node] = KmsgMapper(node, options.library, options.pci_map,
                                                xid_window_s=options.xid_window_s, source="file")
        mapped = mapper.map([rec], now=rec.ts)
        out += _kept(mapped.records)
        unpublished.update(mapped.unpublished)
    for mapper in mappers.values():
        mapped = mapper.due(math.inf, flush=True)
        out += _kept(mapped.records)
        unpublished.update(mapped.unpublished)
    out.sort(key=lambda rec: float(rec.ts))
    return out


def _kept(records: list[r.Record]) -> list[KernelRecords]:
    return [rec for rec in records if isinstance(rec, (r.KernelEvent, r.PortTelemetry))]


def _no_time(kmsg: bool) -> str:
    if kmsg:
        return "kmsg record without a time (give --boot-time: when that boot started)"
    return ("kernel line without a time (no dmesg -T, ISO or syslog stamp; an uptime stamp needs --boot-time; "
            "a syslog stamp needs --log-year or the file's modification time)")
