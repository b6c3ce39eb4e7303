"""Gauges of the decision engine's state: what an operator watches and alerts on.

The decide stage calls :meth:`EngineMetrics.update` on every tick with the engine's
:meth:`~fleetmedic.remediation.engine.DecisionEngine.report` and its non-healthy nodes. The alert
rules in ``deploy/prometheus/alerts.yml`` and the dashboard in ``deploy/grafana/`` use these names
(a test checks that every metric they query is exported by some fleetmedic registry).

Per-node series exist only for nodes that are not healthy, which the quarantine budget bounds
(``safety.max_quarantined_count`` plus suspects), so their cardinality stays small.

``fleetmedic_isolation_refused_nodes{kind="definitive"}`` above 0 means a node whose device is gone
is still schedulable because safety refused its isolation (the breaker is open and blames its
evidence): every job placed there crashes. ``fleetmedic_node_time_seconds{kind="refused_definitive"}``
is that clock, integrated.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Gauge

NODE_STATES = ("healthy", "suspect", "quarantined", "diagnosing", "repair_needed", "probation")
MTTR_STATS = ("p50", "p95", "mean")


class EngineMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.nodes = Gauge("fleetmedic_nodes", "Nodes known to the decision engine, per lifecycle state",
                           ["state"], registry=registry)
        self.node_state_since = Gauge(
            "fleetmedic_node_state_since_timestamp_seconds",
            "When a node that is not healthy entered its current lifecycle state (engine time)",
            ["node", "state"], registry=registry)
        self.breaker_open = Gauge("fleetmedic_breaker_open", "1 while the isolation circuit breaker is open",
                                  registry=registry)
        self.breaker_trips = Gauge("fleetmedic_breaker_trips", "Times the circuit breaker has tripped",
                                   registry=registry)
        self.quarantine_held = Gauge("fleetmedic_quarantine_held",
                                     "Nodes fleetmedic holds isolated now on preventive or uncertain evidence "
                                     "(the budgeted ones)", registry=registry)
        self.quarantine_max = Gauge("fleetmedic_quarantine_max_held",
                                    "Most nodes fleetmedic may hold isolated (fraction and count limits)",
                                    registry=registry)
        self.isolations_window = Gauge("fleetmedic_isolations_in_window",
                                       "New isolations in the current sliding window", registry=registry)
        self.isolations_window_max = Gauge("fleetmedic_isolations_max_in_window",
                                           "New isolations allowed per sliding window", registry=registry)
        self.fleet_nodes = Gauge("fleetmedic_fleet_nodes", "Nodes in the fleet as the engine sees it",
                                 registry=registry)
        self.node_time = Gauge("fleetmedic_node_time_seconds",
                               "Node-time spent dangerous but schedulable, healthy but unschedulable, or "
                               "schedulable while safety refused the isolation (refused_<definitive|preventive|"
                               "uncertain>; the clock keeps running while the refusal lasts)",
                               ["kind"], registry=registry)
        self.refused = Gauge("fleetmedic_isolation_refused_nodes",
                             "Nodes whose isolation safety refuses now, by kind of evidence; they stay suspect and "
                             "schedulable (definitive: a node whose device is gone - alert on it)",
                             ["kind"], registry=registry)
        self.held_definitive = Gauge("fleetmedic_quarantine_held_definitive",
                                     "Nodes fleetmedic holds isolated on definitive evidence (outside the budget)",
                                     registry=registry)
        self.isolations = Gauge("fleetmedic_isolations", "Isolations by what diagnostics later showed",
                                ["outcome"], registry=registry)
        self.repeats = Gauge("fleetmedic_repeats", "Failures or placements on nodes fleetmedic had isolated",
                             ["kind"], registry=registry)
        self.mttr = Gauge("fleetmedic_mttr_seconds", "Recovery time per phase (recent recoveries)",
                          ["phase", "stat"], registry=registry)
        self.mttr_samples = Gauge("fleetmedic_mttr_samples", "Recoveries behind fleetmedic_mttr_seconds",
                                  ["phase"], registry=registry)
        self._since_labels: set[tuple[str, str]] = set()

    def update(self, report: Mapping[str, Any], unhealthy: Iterable[tuple[str, str, float]]) -> None:
        """``report``: the engine's report; ``unhealthy``: (node, state, since) of non-healthy nodes."""
        budget = report.get("budget", {})
        fleet = int(budget.get("fleet_size", 0))
        counts = {state: 0 for state in NODE_STATES}
        for state, n in report.get("nodes", {}).items():
            counts[state] = counts.get(state, 0) + int(n)
        counts["healthy"] = max(counts["healthy"], fleet - sum(v for k, v in counts.items() if k != "healthy"))
        for state, n in counts.items():
            self.nodes.labels(state).set(n)
        self.fleet_nodes.set(fleet)
        self.breaker_open.set(1.0 if budget.get("breaker_open") else 0.0)
        self.breaker_trips.set(float(report.get("breaker_trips", 0)))
        self.quarantine_held.set(float(budget.get("held", 0)))
        self.held_definitive.set(float(budget.get("definitive_held", 0)))
        for kind, n in (report.get("refused_now") or {}).items():
            self.refused.labels(kind).set(float(n))
        self.quarantine_max.set(float(budget.get("max_held", 0)))
        self.isolations_window.set(float(budget.get("new_in_window", 0)))
        self.isolations_window_max.set(float(budget.get("max_new_in_window", 0)))
        for kind, seconds in report.get("node_time", {}).items():
            self.node_time.labels(kind.removesuffix("_s")).set(float(seconds))
        for outcome, n in report.get("isolations", {}).items():
            self.isolations.labels(outcome).set(float(n))
        for kind, n in report.get("repeats", {}).items():
            self.repeats.labels(kind).set(float(n))
        for phase, summary in report.get("mttr_s", {}).items():
            self.mttr_samples.labels(phase).set(float(summary.get("count", 0)))
            for stat in MTTR_STATS:
                value = summary.get(stat)
                if value is not None:
                    self.mttr.labels(phase, stat).set(float(value))
        labels = set()
        for node, state, since in unhealthy:
            if state != "healthy":
                self.node_state_since.labels(node, state).set(since)
                labels.add((node, state))
        for gone in self._since_labels - labels:
            self.node_state_since.remove(*gone)
        self._since_labels = labels
