"""Metrics of topology-aware restarts (:mod:`fleetmedic.executor.workload.placement_apply`), on an injected registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

WAIT_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 900.0, 3600.0)


class PlacementMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.waits = Counter("fleetmedic_executor_capacity_waits_total",
                             "Restarts whose replacement pods found no healthy capacity", ["action"], registry=registry)
        self.wait_seconds = Histogram("fleetmedic_executor_capacity_wait_seconds",
                                      "Time replacement pods waited for healthy capacity "
                                      "(up to placement.capacity_wait_s)",
                                      buckets=WAIT_BUCKETS, registry=registry)
        self.forced_exclusions = Counter("fleetmedic_executor_isolation_forced_total",
                                         "Excluded nodes not yet cordoned/tainted, kept off by a required "
                                         "anti-affinity", registry=registry)
        self.placements = Counter("fleetmedic_executor_placements_total",
                                  "Restarts planned with a topology preference, by capacity verdict",
                                  ["capacity"], registry=registry)
