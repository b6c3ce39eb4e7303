"""``fleetmedic demo``: a simulated GPU fleet, the whole pipeline, and the closed loop, in one process.

A fleet of simulated nodes runs training jobs while faults strike (GPU hard faults, silent
degradation, network faults, software failures, job bugs and negative controls). Its telemetry
goes through the embedded pipeline, detection, triage, policy and safety, and the signed commands
go back to the simulator, which plays the cluster: it cordons, drains, restarts jobs from their
checkpoints, runs diagnostics and returns nodes to service. The demo prints, per injected fault,
the story (fault -> finding -> incident -> commands -> job recovered -> node diagnosed -> returned
to service) and a summary scored against the ground truth. ``--json`` writes it machine-readably.

The simulator re-places a job that fleetmedic restarts toward its surviving ranks' leaf and rack, as
the executor's preferred affinity asks the real scheduler to (``placement.enabled: false``: no
preference); the job controller's own restarts get none. The summary counts, per restarter, the
replacements that stayed in the original leaf where it had room, placements on suspect nodes and
the time spent waiting for capacity.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from fleetmedic.signing import DEMO_COMMAND_KEY as DEMO_KEY  # published: refused outside the demo (DEMO_KEYS)


@dataclass
class Step:
    t: float
    what: str
    detail: str


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from fleetmedic.cli.common import DEFAULT_SEED, add_deprecated_alias, duration, examples

    p = sub.add_parser("demo", help="simulated fleet + full pipeline + closed loop, with a timeline and summary",
                       description="A simulated GPU fleet, the whole pipeline and the closed loop, in one process "
                                   "(or through a Kafka broker with --bootstrap): the story of each injected fault "
                                   "and a summary scored against the ground truth.",
                       epilog=examples("fleetmedic demo",
                                       "fleetmedic demo --nodes 16 --duration 90m --seed 3 --json out.json",
                                       "fleetmedic demo --bootstrap 127.0.0.1:9092"))
    p.add_argument("--nodes", type=int, default=64, help="simulated GPU nodes, 8 GPUs each (default: 64)")
    p.add_argument("--duration", type=duration, default=3 * 3600.0, help="simulated time, e.g. 90m, 3h (default: 3h)")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED,
                   help=f"random seed; the same seed replays the same run (default: {DEFAULT_SEED})")
    p.add_argument("--faults", default="mix", help="fault plan, as `fleetmedic simulate --faults` (default: mix)")
    p.add_argument("--config", metavar="FILE", help="YAML config (default: built-in defaults + FLEETMEDIC__* env)")
    p.add_argument("--json", metavar="FILE", help="also write timeline and summary as JSON ('-' for stdout)")
    p.add_argument("--bootstrap", metavar="HOST:PORT[,HOST:PORT]",
                   help="run the pipeline through the Kafka brokers here, in a `fleetmedic worker` process, not "
                        "in-process")
    add_deprecated_alias(p, "--kafka", "bootstrap", metavar="BOOTSTRAP")
    p.set_defaults(handler=_main)


def _main(args: argparse.Namespace) -> int:
    from fleetmedic.cli.common import EXIT_INVALID, settings_or_none
    settings = settings_or_none(args.config)
    if settings is None:
        return EXIT_INVALID
    if args.bootstrap:
        from aiokafka.errors import KafkaError

        try:
            result = run_demo_on_kafka(settings, args.nodes, args.duration, args.seed, args.faults, args.bootstrap)
        except (KafkaError, OSError, RuntimeError, TimeoutError) as exc:
            print(f"error: the demo on Kafka {args.bootstrap} failed: {exc}", file=sys.stderr)
            return 1
    else:
        result = run_demo(settings, args.nodes, args.duration, args.seed, args.faults)
    out = sys.stdout
    if args.json != "-":
        print_timeline(result, out)
    if args.json:
        text = json.dumps(result, indent=1, default=str)
        if args.json == "-":
            out.write(text + "\n")
        else:
            with open(args.json, "w", encoding="utf-8") as fh:
                fh.write(text + "\n")
    return 0


def sim_config(settings: Any, nodes: int, duration_s: float, seed: int, faults: str) -> Any:
    """The demo's simulator: fleetmedic's restarts are topology-aware when ``placement.enabled``."""
    from fleetmedic.sim.engine import SimConfig
    from fleetmedic.sim.workload import WorkloadSpec

    preference = "fleetmedic" if settings.placement.enabled else "none"
    return SimConfig(nodes=nodes, duration_s=duration_s, seed=seed, faults=faults,
                     workload=WorkloadSpec(topology_preference=preference))


def run_demo(settings: Any, nodes: int, duration_s: float, seed: int, faults: str) -> dict[str, Any]:
    from fleetmedic.sim.embedded import run_simulation
    from fleetmedic.sim.engine import Simulator

    started = time.monotonic()
    sim = Simulator(sim_config(settings, nodes, duration_s, seed, faults))
    run = run_simulation(sim, settings, key=DEMO_KEY)
    return _result(sim, run.pipeline.out, run.truth, run.accounting, run.pipeline.engine, time.monotonic() - started,
                   faults)


def run_demo_on_kafka(settings: Any, nodes: int, duration_s: float, seed: int, faults: str,
                      bootstrap: str) -> dict[str, Any]:
    """The same demo through a real broker and a ``fleetmedic worker`` (:mod:`fleetmedic.sim.kafka_demo`)."""
    from fleetmedic.sim.engine import Simulator
    from fleetmedic.sim.kafka_demo import run_on_kafka

    started = time.monotonic()
    sim = Simulator(sim_config(settings, nodes, duration_s, seed, faults))
    run = run_on_kafka(sim, settings, bootstrap, DEMO_KEY)
    result = _result(sim, run.out, list(sim.truth()), sim.accounting(), run.engine, time.monotonic() - started,
                     faults)
    result["fleet"]["kafka"] = {"bootstrap": bootstrap, "messages": run.messages, "ticks": run.ticks}
    return result


def _result(sim: Any, out: Any, truth: list[Any], accounting_: Any, engine_: Any, elapsed: float,
            faults: str) -> dict[str, Any]:
    import msgspec

    from fleetmedic.evaluation.scoring import score

    nodes, duration_s, seed = sim.config.nodes, sim.config.duration_s, sim.config.seed
    accounting = msgspec.to_builtins(accounting_)
    report = score(truth, out.incidents, out.commands, None, accounting)
    stories = [_story(t, out, report.matches.get(t.id, [])) for t in sorted(truth, key=lambda t: t.onset)]
    engine = engine_.report(sim.config.start + duration_s)
    return {
        "fleet": {"nodes": nodes, "gpus": nodes * sim.fleet.g, "simulated_h": duration_s / 3600, "seed": seed,
                  "faults": faults, "wall_s": round(elapsed, 1)},
        "start": sim.config.start,
        "stories": stories,
        "summary": {
            "faults": report.faults,
            "incidents": report.incidents,
            "false_incidents": report.false_incidents,
            "precision": report.precision,
            "recall": report.recall,
            "detection_delay_p50_s": report.delay_p50_s,
            "top1_attribution": report.top1_accuracy,
            "healthy_nodes_isolated_per_fault": report.isolation.healthy_isolated_per_fault,
            "software_faults_isolated": report.isolation.software_faults_isolated,
            "findings": len(out.findings),
            "commands": dict(sorted(Counter(c.action for c in out.commands).items())),
            "mttr_phases_p50_s": {k: v.get("p50_s") for k, v in accounting.get("phases", {}).items()},
            "effective_training_time_ratio": accounting.get("effective_training_time_ratio"),
            "repeat_failures_same_node": accounting.get("repeat_failures_same_node"),
            "re_placements": accounting.get("placement", {}),
            "capacity_wait_s": {k: accounting.get("phases", {}).get("wait_capacity", {}).get(k)
                                for k in ("n", "p50_s", "max_s")},
            "dangerous_schedulable_node_h": accounting.get("dangerous_schedulable_node_h"),
            "hard_faults_schedulable_s": _hard_faults_schedulable(truth, accounting),
            "refused_isolation_node_h": {k.removeprefix("refused_").removesuffix("_s"): round(v / 3600, 4)
                                         for k, v in engine.get("node_time", {}).items() if k.startswith("refused_")},
            "refused_now": engine.get("refused_now"),
            "definitive_isolations": (engine.get("budget") or {}).get("definitive_isolations"),
            "healthy_unschedulable_node_h": accounting.get("healthy_unschedulable_node_h"),
            "node_states": engine.get("nodes"),
            "budget": engine.get("budget"),
            "breaker_trips": engine.get("breaker_trips"),
        },
    }


def _story(truth: Any, out: Any, incident_ids: list[str]) -> dict[str, Any]:
    nodes = set(truth.nodes or ([truth.node] if truth.node else []))
    window = (truth.onset - 60, truth.end + 600)
    steps = [Step(truth.onset, "fault", f"{truth.kind} ({truth.fault_class}) on "
                  f"{truth.node or truth.switch or truth.job or ', '.join(sorted(nodes)[:3])}"
                  f"{f' GPU {truth.gpu}' if truth.gpu is not None else ''}{f' {truth.port}' if truth.port else ''}")]
    first = next((f for f in out.findings if f.node in nodes and window[0] <= f.ts <= window[1]), None)
    if first is not None:
        steps.append(Step(first.ts, "finding", f"{first.detector}: {first.summary}"))
    incs = [i for i in out.incidents if i.id in set(incident_ids)]
    if incs:
        inc = incs[0]
        suspects = ", ".join(f"{s.kind} {s.name}" for s in inc.suspects[:3])
        steps.append(Step(inc.first_seen, "incident", f"{inc.incident_class} ({inc.confidence:.2f}): {suspects}"))
        cmd_ids = set()
        for c in out.commands:
            if c.incident_id in {i.id for i in incs}:
                cmd_ids.add(c.id)
                steps.append(Step(c.issued_at, "command", f"{c.action} {c.node or c.job}"))
        for res in out.results:
            if res.command_id in cmd_ids and res.outcome == "applied":
                label = {"restart_job": "job recovered", "requeue_job": "job recovered",
                         "retry_in_place": "job retried", "run_diagnostics": "node diagnosed",
                         "return_to_service": "returned to service"}.get(res.action)
                if label:
                    verdict = res.details.get("verdict") or res.details.get("diagnostics") or ""
                    steps.append(Step(res.ts, label, f"{res.node or res.job} {verdict}".strip()))
    # the fault first: nodes stamp telemetry with their own (skewed) clocks, so a finding can carry
    # a time a moment before the simulator's onset
    steps = [steps[0], *sorted(steps[1:], key=lambda s: s.t)]
    expected = truth.expected_response
    return {"fault": truth.id, "kind": truth.kind, "class": truth.fault_class, "expected": expected,
            "detected": bool(incs), "steps": [s.__dict__ for s in steps[:14]]}


def print_timeline(result: dict[str, Any], out: Any) -> None:
    f, s = result["fleet"], result["summary"]
    start = result["start"]
    w = out.write
    w(f"fleetmedic demo: {f['nodes']} nodes / {f['gpus']} GPUs, {f['simulated_h']:g} h simulated in "
      f"{f['wall_s']} s (seed {f['seed']}, faults {f['faults']})\n\n")
    for story in result["stories"]:
        mark = "detected" if story["detected"] else ("not flagged" if story["class"] in
                                                      ("negative_control",) else "missed")
        w(f"== {story['kind']} [{story['class']}; expected: {story['expected']}] - {mark}\n")
        for st in story["steps"]:
            w(f"   +{_hms(st['t'] - start)}  {st['what']:<20} {st['detail']}\n")
        w("\n")
    w("== summary\n")
    rows = [
        ("faults injected", s["faults"]),
        ("incidents (false)", f"{s['incidents']} ({s['false_incidents']})"),
        ("precision / recall", f"{_f(s['precision'])} / {_f(s['recall'])}"),
        ("detection delay p50", f"{_f(s['detection_delay_p50_s'])} s"),
        ("top-1 attribution", _f(s["top1_attribution"])),
        ("healthy nodes isolated per fault", _f(s["healthy_nodes_isolated_per_fault"])),
        ("software faults that isolated a node", s["software_faults_isolated"]),
        ("MTTR p50 by phase (s)", ", ".join(f"{k} {_f(v)}" for k, v in s["mttr_phases_p50_s"].items())),
        ("effective training time ratio", _f(s["effective_training_time_ratio"])),
        ("repeat failures on the same node", s["repeat_failures_same_node"]),
        *placement_rows(s),
        ("node-h dangerous but schedulable", _f(s["dangerous_schedulable_node_h"])),
        ("dead nodes schedulable: max, > 60 s", _schedulable_row(s.get("hard_faults_schedulable_s") or {})),
        ("isolations outside the budget", f"{s.get('definitive_isolations') or 0} (definitive evidence)"),
        ("refused isolations, node-h (now)", ", ".join(
            f"{k} {_f(v)} ({(s.get('refused_now') or {}).get(k, 0)})"
            for k, v in (s.get("refused_isolation_node_h") or {}).items()) or "-"),
        ("node-h healthy but unschedulable", _f(s["healthy_unschedulable_node_h"])),
        ("commands", ", ".join(f"{k} {v}" for k, v in s["commands"].items())),
        ("node states at the end", ", ".join(f"{k} {v}" for k, v in (s["node_states"] or {}).items())),
        ("breaker trips", s["breaker_trips"]),
    ]
    for label, value in rows:
        w(f"   {label:<38} {value}\n")


def placement_rows(s: dict[str, Any]) -> list[tuple[str, str]]:
    """Summary lines about re-placements: leaf locality per restarter, suspects, capacity wait."""
    groups = {k: g for k, g in (s.get("re_placements") or {}).items() if k != "all"}
    everyone = (s.get("re_placements") or {}).get("all") or {}
    names = {"fleetmedic": "fleetmedic", "job_controller": "job controller", "user": "user"}
    locality = [f"{names.get(k, k)} {g['in_leaf']}/{g['replacements']} nodes ({_f(g['leaf_fraction'])}; "
                f"leaf had room in {g['with_room']} of {g['re_placements']})"
                for k, g in sorted(groups.items()) if g.get("re_placements")]
    suspects = ", ".join(f"{names.get(k, k)} {g.get('on_suspect', 0)}" for k, g in sorted(groups.items()))
    wait = s.get("capacity_wait_s") or {}
    return [
        ("re-placements in the original leaf", "; ".join(locality) or "none"),
        ("placements on suspect nodes", f"{everyone.get('on_suspect', 0)}" + (f" ({suspects})" if suspects else "")
         + f", on excluded nodes {everyone.get('on_excluded', 0)}"),
        ("wait for capacity p50 / max",
         f"{_f(wait.get('p50_s'))} / {_f(wait.get('max_s'))} s (n={wait.get('n') or 0})"),
    ]


def _hard_faults_schedulable(truth: list[Any], accounting: dict[str, Any]) -> dict[str, float]:
    """Faults that left a node dead (a fatal XID, a crash) -> seconds a node of it stayed schedulable."""
    from fleetmedic.sim.faults import leaves_node_dead

    by_fault = accounting.get("dangerous_by_fault") or {}
    return {t.id: float(by_fault.get(t.id, 0.0)) for t in truth if leaves_node_dead(t.kind)}


def _schedulable_row(by_fault: dict[str, float]) -> str:
    if not by_fault:
        return "-"
    late = sum(1 for v in by_fault.values() if v > 60.0)
    return f"{max(by_fault.values()):.0f} s / {late} of {len(by_fault)}"


def _hms(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 3600:d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def _f(x: Any) -> str:
    return "-" if x is None else (f"{x:.3f}" if isinstance(x, float) else str(x))
