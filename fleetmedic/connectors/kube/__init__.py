"""Kubernetes jobs and nodes: the job watcher (``fleetmedic watch-jobs``) and its pure mappings of
jobs, nodes and node conditions.
"""
