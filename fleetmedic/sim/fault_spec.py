"""``--faults SPEC``: which faults to inject, and the deterministic plan built from it.

Grammar (comma-separated items; durations like ``90s``, ``15m``, ``6h``, ``1h30m``)::

    none                      no faults
    mix[:N]                   N faults drawn by the kinds' weights (hardware/degradation/network
                              shares after the Llama 3 and StepFun statistics, plus transient
                              software, job bugs and negative controls); default N = nodes x hours / 24,
                              at least 4
    all                       one fault of every kind in the library
    negatives                 one of every negative control
    trace[:opt=val;...]       replay the StepFun trace; options: speedup (default 200: trace days per
                              simulated day), offset (trace day to start at, e.g. 30d), scale
                              (duration divisor, default 24), path (a CSV or fault_trace.json)
    KIND[:COUNT][@AT[+DUR]][/NODE[/GPU]]
                              COUNT faults of KIND (e.g. xid79, straggler, ib_ber, leaf_switch,
                              job_bug, xid13, or xid<N> for any catalog code); @AT fixes the onset
                              (after the start), +DUR the duration; /NODE the node (name or index),
                              /GPU the GPU (or the NIC for network kinds)

Examples: ``mix``, ``mix:40``, ``trace``, ``trace:speedup=500;offset=120d``,
``xid79:2,straggler:3,leaf_switch@2h+45m,xid13:2``, ``straggler@30m/gpu-node-0003/5``.

Random placement: onsets are uniform between a warm-up (so baselines exist; min(20 min, 20 % of the
run)) and a tail (so detection has time; min(30 min, 25 %)); nodes are drawn without replacement
while distinct nodes remain, so truth stays unambiguous. Everything draws from the seed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fleetmedic.sim.faults import KINDS, kind_info
from fleetmedic.sim.fleet import Fleet
from fleetmedic.sim.trace import TraceWindow, load_trace, plan_from_trace
from fleetmedic.sim.units import parse_duration


@dataclass(frozen=True)
class PlannedFault:
    kind: str
    onset_s: float  # after the run's start
    duration_s: float
    node: int = -1
    gpu: int = -1
    nic: int = -1
    leaf: int = -1
    source: str = "spec"
    pinned: bool = False  # the target was given, do not re-target at onset
    params: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class SpecItem:
    kind: str
    count: int = 1
    at_s: float | None = None
    duration_s: float | None = None
    node: str | None = None
    sub: int | None = None
    options: dict[str, str] = field(default_factory=dict)


def parse_spec(spec: str) -> list[SpecItem]:
    items: list[SpecItem] = []
    for raw in (p.strip() for p in spec.split(",")):
        if not raw:
            continue
        if raw == "none":
            continue
        head, _, opt_text = raw.partition(":")
        if head == "trace":
            opts = dict(_kv(o) for o in opt_text.split(";") if o.strip())
            unknown = set(opts) - {"speedup", "offset", "scale", "path"}
            if unknown:
                raise ValueError(f"unknown trace option(s) {sorted(unknown)} (speedup, offset, scale, path)")
            items.append(SpecItem("trace", options=opts))
            continue
        if head in ("mix", "all", "negatives"):
            count = int(opt_text) if opt_text else 0
            items.append(SpecItem(head, count=count))
            continue
        body = raw
        target = None
        if "/" in body:
            body, target = body.split("/", 1)
        at = dur = None
        if "@" in body:
            body, when = body.split("@", 1)
            if "+" in when:
                when, d = when.split("+", 1)
                dur = parse_duration(d)
            at = parse_duration(when)
        kind, _, cnt = body.partition(":")
        kind_info(kind)  # validates
        count = int(cnt) if cnt else 1
        if count < 0:
            raise ValueError(f"negative count in {raw!r}")
        node = sub = None
        if target:
            parts = target.split("/")
            node = parts[0]
            if len(parts) > 1:
                sub = int(parts[1])
        items.append(SpecItem(kind, count=count, at_s=at, duration_s=dur, node=node, sub=sub))
    return items


def _kv(text: str) -> tuple[str, str]:
    k, sep, v = text.partition("=")
    if not sep:
        raise ValueError(f"trace option {text!r} is not key=value")
    return k.strip(), v.strip()


def default_mix_count(n_nodes: int, horizon_s: float) -> int:
    return max(4, round(n_nodes * horizon_s / 3600.0 / 24.0))


def plan_faults(spec: str, fleet: Fleet, horizon_s: float, seed: int) -> list[PlannedFault]:
    """The faults ``spec`` asks for, placed deterministically by ``seed``."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x5EC]))
    warm = min(1200.0, 0.2 * horizon_s)
    tail = min(1800.0, 0.25 * horizon_s)
    lo, hi = warm, max(warm + 1.0, horizon_s - tail)
    pool: list[int] = []
    out: list[PlannedFault] = []

    def next_node() -> int:
        nonlocal pool
        if not pool:
            pool = [int(i) for i in rng.permutation(fleet.n)]
        return pool.pop()

    def one(kind: str, at: float | None = None, dur: float | None = None, node: str | None = None,
            sub: int | None = None, source: str = "spec") -> PlannedFault:
        info = kind_info(kind)
        onset = float(rng.uniform(lo, hi)) if at is None else at
        duration = float(rng.uniform(*info.duration_s)) if dur is None else dur
        n = g = nic = leaf = -1
        pinned = node is not None
        if node is not None and node not in fleet.leaf_index:
            n = fleet.node_index[node] if node in fleet.node_index else int(node) if node.isdigit() else -2
            if not 0 <= n < fleet.n:
                raise ValueError(f"node {node!r} is not in the fleet")
        if info.target == "leaf":
            if node is not None and node in fleet.leaf_index:
                leaf = fleet.leaf_index[node]
            else:
                leaf = int(rng.integers(0, len(fleet.leaf_names))) if n < 0 else int(
                    fleet.ports.leaf_of[n, int(rng.integers(0, fleet.spec.nics_per_node))])
            n = -1
        elif info.target == "job":
            n = -1
        else:
            if n < 0:
                n = next_node()
            if info.target in ("gpu", "busy_gpu"):
                g = sub if sub is not None else int(rng.integers(0, fleet.g))
            elif info.target == "nic":
                nic = sub if sub is not None else int(rng.integers(0, fleet.spec.nics_per_node))
        return PlannedFault(kind, onset, duration, n, g, nic, leaf, source, pinned)

    for item in parse_spec(spec):
        if item.kind == "trace":
            o = item.options
            window = TraceWindow(
                speedup=float(o.get("speedup", 200.0)),
                offset_days=parse_duration(o["offset"]) / 86_400.0 if "offset" in o else 0.0,
                duration_scale=float(o.get("scale", 24.0)),
            )
            trace = load_trace(Path(o["path"]) if "path" in o else None)
            for p in plan_from_trace(trace, fleet.n, horizon_s, window, rng):
                info = kind_info(p.kind)
                g = int(rng.integers(0, fleet.g)) if info.target in ("gpu", "busy_gpu") else -1
                nic = int(rng.integers(0, fleet.spec.nics_per_node)) if info.target == "nic" else -1
                params: dict[str, object] = {"variant": "thermal"} if p.kind == "straggler" else {}
                out.append(PlannedFault(p.kind, p.onset_s, p.duration_s, p.node, g, nic, -1, p.source, True, params))
        elif item.kind == "mix":
            names = [k for k, v in KINDS.items() if v.weight > 0]
            w = np.array([KINDS[k].weight for k in names])
            n_faults = item.count or default_mix_count(fleet.n, horizon_s)
            for idx in rng.choice(len(names), size=n_faults, p=w / w.sum()):
                out.append(one(names[int(idx)], source="mix"))
        elif item.kind == "all":
            for _ in range(max(1, item.count)):
                for name in KINDS:
                    out.append(one(name, source="all"))
        elif item.kind == "negatives":
            for _ in range(max(1, item.count)):
                for name, info in KINDS.items():
                    if info.fault_class == "negative_control":
                        out.append(one(name, source="negatives"))
        else:
            for _ in range(item.count):
                out.append(one(item.kind, item.at_s, item.duration_s, item.node, item.sub))
    out.sort(key=lambda p: (p.onset_s, p.kind, p.node))
    return out
