"""Prometheus remote write 1.0: the receiver (``fleetmedic exporter remote-write``), its wire codec,
its authentication and the assembler of series into records.
"""
