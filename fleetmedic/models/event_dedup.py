"""One event, not two: the same XID reported by several sources.

An XID reaches stage 1 from the node's GPU telemetry (NVML's event, or a change of dcgm-exporter's
XID gauge) and from its kernel log (``fleetmedic exporter kmsg``: the driver's ``NVRM: Xid`` line).
Where both run, each XID would otherwise count twice: two findings, and twice towards
``xid_repeat`` and ``xid_trend``.

The rule, per node: an XID ``(gpu, code)`` from one source is the same event as one from another
source within ``window_s`` of event time (the stamps of the two reports, in either order). Each
report of one source is matched by at most one report of each other source, so an XID that really
repeats (an application faulting every few seconds) still counts once per occurrence when every
source reports every occurrence; two reports from the same source are always two events.

The memory is a list of ``(ts, gpu, code, sources)`` tuples (``sources``: a bit per source), kept
in the node's state (:class:`~fleetmedic.models.gpu_state.NodeGpuState`) and bounded: entries
older than the newest by more than twice the window are dropped, and at most :data:`MAX_ENTRIES`
are kept. Pure: no I/O, no clock.
"""

from __future__ import annotations

from typing import Final

#: the sources an XID comes from, one bit each
TELEMETRY: Final = 1  # GpuTelemetry: NVML's XID events, dcgm-exporter's XID gauge
KERNEL: Final = 2  # KernelEvent: the kernel log's Xid line (or an XID in the driver's own words)
SOURCE_NAMES: Final = {TELEMETRY: "telemetry", KERNEL: "kernel log"}
MAX_ENTRIES: Final = 256

Entry = tuple[float, int, int, int]  # ts, gpu, xid, sources


def accept(entries: list[Entry], gpu: int, xid: int, ts: float, source: int, window_s: float) -> bool:
    """Whether this report of XID ``xid`` on ``gpu`` at ``ts`` from ``source`` is a new event (True)
    or the same event another source reported already (False). ``entries`` is updated in place."""
    if window_s <= 0:
        return True
    best = -1
    for i, (t, g, code, sources) in enumerate(entries):
        if g == gpu and code == xid and not sources & source and abs(t - ts) <= window_s and (
                best < 0 or abs(t - ts) < abs(entries[best][0] - ts)):
            best = i
    if best >= 0:
        t, g, code, sources = entries[best]
        entries[best] = (t, g, code, sources | source)
        return False
    entries.append((ts, gpu, xid, source))
    newest = max(e[0] for e in entries)
    horizon = newest - 2 * window_s
    if entries[0][0] < horizon or len(entries) > MAX_ENTRIES:
        entries[:] = [e for e in entries if e[0] >= horizon][-MAX_ENTRIES:]
    return True
