"""Detection and attribution quality on the simulator, closed loop; writes docs/quality.md.

    .venv/bin/python bench/quality.py                       # 3 seeds x 256 nodes x 24 h (the issue's bar)
    .venv/bin/python bench/quality.py --seeds 1 --nodes 64 --hours 4 --out /tmp/q.md   # quick look
    .venv/bin/python bench/quality.py --bursts-only --out /tmp/bursts.md               # the bursts alone

Each seed runs the fleet simulator with the ``mix`` fault plan (hardware, silent degradation,
network, transient software, job bugs and negative controls) through the embedded pipeline
(detection -> triage -> policy -> commands back to the simulator) and scores the incidents and
commands against the ground truth with the simulator's scorer. A person on call resumes a tripped
breaker once its storm is over (:class:`~fleetmedic.sim.embedded.OnCall`: 30 minutes after the page,
then every 30 minutes while a count is at its level). Seeds run in parallel processes (``--jobs``).
Counts are summed over seeds and the ratios recomputed from the sums.

Then the small-fleet bursts (:data:`BURSTS`, ``--no-bursts`` skips them), each with the shipped
defaults: several distinct hard faults at once on 16 and 32 nodes (each dead node isolated within
one decision interval, whatever the budget), the same faults spread over 50 minutes, and one
signature on 40 % of a fleet at once (the breaker trips; nothing preventive is isolated). Per burst:
dead nodes left schedulable past one decision interval (:data:`DECISION_INTERVAL_S`, target 0),
dangerous-but-schedulable node-hours (the simulator's truth) and the engine's own clock of refused
isolations, isolations, healthy nodes isolated per true fault (target <= 0.05), software faults that
isolated (target 0) and breaker trips. The bursts have nobody on call: they measure the automation
alone.

``--ingest-paths jsonl,text,openmetrics,prometheus`` instead scores one simulated fleet (open loop,
per seed) read through each way telemetry comes in, and says whether every path finds the same
faults as JSONL (:func:`run_ingest_paths`). The simulator writes its telemetry once as JSONL
records and once as dcgm-exporter / node-exporter text scraped every ``--prom-every`` seconds;
``fleetmedic backtest --truth`` then runs on

- ``jsonl``: gpu.jsonl + ports.jsonl;
- ``text``: the Prometheus text files (prom/gpu.prom, prom/ports.prom);
- ``openmetrics``: the same samples as OpenMetrics (float-second timestamps, families grouped,
  ``# EOF``), converted here;
- ``prometheus``: a real Prometheus server (``/usr/bin/prometheus``, or ``$FLEETMEDIC_PROMETHEUS``)
  whose TSDB ``promtool tsdb create-blocks-from openmetrics`` filled from that OpenMetrics file,
  read through ``backtest --prometheus`` (range queries at ``--prom-every``); the file it is
  made from keeps of each series only samples newer than the one before (the simulator also
  delivers late and duplicate samples, which a Prometheus server drops as out of order).

Every path also gets jobs.jsonl (job events and logs are not telemetry) and the switch ports of
ports.jsonl (no exporter writes switch counters; a user feeds them from their fabric manager), so
only the GPU and host-port telemetry differ. Writes the table to ``--out`` (no docs page by
default in this mode) and prints it.

    .venv/bin/python bench/quality.py --ingest-paths jsonl,text,openmetrics,prometheus \
        --seeds 1 --nodes 32 --hours 3 --out /tmp/ingest.md
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from fleetmedic.devenv import prometheus

HARD = {"hardware"}
SILENT = {"degradation"}
#: a dead node must be unschedulable within this: a telemetry sample (10 s), the job-failure settle
#: time (30 s) and the executor's latency, rounded up
DECISION_INTERVAL_S = 60.0


@dataclass(frozen=True)
class Burst:
    name: str
    nodes: int
    hours: float
    faults: str
    what: str
    storm: bool = False  # one signature on many nodes: the breaker should trip
    # the device plugin marks a GPU with a fatal XID unallocatable, which the simulator takes for the whole
    # node: off here, so that what keeps a dead node off the scheduler is fleetmedic alone
    device_plugin: bool = False


def _at(kinds: list[tuple[str, int, int]], at: str) -> str:
    return ",".join(f"{k}@{at}/gpu-node-{n:04d}/{g}" for k, n, g in kinds)


_THREE = [("xid79", 1, 2), ("xid48", 6, 5), ("xid64", 11, 0)]  # GPU off the bus, DBE, row remap failure
_FIVE = [*_THREE, ("xid95", 14, 3), ("xid74", 9, 7)]  # + uncontained ECC, fatal NVLink
BURSTS: tuple[Burst, ...] = (
    Burst("burst16-5", 16, 1.5, _at(_FIVE, "40m"), "5 distinct hard faults at once, 16 nodes, 4 racks"),
    Burst("burst32-3", 32, 1.5, _at(_THREE, "40m"), "GPU lost, DBE, row-remap failure at once, 32 nodes"),
    Burst("burst32-5", 32, 1.5, _at([(k, n * 2 + 1, g) for k, n, g in _FIVE], "40m"),
          "5 distinct hard faults at once, 32 nodes, 5 racks"),
    Burst("spread32-3", 32, 2.0, ",".join(f"{k}@{20 + 25 * i}m/gpu-node-{n:04d}/{g}" for i, (k, n, g) in
                                          enumerate(_THREE)), "the 3 faults spread over 50 minutes, 32 nodes"),
    Burst("storm32-40pct", 32, 1.5, ",".join(f"psu_failure@40m+2h/gpu-node-{n:04d}" for n in range(0, 32, 5))
          + "," + ",".join(f"psu_failure@40m+2h/gpu-node-{n:04d}" for n in (3, 8, 13, 18, 23, 28)),
          "one signature (power brake: preventive) on 13 of 32 nodes at once", storm=True),
    Burst("storm32-40pct-dbe", 32, 1.5, ",".join(f"xid48@40m/gpu-node-{n:04d}/1" for n in range(0, 32, 5))
          + "," + ",".join(f"xid48@40m/gpu-node-{n:04d}/1" for n in (3, 8, 13, 18, 23, 28)),
          "one signature (XID 48, definitive) on 13 of 32 nodes at once", storm=True),
)


def run_seed(seed: int, nodes: int, hours: float, faults: str) -> dict[str, Any]:
    from fleetmedic.config import Settings
    from fleetmedic.evaluation.scoring import score
    from fleetmedic.sim.embedded import OnCall, run_simulation
    from fleetmedic.sim.engine import SimConfig, Simulator

    started = time.process_time()
    sim = Simulator(SimConfig(nodes=nodes, duration_s=hours * 3600.0, seed=seed, faults=faults))
    run = run_simulation(sim, Settings(), oncall=OnCall())
    out = run.pipeline.out
    engine = run.pipeline.engine.report(sim.now)
    acc = msgspec.to_builtins(run.accounting) if not isinstance(run.accounting, dict) else run.accounting
    report = score(run.truth, out.incidents, out.commands, None, acc if isinstance(acc, dict) else None)
    return {
        "seed": seed,
        "cpu_s": round(time.process_time() - started, 1),
        "findings": len(out.findings),
        "breaker": {"trips": engine.get("breaker_trips", 0),
                    "resumed": sum(1 for a in out.audit if a.decision == "breaker_resumed"),
                    "reasons": [a.explanation for a in out.audit if a.decision == "breaker_tripped"]},
        "report": msgspec.to_builtins(report),
        "false_incidents": false_incident_rows(run.truth, out.incidents, report),
        "delays": [{"kind": t.kind, "class": t.fault_class, "delay_s": report.delays.get(t.id)}
                   for t in run.truth if not t.is_negative_control],
    }


def run_burst(burst: Burst, seed: int = 1) -> dict[str, Any]:
    """One burst with the shipped defaults: what happened to the dead nodes, and what it cost."""
    from fleetmedic.config import Settings
    from fleetmedic.evaluation.scoring import score
    from fleetmedic.sim.embedded import run_simulation
    from fleetmedic.sim.engine import SimConfig, Simulator
    from fleetmedic.sim.faults import leaves_node_dead

    started = time.process_time()
    sim = Simulator(SimConfig(nodes=burst.nodes, duration_s=burst.hours * 3600.0, seed=seed, faults=burst.faults,
                              device_plugin_health=burst.device_plugin))
    run = run_simulation(sim, Settings())
    out, acc = run.pipeline.out, run.accounting
    report = score(run.truth, out.incidents, out.commands, None, msgspec.to_builtins(acc))
    engine = run.pipeline.engine.report(sim.now)
    truth = [t for t in run.truth if not t.is_negative_control]
    fault_nodes = {n for t in truth for n in (t.nodes or [t.node]) if n}
    cordoned = {c.node for c in out.commands if c.action == "cordon"}
    dead = {t.id: acc.dangerous_by_fault.get(t.id, 0.0) for t in truth if leaves_node_dead(t.kind)}
    node_time = engine.get("node_time", {})
    return {
        "name": burst.name, "nodes": burst.nodes, "what": burst.what, "storm": burst.storm,
        "cpu_s": round(time.process_time() - started, 1), "faults": len(truth), "dead": len(dead),
        "dead_late": sum(1 for v in dead.values() if v > DECISION_INTERVAL_S),
        "dead_max_schedulable_s": round(max(dead.values(), default=0.0), 1),
        "fault_nodes_cordoned": len(fault_nodes & cordoned), "fault_nodes": len(fault_nodes),
        "healthy_cordoned": len(cordoned - fault_nodes),
        "healthy_isolated_per_fault": report.isolation.healthy_isolated_per_fault,
        "software_faults_isolated": report.isolation.software_faults_isolated,
        "dangerous_node_h": acc.dangerous_schedulable_node_h,
        "refused_definitive_node_h": round(node_time.get("refused_definitive_s", 0.0) / 3600, 4),
        "refused_other_node_h": round((node_time.get("refused_preventive_s", 0.0)
                                       + node_time.get("refused_uncertain_s", 0.0)) / 3600, 4),
        "definitive_isolations": engine["budget"].get("definitive_isolations", 0),
        "breaker_trips": engine.get("breaker_trips", 0),
        "states": engine.get("nodes", {}),
    }


def burst_markdown(rows: list[dict[str, Any]]) -> list[str]:
    def fmt(x: object) -> str:
        return "-" if x is None else (f"{x:.3f}" if isinstance(x, float) else str(x))

    lines = [
        "## Small-fleet bursts (shipped defaults)",
        "",
        f"Targets: 0 dead nodes (a fatal XID) left schedulable past one decision interval ({DECISION_INTERVAL_S:g} s); "
        "healthy nodes isolated per true fault <= 0.05; software faults that isolate 0; a storm of one signature "
        "trips the breaker and isolates nothing preventive. *Dangerous node-h*: the simulator's truth (a node with "
        "a fault to isolate, schedulable and up); *refused node-h*: the engine's clock of nodes it wanted to isolate "
        "and safety refused (definitive / other).",
        "",
        "| burst | what | faults (dead) | dead schedulable > interval | max schedulable (s) | fault nodes cordoned | "
        "healthy cordoned | healthy per fault | software isolated | dangerous node-h | refused node-h | "
        "definitive isolations | breaker trips |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['name']} | {r['what']} | {r['faults']} ({r['dead']}) | {r['dead_late']} | "
                     f"{fmt(r['dead_max_schedulable_s'])} | {r['fault_nodes_cordoned']}/{r['fault_nodes']} | "
                     f"{r['healthy_cordoned']} | {fmt(r['healthy_isolated_per_fault'])} | "
                     f"{r['software_faults_isolated']} | {fmt(r['dangerous_node_h'])} | "
                     f"{fmt(r['refused_definitive_node_h'])} / {fmt(r['refused_other_node_h'])} | "
                     f"{r['definitive_isolations']} | {r['breaker_trips']} |")
    lines.append("")
    return lines


def false_incident_rows(truth: list[Any], incidents: list[Any], report: Any) -> list[dict[str, Any]]:
    """The false incidents with what raised them (detectors, metrics) and the truth near their nodes,
    to find which detector or triage rule produces them."""
    matched = {i for ids in report.matches.values() for i in ids}
    latest = {i.id: i for i in incidents}
    neg = {t.id for t in truth if t.is_negative_control}
    neg_matched = {i for fid, ids in report.matches.items() if fid in neg for i in ids}
    rows = []
    for inc in sorted(latest.values(), key=lambda i: (i.first_seen, i.id)):
        infra = inc.incident_class in ("hardware", "degradation", "network")
        if inc.id in matched and not (inc.id in neg_matched and infra):
            continue
        nodes = {s.name.split("/")[0].split(":")[0] for s in inc.suspects if s.kind in ("node", "gpu", "link")}
        near = sorted({f"{t.kind}@{t.onset:.0f}" for t in truth if set(t.nodes) & nodes})
        rows.append({"id": inc.id, "class": inc.incident_class, "first_seen": inc.first_seen,
                     "suspects": [f"{s.kind}:{s.name}" for s in inc.suspects],
                     "signals": sorted({f"{e.detector}/{e.metric}" for e in inc.evidence}),
                     "summary": inc.summary, "truth_on_nodes": near[:6]})
    return rows


PLACEMENT_COUNTS = ("re_placements", "with_room", "replacements", "in_leaf", "on_suspect", "on_suspect_known",
                    "on_suspect_undetected", "on_flagged", "on_excluded")


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 4) if b else None


def _quantile(xs: list[float], q: float) -> float | None:
    """The ``q`` quantile of the pooled per-fault delays (nearest rank), or None when there are none."""
    if not xs:
        return None
    ys = sorted(xs)
    return round(ys[min(len(ys) - 1, int(q * len(ys)))], 1)


def aggregate(results: list[dict[str, Any]], node_days: float) -> dict[str, Any]:
    kinds: dict[str, dict[str, Any]] = defaultdict(lambda: defaultdict(float))
    delays: dict[str, list[float]] = defaultdict(list)
    for res in results:
        for k in res["report"]["by_kind"]:
            agg = kinds[k["kind"]]
            agg["class"] = k["fault_class"]
            for f in ("faults", "detected", "false_positives", "isolations", "duplicates"):
                agg[f] += k[f] or 0
            if k["delay_p50_s"] is not None:
                delays[k["kind"]].append(k["delay_p50_s"])
    rows = []
    groups: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for kind, agg in sorted(kinds.items()):
        tp, fp, n = agg["detected"], agg["false_positives"], agg["faults"]
        p, r = _ratio(tp, tp + fp), _ratio(tp, n)
        f1 = round(2 * p * r / (p + r), 4) if p and r else None
        d = sorted(delays[kind])
        rows.append({"kind": kind, "class": agg["class"], "faults": int(n), "detected": int(tp),
                     "false_positives": round(fp, 2), "precision": p, "recall": r, "f1": f1,
                     "delay_p50_s": d[len(d) // 2] if d else None, "isolations": int(agg["isolations"])})
        group = "hard" if agg["class"] in HARD else ("silent" if agg["class"] in SILENT else str(agg["class"]))
        for f in ("faults", "detected", "false_positives"):
            groups[group][f] += agg[f]
    overall = {
        "incidents": sum(r["report"]["incidents"] for r in results),
        "false_incidents": sum(r["report"]["false_incidents"] for r in results),
        "top1": [r["report"]["top1_accuracy"] for r in results],
        "software_faults_isolated": sum(r["report"]["isolation"]["software_faults_isolated"] for r in results),
        "healthy_isolated_per_fault": [r["report"]["isolation"]["healthy_isolated_per_fault"] for r in results],
        "job_failures": sum((r["report"].get("closed_loop") or {}).get("job_failures") or 0 for r in results),
        "repeat_failures": sum((r["report"].get("closed_loop") or {}).get("repeat_failures") or 0 for r in results),
        "unobserved": [f"{r['seed']}:{fid}" for r in results for fid in r["report"].get("unobserved") or []],
        "breaker_trips": sum((r.get("breaker") or {}).get("trips", 0) for r in results),
        "breaker_resumed": sum((r.get("breaker") or {}).get("resumed", 0) for r in results),
    }
    overall["false_incidents_per_node_day"] = _ratio(overall["false_incidents"], node_days)
    placement: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for res in results:
        for who, counts in ((res["report"].get("closed_loop") or {}).get("placement") or {}).items():
            for f in PLACEMENT_COUNTS:
                placement[who][f] += int(counts.get(f) or 0)
    overall["placement"] = {who: dict(v) for who, v in sorted(placement.items())}
    undetected: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for res in results:
        for who, by_kind in ((res["report"].get("closed_loop") or {}).get("undetected_by_kind") or {}).items():
            for kind, n in by_kind.items():
                undetected[who][kind] += int(n)
    overall["undetected_by_kind"] = {who: dict(sorted(v.items())) for who, v in sorted(undetected.items())}
    group_delays: dict[str, list[float]] = defaultdict(list)
    for res in results:
        for d in res.get("delays", []):
            if d["delay_s"] is not None:
                cls = d["class"]
                group_delays["hard" if cls in HARD else ("silent" if cls in SILENT else cls)].append(d["delay_s"])
    summary = {g: {"faults": int(v["faults"]), "precision": _ratio(v["detected"], v["detected"] + v["false_positives"]),
                   "recall": _ratio(v["detected"], v["faults"]),
                   "delay_p50_s": _quantile(group_delays[g], 0.5), "delay_p90_s": _quantile(group_delays[g], 0.9)}
               for g, v in sorted(groups.items())}
    return {"kinds": rows, "groups": summary, "overall": overall}


def markdown(args: argparse.Namespace, results: list[dict[str, Any]], agg: dict[str, Any]) -> str:
    def fmt(x: object) -> str:
        return "-" if x is None else (f"{x:.3f}" if isinstance(x, float) else str(x))

    lines = [
        "# Detection and attribution quality",
        "",
        "Generated by `python bench/quality.py "
        + f"--seeds {' '.join(map(str, args.seeds))} --nodes {args.nodes} --hours {args.hours:g}` "
        "(fleet simulator, `mix` fault plan incl. negative controls, closed loop through the embedded "
        "pipeline, scored by the simulator's scorer). Rerun it to regenerate this page.",
        "",
        f"Seeds: {', '.join(str(r['seed']) for r in results)}; CPU per seed: "
        + ", ".join(f"{r['cpu_s']} s" for r in results) + ".",
        "",
        "## By group (targets: hard faults recall 1.0 / precision >= 0.99, found within one sample interval "
        "(10 s); silent degradation P, R >= 0.95, delay p50 <= 120 s)",
        "",
        "Delays are pooled over every detected fault of the group (onset to the first incident that names it).",
        "",
        "| group | faults | precision | recall | delay p50 (s) | delay p90 (s) |",
        "|---|---|---|---|---|---|",
    ]
    for g, v in agg["groups"].items():
        lines.append(f"| {g} | {v['faults']} | {fmt(v['precision'])} | {fmt(v['recall'])} | "
                     f"{fmt(v.get('delay_p50_s'))} | {fmt(v.get('delay_p90_s'))} |")
    o = agg["overall"]
    lines += [
        "",
        f"Incidents: {o['incidents']}, of which false: {o['false_incidents']} "
        f"({fmt(o['false_incidents_per_node_day'])} per node-day; target <= 0.01). "
        f"Top-1 attribution per seed: {', '.join(fmt(x) for x in o['top1'])}. "
        f"Software faults that led to node isolation: {o['software_faults_isolated']} (target 0). "
        f"Faults left out as unobservable (they began and ended while their node was away for repair, "
        f"so no telemetry or job could show them): {len(o['unobserved'])}"
        + (f" ({', '.join(o['unobserved'])}). " if o["unobserved"] else ". ") +
        "Healthy nodes isolated per true fault, per seed: "
        f"{', '.join(fmt(x) for x in o['healthy_isolated_per_fault'])}. "
        f"Job failures: {o['job_failures']}; {o['repeat_failures']} of them were further kills by a fault that had "
        "killed a job before (a leaf switch fails every job behind it; jobs placed on a node before its fault "
        "was found). Placements on a node a restart had excluded: the table below. "
        f"Breaker trips: {o.get('breaker_trips', 0)}, resumed by the person on call once the storm was over: "
        f"{o.get('breaker_resumed', 0)}.",
        "",
        "Re-placements after failures, summed over seeds (replacement nodes that stayed in the job's original "
        "leaf, counted where that leaf had room; placements on a node of the outage's fault, split into nodes "
        "fleetmedic already suspected at placement (held, settling, refused, not yet cordoned, evidence being "
        "confirmed: goal 0 for its own restarts, which exclude them) and nodes not yet detected (a detection "
        "delay); placements on any node fleetmedic suspected then, faulty or not; goal 1.0 and 0):",
        "",
        "| restarted by | re-placements | leaf had room | in the original leaf | on suspects | of which suspected at "
        "placement | of which not yet detected | on nodes fleetmedic suspected | on excluded nodes |",
        "|---|---|---|---|---|---|---|---|---|",
        *(f"| {who} | {p['re_placements']} | {p['with_room']} | {p['in_leaf']}/{p['replacements']} "
          f"({fmt(_ratio(p['in_leaf'], p['replacements']))}) | {p['on_suspect']} | {p.get('on_suspect_known', 0)} | "
          f"{p.get('on_suspect_undetected', 0)} | {p.get('on_flagged', 0)} | {p['on_excluded']} |"
          for who, p in o["placement"].items() if who != "all"),
        "",
        "Placements on a faulty node not yet detected, by fault kind: "
        + ("; ".join(f"{who}: " + ", ".join(f"{k} {n}" for k, n in by.items())
                     for who, by in o.get("undetected_by_kind", {}).items() if who != "all" and by) or "none")
        + ".",
        "",
        "## By fault kind",
        "",
        "| kind | class | faults | detected | false pos. | precision | recall | F1 | delay p50 (s) | isolations |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in agg["kinds"]:
        lines.append(f"| {r['kind']} | {r['class']} | {r['faults']} | {r['detected']} | {fmt(r['false_positives'])} | "
                     f"{fmt(r['precision'])} | {fmt(r['recall'])} | {fmt(r['f1'])} | {fmt(r['delay_p50_s'])} | "
                     f"{r['isolations']} |")
    lines += ["", "False positives of a class are shared among its kinds (the scorer's rule), hence fractions.", ""]
    by_signal: dict[tuple[str, str], int] = defaultdict(int)
    for res in results:
        for row in res.get("false_incidents", []):
            by_signal[(row["class"], ", ".join(row["signals"][:3]) or "-")] += 1
    if by_signal:
        lines += ["## False incidents by evidence", "",
                  "What raised the incidents the scorer found false (class, first detectors/metrics of the "
                  "evidence), summed over seeds; `--json` lists each with the truth near its nodes.", "",
                  "| class | evidence | incidents |", "|---|---|---|"]
        for (cls, sig), n in sorted(by_signal.items(), key=lambda kv: (-kv[1], kv[0])):
            lines.append(f"| {cls} | {sig} | {n} |")
        lines.append("")
    return "\n".join(lines)


# --- ingest paths ----------------------------------------------------------------------------------

INGEST_PATHS = ("jsonl", "text", "openmetrics", "prometheus")


def _cli(*args: str, timeout: float = 3600) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "fleetmedic.cli", *args], capture_output=True, text=True,
                          timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"fleetmedic {' '.join(args[:2])} exited {done.returncode}: {done.stderr[-3000:]}")
    return done


def _switch_ports(src: Path, dst: Path) -> None:
    """The switch-port records of ports.jsonl (the part no node exporter carries)."""
    with src.open("rb") as fin, dst.open("wb") as fout:
        for line in fin:
            if b'"device_kind":"switch"' in line:
                fout.write(line)


def to_openmetrics(sources: list[Path], dst: Path, work: Path, as_stored: bool = False) -> int:
    """Prometheus text files (``# TYPE`` once at the top, scrapes appended, millisecond timestamps)
    -> one OpenMetrics file: each family's samples together and in it each series' samples
    together (as OpenMetrics requires and ``promtool tsdb dump-openmetrics`` writes), float-second
    timestamps, counters under ``_total`` as ``counter``, dcgm-exporter's counters
    without it as ``unknown``, ``# EOF``. ``as_stored``: only what a Prometheus server would have
    stored of them: a sample not newer than its series' last one (the simulator's late and
    duplicate deliveries) is dropped, as Prometheus drops an out-of-order sample. Returns the
    samples written."""
    types: dict[str, str] = {}
    parts: dict[str, Any] = {}
    last: dict[str, int] = {}
    n = 0
    (work / "om-parts").mkdir(parents=True, exist_ok=True)
    try:
        for src in sources:
            with src.open(encoding="utf-8") as fh:
                for line in fh:
                    if line.startswith("#"):
                        bits = line.split()
                        if len(bits) >= 4 and bits[1] == "TYPE":
                            types[bits[2]] = bits[3]
                        continue
                    if not line.strip():
                        continue
                    brace = line.find("{")
                    name = line[:brace] if brace > 0 else line.split(" ", 1)[0]
                    head, _, ts = line.rstrip("\n").rpartition(" ")
                    if as_stored:
                        series = head.rpartition(" ")[0]
                        if int(ts) <= last.get(series, -1):
                            continue
                        last[series] = int(ts)
                    fh_out = parts.get(name)
                    if fh_out is None:
                        fh_out = parts[name] = (work / "om-parts" / name).open("w", encoding="utf-8")
                    fh_out.write(f"{head} {int(ts) / 1000:.3f}\n")
                    n += 1
        for fh_out in parts.values():
            fh_out.close()
        with dst.open("w", encoding="utf-8") as out:
            for name in parts:
                kind = types.get(name, "unknown")
                if kind == "counter" and name.endswith("_total"):
                    out.write(f"# TYPE {name[:-6]} counter\n")
                else:
                    out.write(f"# TYPE {name} {kind if kind == 'gauge' else 'unknown'}\n")
                by_series: dict[str, list[str]] = {}  # series by series, as OpenMetrics and promtool's dump have it
                with (work / "om-parts" / name).open(encoding="utf-8") as fin:
                    for line in fin:
                        by_series.setdefault(line.rpartition(" ")[0].rpartition(" ")[0], []).append(line)
                for series_lines in by_series.values():
                    out.writelines(series_lines)
            out.write("# EOF\n")
    finally:
        for fh_out in parts.values():
            fh_out.close()
        shutil.rmtree(work / "om-parts", ignore_errors=True)
    return n


def run_ingest_paths(seed: int, nodes: int, hours: float, faults: str, paths: list[str],
                     prom_every_s: float) -> dict[str, Any]:
    """One simulated fleet scored through each ingest path (module docstring)."""
    out: dict[str, Any] = {"seed": seed, "paths": {}}
    with tempfile.TemporaryDirectory(prefix=f"fleetmedic-ingest-{seed}-") as tmp:
        work = Path(tmp)
        sim = work / "sim"
        # history a Prometheus server keeps: end an hour ago
        start = int(time.time() - hours * 3600 - 3600) // 60 * 60
        t0 = time.monotonic()
        _cli("simulate", "--nodes", str(nodes), "--duration", f"{hours * 60:g}m", "--seed", str(seed),
             "--faults", faults, "--format", "both", "--prom-every", f"{prom_every_s:g}s", "--start", str(start),
             "--out", str(sim))
        out["simulate_s"] = round(time.monotonic() - t0, 1)
        switches = work / "switch-ports.jsonl"
        _switch_ports(sim / "ports.jsonl", switches)
        common = ["--input", str(sim / "jobs.jsonl"), "--input", str(switches), "--topology", str(sim / "meta.json"),
                  "--truth", str(sim / "truth.jsonl")]
        om, stored = work / "telemetry.om", work / "stored.om"
        prom_files = [sim / "prom" / "gpu.prom", sim / "prom" / "ports.prom"]
        if "openmetrics" in paths:
            out["openmetrics_samples"] = to_openmetrics(prom_files, om, work)
        if "prometheus" in paths:
            out["stored_samples"] = to_openmetrics(prom_files, stored, work, as_stored=True)
        for path in paths:
            t0 = time.monotonic()
            dest = work / f"bt-{path}"
            server: subprocess.Popen[bytes] | None = None
            try:
                if path == "jsonl":
                    args = ["--input", str(sim / "gpu.jsonl"), "--input", str(sim / "ports.jsonl"),
                            "--input", str(sim / "jobs.jsonl"), "--topology", str(sim / "meta.json"),
                            "--truth", str(sim / "truth.jsonl")]
                elif path == "text":
                    args = ["--input", str(sim / "prom"), *common]
                elif path == "openmetrics":
                    args = ["--input", str(om), *common]
                else:
                    # a real server over the stored history (no retention that would drop old samples)
                    prometheus.load_openmetrics(stored, work)
                    url, server = prometheus.start(work, retention="100y")
                    end = start + int(hours * 3600)
                    args = ["--prometheus", url, "--start", str(start), "--end", str(end),
                            "--step", f"{prom_every_s:g}s", *common]
                _cli("backtest", *args, "--out", str(dest))
            except (RuntimeError, subprocess.TimeoutExpired) as exc:  # one path failing leaves the others
                out["paths"][path] = {"error": str(exc)[-2000:]}
                continue
            finally:
                if server is not None:
                    prometheus.stop(server)
            summary = json.loads((dest / "summary.json").read_text())
            score = json.loads((dest / "score.json").read_text())
            out["paths"][path] = {
                "wall_s": round(time.monotonic() - t0, 1), "records": summary.get("records", {}),
                "skipped_total": summary.get("skipped_total", 0), "faults": score["faults"],
                "recall": score["recall"], "precision": score["precision"],
                "false_incidents": score["false_incidents"], "delay_p50_s": score["delay_p50_s"],
                "detected": _detected_faults(score, sim),
            }
    return out


def _detected_faults(score: dict[str, Any], sim: Path) -> list[str]:
    """The true faults (not negative controls) an incident of this backtest found, as
    ``kind/fault id``."""
    from fleetmedic.evaluation.truth import read_truth

    return sorted(f"{t.kind}/{t.id}" for t in read_truth(sim / "truth.jsonl")
                  if t.id in score.get("delays", {}) and not t.is_negative_control)


def ingest_markdown(args: argparse.Namespace, runs: list[dict[str, Any]]) -> str:
    lines = ["# The same fleet through each ingest path\n",
             f"`bench/quality.py --ingest-paths {','.join(args.ingest_paths)} --seeds {' '.join(map(str, args.seeds))} "
             f"--nodes {args.nodes} --hours {args.hours:g} --faults {args.faults} --prom-every {args.prom_every:g}`\n",
             "| seed | path | GPU records | port records | skipped | faults | recall | precision | false incidents "
             "| delay p50 s | faults missed vs JSONL | extra vs JSONL | wall s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for run in runs:
        base = set(run["paths"].get("jsonl", {}).get("detected", []))
        for path, res in run["paths"].items():
            if "error" in res:
                lines.append(f"| {run['seed']} | {path} | failed: {res['error'][-300:]!r} |")
                continue
            got = set(res["detected"])
            rec = res["records"]
            lines.append(
                f"| {run['seed']} | {path} | {rec.get('GpuTelemetry', 0)} | {rec.get('PortTelemetry', 0)} | "
                f"{res['skipped_total']} | {res['faults']} | {_fmt(res['recall'])} | {_fmt(res['precision'])} | "
                f"{res['false_incidents']} | {_fmt(res['delay_p50_s'])} | "
                f"{', '.join(sorted(base - got)) or '-' if path != 'jsonl' else ''} | "
                f"{', '.join(sorted(got - base)) or '-' if path != 'jsonl' else ''} | {res['wall_s']} |")
    return "\n".join(lines) + "\n"


def _fmt(x: object) -> str:
    return "-" if x is None else f"{x:.3f}" if isinstance(x, float) else str(x)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--nodes", type=int, default=256)
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--faults", default="mix")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "docs" / "quality.md"))
    ap.add_argument("--json", help="also write the raw per-seed results here")
    ap.add_argument("--no-bursts", action="store_true", help="skip the small-fleet bursts")
    ap.add_argument("--bursts-only", action="store_true", help="run only the small-fleet bursts")
    ap.add_argument("--ingest-paths", type=lambda v: [p.strip() for p in v.split(",") if p.strip()],
                    help=f"score one open-loop fleet per seed through these ingest paths instead "
                         f"(comma-separated: {', '.join(INGEST_PATHS)}); see above")
    ap.add_argument("--prom-every", type=float, default=30.0,
                    help="with --ingest-paths: the exporters' scrape interval, seconds (default 30)")
    args = ap.parse_args()
    if args.ingest_paths is not None:
        bad = [p for p in args.ingest_paths if p not in INGEST_PATHS]
        if bad or not args.ingest_paths:
            ap.error(f"--ingest-paths: unknown path(s) {', '.join(bad) or '(none given)'}; "
                     f"choose from {', '.join(INGEST_PATHS)}")
        if args.out == ap.get_default("out"):
            ap.error("--ingest-paths writes its own table: give --out FILE (docs/quality.md is left alone)")
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            runs = list(pool.map(run_ingest_paths, args.seeds, [args.nodes] * len(args.seeds),
                                 [args.hours] * len(args.seeds), [args.faults] * len(args.seeds),
                                 [args.ingest_paths] * len(args.seeds), [args.prom_every] * len(args.seeds)))
        text = ingest_markdown(args, runs)
        Path(args.out).write_text(text, encoding="utf-8")
        if args.json:
            Path(args.json).write_text(json.dumps({"ingest_paths": runs}, indent=1), encoding="utf-8")
        print(text)
        return
    results: list[dict[str, Any]] = []
    bursts: list[dict[str, Any]] = []
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = [] if args.bursts_only else [pool.submit(run_seed, s, args.nodes, args.hours, args.faults)
                                               for s in args.seeds]
        burst_futures = [] if args.no_bursts else [pool.submit(run_burst, b) for b in BURSTS]
        results = [f.result() for f in futures]
        bursts = [f.result() for f in burst_futures]
    text = ""
    agg: dict[str, Any] = {}
    if results:
        agg = aggregate(results, node_days=len(args.seeds) * args.nodes * args.hours / 24.0)
        text = markdown(args, results, agg)
    if bursts:
        text += ("" if text else "# Detection and attribution quality\n\n") + "\n".join(burst_markdown(bursts))
    Path(args.out).write_text(text, encoding="utf-8")
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results, "aggregate": agg, "bursts": bursts}, indent=1),
                                   encoding="utf-8")
    print(text)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
