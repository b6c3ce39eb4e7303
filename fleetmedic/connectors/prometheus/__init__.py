"""Prometheus: the text exposition reader every Prometheus path shares, the HTTP API client, scraping
(``fleetmedic exporter prometheus``) and a server's history.
"""
