"""``fleetmedic demo --kafka BOOTSTRAP``: the demo's simulated fleet through a real broker and worker.

:func:`run_on_kafka` gives the run a fresh topic prefix and consumer group, publishes the
simulated fleet's nodes on ``cluster.nodes`` (a ``NodeObservation`` per node with its rack, leaf,
pool and rail labels, as ``watch-jobs``'s Node watch does in a real deployment: the decision stage
learns the topology and the fleet size from them), starts ``fleetmedic worker --role all`` as a
subprocess, and plays the cluster: the simulator's telemetry, job events and executor results go
to their topics, and every command read from ``remediation.commands`` is applied by the
simulator's closed loop. The simulator does not run ahead of the pipeline: before each tick it
waits until stage 1 has summarised telemetry up to ``max_ahead_s`` of simulated time before it
(the node summaries on the fleet-inputs topic), so a command reaches the simulated cluster at most
that much simulated time after the telemetry that caused it. At the end the worker is stopped,
and the run's findings, incidents and commands are read back from their topics, and the engine's
report from its last snapshot.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import yaml
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from fleetmedic import records as r
from fleetmedic.bus import DEMO, client_options, partitions_of, producer_options, summaries_topic
from fleetmedic.config import Settings, parse_config
from fleetmedic.k8s_keys import LABEL_RAIL_PREFIX
from fleetmedic.models.stages import SummaryColumns
from fleetmedic.remediation.engine import DecisionEngine
from fleetmedic.signing import DEMO_OPERATOR_KEY
from fleetmedic.sim.embedded import Collected, fleet_topology
from fleetmedic.sim.engine import Simulator
from fleetmedic.streams.app import ensure_topics
from fleetmedic.streams.detect import SUMMARY_KEY
from fleetmedic.streams.state import decode_snapshot, load_snapshot


@dataclass
class KafkaRun:
    out: Collected
    engine: DecisionEngine
    ticks: int
    messages: int
    log: str
    waits: list[float] = field(default_factory=list)


def demo_settings(settings: Settings, bootstrap: str) -> tuple[Settings, str]:
    """``settings`` on ``bootstrap`` with a fresh prefix and group; also as YAML for the worker."""
    u = uuid.uuid4().hex[:8]
    doc = msgspec.to_builtins(settings)
    doc["kafka"].update(bootstrap_servers=bootstrap, consumer_group=f"fleetmedic-demo-{u}")
    doc["topics"].update(prefix=f"fleetmedic-demo-{u}.", names={})
    doc["metrics"].update(port=0)
    doc["signing"].update(allow_demo_keys=True)  # the worker verifies with the published demo keys
    text = yaml.safe_dump(doc, sort_keys=False)
    return parse_config(text, env={}), text


@contextlib.contextmanager
def _worker(config: Path, key: bytes, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETMEDIC__")}
    env["FLEETMEDIC_SIGNING_KEY"] = key.decode()
    env["FLEETMEDIC_OPERATOR_KEY"] = DEMO_OPERATOR_KEY.decode()  # its own role's key, never the command key
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "fleetmedic.cli.main", "worker", "--config", str(config),
                                 "--role", "all", "--datadir", str(log.parent / "faust"), "--loglevel", "warning"],
                                env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_on_kafka(sim: Simulator, settings: Settings, bootstrap: str, key: bytes,
                 max_ahead_s: float = 30.0, stall_timeout_s: float = 120.0) -> KafkaRun:
    run_settings, text = demo_settings(settings, bootstrap)
    with tempfile.TemporaryDirectory(prefix="fleetmedic-demo-") as tmp:
        config, log = Path(tmp) / "fleetmedic.yaml", Path(tmp) / "worker.log"
        config.write_text(text)
        asyncio.run(_seed(run_settings, sim))
        with _worker(config, key, log) as proc:
            driver = _Driver(sim, run_settings, proc, log, max_ahead_s, stall_timeout_s)
            asyncio.run(driver.run())
        if proc.returncode != 0:
            raise RuntimeError(f"the worker exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        out = asyncio.run(_read_outputs(run_settings))
        out.results = driver.results
        snapshot = asyncio.run(load_snapshot(run_settings))
        assert snapshot is not None, "the worker wrote no final snapshot"
        engine = DecisionEngine.from_bytes(decode_snapshot(snapshot).engine, run_settings)
        return KafkaRun(out, engine, driver.ticks, driver.messages, log.read_text()[-2000:], driver.waits)


async def _seed(settings: Settings, sim: Simulator) -> None:
    """Topics, and the fleet's nodes on ``cluster.nodes`` (the decision stage replays them first)."""
    await ensure_topics(settings)
    producer = AIOKafkaProducer(**producer_options(settings.kafka, DEMO))
    await producer.start()
    try:
        for obs in node_observations(sim, settings):
            await producer.send(settings.topics.topic("cluster.nodes"), value=r.encode(obs), key=obs.node.encode())
        await producer.flush()
    finally:
        await producer.stop()


def node_observations(sim: Simulator, settings: Settings) -> list[r.NodeObservation]:
    """The simulated fleet's nodes as the Node watch would publish them (uncordoned, with the
    triage settings' rack, leaf and pool labels and one ``rails.fleetmedic.io/<nic>`` label per NIC)."""
    t = settings.triage
    out = []
    for node, p in fleet_topology(sim.fleet).nodes.items():
        labels = {t.rack_label: p.rack, t.leaf_label: p.leaf, t.pool_label: p.pool,
                  **{f"{LABEL_RAIL_PREFIX}{nic}": leaf for nic, leaf in p.rails.items()}}
        out.append(r.NodeObservation(node=node, ts=sim.start, labels={k: v for k, v in labels.items() if v}))
    return out


class _Driver:
    def __init__(self, sim: Simulator, settings: Settings, proc: subprocess.Popen[bytes], log: Path,
                 max_ahead_s: float, stall_timeout_s: float) -> None:
        self.sim, self.settings, self.proc, self.log = sim, settings, proc, log
        self.max_ahead_s, self.stall_timeout_s = max_ahead_s, stall_timeout_s
        self.watermark = float("-inf")  # newest telemetry time stage 1 has summarised
        self.produced = float("-inf")  # newest telemetry time produced
        self.results: list[r.RemediationResult] = []
        self.ticks = self.messages = 0
        self.waits: list[float] = []
        self._decode_batch = msgspec.msgpack.Decoder(SummaryColumns).decode

    async def run(self) -> None:
        t = self.settings.topics.topic
        opts = client_options(self.settings.kafka, metadata_max_age_ms=1000)
        producer = AIOKafkaProducer(**producer_options(self.settings.kafka, DEMO, metadata_max_age_ms=1000))
        commands = AIOKafkaConsumer(t("remediation.commands"), **opts, auto_offset_reset="earliest",
                                    enable_auto_commit=False)
        progress = AIOKafkaConsumer(summaries_topic(self.settings), **opts, auto_offset_reset="earliest",
                                    enable_auto_commit=False)
        await producer.start()
        await commands.start()
        await progress.start()
        try:
            last_t = float("-inf")
            for tick in self.sim.run():
                await self._keep_pace(float(tick.t) - self.max_ahead_s, commands, progress)
                batch: list[tuple[str, bytes, r.Record]] = []
                if tick.gpu is not None:
                    gpu = tick.gpu.to_records()
                    batch += [(t("telemetry.gpu"), m.node.encode(), m) for m in gpu]
                    self.produced = max([self.produced, *(float(m.ts) for m in gpu)])
                if tick.ports is not None:
                    batch += [(t("telemetry.port"), m.device.encode(), m) for m in tick.ports.to_records()]
                batch += [(t("jobs.events"), e.job.encode(), e) for e in tick.job_events]
                batch += [(t("remediation.results"), x.command_id.encode(), x) for x in tick.results]
                self.results += tick.results
                for topic, k, rec in batch:
                    await producer.send(topic, value=r.encode(rec), key=k)
                self.messages += len(batch)
                self.ticks += 1
                last_t = float(tick.t)
            await producer.flush()
            await self._keep_pace(last_t, commands, progress)
            await self._settle(commands)
        finally:
            await producer.stop()
            await commands.stop()
            await progress.stop()

    async def _poll(self, commands: AIOKafkaConsumer, progress: AIOKafkaConsumer, timeout_ms: int) -> int:
        """Apply the new commands; move the watermark; return how many commands came."""
        applied = 0
        for recs in (await commands.getmany(timeout_ms=0)).values():
            for rec in recs:
                self.sim.submit(r.decode(r.RemediationCommand, rec.value or b""))
                applied += 1
        for recs in (await progress.getmany(timeout_ms=timeout_ms)).values():
            for rec in recs:
                if rec.key == SUMMARY_KEY and rec.value:
                    times = self._decode_batch(rec.value).ts
                    if times:
                        self.watermark = max(self.watermark, max(times))
        return applied

    async def _keep_pace(self, until: float, commands: AIOKafkaConsumer, progress: AIOKafkaConsumer) -> None:
        started = time.monotonic()
        await self._poll(commands, progress, 0)
        until = min(until, self.produced)  # the newest telemetry of a quiet fleet may be older
        while self.watermark < until:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the worker exited {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
            if time.monotonic() - started > self.stall_timeout_s:
                raise TimeoutError(f"stage 1 stalled at t={self.watermark:.0f} (waiting for {until:.0f})")
            await self._poll(commands, progress, 100)
        self.waits.append(time.monotonic() - started)

    async def _settle(self, commands: AIOKafkaConsumer, quiet_s: float = 3.0) -> None:
        """After the last tick: apply what still comes until the commands are quiet for ``quiet_s``."""
        quiet_since = time.monotonic()
        while time.monotonic() - quiet_since < quiet_s:
            got = 0
            for recs in (await commands.getmany(timeout_ms=200)).values():
                for rec in recs:
                    self.sim.submit(r.decode(r.RemediationCommand, rec.value or b""))
                    got += 1
            if got:
                quiet_since = time.monotonic()


async def _read_outputs(settings: Settings) -> Collected:
    """Everything on ``findings``, ``incidents`` and ``remediation.commands``, from the beginning."""
    t = settings.topics.topic
    wanted: dict[str, Any] = {t("findings"): r.Finding, t("incidents"): r.Incident,
                              t("remediation.commands"): r.RemediationCommand}
    consumer = AIOKafkaConsumer(**client_options(settings.kafka), enable_auto_commit=False)
    await consumer.start()
    got: dict[str, list[Any]] = {name: [] for name in wanted}
    try:
        counts = {t(n): partitions_of(settings, n) for n in ("findings", "incidents", "remediation.commands")}
        tps = [TopicPartition(name, p) for name in wanted for p in range(counts[name])]
        consumer.assign(tps)
        begin, ends = await consumer.beginning_offsets(tps), await consumer.end_offsets(tps)
        for tp in tps:
            consumer.seek(tp, begin[tp])
        deadline = time.monotonic() + 60
        while any([await consumer.position(tp) < ends[tp] for tp in tps]):
            if time.monotonic() > deadline:
                raise TimeoutError("reading the run's outputs back took over 60 s")
            for tp, recs in (await consumer.getmany(timeout_ms=500)).items():
                got[tp.topic] += [r.decode(wanted[tp.topic], rec.value) for rec in recs if rec.value]
    finally:
        await consumer.stop()
    return Collected(findings=sorted(got[t("findings")], key=lambda f: f.ts), incidents=got[t("incidents")],
                     commands=got[t("remediation.commands")])
