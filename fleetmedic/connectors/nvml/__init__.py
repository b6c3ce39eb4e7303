"""NVML: the node exporter that reads the GPUs through NVML (``fleetmedic exporter nvml``), its seam
and its record making.
"""
