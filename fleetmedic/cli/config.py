"""``fleetmedic config check FILE``: validate a config and print the effective settings.
``fleetmedic config reference``: the generated reference of every setting (docs/config-reference.md)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from fleetmedic.cli.common import EXIT_INVALID, examples
from fleetmedic.config import ConfigError, config_warnings, read_config, to_yaml

#: ``config check --strict`` with a dangerous-but-valid setting (:func:`fleetmedic.config.config_warnings`)
EXIT_WARNINGS = 1


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    config = sub.add_parser("config", help="validate and print configuration; the reference of every setting",
                            epilog=examples("fleetmedic config check --config my.yaml",
                                            "fleetmedic config reference --out docs/config-reference.md"))
    config_sub = config.add_subparsers(dest="config_command", metavar="ACTION")
    config_sub.required = True
    check = config_sub.add_parser(
        "check",
        help="validate FILE (with FLEETMEDIC__* environment overrides) and print the effective config",
        description="Validate FILE with FLEETMEDIC__* environment overrides and print the effective config. "
        "Every error is listed (exit 2). Valid but dangerous settings are printed as warnings on stderr "
        "(exit 0, or 1 with --strict).",
        epilog=examples("fleetmedic config check --config my.yaml",
                        "fleetmedic config check --strict --quiet --config my.yaml",
                        "FLEETMEDIC__SAFETY__DRY_RUN=false fleetmedic config check --config my.yaml"),
    )
    check.add_argument("file", nargs="?", metavar="FILE", help="YAML config file (or --config FILE)")
    check.add_argument("--config", metavar="FILE", dest="config_file", help="YAML config file")
    check.add_argument("--quiet", action="store_true", help="print nothing when valid (warnings still go to stderr)")
    check.add_argument("--strict", action="store_true",
                       help=f"exit {EXIT_WARNINGS} when a valid setting is dangerous (a warning)")
    check.set_defaults(handler=run_check)
    ref = config_sub.add_parser(
        "reference",
        help="write the reference of every setting (type, bounds, default, what it does)",
        description="Write the reference of every setting: its type, bounds and default from fleetmedic's config "
                    "types, what it does from the comments of the shipped example config. With --check, compare "
                    "instead and exit 1 when a file differs (CI). With --chart-schema, also write (or check) the "
                    "config part of the Helm chart's values.schema.json, generated from the same types.",
        epilog=examples("fleetmedic config reference --out docs/config-reference.md "
                        "--chart-schema deploy/helm/fleetmedic/values.schema.json",
                        "fleetmedic config reference --check --out docs/config-reference.md "
                        "--chart-schema deploy/helm/fleetmedic/values.schema.json"),
    )
    ref.add_argument("--out", metavar="FILE", help="the Markdown file to write (default: standard output)")
    ref.add_argument("--example", metavar="FILE",
                     help="the commented example config to read descriptions from (default: the repository's "
                          "deploy/config/fleetmedic.yaml)")
    ref.add_argument("--chart-schema", metavar="FILE",
                     help="the Helm chart's values.schema.json: its `config` property is replaced by the "
                          "config's JSON Schema")
    ref.add_argument("--check", action="store_true", help="write nothing; exit 1 when a file is not what it would be")
    ref.set_defaults(handler=run_reference)


def run_check(args: argparse.Namespace) -> int:
    if bool(args.file) == bool(args.config_file):
        print("error: name one config file: --config FILE (or FILE)", file=sys.stderr)
        return EXIT_INVALID
    args.file = args.file or args.config_file
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


def run_reference(args: argparse.Namespace) -> int:
    from fleetmedic.cli.config_reference import EXAMPLE, chart_schema_text, reference, render

    example = Path(args.example) if args.example else EXAMPLE
    try:
        text = render(reference(example.read_text(encoding="utf-8")))
    except OSError as exc:
        print(f"error: the example config: {exc}", file=sys.stderr)
        return EXIT_INVALID
    wanted: list[tuple[Path, str]] = []
    if args.out:
        wanted.append((Path(args.out), text))
    elif not args.check:
        sys.stdout.write(text)
    if args.chart_schema:
        path = Path(args.chart_schema)
        try:
            wanted.append((path, chart_schema_text(path.read_text(encoding="utf-8"))))
        except (OSError, ValueError) as exc:
            print(f"error: {path}: {exc}", file=sys.stderr)
            return EXIT_INVALID
    stale = [path for path, content in wanted
             if not path.exists() or path.read_text(encoding="utf-8") != content]
    if args.check:
        for path in stale:
            print(f"error: {path} is stale: regenerate it with `fleetmedic config reference` (see --help)",
                  file=sys.stderr)
        return 1 if stale else 0
    for path, content in wanted:
        path.write_text(content, encoding="utf-8")
    return 0
