"""Replay of the StepFun fault trace (InfiniteHBD-Trace, SIGCOMM'25, Apache-2.0): 584 faults on 400
servers over 348 days, mapped to the fault kinds' telemetry symptoms and compressed in time.

The trace ships with the package as a compact CSV (``data/stepfun_fault_trace.csv``: node index,
start and end day, Level/Class/Desc); :func:`load_trace` also reads the original
``fault_trace.json`` (pairing each ``fault_start`` with the next ``fault_end`` of the same node and
type).

Mapping (:data:`TRACE_MAP`, keyed by Class and Desc): GPU DBE -> ``xid48``, GPU lost / unknown
error / not found -> ``xid79``, nvidia-smi timeout -> ``xid119``, "GPU xid Error" -> one of the hard
XIDs, PCIe width low -> ``pcie_degradation``, SBE over threshold -> ``hbm_degradation``, P2P bandwidth
low -> ``nvlink_errors``, temperature high -> thermal ``straggler``, parameter-plane link down ->
``nic_flap``, NIC lost / RNIC GID error -> ``nic_down``, NIC speed or width low -> ``nic_speed_low``,
fan -> ``fan_failure``, PSU -> ``psu_failure``, motherboard/CPU/RAID/riser and OS/file-system/kubelet
failures -> ``node_crash``; "Unknown Error" picks a hardware kind by the Llama 3 shares, "Stress Test
Failure" and "Suspect Machine Offline" pick a silent degradation (that is what stress tests and
troubleshooting find), planned changes/tests -> ``planned_reboot``.

Time: simulated time ``t`` corresponds to trace day ``offset_days + t * speedup / 86400``; a fault's
duration is divided by ``duration_scale`` (default 24: a day becomes an hour) and clamped to
[10 min, 12 h], because the trace's durations include waiting for technicians. Nodes: the fleet is a
random subset of the trace's 400 servers when smaller (so per-node fault rates are the trace's),
and tiles copies of it when larger.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

TRACE_SERVERS = 400
TRACE_DAYS = 348.98


@dataclass(frozen=True)
class TraceFault:
    node: int
    start_day: float
    end_day: float
    level: str
    cls: str
    desc: str


# (Class, Desc) -> kind, or a tuple of (kind, weight) choices
TRACE_MAP: dict[tuple[str, str], str | tuple[tuple[str, float], ...]] = {
    ("GPU", "GPU DBE(Double Bit ECC) > Threshold"): "xid48",
    ("GPU", "GPU xid Error"): (("xid79", 4), ("xid119", 3), ("xid95", 2), ("xid74", 1)),
    ("GPU", "GPU Temperature High"): "straggler",
    ("GPU", "GPU Lost"): "xid79",
    ("GPU", "GPU device unknow error"): "xid79",
    ("GPU", "GPU device not found"): "xid79",
    ("GPU", "GPU PCI link width low"): "pcie_degradation",
    ("GPU", "nvidia-smi Timeout"): "xid119",
    ("GPU", "GPU SBE(Single Bit ECC) > Threshold"): "hbm_degradation",
    ("GPU", "GPU P2P Bandwidth Low"): "nvlink_errors",
    ("GPU", "Silent Data Corruption"): "xid95",
    ("Parameter Plane Cable", "Link Down"): "nic_flap",
    ("NIC", "NIC Link Speed low"): "nic_speed_low",
    ("NIC", "NIC PCI link Width low"): "nic_speed_low",
    ("NIC", "NIC Lost"): "nic_down",
    ("NIC", "Rnic Gid Error"): "nic_down",
    ("Power Supply", "Power Supply Failure detected"): "psu_failure",
    ("Power Supply", "Redundancy Lost"): "psu_failure",
    ("Fan", "Speed Critical (Sensor)"): "fan_failure",
    ("Fan", "Redundancy Lost"): "fan_failure",
    ("Change", "Y-cables Taken offline"): "nic_down",
    ("Change", "Remote Optical Module Failure"): "nic_flap",
    ("Test", "Temporarily Offline"): "planned_reboot",
    ("System Crash", "Server down"): "node_crash",
}
_UNKNOWN_HW = (("xid79", 148), ("hbm_degradation", 72), ("xid119", 17), ("xid95", 19), ("straggler", 6),
               ("node_crash", 14), ("nic_flap", 35), ("nic_down", 7))
_SILENT = (("straggler", 3), ("hbm_degradation", 2), ("nvlink_errors", 2), ("pcie_degradation", 1),
           ("ib_ber", 2))


def _choices(cls: str, desc: str) -> str | tuple[tuple[str, float], ...]:
    hit = TRACE_MAP.get((cls, desc))
    if hit is not None:
        return hit
    if cls in ("Stress Test Failure", "Training Task Troubleshooting"):
        return _SILENT
    if cls == "Unknown Error" or (cls == "Other Failures" and desc == "Unknown Error"):
        return _UNKNOWN_HW
    return "node_crash"  # motherboard, CPU, RAID, riser, battery, OS, file system, kubelet, firmware


def map_kind(cls: str, desc: str, rng: np.random.Generator) -> str:
    c = _choices(cls, desc)
    if isinstance(c, str):
        return c
    kinds = [k for k, _ in c]
    w = np.array([w for _, w in c], dtype=float)
    return kinds[int(rng.choice(len(kinds), p=w / w.sum()))]


def load_trace(path: Path | None = None) -> list[TraceFault]:
    """The packaged CSV, or a CSV/JSON (``fault_trace.json``) at ``path``."""
    if path is not None and path.suffix == ".json":
        return _from_json(json.loads(path.read_text(encoding="utf-8")))
    if path is None:
        text = resources.files("fleetmedic.sim").joinpath("data/stepfun_fault_trace.csv").read_text("utf-8")
    else:
        text = path.read_text(encoding="utf-8")
    rows = [r for r in text.splitlines() if r and not r.startswith("#")]
    out = []
    for row in csv.DictReader(rows):
        out.append(TraceFault(int(row["node"]), float(row["start_day"]), float(row["end_day"]), row["level"],
                              row["class"], row["desc"]))
    return out


def _from_json(events: list[dict[str, Any]]) -> list[TraceFault]:
    ids: dict[str, int] = {}
    open_: dict[tuple[str, str, str, str], list[int]] = {}
    starts: list[tuple[int, float, str, str, str]] = []
    ends: dict[int, float] = {}
    for e in events:
        nid = str(e["node_id"])
        ids.setdefault(nid, len(ids))
        ft = e["fault_type"]
        key = (nid, str(ft["Level"]), str(ft["Class"]), str(ft["Desc"]))
        if e["event_type"] == "fault_start":
            open_.setdefault(key, []).append(len(starts))
            starts.append((ids[nid], float(e["event_time"]), key[1], key[2], key[3]))
        elif open_.get(key):
            ends[open_[key].pop(0)] = float(e["event_time"])
    return [TraceFault(node, start, ends.get(i, start), level, cls, desc)
            for i, (node, start, level, cls, desc) in enumerate(starts)]


@dataclass(frozen=True)
class TraceWindow:
    speedup: float = 200.0
    offset_days: float = 0.0
    duration_scale: float = 24.0
    min_duration_s: float = 600.0
    max_duration_s: float = 12 * 3600.0


@dataclass(frozen=True)
class TracePlanItem:
    kind: str
    onset_s: float  # seconds after the run's start
    duration_s: float
    node: int
    source: str


def plan_from_trace(faults: list[TraceFault], n_nodes: int, horizon_s: float, window: TraceWindow,
                    rng: np.random.Generator) -> list[TracePlanItem]:
    """Faults of the trace that fall in the run's window, mapped to kinds and fleet nodes."""
    copies = max(1, -(-n_nodes // TRACE_SERVERS))
    perms = [rng.permutation(TRACE_SERVERS) for _ in range(copies)]
    out: list[TracePlanItem] = []
    for f in faults:
        onset = (f.start_day - window.offset_days) * 86_400.0 / window.speedup
        if not 0.0 <= onset < horizon_s:
            continue
        dur = (f.end_day - f.start_day) * 86_400.0 / window.duration_scale
        dur = min(window.max_duration_s, max(window.min_duration_s, dur))
        for c in range(copies):
            node = c * TRACE_SERVERS + int(perms[c][f.node % TRACE_SERVERS])
            if node >= n_nodes:
                continue
            kind = map_kind(f.cls, f.desc, rng)
            out.append(TracePlanItem(kind, onset, dur, node, f"trace:{f.cls}/{f.desc}@{f.start_day:.4f}d"))
    out.sort(key=lambda p: (p.onset_s, p.node))
    return out
