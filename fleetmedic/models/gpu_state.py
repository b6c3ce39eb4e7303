"""The GPU detector's storage: every node's arrays, and the form a node's state is saved in.

A node's numeric state (baselines, the previous sample, throttle shares, the widest PCIe link, its
clock and sample count, smoothed sibling rates) lives in a :class:`Slab`: one array per quantity for
every node with the same GPU count, one slot per node, so a micro-batch gathers and scatters its
nodes' state with one indexing operation per array. :class:`LiveNode` is one node's slot plus the
rarely used Python-level state (active conditions, XID logs, absent GPUs). :class:`GpuNodeStates`
holds them all and saves and loads a node at a time as a :class:`NodeGpuState` (msgpack), the
format stage 1 writes to its compacted state topic. The rules that read and write these arrays are
:class:`~fleetmedic.models.gpu_detector.GpuDetector`'s. Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec
import numpy as np
from numpy.typing import NDArray

from fleetmedic.models.gpu_signals import PLANES, WATCHED
from fleetmedic.models.state import require_finite, require_finite_time

F64 = NDArray[np.float64]


class NodeGpuState(msgspec.Struct, kw_only=True):
    """Everything the detector remembers about one node: the format of
    :meth:`GpuNodeStates.node_bytes` (msgpack)."""

    gpus: tuple[int, ...]
    signals: tuple[str, ...]
    planes: bytes  # float64 [K, S, G]
    prev: bytes  # float64 [W, G]
    throttle: bytes  # float64 [G]
    max_width: bytes  # float64 [G]
    prev_ts: float = float("nan")
    boot_id: str = ""
    samples: int = 0
    active: dict[str, list[float]] = {}  # condition -> [last reported, last seen]
    xid_log: list[tuple[float, int, int]] = []
    absent: dict[int, list[float]] = {}  # GPU -> [first record without it, records in a row without it]
    siblings: bytes = b""  # float64 [siblings.signals, G]: smoothed rates (empty: zeros)
    xid_seen: list[tuple[float, int, int, int]] = []  # XIDs by source, one event not two (models/event_dedup.py)


_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(NodeGpuState).decode


def _check_finite(st: NodeGpuState) -> None:
    """Refuse a saved node state no detector could have written: baselines, throttle counts and
    smoothed rates are finite; a previous sample and the widest link may be NaN (none yet), never
    infinite; every time is finite."""
    for part in ("planes", "throttle", "siblings"):
        require_finite(part, np.frombuffer(getattr(st, part), dtype=np.float64))
    for part in ("prev", "max_width"):
        require_finite(part, np.frombuffer(getattr(st, part), dtype=np.float64), nan_is_none=True)
    require_finite_time("prev_ts", st.prev_ts)
    require_finite("active", [t for v in st.active.values() for t in v])
    require_finite("xid_log", [e[0] for e in st.xid_log])
    require_finite("absent", [t for v in st.absent.values() for t in v])
    require_finite("xid_seen", [e[0] for e in st.xid_seen])


class Slab:
    """The arrays of every node with the same GPU count, one slot per node (grown by doubling), so a
    micro-batch gathers and scatters its nodes' state with one indexing operation per array."""

    planes: F64  # [cap, K, S, G]
    prev: F64  # [cap, W, G]
    throttle: F64  # [cap, G]
    max_width: F64  # [cap, G]
    prev_ts: F64  # [cap]
    samples: NDArray[np.int64]  # [cap]
    last: F64  # [cap, S, G] the latest signals (not persisted)
    sib: F64  # [cap, R, G] smoothed rates of the sibling-compared signals

    def __init__(self, gpus: int, signals: int, siblings: int = 0) -> None:
        self.g, self.s, self.r = gpus, signals, siblings
        self.used = 0
        self.free: list[int] = []
        self._allocate(16, first=True)

    def _allocate(self, cap: int, first: bool = False) -> None:
        k, g, s = PLANES, self.g, self.s
        planes, prev = np.zeros((cap, k, s, g)), np.full((cap, len(WATCHED), g), np.nan)
        throttle, max_width = np.zeros((cap, g)), np.full((cap, g), np.nan)
        prev_ts, samples, last = np.full(cap, np.nan), np.zeros(cap, dtype=np.int64), np.full((cap, s, g), np.nan)
        sib = np.zeros((cap, self.r, g))
        if not first:
            n = self.used
            planes[:n], prev[:n], throttle[:n] = self.planes[:n], self.prev[:n], self.throttle[:n]
            max_width[:n], prev_ts[:n], samples[:n], last[:n] = (
                self.max_width[:n], self.prev_ts[:n], self.samples[:n], self.last[:n])
            sib[:n] = self.sib[:n]
        self.planes, self.prev, self.throttle, self.max_width = planes, prev, throttle, max_width
        self.prev_ts, self.samples, self.last, self.sib = prev_ts, samples, last, sib

    def alloc(self) -> int:
        if self.free:
            return self.free.pop()
        if self.used == len(self.prev_ts):
            self._allocate(2 * self.used)
        self.used += 1
        return self.used - 1

    def release(self, slot: int) -> None:
        self.planes[slot], self.prev[slot], self.throttle[slot], self.max_width[slot] = 0.0, np.nan, 0.0, np.nan
        self.prev_ts[slot], self.samples[slot], self.last[slot], self.sib[slot] = np.nan, 0, np.nan, 0.0
        self.free.append(slot)


@dataclass
class LiveNode:
    """One node: its slot in the slab of its GPU count, and the rarely used Python-level state."""

    gpus: tuple[int, ...]
    slab: Slab
    slot: int
    boot_id: str = ""
    active: dict[str, list[float]] = field(default_factory=dict)
    xid_log: list[tuple[float, int, int]] = field(default_factory=list)
    # GPUs missing from the latest records: GPU -> [first record without it, records in a row without it]
    absent: dict[int, list[float]] = field(default_factory=dict)
    xid_seen: list[tuple[float, int, int, int]] = field(default_factory=list)  # event_dedup's entries
    gpu_list: list[int] = field(init=False)  # ``gpus`` as messages carry them, for a cheap comparison

    def __post_init__(self) -> None:
        self.gpu_list = list(self.gpus)

    @property
    def planes(self) -> F64:
        return self.slab.planes[self.slot]  # type: ignore[no-any-return]

    @property
    def prev(self) -> F64:
        return self.slab.prev[self.slot]  # type: ignore[no-any-return]

    @property
    def throttle(self) -> F64:
        return self.slab.throttle[self.slot]  # type: ignore[no-any-return]

    @property
    def max_width(self) -> F64:
        return self.slab.max_width[self.slot]  # type: ignore[no-any-return]

    @property
    def prev_ts(self) -> float:
        return float(self.slab.prev_ts[self.slot])

    @property
    def samples(self) -> int:
        return int(self.slab.samples[self.slot])


class GpuNodeStates:
    """Every node's state: its :class:`LiveNode` by name, in slabs by GPU count. ``names`` are the
    monitored signals (the rows of ``planes``), ``siblings`` how many signals are compared with the
    node's other GPUs (the rows of ``sib``)."""

    def __init__(self, names: tuple[str, ...], siblings: int) -> None:
        self.names = names
        self.siblings = siblings
        self.live: dict[str, LiveNode] = {}
        self._slabs: dict[int, Slab] = {}

    def new(self, gpus: tuple[int, ...]) -> LiveNode:
        """A fresh slot for a node of ``gpus`` (not yet registered under a name)."""
        slab = self._slabs.get(len(gpus))
        if slab is None:
            slab = self._slabs[len(gpus)] = Slab(len(gpus), len(self.names), self.siblings)
        return LiveNode(gpus=gpus, slab=slab, slot=slab.alloc())

    def node_bytes(self, node: str) -> bytes | None:
        """The node's state (a :class:`NodeGpuState`, msgpack), or None before its first message."""
        live = self.live.get(node)
        if live is None:
            return None
        return _encode(NodeGpuState(
            gpus=live.gpus,
            signals=self.names,
            planes=live.planes.tobytes(),
            prev=live.prev.tobytes(),
            throttle=live.throttle.tobytes(),
            max_width=live.max_width.tobytes(),
            prev_ts=live.prev_ts,
            boot_id=live.boot_id,
            samples=live.samples,
            active={k: list(v) for k, v in live.active.items()},
            xid_log=list(live.xid_log),
            absent={k: list(v) for k, v in live.absent.items()},
            siblings=live.slab.sib[live.slot].tobytes(),
            xid_seen=list(live.xid_seen),
        ))

    def load_node(self, node: str, data: bytes) -> None:
        """Replace the node's state with what :meth:`node_bytes` wrote; :class:`ValueError` (the
        node's state left as it was) for a baseline, counter or time that is not finite."""
        st = _decode(data)
        _check_finite(st)
        g = len(st.gpus)
        self.forget(node)
        live = self.live[node] = self.new(st.gpus)
        slab, i = live.slab, live.slot
        if st.signals == self.names:  # else the monitored signals changed (config): relearn baselines
            slab.planes[i] = np.frombuffer(st.planes, dtype=np.float64).reshape(PLANES, len(self.names), g)
        slab.prev[i] = np.frombuffer(st.prev, dtype=np.float64).reshape(len(WATCHED), g)
        slab.throttle[i] = np.frombuffer(st.throttle, dtype=np.float64)
        slab.max_width[i] = np.frombuffer(st.max_width, dtype=np.float64)
        slab.prev_ts[i], slab.samples[i] = st.prev_ts, st.samples
        if len(st.siblings) == slab.sib[i].nbytes:  # else the compared signals changed (config): start again
            slab.sib[i] = np.frombuffer(st.siblings, dtype=np.float64).reshape(slab.r, g)
        live.boot_id = st.boot_id
        live.active = {k: list(v) for k, v in st.active.items()}
        live.xid_log = list(st.xid_log)
        live.absent = {k: list(v) for k, v in st.absent.items()}
        live.xid_seen = list(st.xid_seen)

    def forget(self, node: str) -> None:
        """Drop a node's state (e.g. after repair: baselines start again)."""
        live = self.live.pop(node, None)
        if live is not None:
            live.slab.release(live.slot)

    def realigned(self, live: LiveNode, gpus: tuple[int, ...]) -> LiveNode:
        """The node reported a GPU it had not before: a fresh slot for ``gpus``, keeping what is known of
        the GPUs in both."""
        fresh = self.new(gpus)
        src, dst = live.slab, fresh.slab
        for j, gpu in enumerate(gpus):
            if gpu in live.gpus:
                k = live.gpus.index(gpu)
                dst.planes[fresh.slot, ..., j] = src.planes[live.slot, ..., k]
                dst.prev[fresh.slot, :, j] = src.prev[live.slot, :, k]
                dst.throttle[fresh.slot, j] = src.throttle[live.slot, k]
                dst.max_width[fresh.slot, j] = src.max_width[live.slot, k]
                dst.sib[fresh.slot, :, j] = src.sib[live.slot, :, k]
        dst.prev_ts[fresh.slot], dst.samples[fresh.slot] = live.prev_ts, live.samples
        fresh.boot_id, fresh.active, fresh.xid_log = live.boot_id, live.active, live.xid_log
        fresh.xid_seen = live.xid_seen
        fresh.absent = {g: v for g, v in live.absent.items() if g in gpus}
        src.release(live.slot)
        return fresh
