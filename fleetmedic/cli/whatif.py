"""``fleetmedic whatif HISTORY``: replay a fault history through the real decision engine and compare
it with what teams do without it (see :mod:`fleetmedic.sim.whatif.replay`).

Exit codes: 0 after a replay, 2 for a usage error (an unreadable history or mapping, more bad rows
than ``--max-bad``, an invalid config)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from fleetmedic.cli.common import DEFAULT_SEED, EXIT_INVALID, duration, examples, settings_or_none
from fleetmedic.sim.whatif.history import FORMATS, History, HistoryError, parse_history
from fleetmedic.sim.whatif.mapping import MappingError, load_mapping
from fleetmedic.sim.whatif.replay import PolicySpec, replay
from fleetmedic.sim.whatif.report import html_report, table
from fleetmedic.sim.whatif.shipped import SHIPPED, declared_nodes, shipped_history
from fleetmedic.sim.whatif.world import Assumptions

POLICIES = ("manual", "npd-draino", "fleetmedic")


def fraction(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= v <= 1.0:
        raise argparse.ArgumentTypeError(f"{text} is not between 0 and 1")
    return v


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "whatif", help="replay a fault history through the decision engine: job time saved against manual "
                       "operations and node-problem-detector+draino",
        description="Replay a history of node faults (the shipped StepFun or Llama 3 histories, a StepFun-format "
                    "JSON trace, or your incidents as CSV: node,start,end,category[,detail]) through fleetmedic's "
                    "decision engine and through what teams do without it, on the same simulated cluster and "
                    "workload, and report ETTR, GPU-hours lost by cause, MTTR, and how long faulty nodes stayed "
                    "schedulable. Every assumption is a flag and is printed with the results.",
        epilog=examples(
            "fleetmedic whatif stepfun",
            "fleetmedic whatif llama3 --json out.json --report out.html",
            "fleetmedic whatif incidents.csv --mapping my-mapping.yaml --nodes 512 --config today.yaml "
            "--config proposed.yaml",
            "fleetmedic whatif fault_trace.json --format stepfun --human-delay 15m --policy manual "
            "--policy fleetmedic"))
    p.add_argument("history", metavar="HISTORY", help=f"a file, or a shipped history: {', '.join(SHIPPED)}")
    p.add_argument("--format", choices=FORMATS, help="history format (default: from its content)")
    p.add_argument("--mapping", help="category -> evidence mapping: a shipped one (stepfun, llama3) or a YAML file "
                                     "(default: the shipped one of that name, else stepfun)")
    p.add_argument("--max-bad", type=int, default=0, metavar="N", help="accept up to N unreadable rows (default 0)")
    p.add_argument("--policy", action="append", choices=POLICIES, help="policies to replay; repeatable "
                                                                       "(default: all three)")
    p.add_argument("--config", action="append", default=[], metavar="FILE",
                   help="fleetmedic's config; repeat to compare configs (default: the shipped defaults)")
    p.add_argument("--nodes", type=int, help="fleet size (default: the history's: 400 for stepfun, 2048 for llama3, "
                                             "else the nodes it names)")
    p.add_argument("--gpus-per-node", type=int, default=8, help="GPUs of a node (default 8)")
    p.add_argument("--big-job-fraction", type=fraction, default=0.9, help="share of nodes of the lock-step job")
    p.add_argument("--small-job-fraction", type=fraction, default=0.05, help="share of nodes running 1-node jobs")
    p.add_argument("--checkpoint", type=duration, default=1800.0, help="checkpoint interval (default 30m)")
    p.add_argument("--restart-overhead", type=duration, default=600.0, help="restart cost (default 10m)")
    p.add_argument("--controller-restart", type=duration, default=30.0,
                   help="the job controller's own restart delay (default 30s)")
    p.add_argument("--backoff-limit", type=int, default=6, help="the job controller's restarts in a row (default 6)")
    p.add_argument("--human-delay", type=duration, default=1800.0, help="on-call reaction, median (default 30m)")
    p.add_argument("--human-spread", type=float, default=0.5, help="lognormal sigma of the on-call delay (0.5)")
    p.add_argument("--npd-delay", type=duration, default=30.0,
                   help="node-problem-detector + draino, evidence to drain (default 30s)")
    p.add_argument("--diag-false-pass", type=fraction, default=0.05, help="diagnostics that miss a real fault")
    p.add_argument("--diag-false-fail", type=fraction, default=0.01, help="diagnostics that fail a healthy node")
    p.add_argument("--tick", type=duration, default=10.0, help="the decision stage's tick (default 10s)")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"the replay's random draws (default {DEFAULT_SEED})")
    p.add_argument("--json", metavar="FILE", help="write the results as JSON")
    p.add_argument("--report", metavar="HTML", help="write a self-contained HTML report")
    p.add_argument("--progress", action="store_true", help="show progress even when stderr is not a terminal")
    p.set_defaults(handler=run)


def _history(args: argparse.Namespace) -> History:
    if args.history in SHIPPED and not Path(args.history).exists():
        return shipped_history(args.history)
    try:
        text = Path(args.history).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise HistoryError(f"{args.history}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    return parse_history(text, args.format, args.history, args.max_bad)


def run(args: argparse.Namespace) -> int:
    try:
        history = _history(args)
        mapping = load_mapping(args.mapping or (args.history if args.history in SHIPPED else "stepfun"))
    except (HistoryError, MappingError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_INVALID
    for bad in history.bad:
        print(f"warning: {history.source} line {bad.line}: {bad.reason} (skipped)", file=sys.stderr)
    policies: list[PolicySpec] = []
    for kind in args.policy or POLICIES:
        if kind != "fleetmedic":
            policies.append(PolicySpec(kind, kind))
            continue
        for path in args.config or [None]:
            settings = settings_or_none(path)
            if settings is None:
                return EXIT_INVALID
            name = "fleetmedic" if len(args.config) < 2 else f"fleetmedic[{Path(path or '').name}]"
            policies.append(PolicySpec(name, "fleetmedic", settings, path or ""))
    nodes = args.nodes or (declared_nodes(args.history) if args.history in SHIPPED else len(history.nodes))
    if nodes < len(history.nodes):
        print(f"error: --nodes {nodes} is fewer than the {len(history.nodes)} nodes the history names",
              file=sys.stderr)
        return EXIT_INVALID
    assumptions = Assumptions(
        nodes=nodes, gpus_per_node=args.gpus_per_node, big_job_fraction=args.big_job_fraction,
        small_job_fraction=args.small_job_fraction, checkpoint_s=args.checkpoint,
        restart_overhead_s=args.restart_overhead, controller_restart_s=args.controller_restart,
        backoff_limit=args.backoff_limit, human_delay_s=args.human_delay, human_spread=args.human_spread,
        npd_delay_s=args.npd_delay, diag_false_pass=args.diag_false_pass, diag_false_fail=args.diag_false_fail,
        tick_s=args.tick, seed=args.seed)
    show = args.progress or sys.stderr.isatty()
    shown: dict[str, int] = {}

    def progress(name: str, pct: float) -> None:
        step = int(pct * 20)
        if show and shown.get(name) != step:
            shown[name] = step
            bar = "#" * step + "." * (20 - step)
            print(f"\r{name:>24} [{bar}] {pct:4.0%}", end="\n" if step == 20 else "", file=sys.stderr, flush=True)

    result = replay(history, mapping, assumptions, policies, progress)
    print(table(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    if args.report:
        Path(args.report).write_text(html_report(result), encoding="utf-8")
    return 0
