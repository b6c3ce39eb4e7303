"""``fleetmedic backtest``: detection, triage and policy over recorded telemetry (see
:mod:`fleetmedic.evaluation.backtest`): files (``--input``), the history of a Prometheus server
(``--prometheus URL --start T --end T``), or both.

Exit codes: 0 when records were read (whatever was found), 1 when the input yielded no record at
all (the most frequent skip reasons are printed) or the Prometheus server could not give the
history, 2 for a usage error (a missing input, a bad time, an invalid config)."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

from fleetmedic.cli.common import EXIT_INVALID, examples, settings_or_none
from fleetmedic.evaluation.backtest import NoRecords, Progress, load_topology, run

EXIT_NO_RECORDS = 1


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "backtest", help="run detection over recorded telemetry (JSONL, Prometheus text, a Prometheus server)",
        description="Run detection, triage and policy over recorded telemetry: JSONL records, Prometheus text or "
                    "OpenMetrics files (exporter scrapes, promtool tsdb dump), kernel logs (*.kmsg, *.dmesg, "
                    "*.journal, *.log: kern.log, dmesg -T, journalctl -k -o json), each also gzip-compressed (*.gz), "
                    "and/or the history a Prometheus server holds. A directory's other files are ignored and "
                    "counted. Times (T) are RFC 3339 (2024-05-01T12:00:00Z) or Unix seconds.",
        epilog=examples("fleetmedic backtest --config my.yaml --input recorded/ --out results/ "
                        "--report results/report.html",
                        "fleetmedic backtest --input dcgm.prom.gz --label instance=gpu-node-1:9400 --out results/",
                        "fleetmedic backtest --prometheus http://prometheus:9090 --start 2026-05-01T00:00:00Z "
                        "--end 2026-05-02T00:00:00Z --out results/",
                        "fleetmedic backtest --input sim/ --truth sim/truth.jsonl --topology sim/meta.json "
                        "--out results/"))
    p.add_argument("--config", metavar="FILE", help="YAML config (default: built-in defaults + FLEETMEDIC__* env)")
    p.add_argument("--input", action="append", default=[], metavar="FILE|DIR",
                   help="file or directory (files may be gzip-compressed); repeatable")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--report", metavar="HTML", help="also write a self-contained HTML report to this file")
    p.add_argument("--topology", help="node -> {rack, leaf, pool, rails} (YAML/JSON), or a simulator meta.json")
    p.add_argument("--truth", type=Path, help="truth.jsonl of a simulation: score the results (score.json)")
    p.add_argument("--progress", action="store_true", help="show progress even when stderr is not a terminal")
    p.add_argument("--scrape-time", metavar="T",
                   help="time of exposition samples without a timestamp (a raw /metrics scrape; default: the "
                        "file's modification time)")
    p.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                   help="add a label to every exposition sample, as a scrape target's (e.g. instance=gpu-node-1:9400 "
                        "for a file curl'ed from one exporter); repeatable")
    p.add_argument("--node-from-path", choices=("file", "dir"),
                   help="exposition samples that name no node (a raw node-exporter scrape) take it from where the "
                        "file was saved: its name without suffixes (gpu-node-1.prom) or its directory "
                        "(gpu-node-1/node-0001.prom); without it they are skipped and counted")
    p.add_argument("--pci-map", metavar="FILE",
                   help="kernel logs: PCI address -> GPU index for every node (nvidia-smi --query-gpu=index,pci.bus_id "
                        "--format=csv,noheader); without it XID lines are not mapped to a GPU")
    p.add_argument("--log-year", type=int, metavar="YYYY",
                   help="kernel logs: the year of syslog stamps, which have none (default: the file's modification "
                        "year)")
    p.add_argument("--boot-time", metavar="T",
                   help="kernel logs: when the logged boot started, for kmsg records and [uptime] stamps")
    p.add_argument("--prometheus", metavar="URL", help="read history from this Prometheus server (range queries)")
    p.add_argument("--start", metavar="T", help="with --prometheus: the first time")
    p.add_argument("--end", metavar="T", help="with --prometheus: the last time")
    p.add_argument("--step", default="30s", metavar="DURATION",
                   help="with --prometheus: the resolution, e.g. 30s, 1m (default: 30s)")
    p.add_argument("--match", metavar="SELECTOR",
                   help="with --prometheus: the series to read (default: exporters.prometheus.api_selector)")
    p.set_defaults(handler=_main)


def _main(args: argparse.Namespace) -> int:
    from fleetmedic.connectors.prometheus.api import parse_duration, parse_time
    from fleetmedic.connectors.prometheus.history import History, HistoryError
    from fleetmedic.evaluation.kernel_logs import KernelLogOptions

    settings = settings_or_none(args.config)
    if settings is None:
        return EXIT_INVALID
    try:
        if not args.input and not args.prometheus:
            raise ValueError("give --input FILE|DIR and/or --prometheus URL --start T --end T")
        history = None
        if args.prometheus:
            if not (args.start and args.end):
                raise ValueError("--prometheus needs --start and --end")
            start, end = parse_time(args.start), parse_time(args.end)
            if end < start:
                raise ValueError("--end is before --start")
            history = History(settings, args.prometheus, start, end, parse_duration(args.step), args.match or "")
        elif args.start or args.end or args.match:
            raise ValueError("--start, --end and --match go with --prometheus")
        labels = dict(_label(x) for x in args.label)
        scrape_time = parse_time(args.scrape_time) if args.scrape_time else None
        topology = load_topology(args.topology) if args.topology else None
        if args.log_year is not None and not 1970 <= args.log_year <= 2100:
            raise ValueError(f"--log-year {args.log_year}: expected a year between 1970 and 2100")
        kernel = KernelLogOptions(pci_map=KernelLogOptions.read_pci_map(args.pci_map) if args.pci_map else {},
                                  year=args.log_year,
                                  boot_time=parse_time(args.boot_time) if args.boot_time else None)
        progress = Progress(sys.stderr, args.progress)
        with _logs_above(progress):
            summary = run(settings, args.input, Path(args.out), progress, args.report, topology, args.truth,
                          scrape_time=scrape_time, extra_labels=labels, history=history, kernel=kernel,
                          node_from_path=args.node_from_path or "")
    except NoRecords as exc:
        print(f"error: {exc}", file=sys.stderr)
        print(f"(summary: {Path(args.out) / 'summary.json'})", file=sys.stderr)
        return EXIT_NO_RECORDS
    except HistoryError as exc:
        print(f"error: prometheus: {exc}", file=sys.stderr)
        return EXIT_NO_RECORDS
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_INVALID
    ignored = summary["ignored_files"]
    if ignored["count"]:
        print(f"note: {ignored['count']} file(s) of the input directories ignored: " + "; ".join(
            f"{v['files']} with {reason} (e.g. {v['examples'][0]})" for reason, v in ignored["by_reason"].items()),
            file=sys.stderr)
    keys = ("records", "findings", "findings_by_kind", "incidents", "incidents_by_class", "commands_by_action",
            "skipped_total", "skipped_by_file", "ignored_files", "input_problems", "timestamps",
            "kernel_lines_not_published", "prometheus", "elapsed_s", "score")
    empty: tuple[object, ...] = ({}, None, {"count": 0, "by_reason": {}})
    print(json.dumps({k: summary[k] for k in keys if k in summary and summary[k] not in empty}, sort_keys=True))
    return 0


def _logs_above(progress: Progress) -> contextlib.AbstractContextManager[object]:
    """While bars show, log lines (a bad input file) are printed above them, not into them."""
    if not progress.enabled:
        return contextlib.nullcontext()
    from tqdm.contrib.logging import logging_redirect_tqdm

    return logging_redirect_tqdm()  # type: ignore[no-any-return]


def _label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip() or not key.strip().replace("_", "a").isalnum():
        raise ValueError(f"--label {text[:100]!r}: expected KEY=VALUE (e.g. instance=gpu-node-1:9400)")
    return key.strip(), value
