"""``fleetmedic config check FILE``: validate a config and print the effective settings."""

from __future__ import annotations

import argparse
import os
import sys

from fleetmedic.cli.common import EXIT_INVALID
from fleetmedic.config import ConfigError, config_warnings, read_config, to_yaml

#: ``config check --strict`` with a dangerous-but-valid setting (:func:`fleetmedic.config.config_warnings`)
EXIT_WARNINGS = 1


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    config = sub.add_parser("config", help="validate and print configuration")
    config_sub = config.add_subparsers(dest="config_command", metavar="ACTION")
    config_sub.required = True
    check = config_sub.add_parser(
        "check",
        help="validate FILE (with FLEETMEDIC__* environment overrides) and print the effective config",
        description="Validate FILE with FLEETMEDIC__* environment overrides and print the effective config. "
        "Every error is listed (exit 2). Valid but dangerous settings are printed as warnings on stderr "
        "(exit 0, or 1 with --strict).",
    )
    check.add_argument("file", help="YAML config file")
    check.add_argument("--quiet", action="store_true", help="print nothing when valid (warnings still go to stderr)")
    check.add_argument("--strict", action="store_true",
                       help=f"exit {EXIT_WARNINGS} when a valid setting is dangerous (a warning)")
    check.set_defaults(handler=run_check)


def run_check(args: argparse.Namespace) -> int:
    try:
        settings = read_config(args.file, os.environ)
    except ConfigError as exc:
        for line in exc.messages():
            print(f"error: {line}", file=sys.stderr)
        return EXIT_INVALID
    warnings = config_warnings(settings)
    for warning in warnings:
        print(f"warning: {args.file}: {warning}", file=sys.stderr)
    if not args.quiet:
        sys.stdout.write(to_yaml(settings))
    return EXIT_WARNINGS if warnings and args.strict else 0
