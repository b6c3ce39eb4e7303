"""The pipeline's Prometheus metrics, registered on an injected :class:`CollectorRegistry`.

Nothing registers on prometheus_client's global registry: the worker creates one registry and
serves it (``metrics.bind_address``/``metrics.port``); tests pass their own.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class PipelineMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.messages_in = Counter("fleetmedic_messages_in", "Messages consumed, per topic and stage",
                                   ["topic", "stage"], registry=registry)
        self.messages_out = Counter("fleetmedic_messages_out", "Messages produced, per topic",
                                    ["topic"], registry=registry)
        self.dead_letters = Counter("fleetmedic_dead_letters", "Messages sent to the dead-letter topic",
                                    ["topic", "stage"], registry=registry)
        self.findings = Counter("fleetmedic_findings", "Findings produced, per detector and severity",
                                ["detector", "severity"], registry=registry)
        self.incidents = Counter("fleetmedic_incidents", "Incident updates published, per class",
                                 ["incident_class"], registry=registry)
        self.commands = Counter("fleetmedic_commands", "Signed remediation commands issued, per action",
                                ["action"], registry=registry)
        self.latency = Histogram("fleetmedic_processing_seconds", "Processing time of one batch or message",
                                 ["stage"], registry=registry,
                                 buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5))
        self.snapshots = Counter("fleetmedic_engine_snapshots", "Decision engine state snapshots written",
                                 registry=registry)
        self.state_bytes = Counter("fleetmedic_state_bytes_written", "Bytes of state snapshots written, per stage",
                                   ["stage"], registry=registry)
        self.checkpoint_failures = Counter("fleetmedic_checkpoint_failures", "Checkpoints (state, then offsets) "
                                           "that failed and were carried on from, per stage and when",
                                           ["stage", "when"], registry=registry)
        self.nodes_restored = Counter("fleetmedic_nodes_restored", "Stage-1 node states loaded at assignment",
                                      registry=registry)
        self.nodes_evicted = Counter("fleetmedic_stage1_nodes_evicted", "Nodes stage 1 forgot (their saved state "
                                     "deleted; one that returns starts fresh), per reason: silence "
                                     "(detection.evict_node_after_s), capacity (detection.max_nodes_per_worker)",
                                     ["reason"], registry=registry)
        self.nodes_tracked = Gauge("fleetmedic_stage1_nodes_tracked", "Nodes this stage-1 worker keeps state for",
                                   registry=registry)
        self.lag = Gauge("fleetmedic_consumer_lag", "Messages on a partition not yet processed, per stage",
                         ["topic", "partition", "stage"], registry=registry)
        self.duplicate_findings = Counter("fleetmedic_duplicate_findings",
                                          "Findings dropped by the decision stage: the same id was handled before",
                                          registry=registry)
        self.suppressed = Counter("fleetmedic_commands_suppressed",
                                  "Commands rebuilt after a restart whose id was already on the commands topic",
                                  registry=registry)
        self.model_bytes = Gauge("fleetmedic_model_state_bytes", "Stage 1: bytes of the multivariate model's "
                                 "training rows last written to the state topic (all partitions)", registry=registry)
        self.audit_suppressed = Counter("fleetmedic_audit_suppressed",
                                        "Audit records rebuilt after a restart that were already on the audit topic",
                                        registry=registry)
        # hardening: what a stage survived instead of crashing or stalling
        self.record_errors = Counter("fleetmedic_record_errors", "Records whose handling raised: dead-lettered with "
                                     "the exception, the stage went on; per stage and exception type",
                                     ["stage", "exception"], registry=registry)
        self.dead_letters_failed = Counter("fleetmedic_dead_letters_failed", "Dead letters the producer refused or "
                                           "could not queue (logged with the record's place and hash)",
                                           ["topic", "stage"], registry=registry)
        self.skipped = Counter("fleetmedic_records_skipped", "Records consumed and left alone on purpose, per "
                               "topic, stage and reason: other_cluster (labelled with a cluster other than "
                               "cluster.name: another cluster's, on a shared topic)",
                               ["topic", "stage", "reason"], registry=registry)
        self.ahead_of_clock = Counter("fleetmedic_records_ahead_of_clock", "Records stamped more than "
                                      "streams.max_future_skew_s ahead of the clock: dead-lettered, no clock moved",
                                      ["topic", "stage"], registry=registry)
        self.replayed = Counter("fleetmedic_replayed_samples", "Stage 1: GPU samples stamped before their node's "
                                "latest sample in its baselines (a replay after a restart, whose node state was "
                                "saved past the committed offset): not taken twice", registry=registry)
        self.state_unreadable = Counter("fleetmedic_state_unreadable", "Saved state that could not be read and "
                                        "started fresh (alert on any): per stage and part (snapshot, engine, fleet, "
                                        "node, model)", ["stage", "part"], registry=registry)
        self.snapshot_size = Gauge("fleetmedic_engine_snapshot_bytes", "Size of the decision stage's last snapshot "
                                   "(encoded, whether written or not); the topic takes at most "
                                   "fleetmedic_engine_snapshot_limit_bytes", registry=registry)
        self.snapshot_limit = Gauge("fleetmedic_engine_snapshot_limit_bytes", "The largest record the decision "
                                    "stage writes to the state topic (a larger snapshot is written in parts)",
                                    registry=registry)
        self.snapshot_parts = Gauge("fleetmedic_engine_snapshot_parts", "Records the decision stage's last snapshot "
                                    "took on the state topic (1: whole; more: written in parts)", registry=registry)
        self.snapshots_skipped = Counter("fleetmedic_engine_snapshots_skipped", "Decision snapshots not written "
                                         "(the previous one stays; the replay covers the gap), per reason: "
                                         "broker", ["reason"], registry=registry)
