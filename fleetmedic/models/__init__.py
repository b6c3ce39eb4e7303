"""fleetmedic.models"""
