"""Errors the connectors share (pure: importable without the adapters' libraries)."""

from __future__ import annotations


class SourceUnavailable(RuntimeError):
    """A connector's source cannot be used at all (no driver, no permission); the message says why
    and what to do. ``fleetmedic exporter`` exits 3 with it."""
