"""EngineMetrics: the decision engine's state as gauges, from a real engine's report."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from fleetmedic.config import Settings
from fleetmedic.remediation.engine import DecisionEngine
from fleetmedic.streams.engine_metrics import EngineMetrics


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


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
    assert _value(registry, "fleetmedic_node_time_seconds", kind="dangerous_but_schedulable") == 0
    report["nodes"] = {"quarantined": 1}
    metrics.update(report, [("n1", "quarantined", 50.0)])
    assert _value(registry, "fleetmedic_node_state_since_timestamp_seconds", node="n3", state="diagnosing") is None
    assert _value(registry, "fleetmedic_nodes", state="healthy") == 9
