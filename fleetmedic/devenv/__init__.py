"""fleetmedic.devenv"""
