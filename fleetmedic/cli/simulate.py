"""``fleetmedic simulate`` and ``fleetmedic score``: the fleet simulator and its scorer.

Simulate a GPU fleet with injected faults and write its telemetry and the ground truth, or produce
the telemetry to Kafka (``--kafka``, or ``--bootstrap HOST:PORT``).

``--faults`` grammar: ``none``, ``mix[:N]``, ``all``, ``negatives``,
``trace[:speedup=X;offset=30d;scale=24;path=FILE]``, and ``KIND[:COUNT][@AT[+DUR]][/NODE[/GPU]]``
items, comma-separated. ``fleetmedic simulate --list-kinds`` prints the fault library.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import msgspec

from fleetmedic.cli.common import DEFAULT_SEED, duration, examples, timestamp
from fleetmedic.evaluation.scoring import ScoreParams, encode_report, format_report, score
from fleetmedic.evaluation.truth import read_meta, read_truth
from fleetmedic.records import Incident, RemediationCommand
from fleetmedic.sim.engine import SimConfig, Simulator
from fleetmedic.sim.faults import KINDS
from fleetmedic.sim.files import write_run
from fleetmedic.sim.fleet import SKUS, FleetSpec
from fleetmedic.sim.telemetry import NoiseSpec
from fleetmedic.sim.units import format_duration
from fleetmedic.sim.workload import WorkloadSpec

EXIT_USAGE = 2


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sim = sub.add_parser(
        "simulate", help="simulate a GPU fleet with injected faults; write telemetry and truth",
        description=__doc__.split("\n", 2)[2] if __doc__ else None,
        epilog=examples("fleetmedic simulate --nodes 64 --duration 6h --faults mix --out out/sim",
                        "fleetmedic simulate --nodes 400 --duration 24h --faults trace:speedup=100 --format both "
                        "--out out/trace",
                        "fleetmedic simulate --nodes 16 --duration 2h "
                        "--faults 'xid79@30m,straggler:2,leaf_switch@1h+20m' --out out/x",
                        "fleetmedic simulate --nodes 16 --duration 1h --bootstrap 127.0.0.1:9092 --rate 500",
                        "fleetmedic simulate --list-kinds"))
    sim.add_argument("--nodes", type=int, default=64, help="nodes (8 GPUs each; default 64)")
    sim.add_argument("--duration", type=duration, default=6 * 3600.0, help="simulated time, e.g. 6h, 90m (default 6h)")
    sim.add_argument("--seed", type=int, default=DEFAULT_SEED,
                     help=f"random seed: same seed, same output (default {DEFAULT_SEED})")
    sim.add_argument("--faults", default="mix", help="fault spec (default: mix); see above")
    sim.add_argument("--out", type=Path, help="output directory")
    sim.add_argument("--format", choices=("jsonl", "prom", "both"), default="jsonl",
                     help="jsonl records, Prometheus exposition (prom/), or both "
                          "(default jsonl; truth is always written)")
    sim.add_argument("--prom-every", type=duration, default=60.0,
                     help="exposition rounds every this much simulated time (default 60s)")
    sim.add_argument("--noise", choices=("none", "default", "heavy"), default="default",
                     help="delivery noise: missing, late, duplicate samples, clock skew (default: default)")
    sim.add_argument("--gpu-interval", type=duration, default=10.0, help="GPU sampling interval (default 10s)")
    sim.add_argument("--port-interval", type=duration, default=30.0, help="port counter interval (default 30s)")
    sim.add_argument("--sku", default="h100", help=f"GPU SKU mix, e.g. h100 or h100=0.75,a100=0.25 ({', '.join(SKUS)})")
    sim.add_argument("--start", type=timestamp, default=None, metavar="T",
                     help="start time, RFC 3339 or Unix seconds (default 2026-01-01T00:00:00Z)")
    sim.add_argument("--commands", type=Path, default=None,
                     help="JSONL of RemediationCommand to replay at their issued_at (open-loop replay)")
    sim.add_argument("--no-native-restart", action="store_true",
                     help="the job controller does not restart failed jobs (only commands do)")
    sim.add_argument("--kafka", action="store_true",
                     help="produce the records to the Kafka telemetry topics instead of writing files "
                          "(truth, meta and accounting still go to --out when given); --bootstrap implies it")
    sim.add_argument("--rate", type=float, default=0.0, help="with --kafka: messages per second (0 = unlimited)")
    sim.add_argument("--closed-loop", action="store_true",
                     help="with --kafka: apply RemediationCommands read from the commands topic")
    sim.add_argument("--config", metavar="FILE", default=None,
                     help="with --kafka: fleetmedic config file (brokers, topic names)")
    sim.add_argument("--progress", action="store_true",
                     help="show a progress bar on stderr even when it is not a terminal (simulated time, ETA)")
    sim.add_argument("--list-kinds", action="store_true", help="print the fault library and exit")
    sim.set_defaults(handler=run_simulate)

    sc = sub.add_parser("score", help="score incidents and commands against a simulation's truth",
                        description="Score incidents and commands against a simulation's ground truth: per fault "
                                    "kind precision, recall, F1 and detection delay, attribution, isolations.",
                        epilog=examples("fleetmedic score --truth out/sim/truth.jsonl --incidents incidents.jsonl "
                                        "--commands commands.jsonl --out out/score",
                                        "fleetmedic score --truth out/sim/truth.jsonl --incidents incidents.jsonl "
                                        "--json"))
    sc.add_argument("--truth", type=Path, required=True, help="truth.jsonl from fleetmedic simulate")
    sc.add_argument("--incidents", type=Path, default=None, help="JSONL with Incident records (other lines ignored)")
    sc.add_argument("--commands", type=Path, default=None,
                    help="JSONL with RemediationCommand records (other lines ignored)")
    sc.add_argument("--meta", type=Path, default=None, help="meta.json (default: next to --truth)")
    sc.add_argument("--accounting", type=Path, default=None,
                    help="accounting.json of a closed-loop run, for MTTR, ETTR and repeat failures")
    sc.add_argument("--grace", type=duration, default=600.0, help="matching grace after a fault's end (default 10m)")
    sc.add_argument("--early", type=duration, default=60.0,
                    help="tolerance before onset, for clock skew (default 60s)")
    sc.add_argument("--out", type=Path, default=None, help="directory for score.json")
    sc.add_argument("--json", action="store_true", help="print JSON instead of the table")
    sc.set_defaults(handler=run_score)


def _skus(text: str) -> tuple[tuple[str, float], ...]:
    out = []
    for part in text.split(","):
        key, _, share = part.partition("=")
        out.append((key.strip(), float(share) if share else 1.0))
    return tuple(out)


def run_simulate(args: argparse.Namespace) -> int:
    if args.list_kinds:
        for name, k in KINDS.items():
            print(f"{name:22s} {k.fault_class:18s} {k.component:7s} {k.expected:15s} {k.description}")
        print("xid<N>                 (any XID code: by its catalog bucket, hardware or negative control)")
        return 0
    if getattr(args, "bootstrap", None):
        args.kafka = True
    if args.out is None and not args.kafka:
        print("error: --out is required (or --kafka)", file=sys.stderr)
        return EXIT_USAGE
    try:
        fleet = FleetSpec(nodes=args.nodes, skus=_skus(args.sku))
        config = SimConfig(
            duration_s=args.duration,
            seed=args.seed,
            faults=args.faults,
            gpu_interval_s=args.gpu_interval,
            port_interval_s=args.port_interval,
            noise=NoiseSpec.named(args.noise),
            fleet=fleet,
            workload=WorkloadSpec(native_restart=not args.no_native_restart),
            **({"start": args.start} if args.start is not None else {}),
        )
        sim = Simulator(config)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.kafka:
        return _run_kafka(sim, args)
    commands = _read_typed(args.commands, RemediationCommand) if args.commands else []
    with _SimProgress(sim, args.progress) as progress:
        summary = write_run(sim, args.out, jsonl=args.format in ("jsonl", "both"),
                            prom_every_s=args.prom_every if args.format in ("prom", "both") else None,
                            commands=commands, on_step=progress.step)
    acc = sim.accounting()
    print(f"simulated {args.nodes} nodes for {format_duration(args.duration)} (seed {args.seed}): "
          f"{summary.gpu_records} GPU records ({summary.gpu_samples} GPU samples), {summary.port_records} port "
          f"records, {summary.job_events} job events, {summary.faults} faults, {acc.job_failures} job failures")
    print(f"wrote {args.out}/ (truth.jsonl, meta.json, accounting.json"
          + (", gpu/ports/jobs/results.jsonl" if args.format != "prom" else "")
          + (", prom/" if args.format != "jsonl" else "") + ")")
    return 0


class _SimProgress:
    """A progress bar of simulated time (tqdm) on stderr, when it is a terminal or ``force``."""

    def __init__(self, sim: Simulator, force: bool) -> None:
        self.start, self.bar = sim.now, None
        if force or sys.stderr.isatty():
            from fleetmedic.evaluation.backtest import progress_bar

            self.bar = progress_bar(sys.stderr, total=round(sim.end - sim.start), desc="simulated time", unit="s")

    def step(self, now: float) -> None:
        if self.bar is not None:
            self.bar.update(round(now - self.start) - self.bar.n)

    def __enter__(self) -> _SimProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.close()


def _run_kafka(sim: Simulator, args: argparse.Namespace) -> int:
    import asyncio

    from fleetmedic.cli.common import settings_or_none
    from fleetmedic.evaluation.truth import write_meta, write_truth
    from fleetmedic.sim.closed_loop import encode_accounting
    from fleetmedic.sim.kafka_producer import produce

    settings = settings_or_none(args.config)  # the file and FLEETMEDIC__* overrides, as every command reads them
    if settings is None:
        return EXIT_USAGE
    stats = asyncio.run(produce(sim, settings, rate=args.rate, closed_loop=args.closed_loop))
    print(f"produced {stats.messages} messages ({stats.bytes / 1e6:.1f} MB) in {stats.wall_s:.1f} s "
          f"({stats.messages / max(stats.wall_s, 1e-9):.0f}/s); applied {stats.commands} commands")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        write_truth(args.out / "truth.jsonl", sim.truth())
        write_meta(args.out / "meta.json", sim.meta())
        (args.out / "accounting.json").write_bytes(encode_accounting(sim.accounting()))
    return 0


def _read_typed(path: Path, kind: type) -> list:  # type: ignore[type-arg]
    """Records of one type from a JSONL file; lines of other record types are skipped."""
    dec: msgspec.json.Decoder[Any] = msgspec.json.Decoder(kind)
    tag = kind.__struct_config__.tag  # type: ignore[attr-defined]
    out = []
    for n, line in enumerate(path.read_bytes().splitlines(), 1):
        if not line.strip():
            continue
        try:
            head = msgspec.json.decode(line, type=dict)
        except msgspec.DecodeError as exc:
            raise SystemExit(f"error: {path}:{n}: not JSON ({exc})") from None
        if head.get("type") != tag:
            continue
        try:
            out.append(dec.decode(line))
        except msgspec.ValidationError as exc:
            raise SystemExit(f"error: {path}:{n}: {exc}") from None
    return out


def run_score(args: argparse.Namespace) -> int:
    truth = read_truth(args.truth)
    meta_path = args.meta or args.truth.parent / "meta.json"
    meta = read_meta(meta_path) if meta_path.is_file() else None
    incidents: list[Incident] = _read_typed(args.incidents, Incident) if args.incidents else []
    commands: list[RemediationCommand] = _read_typed(args.commands, RemediationCommand) if args.commands else []
    accounting = json.loads(args.accounting.read_text(encoding="utf-8")) if args.accounting else None
    report = score(truth, incidents, commands, meta, accounting, ScoreParams(early_s=args.early, grace_s=args.grace))
    if args.json:
        sys.stdout.write(encode_report(report).decode())
    else:
        print(format_report(report))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "score.json").write_bytes(encode_report(report))
    return 0
