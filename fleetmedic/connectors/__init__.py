"""Connectors: the exporters and ingest paths that turn a telemetry source into fleetmedic records.

One subpackage per source (``nvml``, ``prometheus``, ``remote_write``, ``kernel``,
``kafka_telemetry``, ``kube``, ``infiniband``, ``logs``), each an I/O module over pure mapping
modules; the pieces they share sit here: :mod:`~fleetmedic.connectors.runtime` (outbox, produce
loop, backoff, metrics) and :mod:`~fleetmedic.connectors.errors`.
"""
