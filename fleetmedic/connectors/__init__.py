"""fleetmedic.connectors"""
