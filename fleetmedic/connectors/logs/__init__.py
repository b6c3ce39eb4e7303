"""Training jobs' logs: the log exporter (``fleetmedic exporter logs``) and its reading of failures
from log lines.
"""
