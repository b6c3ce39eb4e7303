"""The scorer: incidents and remediation commands against the simulator's ground truth.

Rules (all times are simulated epoch seconds):

**Names.** A suspect *names* a truth fault when it equals one of the fault's ``blame`` entries:
``node`` by node name; ``gpu`` as ``<node>/<gpu>`` (also ``<node>:<gpu>``, ``<node>/gpu<gpu>``);
``link`` by either end (``<leaf>:<port>`` or ``<node>:mlx5_<k>``, ``/`` also accepted); ``switch``
by name; ``job`` as ``namespace/name``. A GPU fault is named by its GPU or its node; a link by its
ends or the node behind it; a leaf failure only by the switch; a job fault only by the job.

**Matching.** An incident *matches* a fault when ``first_seen`` lies in
``[onset - early_s, end + grace_s]`` (``end`` = the earlier of the natural end and ``cleared_at``;
defaults: 60 s early for clock skew, 600 s grace) and the incident is *about* the fault: a suspect
names it, or a ``node`` suspect is one of the nodes the fault touches (``nodes``), or the incident's
``jobs`` (or a ``job`` suspect) include a job the fault affected. Each incident is assigned to at
most one fault: the one it names (strict blame) before the one it is merely about, then the nearest
onset, then the fault id. A fault with at least one assigned incident is *detected*; further
incidents for it are duplicates (counted, not penalised).

**Detection metrics** (event-level): per fault kind and per class, TP = detected faults, FN =
undetected faults, FP = false incidents, precision = TP/(TP+FP), recall = TP/(TP+FN), F1. A false
incident is one assigned to no fault, or assigned to a negative control while blaming the
infrastructure (class hardware, degradation or network). Per kind, each false incident is charged
to the kinds of its class present in the truth, split equally (so FP per kind can be fractional;
the per-class and overall figures are exact); false incidents of a class with no such kind are
"unattributed". Negative controls have no recall: their rows show how often they were blamed on the
infrastructure and how often they led to an isolation. Detection delay = first matching
``first_seen`` - onset (0 if earlier), p50/p90 over detected faults. A fault that began and ended
while its nodes were away for repair (``TruthRecord.unobserved``) had nothing to show: it is left out
of the detection metrics and listed in ``unobserved``; an isolation during it is still justified.

**Attribution**: over detected faults that are not negative controls, the earliest matching
incident's first suspect (top-1) or any of its first three (top-3) names the fault. Class accuracy:
that incident's ``class`` equals the fault's class.

**Incidents** are taken by id, the latest record of each (an incident is re-published when it changes).

**Isolation** (from commands): ``cordon``, ``taint``, ``drain`` and a repair ``escalate``
(``params.escalation: repair``; a notification or a switch escalation isolates nothing) isolate a node
until ``uncordon``/``untaint``/``return_to_service``; one *episode* per node from its first
isolating command to its release. An episode is justified when the node is in ``isolate_nodes`` of
a fault active at that time (same window as matching); otherwise a healthy node was isolated.
Software faults (transient software, job bugs, negative controls) that led to isolation: those
touching the node of an unjustified episode within their window — must be 0. False positives per
node-day = false incidents / (nodes x days of the run).

**Closed loop** (from ``accounting.json`` when given): MTTR and its phases (detect, isolate, wait
for capacity, restore, first good step), repeat failures, effective training time ratio and
node-hours dangerous-but-schedulable / healthy-but-unschedulable, and re-placements (``placement``:
replacements that stayed in the original leaf where it had room, placements on suspect or excluded
nodes; "all" and per restarter). Without it the two node-hour
figures are estimated from the truth and the command timeline (marked ``estimated``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

import msgspec
import numpy as np
from msgspec import Struct

from fleetmedic.actions import ISOLATING, RELEASING
from fleetmedic.evaluation.truth import RunMeta, TruthRecord
from fleetmedic.records import Incident, RemediationCommand

INFRA_CLASSES = frozenset({"hardware", "degradation", "network"})
_GPU_NAME = re.compile(r"^(?P<node>.+?)[/:](?:gpu)?(?P<gpu>\d+)$")


def is_repair(cmd: RemediationCommand) -> bool:
    """An ``escalate`` that sends a node to repair (not a notification, not about a switch)."""
    return (cmd.action == "escalate" and cmd.params.get("escalation") == "repair"
            and cmd.params.get("target_kind", "node") == "node")


@dataclass(frozen=True)
class ScoreParams:
    early_s: float = 60.0
    grace_s: float = 600.0


class KindScore(Struct, frozen=True, kw_only=True):
    kind: str
    fault_class: str
    faults: int
    detected: int
    false_positives: float
    precision: float | None
    recall: float | None
    f1: float | None
    delay_p50_s: float | None
    delay_p90_s: float | None
    duplicates: int = 0
    infra_blamed: int = 0  # negative controls: incidents blaming infrastructure
    isolations: int = 0  # negative controls / software: isolation episodes it led to


class IsolationScore(Struct, frozen=True, kw_only=True):
    episodes: int
    justified: int
    healthy_isolated: int
    healthy_isolated_per_fault: float | None
    software_faults_isolated: int
    software_fault_ids: list[str]
    unjustified: list[tuple[str, float]]


class ClosedLoopScore(Struct, frozen=True, kw_only=True):
    source: str  # "accounting" or "estimated"
    dangerous_schedulable_node_h: float
    healthy_unschedulable_node_h: float
    mttr: dict[str, dict[str, float | int | None]] = {}
    repeat_failures: int | None = None
    repeat_failures_same_node: int | None = None
    effective_training_time_ratio: float | None = None
    job_failures: int | None = None
    placement: dict[str, dict[str, float | int | None]] = {}
    # per restarter: placements on a faulty node fleetmedic had not found yet, by fault kind
    undetected_by_kind: dict[str, dict[str, int]] = {}


class ScoreReport(Struct, frozen=True, kw_only=True):
    faults: int
    incidents: int
    false_incidents: int
    precision: float | None
    recall: float | None
    f1: float | None
    delay_p50_s: float | None
    delay_p90_s: float | None
    top1_accuracy: float | None
    top3_accuracy: float | None
    class_accuracy: float | None
    false_positives_per_node_day: float | None
    by_kind: list[KindScore]
    by_class: list[KindScore]
    unattributed_false_positives: int
    isolation: IsolationScore
    closed_loop: ClosedLoopScore | None
    matches: dict[str, list[str]]  # fault id -> incident ids
    delays: dict[str, float] = {}  # fault id -> detection delay (s), for the detected faults
    unobserved: list[str] = []  # faults no telemetry or job could show (TruthRecord.unobserved): not scored


# --- names ------------------------------------------------------------------------------------------


def _norm(kind: str, name: str) -> set[tuple[str, str]]:
    """Canonical forms of a suspect or blame entry."""
    if kind == "gpu":
        m = _GPU_NAME.match(name)
        if m:
            return {("gpu", f"{m.group('node')}/{int(m.group('gpu'))}")}
        return {("gpu", name)}
    if kind == "link":
        return {("link", name.replace("/", ":", 1))}
    return {(kind, name)}


def names_fault(kind: str, name: str, truth: TruthRecord) -> bool:
    forms = _norm(kind, name)
    return any(forms & _norm(b.kind, b.name) for b in truth.blame)


def _about(inc: Incident, truth: TruthRecord) -> int:
    """2: a suspect names the fault; 1: the incident is about its nodes or jobs; 0: unrelated."""
    if any(names_fault(s.kind, s.name, truth) for s in inc.suspects):
        return 2
    nodes = set(truth.nodes)
    if any(s.kind == "node" and s.name in nodes for s in inc.suspects):
        return 1
    jobs = set(truth.affected_jobs) | ({truth.job} if truth.job else set())
    if jobs and (jobs & set(inc.jobs) or any(s.kind == "job" and s.name in jobs for s in inc.suspects)):
        return 1
    if any(s.kind == "gpu" and _GPU_NAME.match(s.name) and _GPU_NAME.match(s.name).group("node") in nodes  # type: ignore[union-attr]
           for s in inc.suspects):
        return 1
    return 0


def _end(t: TruthRecord) -> float:
    return min(t.end, t.cleared_at) if t.cleared_at is not None else t.end


def _in_window(ts: float, t: TruthRecord, p: ScoreParams) -> bool:
    return t.onset - p.early_s <= ts <= _end(t) + p.grace_s


# --- isolation episodes -----------------------------------------------------------------------------


def isolation_episodes(commands: Iterable[RemediationCommand]) -> list[tuple[str, float, float]]:
    """(node, start, end) of each isolation episode (end = inf while still isolated)."""
    out: list[tuple[str, float, float]] = []
    open_: dict[str, float] = {}
    for c in sorted(commands, key=lambda c: (c.issued_at, c.id)):
        if not c.node or c.dry_run:
            continue
        isolating = c.action in ISOLATING or (c.action == "escalate" and is_repair(c))
        if isolating and c.node not in open_:
            open_[c.node] = c.issued_at
        elif c.action in RELEASING and c.node in open_:
            out.append((c.node, open_.pop(c.node), c.issued_at))
    out.extend((n, s, float("inf")) for n, s in open_.items())
    out.sort(key=lambda e: (e[1], e[0]))
    return out


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


# --- scoring ----------------------------------------------------------------------------------------


def _pct(xs: list[float], q: float) -> float | None:
    return round(float(np.percentile(np.array(xs), q)), 3) if xs else None


def _prf(tp: float, fp: float, fn: float | None) -> tuple[float | None, float | None, float | None]:
    p = tp / (tp + fp) if tp + fp > 0 else None
    r = tp / (tp + fn) if fn is not None and tp + fn > 0 else None
    f = 2 * p * r / (p + r) if p is not None and r is not None and p + r > 0 else (0.0 if p == 0 or r == 0 else None)
    return (round(p, 4) if p is not None else None, round(r, 4) if r is not None else None,
            round(f, 4) if f is not None else None)


def score(truth: list[TruthRecord], incidents: list[Incident], commands: list[RemediationCommand],
          meta: RunMeta | None = None, accounting: dict[str, object] | None = None,
          params: ScoreParams = ScoreParams()) -> ScoreReport:
    faults = sorted(truth, key=lambda t: (t.onset, t.id))
    scored = [t for t in faults if not t.unobserved]  # what telemetry or a job could have shown
    latest = {i.id: i for i in incidents}  # re-published incidents: the latest record of each id
    incs = sorted(latest.values(), key=lambda i: (i.first_seen, i.id))

    # assignment
    matches: dict[str, list[Incident]] = {t.id: [] for t in faults}
    false: list[Incident] = []
    by_id = {t.id: t for t in faults}
    for inc in incs:
        best: tuple[int, int, float, float, str] | None = None
        for t in faults:
            if not _in_window(inc.first_seen, t, params):
                continue
            a = _about(inc, t)
            if a == 0:
                continue
            # among faults the incident names, the one it names most precisely (its GPU as well as its
            # node) wins over the nearest in time: an XID on a GPU whose fault is still active is
            # about that fault, even if a planned reboot of the same node happened just before
            named = sum(1 for s in inc.suspects if names_fault(s.kind, s.name, t))
            key = (-a, -named, 0.0 if inc.first_seen >= t.onset else 1.0, abs(inc.first_seen - t.onset), t.id)
            if best is None or key < best:
                best = key
        if best is None:
            false.append(inc)
            continue
        t = by_id[best[4]]
        if t.is_negative_control and inc.incident_class in INFRA_CLASSES:
            false.append(inc)
            matches[t.id].append(inc)  # recorded, but it is a false alarm
            continue
        matches[t.id].append(inc)

    # isolation
    episodes = isolation_episodes(commands)
    justified = 0
    unjustified: list[tuple[str, float]] = []
    sw_isolated: set[str] = set()
    iso_by_fault: dict[str, int] = {}
    for node, s, _e in episodes:
        ok = any(node in t.isolate_nodes and not t.is_software and _in_window(s, t, params) for t in faults)
        if ok:
            justified += 1
            continue
        unjustified.append((node, round(s, 3)))
        for t in faults:
            if t.is_software and node in t.nodes and _in_window(s, t, params):
                sw_isolated.add(t.id)
                iso_by_fault[t.id] = iso_by_fault.get(t.id, 0) + 1
    real = [t for t in scored if not t.is_negative_control]
    iso = IsolationScore(
        episodes=len(episodes),
        justified=justified,
        healthy_isolated=len(unjustified),
        healthy_isolated_per_fault=round(len(unjustified) / len(real), 4) if real else None,
        software_faults_isolated=len(sw_isolated),
        software_fault_ids=sorted(sw_isolated),
        unjustified=unjustified,
    )

    # false incidents charged to kinds
    kinds_by_class: dict[str, list[str]] = {}
    for t in faults:
        if not t.is_negative_control:
            ks = kinds_by_class.setdefault(t.fault_class, [])
            if t.kind not in ks:
                ks.append(t.kind)
    fp_kind: dict[str, float] = {}
    fp_class: dict[str, int] = {}
    unattributed = 0
    for inc in false:
        cls = inc.incident_class
        fp_class[cls] = fp_class.get(cls, 0) + 1
        ks = kinds_by_class.get(cls, [])
        if not ks:
            unattributed += 1
            continue
        for k in ks:
            fp_kind[k] = fp_kind.get(k, 0.0) + 1.0 / len(ks)

    # per fault
    delays: dict[str, float] = {}
    top1 = top3 = cls_ok = 0
    attributed = 0
    for t in faults:
        got = [i for i in matches[t.id] if not (t.is_negative_control and i.incident_class in INFRA_CLASSES)]
        if not got:
            continue
        first = min(got, key=lambda i: (i.first_seen, i.id))
        delays[t.id] = max(0.0, first.first_seen - t.onset)
        if not t.is_negative_control:
            attributed += 1
            sus = first.suspects
            if sus and names_fault(sus[0].kind, sus[0].name, t):
                top1 += 1
            if any(names_fault(s.kind, s.name, t) for s in sus[:3]):
                top3 += 1
            if first.incident_class == t.fault_class:
                cls_ok += 1

    def row(key: str, group: list[TruthRecord], fp: float, cls: str) -> KindScore:
        neg = bool(group) and all(t.is_negative_control for t in group)
        detected = [t for t in group if t.id in delays]
        d = [delays[t.id] for t in detected]
        dup = sum(max(0, len(matches[t.id]) - 1) for t in group)
        blamed = sum(1 for t in group for i in matches[t.id]
                     if t.is_negative_control and i.incident_class in INFRA_CLASSES)
        isol = sum(iso_by_fault.get(t.id, 0) for t in group)
        if neg:
            return KindScore(kind=key, fault_class=cls, faults=len(group), detected=len(detected),
                             false_positives=blamed, precision=None, recall=None, f1=None,
                             delay_p50_s=_pct(d, 50), delay_p90_s=_pct(d, 90), duplicates=dup,
                             infra_blamed=blamed, isolations=isol)
        p, r, f = _prf(len(detected), fp, len(group) - len(detected))
        return KindScore(kind=key, fault_class=cls, faults=len(group), detected=len(detected),
                         false_positives=round(fp, 3), precision=p, recall=r, f1=f, delay_p50_s=_pct(d, 50),
                         delay_p90_s=_pct(d, 90), duplicates=dup, isolations=isol)

    kinds: dict[str, list[TruthRecord]] = {}
    classes: dict[str, list[TruthRecord]] = {}
    for t in scored:
        kinds.setdefault(t.kind, []).append(t)
        classes.setdefault(t.fault_class, []).append(t)
    by_kind = [row(k, g, fp_kind.get(k, 0.0), g[0].fault_class) for k, g in sorted(kinds.items())]
    by_class = [row(c, g, float(fp_class.get(c, 0)), c) for c, g in sorted(classes.items())]
    for c, n in sorted(fp_class.items()):
        if c not in classes:
            by_class.append(KindScore(kind=c, fault_class=c, faults=0, detected=0, false_positives=n,
                                      precision=0.0, recall=None, f1=None, delay_p50_s=None, delay_p90_s=None))

    det_real = [t for t in real if t.id in delays]
    p, r, f = _prf(len(det_real), len(false), len(real) - len(det_real))
    d_all = [delays[t.id] for t in det_real]
    node_days = meta.node_days if meta is not None else None
    return ScoreReport(
        faults=len(faults),
        incidents=len(incs),
        false_incidents=len(false),
        precision=p,
        recall=r,
        f1=f,
        delay_p50_s=_pct(d_all, 50),
        delay_p90_s=_pct(d_all, 90),
        top1_accuracy=round(top1 / attributed, 4) if attributed else None,
        top3_accuracy=round(top3 / attributed, 4) if attributed else None,
        class_accuracy=round(cls_ok / attributed, 4) if attributed else None,
        false_positives_per_node_day=round(len(false) / node_days, 4) if node_days else None,
        by_kind=by_kind,
        by_class=by_class,
        unattributed_false_positives=unattributed,
        isolation=iso,
        closed_loop=_closed_loop(faults, episodes, meta, accounting),
        matches={k: [i.id for i in v] for k, v in matches.items()},
        delays={k: round(v, 3) for k, v in delays.items()},
        unobserved=sorted(t.id for t in faults if t.unobserved),
    )


def _closed_loop(faults: list[TruthRecord], episodes: list[tuple[str, float, float]], meta: RunMeta | None,
                 accounting: dict[str, object] | None) -> ClosedLoopScore | None:
    if accounting is not None:
        phases = accounting.get("phases", {})
        placement = accounting.get("placement", {})
        assert isinstance(phases, dict) and isinstance(placement, dict)
        return ClosedLoopScore(
            source="accounting",
            dangerous_schedulable_node_h=float(accounting.get("dangerous_schedulable_node_h", 0.0)),  # type: ignore[arg-type]
            healthy_unschedulable_node_h=float(accounting.get("healthy_unschedulable_node_h", 0.0)),  # type: ignore[arg-type]
            mttr={k: dict(v) for k, v in phases.items()},
            repeat_failures=accounting.get("repeat_failures"),  # type: ignore[arg-type]
            repeat_failures_same_node=accounting.get("repeat_failures_same_node"),  # type: ignore[arg-type]
            effective_training_time_ratio=accounting.get("effective_training_time_ratio"),  # type: ignore[arg-type]
            job_failures=accounting.get("job_failures"),  # type: ignore[arg-type]
            placement={k: {f: n for f, n in dict(v).items() if not isinstance(n, dict)} for k, v in placement.items()},
            undetected_by_kind={k: dict(dict(v).get("undetected_by_kind") or {}) for k, v in placement.items()},
        )
    if meta is None:
        return None
    # estimate from the truth and the command timeline
    iso: dict[str, list[tuple[float, float]]] = {}
    for node, s, e in episodes:
        iso.setdefault(node, []).append((s, min(e, meta.end)))
    bad: dict[str, list[tuple[float, float]]] = {}
    for t in faults:
        if t.is_software:
            continue
        for n in t.isolate_nodes:
            bad.setdefault(n, []).append((max(t.onset, meta.start), min(_end(t), meta.end)))
    dangerous = healthy = 0.0
    for n in meta.nodes:
        bi = _union(bad.get(n, []))
        ii = _union(iso.get(n, []))
        bad_total = sum(b - a for a, b in bi)
        iso_total = sum(b - a for a, b in ii)
        both = sum(_overlap(a0, a1, b0, b1) for a0, a1 in bi for b0, b1 in ii)
        dangerous += bad_total - both
        healthy += iso_total - both
    return ClosedLoopScore(source="estimated", dangerous_schedulable_node_h=round(dangerous / 3600, 4),
                           healthy_unschedulable_node_h=round(healthy / 3600, 4))


def _union(iv: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(x for x in iv if x[1] > x[0]):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


# --- presentation -----------------------------------------------------------------------------------


def _f(v: float | int | None, pct: bool = False) -> str:
    if v is None:
        return "-"
    if pct:
        return f"{100 * v:.1f}%"
    if isinstance(v, float) and not v.is_integer():
        return f"{v:.2f}"
    return str(int(v))


def format_report(rep: ScoreReport) -> str:
    out = []
    hdr = (f"{'kind':22s} {'class':18s} {'faults':>6s} {'det':>4s} {'FP':>6s} {'prec':>7s} {'recall':>7s} "
           f"{'F1':>7s} {'p50 s':>7s} {'p90 s':>7s}")
    out.append(hdr)
    out.append("-" * len(hdr))
    for r in rep.by_kind:
        extra = (f"  infra-blamed {r.infra_blamed}, isolations {r.isolations}"
                 if r.fault_class == "negative_control" else "")
        out.append(f"{r.kind:22s} {r.fault_class:18s} {r.faults:6d} {r.detected:4d} {_f(r.false_positives):>6s} "
                   f"{_f(r.precision, True):>7s} {_f(r.recall, True):>7s} {_f(r.f1, True):>7s} "
                   f"{_f(r.delay_p50_s):>7s} {_f(r.delay_p90_s):>7s}{extra}")
    out.append("-" * len(hdr))
    for r in rep.by_class:
        out.append(f"{'class ' + r.kind:41s} {r.faults:6d} {r.detected:4d} {_f(r.false_positives):>6s} "
                   f"{_f(r.precision, True):>7s} {_f(r.recall, True):>7s} {_f(r.f1, True):>7s} "
                   f"{_f(r.delay_p50_s):>7s} {_f(r.delay_p90_s):>7s}")
    out.append(f"{'overall':41s} {rep.faults:6d} {'':4s} {rep.false_incidents:6d} {_f(rep.precision, True):>7s} "
               f"{_f(rep.recall, True):>7s} {_f(rep.f1, True):>7s} {_f(rep.delay_p50_s):>7s} {_f(rep.delay_p90_s):>7s}")
    out.append("")
    out.append(f"attribution: top-1 {_f(rep.top1_accuracy, True)}, top-3 {_f(rep.top3_accuracy, True)}, "
               f"class {_f(rep.class_accuracy, True)}")
    out.append(f"false positives per node-day: {_f(rep.false_positives_per_node_day)} "
               f"(unattributed {rep.unattributed_false_positives})")
    i = rep.isolation
    out.append(f"isolation episodes: {i.episodes}, justified {i.justified}, "
               f"healthy nodes isolated {i.healthy_isolated} "
               f"({_f(i.healthy_isolated_per_fault)} per true fault)")
    out.append(f"software faults that led to node isolation: {i.software_faults_isolated} (must be 0)"
               + (f": {', '.join(i.software_fault_ids)}" if i.software_fault_ids else ""))
    c = rep.closed_loop
    if c is not None:
        out.append(f"node-hours dangerous but schedulable: {c.dangerous_schedulable_node_h:.2f}, "
                   f"healthy but unschedulable: {c.healthy_unschedulable_node_h:.2f} ({c.source})")
        if c.mttr:
            parts = []
            for k in ("detect", "isolate", "wait_capacity", "restore", "first_good_step", "mttr"):
                v = c.mttr.get(k, {})
                parts.append(f"{k} p50 {_f(v.get('p50_s'))} s")
            out.append("MTTR: " + ", ".join(parts) + f" (n={c.mttr.get('mttr', {}).get('n', 0)})")
        if c.effective_training_time_ratio is not None or c.repeat_failures is not None:
            out.append(f"effective training time ratio: {_f(c.effective_training_time_ratio, True)}, job failures "
                       f"{_f(c.job_failures)}, repeat failures {_f(c.repeat_failures)} "
                       f"(same node {_f(c.repeat_failures_same_node)})")
        for who, p in sorted(c.placement.items()):
            out.append(f"re-placements ({who}): {_f(p.get('re_placements'))}, replacements in the original leaf "
                       f"{_f(p.get('in_leaf'))}/{_f(p.get('replacements'))} (leaf had room in "
                       f"{_f(p.get('with_room'))}), on suspect nodes {_f(p.get('on_suspect'))} (already suspected "
                       f"by fleetmedic {_f(p.get('on_suspect_known'))}, not yet detected "
                       f"{_f(p.get('on_suspect_undetected'))}), on excluded nodes {_f(p.get('on_excluded'))}")
    return "\n".join(out)


def encode_report(rep: ScoreReport) -> bytes:
    return msgspec.json.format(msgspec.json.encode(rep), indent=2) + b"\n"
