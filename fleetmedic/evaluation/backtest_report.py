"""Builds the backtest's HTML report: which subjects to show and the series behind each plot.

A second pass over the inputs replays only the subjects' nodes through a fresh
:class:`~fleetmedic.models.gpu_detector.GpuDetector` to recover, sample by sample, each judged
signal of the suspect GPU, its baseline band (mean ± ``z_warning`` std) and the same signal on the
node's other GPUs (its peers). Port findings get the counter's increase per sample against its
threshold. Findings and commands become markers.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from fleetmedic import records as r
from fleetmedic.config import Settings
from fleetmedic.evaluation.report import Panel, Section, Series, downsample, render
from fleetmedic.models.gpu_detector import GpuDetector

MAX_SUBJECTS = 40
MAX_PANELS = 3


@dataclass
class Subject:
    heading: str
    summary: str
    nodes: set[str]
    findings: list[r.Finding]
    commands: list[r.RemediationCommand] = field(default_factory=list)


def subjects(
    findings: list[r.Finding], incidents: list[r.Incident], commands: list[r.RemediationCommand]
) -> list[Subject]:
    by_id = {f.id: f for f in findings}
    out: list[Subject] = []
    latest: dict[str, r.Incident] = {}
    for inc in incidents:
        latest[inc.id] = inc
    covered: set[str] = set()
    for inc in list(latest.values())[:MAX_SUBJECTS]:
        nodes = {s.name for s in inc.suspects if s.kind == "node"} or {
            by_id[i].node for i in inc.finding_ids if i in by_id}
        fs = [by_id[i] for i in inc.finding_ids if i in by_id] or [f for f in findings if f.node in nodes]
        covered.update(f.id for f in fs)
        cmds = [c for c in commands if c.incident_id == inc.id]
        suspects = ", ".join(f"{s.kind} {s.name}" for s in inc.suspects) or "none"
        out.append(Subject(f"{inc.incident_class} incident {inc.id}",
                           f"{inc.summary} Suspects: {suspects}; confidence {inc.confidence:.2f}.", nodes, fs, cmds))
    # findings that did not (yet) make an incident: what a person tuning thresholds wants to see too
    per_node: dict[str, list[r.Finding]] = defaultdict(list)
    for f in findings:
        if f.id not in covered:
            per_node[f.node].append(f)
    rank = sorted(per_node.items(), key=lambda kv: (-sum(f.severity == "critical" for f in kv[1]), -len(kv[1])))
    for node, fs in rank[: max(0, MAX_SUBJECTS - len(out))]:
        kinds = ", ".join(sorted({f.kind for f in fs}))
        out.append(Subject(f"node {node}: findings without an incident",
                           f"{len(fs)} findings ({kinds}) that triage did not turn into an incident.", {node}, fs))
    return out


@dataclass
class _Trace:
    t: list[float] = field(default_factory=list)
    value: list[float | None] = field(default_factory=list)
    lo: list[float | None] = field(default_factory=list)
    hi: list[float | None] = field(default_factory=list)
    peers: list[list[float | None]] = field(default_factory=list)


def _num(x: float) -> float | None:
    return None if x != x or x in (float("inf"), float("-inf")) else round(float(x), 4)


def collect(
    settings: Settings, records: Iterable[r.GpuTelemetry | r.PortTelemetry | r.JobEvent], subs: list[Subject]
) -> list[Section]:
    wanted: dict[str, set[tuple[str, int]]] = defaultdict(set)  # node -> (signal, gpu)
    ports: dict[str, str] = {}  # "device/port" -> metric
    for sub in subs:
        for f in sub.findings:
            ev = f.evidence[0] if f.evidence else None
            if ev is None:
                continue
            if f.port and ev.metric:
                ports[f.port] = ev.metric
            elif ev.metric and ev.gpu is not None:
                wanted[f.node].add((ev.metric, ev.gpu))
    det = GpuDetector(settings.detection)
    z = {n: settings.detection.metrics[n].z_warning for n in det.names}
    traces: dict[tuple[str, str, int], _Trace] = defaultdict(_Trace)
    port_traces: dict[str, _Trace] = defaultdict(_Trace)
    port_prev: dict[str, int] = {}
    for rec in records:
        if isinstance(rec, r.GpuTelemetry) and rec.node in wanted:
            det.observe(rec)
            sig = det.signals(rec.node)
            if sig is None:
                continue
            names, value, mean, std = sig
            for metric, gpu in wanted[rec.node]:
                if metric not in names or gpu not in rec.gpus:
                    continue
                s, g = names.index(metric), rec.gpus.index(gpu)
                tr = traces[(rec.node, metric, gpu)]
                tr.t.append(float(rec.ts))
                tr.value.append(_num(value[s, g]))
                tr.lo.append(_num(mean[s, g] - z[metric] * std[s, g]))
                tr.hi.append(_num(mean[s, g] + z[metric] * std[s, g]))
                tr.peers.append([_num(value[s, k]) for k in range(value.shape[1]) if k != g])
        elif isinstance(rec, r.PortTelemetry):
            for p in rec.ports:
                key = f"{rec.device}/{p.port}"
                port_metric = ports.get(key)
                current = getattr(p, port_metric, None) if port_metric else None
                if port_metric is None or not isinstance(current, int):
                    continue
                before = port_prev.get(key)
                port_prev[key] = current
                if before is not None:
                    pt = port_traces[key]
                    pt.t.append(float(rec.ts))
                    pt.value.append(float(max(current - before, 0)))
    thresholds = dict(settings.detection.ib_thresholds)
    sections = []
    for sub in subs:
        panels: list[Panel] = []
        markers = [(f.ts, f.detector, "finding") for f in sub.findings[:30]]
        markers += [(c.issued_at, c.action, "command") for c in sub.commands[:30]]
        for (node, metric, gpu), tr in sorted(traces.items()):
            if node not in sub.nodes or len(panels) >= MAX_PANELS:
                continue
            if not any(f.node == node and f.gpu == gpu for f in sub.findings):
                continue
            t, v = downsample(tr.t, tr.value)
            series = [Series(f"GPU {gpu}", t, v)]
            for k in range(len(tr.peers[0]) if tr.peers else 0):
                peer_t, peer_v = downsample(tr.t, [row[k] if k < len(row) else None for row in tr.peers])
                series.append(Series(f"peer {k}", peer_t, peer_v, "peer"))
            bt, lo = downsample(tr.t, tr.lo)
            _, hi = downsample(tr.t, tr.hi)
            unit = "(value - node median)" if not metric.endswith("_rate") else "(per minute)"
            panels.append(Panel(f"{node} GPU {gpu} {metric}", unit, series, (bt, lo, hi), markers))
        for key, pt in sorted(port_traces.items()):
            if len(panels) >= MAX_PANELS or not any(f.port == key for f in sub.findings):
                continue
            t, v = downsample(pt.t, pt.value)
            limit = float(thresholds.get(ports[key], 0))
            panels.append(
                Panel(
                    f"{key} {ports[key]}",
                    "(increase per sample)",
                    [Series("increase", t, v), Series("threshold", [t[0], t[-1]], [limit, limit], "threshold")]
                    if t
                    else [],
                    None,
                    markers,
                )
            )
        sections.append(
            Section(
                sub.heading,
                sub.summary,
                panels,
                [(f.ts, f.detector, f.severity, f.summary) for f in sorted(sub.findings, key=lambda f: f.ts)],
                [(c.issued_at, f"{c.action} {c.node or c.job}", c.reason) for c in sub.commands],
            )
        )
    return sections


def write_report(
    path: str,
    settings: Settings,
    records: Iterable[r.GpuTelemetry | r.PortTelemetry | r.JobEvent],
    findings: list[r.Finding],
    incidents: list[r.Incident],
    commands: list[r.RemediationCommand],
    meta: dict[str, object],
) -> int:
    subs = subjects(findings, incidents, commands)
    sections = collect(settings, records, subs)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(render("fleetmedic backtest", {k: str(v) for k, v in meta.items()}, sections))
    return sum(len(s.panels) for s in sections)
