"""fleetmedic.executor.node"""
