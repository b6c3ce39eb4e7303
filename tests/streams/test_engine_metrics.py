"""EngineMetrics: the decision engine's state for Prometheus, from a real engine's report: gauges
for what is true now, counters for what the engine counts (continuing across a restart from its
snapshot), histograms of recovery time observed once per completed recovery."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from fleetmedic.config import Settings
from fleetmedic.remediation.engine import DecisionEngine
from fleetmedic.streams.engine_metrics import RECOVERY_BUCKETS, EngineMetrics


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def _types(registry: CollectorRegistry) -> dict[str, str]:
    """Metric family -> type, as a scraper parses the exposition."""
    return {f.name: f.type for f in text_string_to_metric_families(generate_latest(registry).decode())}


def test_gauges_follow_the_engine_and_drop_nodes_that_recovered() -> None:
    registry = CollectorRegistry()
    metrics = EngineMetrics(registry)
    engine = DecisionEngine(Settings())
    report = engine.report(100.0)
    report["budget"]["fleet_size"] = 10  # the engine learns the fleet size from topology; set it directly
    report["nodes"] = {"quarantined": 2, "diagnosing": 1}
    metrics.update(report, [("n1", "quarantined", 50.0), ("n2", "quarantined", 60.0), ("n3", "diagnosing", 70.0)])
    assert _value(registry, "fleetmedic_nodes", state="healthy") == 7
    assert _value(registry, "fleetmedic_nodes", state="quarantined") == 2
    assert _value(registry, "fleetmedic_nodes", state="probation") == 0
    assert _value(registry, "fleetmedic_node_state_since_timestamp_seconds", node="n3", state="diagnosing") == 70
    assert _value(registry, "fleetmedic_breaker_open") == 0
    assert _value(registry, "fleetmedic_quarantine_max_held") == report["budget"]["max_held"]
    assert _value(registry, "fleetmedic_node_time_seconds_total", kind="dangerous_but_schedulable") == 0
    report["nodes"] = {"quarantined": 1}
    metrics.update(report, [("n1", "quarantined", 50.0)])
    assert _value(registry, "fleetmedic_node_state_since_timestamp_seconds", node="n3", state="diagnosing") is None
    assert _value(registry, "fleetmedic_nodes", state="healthy") == 9


def _recover(engine: DecisionEngine, job: str, fault_at: float, detected_at: float, done_at: float) -> None:
    """One job recovery through the engine's accounting: fault, incident, restart, placement, start,
    first good step (at ``done_at``)."""
    acc = engine.accounting
    acc.recovery_started(job, f"inc-{job}", 1, fault_at, detected_at, [], detected_at + 1.0)
    acc.job_progress(job, "placement", 2, detected_at + 2.0)
    acc.job_progress(job, "start", 2, detected_at + 3.0)
    assert acc.job_progress(job, "progress", 2, done_at) == f"inc-{job}"


def _update(metrics: EngineMetrics, engine: DecisionEngine, now: float) -> None:
    metrics.update(engine.report(now), [], engine.accounting.recoveries())


def test_cumulative_counts_are_counters_that_continue_across_a_restart() -> None:
    engine = DecisionEngine(Settings())
    registry = CollectorRegistry()
    metrics = EngineMetrics(registry)
    # nothing before the first report: a restarted stage must not show 0 and then its count (a reset)
    assert _value(registry, "fleetmedic_breaker_trips_total") is None
    engine.gate.breaker.state.trips = 2
    acc = engine.accounting
    acc.isolation_started("n1", "hardware", 10.0)
    acc.isolated("n1", 40.0)
    acc.verdict("n1", passed=False, first_try=True, now=100.0)  # confirmed bad: 30 s dangerous but schedulable
    acc.isolation_started("n2", "hardware", 10.0)
    acc.verdict("n2", passed=True, first_try=True, now=100.0)
    acc.repeat_placement()
    _update(metrics, engine, 200.0)
    assert _value(registry, "fleetmedic_breaker_trips_total") == 2
    assert _value(registry, "fleetmedic_isolations_total") == 2
    assert _value(registry, "fleetmedic_isolation_outcomes_total", outcome="confirmed_bad") == 1
    assert _value(registry, "fleetmedic_isolation_outcomes_total", outcome="healthy_first_try") == 1
    assert _value(registry, "fleetmedic_repeats_total", kind="placements_on_isolated_nodes") == 1
    assert _value(registry, "fleetmedic_repeats_total", kind="failures_on_isolated_nodes") == 0
    assert _value(registry, "fleetmedic_node_time_seconds_total", kind="dangerous_but_schedulable") == 30
    types = _types(registry)
    for family in ("fleetmedic_breaker_trips", "fleetmedic_isolations", "fleetmedic_isolation_outcomes",
                   "fleetmedic_isolations_definitive", "fleetmedic_repeats", "fleetmedic_node_time_seconds"):
        assert types[family] == "counter", family
    assert types["fleetmedic_mttr_seconds"] == "histogram" and types["fleetmedic_breaker_open"] == "gauge"
    # a restart: the engine comes back from its snapshot, the counters go on from its counts
    restored = DecisionEngine.from_bytes(engine.to_bytes(), Settings())
    registry = CollectorRegistry()
    metrics = EngineMetrics(registry)
    restored.accounting.repeat_placement()
    _update(metrics, restored, 300.0)
    assert _value(registry, "fleetmedic_repeats_total", kind="placements_on_isolated_nodes") == 2
    assert _value(registry, "fleetmedic_breaker_trips_total") == 2


def test_each_recovery_is_observed_once_into_the_histogram_and_none_again_after_a_restart() -> None:
    engine = DecisionEngine(Settings())
    registry = CollectorRegistry()
    metrics = EngineMetrics(registry)
    _recover(engine, "team/a", fault_at=0.0, detected_at=12.0, done_at=100.0)  # before this process
    _update(metrics, engine, 100.0)
    assert _value(registry, "fleetmedic_mttr_seconds_count", phase="detect") == 0  # present, at 0
    _recover(engine, "team/b", fault_at=200.0, detected_at=204.0, done_at=400.0)
    _recover(engine, "team/c", fault_at=200.0, detected_at=290.0, done_at=400.0)
    _update(metrics, engine, 400.0)
    _update(metrics, engine, 410.0)  # nothing new: nothing observed twice
    assert _value(registry, "fleetmedic_mttr_seconds_count", phase="detect") == 2
    assert _value(registry, "fleetmedic_mttr_seconds_sum", phase="detect") == 4.0 + 90.0
    assert _value(registry, "fleetmedic_mttr_seconds_bucket", phase="detect", le="5.0") == 1
    assert _value(registry, "fleetmedic_mttr_seconds_bucket", phase="detect", le="60.0") == 1
    assert _value(registry, "fleetmedic_mttr_seconds_bucket", phase="detect", le="120.0") == 2
    assert _value(registry, "fleetmedic_mttr_seconds_bucket", phase="detect", le="+Inf") == 2
    assert _value(registry, "fleetmedic_mttr_seconds_count", phase="first_good_step") == 2
    assert len(RECOVERY_BUCKETS) >= 10 and RECOVERY_BUCKETS[-1] >= 86400
    # after a restart the snapshot's recoveries are not observed again, the next one is
    restored = DecisionEngine.from_bytes(engine.to_bytes(), Settings())
    registry = CollectorRegistry()
    metrics = EngineMetrics(registry)
    _update(metrics, restored, 500.0)
    assert _value(registry, "fleetmedic_mttr_seconds_count", phase="detect") == 0
    _recover(restored, "team/d", fault_at=500.0, detected_at=507.0, done_at=700.0)
    _update(metrics, restored, 700.0)
    assert _value(registry, "fleetmedic_mttr_seconds_count", phase="detect") == 1
    assert _value(registry, "fleetmedic_mttr_seconds_sum", phase="detect") == 7.0
    assert restored.accounting.recoveries()["detect"][0] == 4
