"""Telemetry from a user's Kafka topics (``fleetmedic exporter kafka``) and its mapping of their JSON
formats.
"""
