"""``fleetmedic config check FILE``: validate a config and print the effective settings."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from fleetmedic.config import ConfigError, Settings, read_config, to_yaml
from fleetmedic.signing import load_key

EXIT_INVALID = 2


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    config = sub.add_parser("config", help="validate and print configuration")
    config_sub = config.add_subparsers(dest="config_command", metavar="ACTION")
    config_sub.required = True
    check = config_sub.add_parser(
        "check",
        help="validate FILE (with FLEETMEDIC__* environment overrides) and print the effective config",
    )
    check.add_argument("file", help="YAML config file")
    check.add_argument("--quiet", action="store_true", help="print nothing when valid")
    check.set_defaults(handler=run_check)


def settings_or_none(path: str | None) -> Settings | None:
    """The config at ``path`` (defaults when None) with environment overrides, or None after
    printing the error (callers exit with :data:`EXIT_INVALID`)."""
    try:
        return read_config(path, os.environ)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None


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


def run_check(args: argparse.Namespace) -> int:
    try:
        settings = read_config(args.file, os.environ)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_INVALID
    if not args.quiet:
        sys.stdout.write(to_yaml(settings))
    return 0
