"""Writing a run to a directory: the project's records as JSONL, the truth, and the accounting.

Layout of ``DIR``::

    gpu.jsonl          GpuTelemetry, one per node sample, in delivery order (late samples arrive late)
    ports.jsonl        PortTelemetry, one per device sample (hosts and switches)
    jobs.jsonl         JobEvent (placement, start, progress, failure, restart, completion)
    results.jsonl      RemediationResult of replayed commands (empty without --commands)
    truth.jsonl        TruthRecord, one per injected fault
    meta.json          RunMeta: seed, time span, nodes, switches, racks, intervals
    accounting.json    Accounting: the closed loop's MTTR phases, ETTR, node-hours, repeat failures
    prom/gpu.prom      (with prom output) dcgm-exporter exposition, rounds appended, timestamps in ms
    prom/ports.prom    (with prom output) node-exporter infiniband exposition of host ports
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from fleetmedic.evaluation.truth import write_meta, write_truth
from fleetmedic.records import RemediationCommand, encode
from fleetmedic.sim.closed_loop import encode_accounting
from fleetmedic.sim.engine import Simulator, TickOutput
from fleetmedic.sim.exposition import ExpositionWriter


@dataclass
class RunSummary:
    ticks: int = 0
    gpu_records: int = 0
    gpu_samples: int = 0
    port_records: int = 0
    job_events: int = 0
    results: int = 0
    faults: int = 0


class RunWriter:
    def __init__(self, out: Path, jsonl: bool = True, prom_every_s: float | None = None) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.out = out
        self.jsonl = jsonl
        self._files: dict[str, IO[bytes]] = {}
        if jsonl:
            for name in ("gpu", "ports", "jobs", "results"):
                self._files[name] = (out / f"{name}.jsonl").open("wb")
        self.prom = ExpositionWriter(out / "prom", prom_every_s) if prom_every_s is not None else None
        self.summary = RunSummary()

    def write(self, tick: TickOutput) -> None:
        s = self.summary
        s.ticks += 1
        if tick.gpu is not None:
            s.gpu_records += tick.gpu.rows
            s.gpu_samples += tick.gpu.samples
            if self.jsonl:
                self._files["gpu"].write(tick.gpu.encode_jsonl())
            if self.prom is not None:
                self.prom.gpu(tick.gpu)
        if tick.ports is not None:
            if self.jsonl:
                recs = tick.ports.to_records()
                s.port_records += len(recs)
                self._files["ports"].write(b"".join(encode(r) + b"\n" for r in recs))
            if self.prom is not None:
                self.prom.ports(tick.ports)
        s.job_events += len(tick.job_events)
        s.results += len(tick.results)
        if self.jsonl:
            self._files["jobs"].write(b"".join(encode(e) + b"\n" for e in tick.job_events))
            self._files["results"].write(b"".join(encode(e) + b"\n" for e in tick.results))

    def finish(self, sim: Simulator) -> RunSummary:
        for fh in self._files.values():
            fh.close()
        if self.prom is not None:
            self.prom.close()
        truth = sim.truth()
        self.summary.faults = len(truth)
        write_truth(self.out / "truth.jsonl", truth)
        write_meta(self.out / "meta.json", sim.meta())
        (self.out / "accounting.json").write_bytes(encode_accounting(sim.accounting()))
        return self.summary


def write_run(sim: Simulator, out: Path, jsonl: bool = True, prom_every_s: float | None = None,
              commands: Iterable[RemediationCommand] = (),
              on_step: Callable[[float], None] | None = None) -> RunSummary:
    """Run ``sim`` to its end, replaying ``commands`` at their ``issued_at``, writing everything to ``out``;
    ``on_step`` is called with the simulated time after each step (progress)."""
    writer = RunWriter(out, jsonl, prom_every_s)
    pending = sorted(commands, key=lambda c: (c.issued_at, c.id))
    i = 0
    dt = sim.config.gpu_interval_s
    while not sim.done:
        while i < len(pending) and pending[i].issued_at <= sim.now + dt:
            sim.submit(pending[i])
            i += 1
        tick = sim.step()
        if tick is None:
            break
        writer.write(tick)
        if on_step is not None:
            on_step(sim.now)
    return writer.finish(sim)
