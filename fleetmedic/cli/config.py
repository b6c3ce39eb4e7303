"""``fleetmedic config check FILE``: validate a config and print the effective settings."""

from __future__ import annotations

import argparse
import os
import sys

from fleetmedic.cli.common import EXIT_INVALID
from fleetmedic.config import ConfigError, read_config, to_yaml


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


def run_check(args: argparse.Namespace) -> int:
    try:
        settings = read_config(args.file, os.environ)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_INVALID
    if not args.quiet:
        sys.stdout.write(to_yaml(settings))
    return 0
