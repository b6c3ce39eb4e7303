"""fleetmedic.executor.workload"""
