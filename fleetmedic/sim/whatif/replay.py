"""Replay one history under several policies and say what each cost: ``fleetmedic whatif``.

:func:`replay` runs the same history, mapping, assumptions and seed through each policy
(:mod:`.policies`) on a fresh :class:`~.world.World` and returns, per policy, the outcome
(:func:`outcome`): ETTR of the big job and of the fleet's jobs, GPU-hours lost by cause,
interruptions, MTTR by phase, dangerous- and degraded-but-schedulable node-hours, healthy capacity
held by false isolation, placements on faulty nodes (split into nodes the policy suspected at that
moment and nodes not yet detected, by evidence), and for fleetmedic its refusals, budget and
breaker use.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from fleetmedic.config import Settings
from fleetmedic.sim.whatif.history import History
from fleetmedic.sim.whatif.mapping import Mapping
from fleetmedic.sim.whatif.policies import Fleetmedic, Manual, NpdDraino
from fleetmedic.sim.whatif.world import JOB_BUCKETS, Assumptions, Policy, World

BASELINES = ("manual", "npd-draino")


@dataclass(frozen=True)
class PolicySpec:
    """A policy to replay: ``manual``, ``npd-draino``, or ``fleetmedic`` with ``settings``."""

    name: str
    kind: str
    settings: Settings | None = None
    config_path: str = ""


def decision_interval_s(settings: Settings, tick_s: float) -> float:
    """The time the engine may take after evidence is confirmable before it must have acted: the
    longest settle window plus a tick plus the executor's cordon."""
    tr = settings.triage
    return max(tr.failure_settle_s, settings.safety.settle_s, tr.network_settle_s) + tick_s + 5.0


def make_policy(spec: PolicySpec) -> Policy:
    if spec.kind == "manual":
        return Manual()
    if spec.kind == "npd-draino":
        return NpdDraino()
    return Fleetmedic(spec.settings or Settings(), spec.name)


@contextlib.contextmanager
def _few_collections() -> Iterator[None]:
    """Run with the cyclic collector's first threshold at 100,000 allocations and almost no full
    collections: a replay of thousands of nodes allocates a lock-step job's placement (a record a
    rank) at each of its restarts and keeps its state's records for the whole replay, which the
    default thresholds walk again and again (a fifth of a 20,000-node replay's time); a replay's
    garbage is freed by reference counts, the collector only takes what cycles are left."""
    before = gc.get_threshold()
    gc.set_threshold(100_000, 50, 100)
    try:
        yield
    finally:
        gc.set_threshold(*before)


def replay(history: History, mapping: Mapping, assumptions: Assumptions, policies: Sequence[PolicySpec],
           progress: Callable[[str, float], None] | None = None) -> dict[str, Any]:
    settings = next((p.settings for p in policies if p.settings is not None), None) or Settings()
    interval = decision_interval_s(settings, assumptions.tick_s)
    results: dict[str, Any] = {}
    unmapped: dict[str, int] = {}
    for spec in policies:
        policy = make_policy(spec)
        world = World(history, mapping, assumptions, policy, interval,
                      confirm_s=settings.detection.reassert_s)
        unmapped = world.unmapped
        t0 = time.process_time()
        with _few_collections():
            world.run(functools.partial(progress, spec.name) if progress else None)
        out = outcome(world, policy)
        out["cpu_s"] = round(time.process_time() - t0, 2)
        if spec.config_path:
            out["config"] = spec.config_path
        results[spec.name] = out
    return {
        "policies": results,
        "assumptions": {**assumptions.as_dict(), "decision_interval_s": interval,
                        "confirm_s": settings.detection.reassert_s},
        "history": {"source": history.source, "format": history.format, "faults": len(history.faults),
                    "nodes_named": len(history.nodes), "days": round(history.days, 2), "bad_rows": len(history.bad)},
        "mapping": {"name": mapping.name, "entries": {k: {"evidence": e.evidence, "effect": e.effect,
                                                          "reason": e.reason} for k, e in mapping.entries.items()}},
        "unmapped": unmapped,
    }


def _phase(xs: list[float]) -> dict[str, float | int | None]:
    if not xs:
        return {"n": 0, "p50_s": None, "mean_s": None, "max_s": None}
    return {"n": len(xs), "p50_s": round(statistics.median(xs), 1), "mean_s": round(statistics.fmean(xs), 1),
            "max_s": round(max(xs), 1)}


def outcome(world: World, policy: Policy) -> dict[str, Any]:
    span = world.end - world.history.start
    a = world.a
    big = world.jobs[0]
    total_job_gpu_s = sum(j.gpus for j in world.jobs) * span
    fleet_gpu_s = len(world.nodes) * a.gpus_per_node * span
    lost: dict[str, float] = dict.fromkeys(JOB_BUCKETS[1:], 0.0)
    for j in world.jobs:
        for k in lost:
            lost[k] += j.buckets[k]
    tally = world.tally
    lost_h = {k: round(v / 3600, 1) for k, v in lost.items()}
    lost_h["healthy_held_by_false_isolation"] = round(tally.false_held_s * a.gpus_per_node / 3600, 1)
    out: dict[str, Any] = {
        "ettr": round(big.buckets["useful"] / (big.gpus * span), 4),
        "ettr_fleet": round(sum(j.buckets["useful"] for j in world.jobs) / total_job_gpu_s, 4),
        "gpu_hours_lost": lost_h,
        "interruptions": sum(j.interruptions for j in world.jobs),
        "interruptions_big_job": big.interruptions,
        "mttr": {k: _phase(v) for k, v in tally.mttr_phases.items()},
        "dangerous_schedulable_node_hours": round(tally.dangerous_s / 3600, 2),
        "dangerous_past_decision_node_hours": round(tally.dangerous_past_decision_s / 3600, 2),
        "dangerous_after_passed_diagnostics_node_hours": round(tally.dangerous_after_passed_diagnostics_s / 3600, 2),
        "degraded_schedulable_node_hours": round(tally.degraded_s / 3600, 2),
        "degraded_past_decision_node_hours": round(tally.degraded_past_decision_s / 3600, 2),
        "schedulable_by_evidence_node_hours": {k: [round(v[0] / 3600, 2), round(v[1] / 3600, 2)]
                                               for k, v in sorted(tally.schedulable_by_evidence.items())},
        "silent_schedulable_node_hours": round(tally.silent_schedulable_s / 3600, 2),
        "false_isolation_gpu_hours": lost_h["healthy_held_by_false_isolation"],
        "false_isolation_share": round(tally.false_held_s * a.gpus_per_node / fleet_gpu_s, 5),
        "validation_after_repair_node_hours": round(tally.validation_held_s / 3600, 1),
        "unschedulable_node_hours": {k: round(v / 3600, 1) for k, v in sorted(
            tally.unschedulable_by.items(), key=lambda kv: -kv[1])},
        "isolations": tally.isolations,
        "false_isolations": tally.false_isolations,
        "repairs": tally.repairs,
        "diagnostics": tally.diagnostics,
        "placements_on_faulty_nodes": {
            "total": tally.placements_on_faulty,
            "suspected_at_placement": tally.placements_on_suspected,
            "suspected_at_placement_by": dict(sorted(tally.placements_on_suspected_by.items())),
            "not_yet_detected": dict(sorted(tally.placements_on_undetected.items())),
        },
    }
    out["timeline"] = [[round(t, 0), n, round(u, 1)] for t, n, u in world.timeline]
    if isinstance(policy, Fleetmedic):
        engine = policy.engine_pipeline.engine
        out["commands"] = dict(sorted(policy.commands.items()))
        out["refused_isolations"] = dict(sorted(policy.refused.items(), key=lambda kv: -kv[1])[:20])
        out["breaker_trips"] = policy.breaker_trips
        out["breaker_reasons"] = dict(sorted(policy.breaker_reasons.items(), key=lambda kv: -kv[1])[:10])
        out["budget"] = {"fleet_size": engine.fleet_size}
    return out
