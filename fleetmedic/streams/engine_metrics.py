"""The decision engine's state for Prometheus: what an operator watches and alerts on.

The decide stage calls :meth:`EngineMetrics.update` on every tick with the engine's
:meth:`~fleetmedic.remediation.engine.DecisionEngine.report`, its non-healthy nodes and its
recoveries (:meth:`~fleetmedic.remediation.accounting.Accounting.recoveries`). The alert rules in
``deploy/prometheus/alerts.yml`` and the dashboard in ``deploy/grafana/`` use these names (a test
checks that every metric they query is exported by some fleetmedic registry).

- **Gauges** for what is true now: nodes per lifecycle state, the breaker, the budget.
- **Counters** (``_total``) for what the engine counts cumulatively in its state (breaker trips,
  isolations and what diagnostics showed, repeats, node-time): each is exposed as the engine's own
  count, which survives a restart with its snapshot, so a restarted decide stage neither resets
  them nor counts them twice; ``increase()``/``rate()`` give any window.
- **Histograms** for recovery time per phase (``fleetmedic_mttr_seconds{phase}``; ``detect`` is the
  detection delay, first evidence to incident): every recovery is observed once, when it completes,
  into :data:`RECOVERY_BUCKETS`, so ``histogram_quantile`` gives p50/p95 over any window. The
  recoveries completed before this process started are not observed again (they were, by the
  process before).

Per-node series exist only for nodes that are not healthy, which the quarantine budget bounds
(``safety.max_quarantined_count`` plus suspects), so their cardinality stays small.

``fleetmedic_isolation_refused_nodes{kind="definitive"}`` above 0 means a node whose device is gone
is still schedulable because safety refused its isolation (the breaker is open and blames its
evidence): every job placed there crashes. ``fleetmedic_node_time_seconds_total{kind="refused_definitive"}``
is that clock, integrated.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from fleetmedic.remediation.accounting import PHASES

NODE_STATES = ("healthy", "suspect", "quarantined", "diagnosing", "repair_needed", "probation")
#: seconds: a recovery phase takes from under a second (detection of an XID) to hours (waiting for capacity)
RECOVERY_BUCKETS = (1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0,
                    7200.0, 14400.0, 43200.0, 86400.0)
#: report["isolations"] keys that are outcomes of an isolation (its "total" is fleetmedic_isolations_total)
ISOLATION_OUTCOMES = ("confirmed_bad", "healthy_first_try", "for_software_or_job_bugs")


class EngineCounters(Collector):
    """The engine's cumulative counts as Prometheus counters, valued from its last report (nothing
    is exported before the first one)."""

    def __init__(self) -> None:
        self.report: Mapping[str, Any] | None = None

    def describe(self) -> Iterable[Any]:
        return list(self._families({}))

    def collect(self) -> Iterable[Any]:
        return list(self._families(self.report)) if self.report is not None else []

    @staticmethod
    def _families(report: Mapping[str, Any]) -> Iterator[CounterMetricFamily]:
        trips = CounterMetricFamily("fleetmedic_breaker_trips", "Times the circuit breaker has tripped")
        trips.add_metric([], float(report.get("breaker_trips", 0)))
        yield trips
        isolations = report.get("isolations", {})
        total = CounterMetricFamily("fleetmedic_isolations", "Nodes isolated (cordoned) by fleetmedic")
        total.add_metric([], float(isolations.get("total", 0)))
        yield total
        definitive = CounterMetricFamily("fleetmedic_isolations_definitive",
                                         "Isolations on definitive evidence (outside the budget)")
        definitive.add_metric([], float(report.get("budget", {}).get("definitive_isolations", 0)))
        yield definitive
        outcomes = CounterMetricFamily("fleetmedic_isolation_outcomes",
                                       "Isolations by what diagnostics later showed: confirmed_bad, healthy_first_try "
                                       "(held out of service for nothing), for_software_or_job_bugs",
                                       labels=["outcome"])
        for outcome in ISOLATION_OUTCOMES:
            outcomes.add_metric([outcome], float(isolations.get(outcome, 0)))
        yield outcomes
        repeats = CounterMetricFamily("fleetmedic_repeats", "Failures attributed to, or placements of a job onto, a "
                                      "node fleetmedic holds out of service (kind: failures_on_isolated_nodes, "
                                      "placements_on_isolated_nodes)", labels=["kind"])
        for kind, n in sorted(report.get("repeats", {}).items()):
            repeats.add_metric([kind], float(n))
        yield repeats
        node_time = CounterMetricFamily("fleetmedic_node_time_seconds",
                                        "Node-time spent dangerous but schedulable, healthy but unschedulable, or "
                                        "schedulable while safety refused the isolation (refused_<definitive|"
                                        "preventive|uncertain>; the clock runs while the refusal lasts)",
                                        labels=["kind"])
        for kind, seconds in sorted(report.get("node_time", {}).items()):
            node_time.add_metric([kind.removesuffix("_s")], float(seconds))
        yield node_time


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
        self.refused = Gauge("fleetmedic_isolation_refused_nodes",
                             "Nodes whose isolation safety refuses now, by kind of evidence; they stay suspect and "
                             "schedulable (definitive: a node whose device is gone - alert on it)",
                             ["kind"], registry=registry)
        self.held_definitive = Gauge("fleetmedic_quarantine_held_definitive",
                                     "Nodes fleetmedic holds isolated on definitive evidence (outside the budget)",
                                     registry=registry)
        self.held_confirmed = Gauge("fleetmedic_quarantine_held_confirmed",
                                    "Nodes fleetmedic holds isolated on preventive or uncertain evidence that failed "
                                    "diagnostics or a repair confirmed since (outside the budget)", registry=registry)
        self.mttr = Histogram("fleetmedic_mttr_seconds", "Recovery time per phase (detect: first evidence to "
                              "incident, the detection delay; isolate; wait_for_capacity; restore; first_good_step), "
                              "one observation per completed recovery", ["phase"], buckets=RECOVERY_BUCKETS,
                              registry=registry)
        for phase in PHASES:  # every phase's series from the start, at 0 (rate() needs a first sample)
            self.mttr.labels(phase)
        self.counters = EngineCounters()
        registry.register(self.counters)
        self._recovered: dict[str, int] | None = None  # per phase: recoveries already observed
        self._since_labels: set[tuple[str, str]] = set()

    def update(self, report: Mapping[str, Any], unhealthy: Iterable[tuple[str, str, float]],
               recoveries: Mapping[str, tuple[int, Sequence[float]]] | None = None) -> None:
        """``report``: the engine's report; ``unhealthy``: (node, state, since) of non-healthy nodes;
        ``recoveries``: per phase, (durations sampled ever, the recent ones), from
        :meth:`~fleetmedic.remediation.accounting.Accounting.recoveries`."""
        self.counters.report = report
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
        self.quarantine_held.set(float(budget.get("held", 0)))
        self.held_definitive.set(float(budget.get("definitive_held", 0)))
        self.held_confirmed.set(float(budget.get("confirmed_held", 0)))
        for kind, n in (report.get("refused_now") or {}).items():
            self.refused.labels(kind).set(float(n))
        self.quarantine_max.set(float(budget.get("max_held", 0)))
        self.isolations_window.set(float(budget.get("new_in_window", 0)))
        self.isolations_window_max.set(float(budget.get("max_new_in_window", 0)))
        if recoveries is not None:
            self._observe(recoveries)
        labels = set()
        for node, state, since in unhealthy:
            if state != "healthy":
                self.node_state_since.labels(node, state).set(since)
                labels.add((node, state))
        for gone in self._since_labels - labels:
            self.node_state_since.remove(*gone)
        self._since_labels = labels

    def _observe(self, recoveries: Mapping[str, tuple[int, Sequence[float]]]) -> None:
        """Observe the durations completed since the last update; on the first, only remember the
        counts (those recoveries were observed by the process that saw them complete)."""
        seen = self._recovered
        self._recovered = {phase: total for phase, (total, _) in recoveries.items()}
        if seen is None:
            return
        for phase, (total, recent) in recoveries.items():
            new = total - seen.get(phase, 0)
            if new <= 0:
                continue
            for seconds in recent[max(0, len(recent) - new):]:
                self.mttr.labels(phase).observe(seconds)
