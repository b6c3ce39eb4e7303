"""The ``fleetmedic`` command line.

Each feature registers its own subcommand through an ``add_parser(subparsers)`` function, so this
module stays a thin index and ``fleetmedic --help`` lists only subcommands that exist.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from fleetmedic import __version__

Registrar = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]


def _registrars() -> list[Registrar]:
    import fleetmedic.executor_cli as executor_cli
    import fleetmedic.watch_jobs_cli as watch_jobs_cli
    from fleetmedic import (
        backtest,
        config_cli,
        ctl_cli,
        demo,
        exporter_cli,
        schema_cli,
        simulator_cli,
        triage_cli,
        worker_cli,
    )
    from fleetmedic.devenv import cli as dev_cli

    return [demo.add_parser, config_cli.add_parser, schema_cli.add_parser, backtest.add_parser, triage_cli.add_parser,
            dev_cli.add_parser, simulator_cli.add_parser, worker_cli.add_parser, exporter_cli.add_parser,
            executor_cli.add_parser, watch_jobs_cli.add_parser, ctl_cli.add_parser]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fleetmedic",
        description="Detect sick GPU nodes, isolate them, recover jobs, return nodes to service.",
    )
    parser.add_argument("--version", action="version", version=f"fleetmedic {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for register in _registrars():
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
