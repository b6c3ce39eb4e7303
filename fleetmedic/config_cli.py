"""``fleetmedic config check FILE``: validate a config and print the effective settings."""

from __future__ import annotations

import argparse
import os
import sys

from fleetmedic.config import ConfigError, Settings, read_config, to_yaml

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


def run_check(args: argparse.Namespace) -> int:
    try:
        settings = read_config(args.file, os.environ)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_INVALID
    if not args.quiet:
        sys.stdout.write(to_yaml(settings))
    return 0
