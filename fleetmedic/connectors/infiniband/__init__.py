"""InfiniBand: the port exporter (``fleetmedic exporter infiniband``) and its parser of ``perfquery``
output.
"""
