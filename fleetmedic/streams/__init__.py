"""fleetmedic.streams"""
