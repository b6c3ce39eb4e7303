"""``fleetmedic backtest``: detection, triage and policy over recorded telemetry (see
:mod:`fleetmedic.evaluation.backtest`)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from fleetmedic.cli.common import EXIT_INVALID, settings_or_none
from fleetmedic.evaluation.backtest import Progress, load_topology, run


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("backtest", help="run detection over recorded telemetry (JSONL records or Prometheus text)")
    p.add_argument("--config", help="YAML config (default: built-in defaults + FLEETMEDIC__* env)")
    p.add_argument("--input", action="append", required=True, help="file or directory; repeatable")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--report", metavar="HTML", help="also write a self-contained HTML report to this file")
    p.add_argument("--topology", help="node -> {rack, leaf, pool, rails} (YAML/JSON), or a simulator meta.json")
    p.add_argument("--truth", type=Path, help="truth.jsonl of a simulation: score the results (score.json)")
    p.add_argument("--progress", action="store_true", help="show progress even when stderr is not a terminal")
    p.set_defaults(handler=_main)


def _main(args: argparse.Namespace) -> int:
    settings = settings_or_none(args.config)
    if settings is None:
        return EXIT_INVALID
    try:
        topology = load_topology(args.topology) if args.topology else None
        summary = run(settings, args.input, Path(args.out), Progress(sys.stderr, args.progress), args.report,
                      topology, args.truth)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    keys = ("records", "findings", "findings_by_kind", "incidents", "incidents_by_class", "commands_by_action",
            "skipped_total", "input_problems", "elapsed_s", "score")
    print(json.dumps({k: summary[k] for k in keys if k in summary}, sort_keys=True))
    return 0
