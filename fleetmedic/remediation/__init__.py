"""fleetmedic.remediation"""
