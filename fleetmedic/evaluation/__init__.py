"""fleetmedic.evaluation"""
