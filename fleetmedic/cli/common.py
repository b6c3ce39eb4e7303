"""What every subcommand shares: the exit code for bad input, config and key loading, logging options."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from fleetmedic.config import ConfigError, Settings, config_warnings, read_config
from fleetmedic.signing import load_key

EXIT_INVALID = 2
LOG_LEVELS = ("debug", "info", "warning", "error")


def add_loglevel(p: argparse.ArgumentParser) -> None:
    """``--loglevel``, the same on every long-running subcommand."""
    p.add_argument("--loglevel", default="info", choices=LOG_LEVELS, help="log level (default: info)")


def setup_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def settings_or_none(path: str | None) -> Settings | None:
    """The config at ``path`` (defaults when None) with environment overrides, or None after
    printing every error (callers exit with :data:`EXIT_INVALID`). Dangerous-but-valid settings
    (:func:`~fleetmedic.config.config_warnings`) are printed as warnings; the command still runs."""
    try:
        settings = read_config(path, os.environ)
    except ConfigError as exc:
        for line in exc.messages():
            print(f"error: {line}", file=sys.stderr)
        return None
    for warning in config_warnings(settings):
        print(f"warning: {warning}", file=sys.stderr)
    return settings


def signing_key(settings: Settings) -> bytes:
    """The command signing key from ``signing.key_file`` or the env var ``signing.key_env``."""
    s = settings.signing
    if s.key_file:
        return load_key(Path(s.key_file).read_bytes())
    text = os.environ.get(s.key_env, "")
    if not text:
        raise ValueError(f"signing key: set signing.key_file or the environment variable {s.key_env}")
    return load_key(text)


def settings_and_key(path: str | None, need_key: bool = True) -> tuple[Settings, bytes] | None:
    """The config (as :func:`settings_or_none`) and the signing key (``b""`` unless ``need_key``),
    or None after printing what is wrong (callers exit with :data:`EXIT_INVALID`)."""
    settings = settings_or_none(path)
    if settings is None:
        return None
    try:
        return settings, signing_key(settings) if need_key else b""
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None
