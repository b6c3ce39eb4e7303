"""The executor's Prometheus metrics, on an injected registry (never the global one)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from fleetmedic.executor.workload.placement_metrics import PlacementMetrics

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)


class ExecutorMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.commands = Counter("fleetmedic_executor_commands_total", "Commands handled, by action and outcome",
                                ["action", "outcome"], registry=registry)
        self.latency = Histogram("fleetmedic_executor_action_seconds", "Time from receiving a command to its result",
                                 ["action"], buckets=LATENCY_BUCKETS, registry=registry)
        self.failures = Counter("fleetmedic_executor_failures_total",
                                "Commands that failed, and errors talking to the API server or the broker",
                                ["action"], registry=registry)
        self.leader = Gauge("fleetmedic_executor_leader", "1 while this replica holds the leader Lease",
                            registry=registry)
        self.drains = Gauge("fleetmedic_executor_drains_in_progress", "Node drains in progress", registry=registry)
        self.rejected = Counter("fleetmedic_executor_rejected_total",
                                "Commands not acted on: bad signature, expired, undecodable, addressed to "
                                "another cluster (cluster)",
                                ["reason"], registry=registry)
        self.redelivered = Counter("fleetmedic_executor_redelivered_total",
                                   "Commands delivered again after their result was on the broker (an offset "
                                   "commit lost to a broker restart): not handled or answered twice",
                                   registry=registry)
        self.placement = PlacementMetrics(registry)  # topology-aware restarts (workload/placement_apply.py)
        # hardening: the consume loop survives any record
        self.record_errors = Counter("fleetmedic_record_errors_total", "Records whose handling raised: "
                                     "dead-lettered with the exception, the loop went on; per stage and exception type",
                                     ["stage", "exception"], registry=registry)
        self.dead_letters_failed = Counter("fleetmedic_executor_dead_letters_failed_total",
                                           "Dead letters the broker refused (logged with the record's place and hash)",
                                           registry=registry)
        self.commit_failures = Counter("fleetmedic_executor_commit_failures_total",
                                       "Offset commits that failed or timed out (the broker away): retried at the "
                                       "next round of the loop, which goes on renewing the Lease", ["reason"],
                                       registry=registry)

    def observe(self, action: str, outcome: str, seconds: float) -> None:
        self.commands.labels(action=action, outcome=outcome).inc()
        self.latency.labels(action=action).observe(seconds)
        if outcome == "failed":
            self.failures.labels(action=action).inc()
