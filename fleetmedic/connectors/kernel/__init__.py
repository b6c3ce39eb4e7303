"""Kernel logs: the kernel-log exporter (``fleetmedic exporter kmsg``), its mapping of lines to kernel
events, and the line formats it reads.
"""
