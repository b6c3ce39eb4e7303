"""Builds the backtest's HTML report: which subjects to show and the series behind each plot.

A second pass over the inputs replays only the subjects' nodes through a fresh
:class:`~fleetmedic.models.gpu_detector.GpuDetector` to recover, sample by sample, each judged
signal of the suspect GPU, its baseline band (mean ± ``z_warning`` std) and the same signal on the
node's other GPUs (its peers: their median and range). Port findings get the counter's increase
per sample against its threshold. Findings and commands become markers.

A backtest has no executor: no command gets a result, so the decision engine issues node actions
again after ``policy.action_timeout_s`` and finally escalates with "no result for ... gave up".
The report shows what fleetmedic would do: each action once per target, at its first issue (with
how often it was issued), and leaves out the escalations that only the missing executor caused
(``commands.jsonl`` keeps every command).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from fleetmedic import records as r
from fleetmedic.actions import ISOLATING
from fleetmedic.config import Settings
from fleetmedic.evaluation.report import Overview, Plot, Row, Section, bucket, render, utc
from fleetmedic.models.gpu_detector import GpuDetector

MAX_SUBJECTS = 40
MAX_PANELS = 3
MAX_FINDING_ROWS = 60
#: the escalation the engine issues when no executor answered (fleetmedic.remediation.lifecycle)
NO_RESULT = "no result for "

#: what the judged signals are, for the y axis (GPU signals are the GPU minus its node's median)
UNITS = {"gpu_temp": "°C vs node median", "memory_temp": "°C vs node median", "power_usage": "W vs node median",
         "sm_clock": "MHz vs node median", "mem_clock": "MHz vs node median"}


@dataclass
class Subject:
    anchor: str
    heading: str
    summary: str
    nodes: set[str]
    findings: list[r.Finding]
    commands: list[r.RemediationCommand] = field(default_factory=list)
    incident: r.Incident | None = None


def subjects(
    findings: list[r.Finding], incidents: list[r.Incident], commands: list[r.RemediationCommand]
) -> list[Subject]:
    by_id = {f.id: f for f in findings}
    out: list[Subject] = []
    latest: dict[str, r.Incident] = {}
    for inc in incidents:
        latest[inc.id] = inc
    covered: set[str] = set()
    for k, inc in enumerate(list(latest.values())[:MAX_SUBJECTS], 1):
        nodes = {s.name for s in inc.suspects if s.kind == "node"} or {
            by_id[i].node for i in inc.finding_ids if i in by_id}
        fs = [by_id[i] for i in inc.finding_ids if i in by_id] or [f for f in findings if f.node in nodes]
        covered.update(f.id for f in fs)
        cmds = [c for c in commands if c.incident_id == inc.id]
        suspects = ", ".join(f"{s.kind} {s.name}" for s in inc.suspects) or "none"
        out.append(Subject(f"incident-{k}", f"{k}. {inc.incident_class} incident {inc.id}",
                           f"{inc.summary} Suspects: {suspects}; confidence {inc.confidence:.2f}.", nodes, fs, cmds,
                           inc))
    # findings that did not (yet) make an incident: what a person tuning thresholds wants to see too
    per_node: dict[str, list[r.Finding]] = defaultdict(list)
    for f in findings:
        if f.id not in covered:
            per_node[f.node].append(f)
    rank = sorted(per_node.items(), key=lambda kv: (-sum(f.severity == "critical" for f in kv[1]), -len(kv[1])))
    for node, fs in rank[: max(0, MAX_SUBJECTS - len(out))]:
        kinds = ", ".join(sorted({f.kind for f in fs}))
        out.append(Subject(f"node-{node}", f"node {node}: findings without an incident",
                           f"{len(fs)} findings ({kinds}) that triage did not turn into an incident.", {node}, fs))
    return out


@dataclass
class Planned:
    """One action on one target, however often the engine issued it."""

    first: float
    action: str
    target: str
    reason: str
    issued: int = 1


def planned(commands: Iterable[r.RemediationCommand]) -> tuple[list[Planned], int, int]:
    """What would be done: each (action, target) once, at its first issue; and how many re-issues
    and "no result ... gave up" escalations (caused by there being no executor) were folded away."""
    seen: dict[tuple[str, str], Planned] = {}
    again = gave_up = 0
    for c in sorted(commands, key=lambda c: c.issued_at):
        if c.action == "escalate" and c.reason.startswith(NO_RESULT):
            gave_up += 1
            continue
        target = c.node or c.job
        p = seen.get((c.action, target))
        if p is None:
            seen[(c.action, target)] = Planned(float(c.issued_at), c.action, target, c.reason)
        else:
            p.issued += 1
            again += 1
    return list(seen.values()), again, gave_up


def _would(plans: list[Planned]) -> str:
    """``cordon, taint, drain gpu-node-4; restart_job ns/job``: the actions grouped by target."""
    by_target: dict[str, list[str]] = {}
    for p in plans:
        by_target.setdefault(p.target, []).append(p.action)
    return "; ".join(f"{', '.join(actions)} {target}" for target, actions in by_target.items()) or "nothing"


@dataclass
class _Trace:
    t: list[float] = field(default_factory=list)
    value: list[float | None] = field(default_factory=list)
    lo: list[float | None] = field(default_factory=list)
    hi: list[float | None] = field(default_factory=list)
    p_lo: list[float | None] = field(default_factory=list)
    p_hi: list[float | None] = field(default_factory=list)
    p_med: list[float | None] = field(default_factory=list)


def _num(x: Any) -> float | None:
    x = float(x)
    return None if x != x or x in (float("inf"), float("-inf")) else x


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    m = len(s) // 2
    return s[m] if len(s) % 2 else (s[m - 1] + s[m]) / 2


def _traces(settings: Settings, records: Iterable[r.Record],
            wanted: dict[str, set[tuple[str, int]]], ports: dict[str, set[str]]
            ) -> tuple[dict[tuple[str, str, int], _Trace], dict[tuple[str, str], _Trace]]:
    det = GpuDetector(settings.detection)
    z = {n: settings.detection.metrics[n].z_warning for n in det.names if n in settings.detection.metrics}
    traces: dict[tuple[str, str, int], _Trace] = defaultdict(_Trace)
    port_traces: dict[tuple[str, str], _Trace] = defaultdict(_Trace)
    port_prev: dict[tuple[str, str], int] = {}
    for rec in records:
        if isinstance(rec, r.GpuTelemetry) and rec.node in wanted:
            det.detect((rec,), float(rec.ts))
            sig = det.signals(rec.node)
            if sig is None:
                continue
            names, value, mean, std = sig
            for metric, gpu in wanted[rec.node]:
                if metric not in names or gpu not in rec.gpus or metric not in z:
                    continue
                s, g = names.index(metric), rec.gpus.index(gpu)
                tr = traces[(rec.node, metric, gpu)]
                tr.t.append(float(rec.ts))
                tr.value.append(_num(value[s, g]))
                tr.lo.append(_num(mean[s, g] - z[metric] * std[s, g]))
                tr.hi.append(_num(mean[s, g] + z[metric] * std[s, g]))
                peers = [x for k in range(value.shape[1]) if k != g and (x := _num(value[s, k])) is not None]
                tr.p_lo.append(min(peers) if peers else None)
                tr.p_hi.append(max(peers) if peers else None)
                tr.p_med.append(_median(peers) if peers else None)
        elif isinstance(rec, r.PortTelemetry):
            for p in rec.ports:
                name = f"{rec.device}/{p.port}"
                for port_metric in ports.get(name, ()):
                    current = getattr(p, port_metric, None)
                    if not isinstance(current, int):  # a derived figure (BER): not a counter to plot
                        continue
                    key = (name, port_metric)
                    before = port_prev.get(key)
                    port_prev[key] = current
                    if before is not None:
                        pt = port_traces[key]
                        pt.t.append(float(rec.ts))
                        pt.value.append(float(max(current - before, 0)))
    return traces, port_traces


def _gpu_plot(title: str, unit: str, tr: _Trace, t0: float, t1: float, anchor: str) -> Plot:
    def b(v: list[float | None], how: str) -> list[float | None]:
        return bucket(tr.t, v, t0, t1, how)

    arrays = {"v_lo": b(tr.value, "min"), "v_hi": b(tr.value, "max"), "b_lo": b(tr.lo, "mean"),
              "b_hi": b(tr.hi, "mean")}
    if any(x is not None for x in tr.p_med):
        arrays |= {"p_lo": b(tr.p_lo, "min"), "p_hi": b(tr.p_hi, "max"), "p_med": b(tr.p_med, "mean")}
    return Plot(title, unit, arrays, None, anchor)


def collect(
    settings: Settings, records: Iterable[r.Record], subs: list[Subject],
    t0: float | None = None, t1: float | None = None,
) -> tuple[list[Section], float, float]:
    """The sections, and the time range their plots share."""
    wanted: dict[str, set[tuple[str, int]]] = defaultdict(set)  # node -> (signal, gpu)
    ports: dict[str, set[str]] = defaultdict(set)  # "device/port" -> counters
    for sub in subs:
        for f in sub.findings:
            ev = f.evidence[0] if f.evidence else None
            if ev is None:
                continue
            if f.port and ev.metric:
                ports[f.port].add(ev.metric)
            elif ev.metric and ev.gpu is not None:
                wanted[f.node].add((ev.metric, ev.gpu))
    traces, port_traces = _traces(settings, records, wanted, ports)
    times = [t for tr in (*traces.values(), *port_traces.values()) for t in (tr.t[:1] + tr.t[-1:])]
    t0 = t0 if t0 is not None else min(times, default=0.0)
    t1 = t1 if t1 is not None else max(times, default=t0 + 1)
    interval = settings.detection.sample_interval_s
    thresholds = dict(settings.detection.ib_thresholds)
    plotted: dict[str, str] = {}  # plot key -> the anchor of the section that shows it
    sections = []
    for sub in subs:
        plots: list[Plot] = []
        refs: list[tuple[str, str]] = []
        plans, again, gave_up = planned(sub.commands)
        markers = [(float(f.ts), f.detector, "finding") for f in sub.findings]
        acts: dict[float, list[str]] = {}  # one marker for the actions issued together (cordon, taint, drain)
        for p in plans:
            acts.setdefault(next((t for t in acts if abs(t - p.first) <= interval), p.first), []).append(p.action)
        markers += [(t, "would " + "/".join(dict.fromkeys(a)), "command") for t, a in acts.items()]

        candidates: list[tuple[str, str, Any]] = []  # key, title, what makes the plot
        for (node, metric, gpu), tr in sorted(traces.items()):
            if node in sub.nodes and any(f.node == node and f.gpu == gpu for f in sub.findings):
                unit = UNITS.get(metric, "per minute" if metric.endswith("_rate") else "vs node median")
                candidates.append((f"{node}/{gpu}/{metric}", f"{node} GPU {gpu} {metric}", (unit, tr)))
        for (name, counter), pt in sorted(port_traces.items()):
            if any(f.port == name and f.evidence and f.evidence[0].metric == counter for f in sub.findings):
                candidates.append((f"{name}/{counter}", f"{name} {counter}", (thresholds.get(counter), pt)))
        for key, title, (extra, tr) in candidates:
            if key in plotted:  # shown in an earlier section: a link, not the plot again
                if (title, plotted[key]) not in refs:
                    refs.append((title, plotted[key]))
            elif len(plots) < MAX_PANELS:
                plotted[key] = sub.anchor
                if isinstance(extra, (int, float)) or extra is None:  # a port counter and its threshold
                    plots.append(Plot(title, f"increase per sample (~{interval:g} s)",
                                      {"v_lo": bucket(tr.t, tr.value, t0, t1, "min"),
                                       "v_hi": bucket(tr.t, tr.value, t0, t1, "max")},
                                      float(extra) if extra is not None else None, sub.anchor))
                else:
                    plots.append(_gpu_plot(title, extra, tr, t0, t1, sub.anchor))
        note = ""
        if again or gave_up:
            note = (f"No executor runs in a backtest, so no command got a result: the engine issued "
                    f"{again} of these again after policy.action_timeout_s and escalated {gave_up} times with "
                    f"\"no result ... gave up\"; those are left out here (commands.jsonl has every command).")
        sections.append(Section(
            sub.anchor, sub.heading, sub.summary, plots, refs, _finding_rows(sub.findings),
            [Row([utc(p.first), f"would {p.action}", p.target, f"{p.issued}x" if p.issued > 1 else "once",
                  p.reason]) for p in plans], note, markers))
    return sections, t0, t1


def _finding_rows(findings: list[r.Finding]) -> list[Row]:
    """One row per detector, severity and GPU/port: first and last time, how many, the first summary."""
    groups: dict[tuple[str, str, str], list[r.Finding]] = {}
    for f in sorted(findings, key=lambda f: f.ts):
        where = f.port or (f"{f.node} GPU {f.gpu}" if f.gpu is not None else f.node)
        groups.setdefault((f.detector, f.severity, where), []).append(f)
    rows = [Row([utc(fs[0].ts), utc(fs[-1].ts) if len(fs) > 1 else "", str(len(fs)), det, sev, fs[0].summary])
            for (det, sev, _), fs in groups.items()]
    return rows[:MAX_FINDING_ROWS]


def _overview(meta: dict[str, Any], findings: list[r.Finding], subs: list[Subject],
              commands: list[r.RemediationCommand]) -> Overview:
    facts: list[tuple[str, str]] = []
    start, end = meta.get("start"), meta.get("end")
    if start is not None and end is not None:
        hours = (float(end) - float(start)) / 3600
        facts.append(("span (UTC)", f"{utc(float(start), False)} to {utc(float(end), False)} ({hours:,.1f} h)"))
    by_type = meta.get("records_by_type") or {}
    facts.append(("records", f"{int(meta.get('records', 0)):,}" + (
        " (" + ", ".join(f"{k.replace('Telemetry', '').lower()} {v:,}" for k, v in sorted(by_type.items())) + ")"
        if by_type else "")))
    nodes = {f.node for f in findings}
    kinds = Counter(f.kind for f in findings)
    facts.append(("findings", f"{len(findings):,} on {len(nodes)} nodes"
                  + (" (" + ", ".join(f"{k} {n}" for k, n in kinds.most_common()) + ")" if kinds else "")))
    incs = [s for s in subs if s.incident is not None]
    classes = Counter(s.incident.incident_class for s in incs if s.incident is not None)
    facts.append(("incidents", f"{len(incs)}" + (" (" + ", ".join(f"{k} {n}" for k, n in classes.most_common())
                                                  + ")" if classes else "")))
    plans = planned(commands)[0]
    node_actions = Counter(p.action for p in plans if p.action in ISOLATING)
    facts.append(("would act", f"{len(plans)} actions" + (
        " (" + ", ".join(f"{a} {n} nodes" for a, n in node_actions.items()) + ")" if node_actions else "")))
    rows = []
    for s in incs:
        inc = s.incident
        assert inc is not None
        first = float(inc.first_seen)
        suspects = ", ".join(x.name for x in inc.suspects) or "none"
        rows.append(Row([s.anchor, f"{inc.incident_class}: {_subject_of(inc.id)}", utc(first)[11:], suspects,
                         f"{inc.confidence:.2f}", _would(planned(s.commands)[0])]))
    quiet = [(s.anchor, f"{next(iter(s.nodes))} ({len(s.findings)})") for s in subs if s.incident is None]
    score = meta.get("score")
    return Overview(facts, score if isinstance(score, dict) else None, rows, quiet)


def _subject_of(incident_id: str) -> str:
    """``hardware:node:gpu-node-4:1767227309394`` -> ``node:gpu-node-4`` (the class is shown apart)."""
    parts = incident_id.split(":")
    if len(parts) >= 3 and parts[-1].isdigit():
        parts = parts[1:-1]
    return ":".join(parts)


def _short(text: str, n: int = 70) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def write_report(
    path: str,
    settings: Settings,
    records: Iterable[r.Record],
    findings: list[r.Finding],
    incidents: list[r.Incident],
    commands: list[r.RemediationCommand],
    meta: dict[str, Any],
) -> int:
    """Write the page; ``meta``: ``inputs``, ``records``, ``start``/``end`` (the records' span),
    ``records_by_type`` and ``score`` (from ``--truth``), each optional. Returns the plots drawn."""
    subs = subjects(findings, incidents, commands)
    start, end = meta.get("start"), meta.get("end")
    sections, t0, t1 = collect(settings, _iter(records), subs, float(start) if start is not None else None,
                               float(end) if end is not None else None)
    overview = _overview(meta, findings, subs, commands)
    title = "fleetmedic backtest" + (f": {meta['inputs']}" if meta.get("inputs") else "")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(render(_short(title, 120), overview, sections, t0, t1))
    return sum(len(s.plots) for s in sections)


def _iter(records: Iterable[r.Record]) -> Iterator[r.Record]:
    yield from records
