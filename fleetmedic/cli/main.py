"""The ``fleetmedic`` command line.

Each feature registers its own subcommand through an ``add_parser(subparsers)`` function, so this
module stays a thin index and ``fleetmedic --help`` lists only subcommands that exist.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from fleetmedic import __version__
from fleetmedic.cli.common import BOOTSTRAP_ENV, DRY_RUN_ENV, add_bootstrap, examples, plain_help

EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a tool killed by the closed pipe exits with

Registrar = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]


def _registrars() -> list[Registrar]:
    from fleetmedic.cli import (
        backtest,
        config,
        ctl,
        demo,
        executor,
        exporter,
        kafka,
        schema,
        simulate,
        triage,
        watch_jobs,
        whatif,
        worker,
    )
    from fleetmedic.devenv import cli as dev

    return [demo.add_parser, config.add_parser, schema.add_parser, backtest.add_parser, triage.add_parser,
            dev.add_parser, simulate.add_parser, worker.add_parser, exporter.add_parser,
            executor.add_parser, watch_jobs.add_parser, ctl.add_parser, kafka.add_parser, whatif.add_parser]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fleetmedic",
        description="Detect sick GPU nodes, isolate them, recover jobs, return nodes to service.",
        epilog=examples("fleetmedic demo", "fleetmedic config check --config my.yaml",
                        "fleetmedic worker --config my.yaml --dry-run", "fleetmedic exporter --help"),
    )
    parser.add_argument("--version", action="version", version=f"fleetmedic {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for register in _registrars():
        register(sub)
    add_bootstrap(sub)
    plain_help(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # options that override a setting are read by every command's one config loader, as the variable is;
    # set for this command only (a caller that runs several in one process gets its environment back)
    overrides = {}
    if getattr(args, "bootstrap", None):
        overrides[BOOTSTRAP_ENV] = args.bootstrap
    if getattr(args, "dry_run", False) is True:
        overrides[DRY_RUN_ENV] = "true"
    saved = {name: os.environ.get(name) for name in overrides}
    os.environ.update(overrides)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except BrokenPipeError:  # the reader went away (`... | head`): stop quietly, as Unix tools do
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's final flush must not raise again
        return EXIT_BROKEN_PIPE
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


if __name__ == "__main__":
    sys.exit(main())
