"""The Faust pipeline on a real broker: stage-1 throughput, scale-out, ingest -> command latency, state costs.

    .venv/bin/python bench/bench_pipeline.py [--messages 280000] [--nodes 1000] [--rounds 3] [--latency-s 30]

Uses ``$FLEETMEDIC_KAFKA_BOOTSTRAP`` or starts its own broker (fleetmedic.devenv.kafka, free ports).
Pre-produces ``--messages`` GpuTelemetry messages (8 GPUs each, every dcgm field; bench_detection's
generator; a node's messages ``--interval-s`` 1 s apart, the issue's fleet at 1 Hz) on a 2-partition
``telemetry.gpu``, then measures, in the same run:

Parts 1-3 run in ``--rounds`` rounds (default 3): a plain read, one worker, two workers, and a
last plain read after the last round. Each ratio is taken between runs next to each other (this
machine's speed drifts by tens of percent over minutes); the median round counts.

1. a plain aiokafka consumer reading and decoding them (msgspec, into GpuTelemetry), the faster of
   the reads right before and right after the round: the baseline (also printed, per CPU second:
   one worker against a plain read decoding only what the worker decodes, DetectionTelemetry, and
   against one not decoding at all);
2. one ``fleetmedic worker --role detect`` process (a new consumer group, fresh state): GPU
   samples/s through stage 1 (decode, detectors, findings, node summaries) from its first message
   until it has read them all, in wall time and per CPU second of the worker (other load on a
   shared machine slows the former only); ratio against (1). Targets: >= 100k GPU samples/s, >= 0.5x;
3. two ``--role detect`` workers on the two partitions (a new group, both in its first assignment:
   the bench's broker delays it 6 s for them), from the moment both consume until both are done:
   ratio against (2) (target >= 1.7x), split into what each did per CPU second against one worker
   alone and the cores they got against its one; with the CPU share each worker got, what the
   rest of the machine (broker, bench, kernel) and the hypervisor took meanwhile (/proc/stat),
   and how long each worker worked (its CPU time, sampled every 20 ms: the one that finished
   first idled for the rest);
4. ingest -> command latency: one ``--role all`` worker under a steady telemetry load (the target
   100k GPU samples/s, or 70 % of what (2) sustained if less: as many nodes as messages per
   second, each sending once a second, telemetry time running with the wall clock), a hard fault
   (XID 79 on a fresh node) every second from the third second on; latency = the fault message's
   produce time -> the first command for it on ``remediation.commands`` (its record timestamp),
   and to its first finding on ``findings`` (stage 1's share). Target p99 <= 1 s, read from the
   sixth second on (steady state: the fresh worker meets 12,500 new nodes in the first second and
   catches up over the next few); every fault's figure is printed as well. The load generator's
   CPU is printed (it shares the machine with the worker);
5. without the broker, what the designs cost per telemetry message: stage-1 state written per
   message (a node's whole state per message, as a Faust table would, vs a per-node snapshot every
   ``streams.detect_snapshot_every_s``), and the decision stage's peer input (raw telemetry vs
   stage 1's node summaries: bytes and decode CPU).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import msgspec
import numpy as np
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.producer.message_accumulator import BatchBuilder
from numpy.typing import NDArray

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_detection import make_messages

from fleetmedic import records as r
from fleetmedic.config import Settings, parse_config
from fleetmedic.devenv import proc
from fleetmedic.models.stages import NodeDetection, SummaryColumns, summarise, summary_columns
from fleetmedic.streams.app import ensure_topics
from fleetmedic.streams.runner import GC_GEN0_THRESHOLD
from fleetmedic.streams.state import NodeStageState

KEY = "bench-signing-key-" + "x" * 32
#: part 4: the first fault this many seconds into the load, then one a second; the target is read
#: on the faults from STEADY_AFTER_S on (the worker starts fresh, and 12,500 nodes it has never seen
#: arrive in the first second: it catches up over the next few, printed apart)
FIRST_FAULT_S, STEADY_AFTER_S = 2.0, 5.0
CLK_TCK = os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def broker(workdir: Path) -> Iterator[str]:
    given = os.environ.get("FLEETMEDIC_KAFKA_BOOTSTRAP")
    if given:
        yield given
        return
    from fleetmedic.devenv.kafka import Kafka

    port, controller = proc.free_ports(2)
    # both scale-out workers join before the group's first assignment (production brokers wait 3 s)
    kafka = Kafka(workdir / "kafka", port=port, controller_port=controller, heap="1g",
                  extra=(("group.initial.rebalance.delay.ms", "6000"),))
    print(f"starting a broker on 127.0.0.1:{port} ...", flush=True)
    kafka.start(timeout=180)
    try:
        yield kafka.bootstrap
    finally:
        kafka.stop()


def config(workdir: Path, bootstrap: str, prefix: str, group: str, extra: str = "") -> tuple[Path, Settings]:
    text = (f"kafka: {{bootstrap_servers: '{bootstrap}', consumer_group: {group}}}\n"
            f"topics: {{prefix: {prefix}, default_partitions: 2}}\nmetrics: {{port: 0}}\n" + extra)
    path = workdir / f"{group}.yaml"
    path.write_text(text)
    return path, parse_config(text, env={})


async def produce_all(bootstrap: str, topic: str, wire: list[bytes], keys: list[bytes]) -> float:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20, max_batch_size=1 << 20)
    await producer.start()
    t0 = time.perf_counter()
    try:
        for k, v in zip(keys, wire, strict=True):
            await producer.send(topic, value=v, key=k)
        await producer.flush()
    finally:
        await producer.stop()
    return time.perf_counter() - t0


async def plain_consumer(bootstrap: str, topic: str, total: int,
                         record: type[r.Record] | None = r.GpuTelemetry) -> tuple[float, float]:
    """Read ``total`` messages and decode each as ``record`` (None: read only); (wall s, CPU s of
    this process). With the worker's collector settings (runner.py: the heap so far frozen, gen-0
    threshold raised), so neither side pays for collections the other skips."""
    decode = r.decoder_for(record).decode if record is not None else len
    gc.collect()
    gc.freeze()
    threshold = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, 20, 50)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest",
                                max_partition_fetch_bytes=8 << 20, fetch_max_bytes=64 << 20)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or {0, 1})]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        seen, t0, c0 = 0, time.perf_counter(), time.process_time()
        while seen < total:
            for recs in (await consumer.getmany(timeout_ms=1000, max_records=5000)).values():
                for rec in recs:
                    decode(rec.value)
                seen += len(recs)
        return time.perf_counter() - t0, time.process_time() - c0
    finally:
        await consumer.stop()
        gc.set_threshold(*threshold)
        gc.unfreeze()


class Worker:
    """``fleetmedic worker`` as a subprocess; its metrics page and CPU time."""

    def __init__(self, cfg: Path, role: str, workdir: Path, name: str) -> None:
        self.log = workdir / f"{name}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETMEDIC__")}
        env["FLEETMEDIC_SIGNING_KEY"] = KEY
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "fleetmedic.cli.main", "worker", "--config", str(cfg),
                                          "--role", role, "--loglevel", "info"],
                                         env=env, stdout=out, stderr=subprocess.STDOUT, cwd=workdir)
        self.url: str | None = None

    def counter(self, name: str, labels: str) -> float:
        if self.url is None:
            found = re.search(r"metrics on (http://\S+/metrics)", self.log.read_text(errors="replace"))
            if not found:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"worker exited {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
                return 0.0
            self.url = found.group(1)
        with urllib.request.urlopen(self.url, timeout=10) as resp:
            page = resp.read().decode()
        m = re.search(re.escape(f"{name}{{{labels}}}") + r" (\S+)", page)
        return float(m.group(1)) if m else 0.0

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def wait_for_partitions(workers: list[Worker], topic: str, timeout: float = 120) -> str:
    """Until each worker holds one partition of ``topic``; "" if that was the group's first
    assignment, else what happened before (a worker that read alone first)."""
    deadline = time.monotonic() + timeout
    while True:
        seen = []
        for w in workers:
            w.counter("fleetmedic_messages_in_total", "")  # raises if it died
            log = w.log.read_text(errors="replace")
            seen.append(re.findall(r"detect: partitions \[([\d, ]*)\] of " + re.escape(topic), log))
        last = [s[-1] if s else "" for s in seen]
        if all(h and "," not in h for h in last) and len(set(last)) == len(workers):
            first = [s[0] for s in seen]
            return "" if first == last else f"the workers' first assignments were {first}"
        if time.monotonic() > deadline:
            raise TimeoutError(f"workers hold partitions {last} of {topic} after {timeout:.0f}s")
        time.sleep(0.2)


class Stage1Run(NamedTuple):
    """Stage 1 reading the pre-produced messages, from the moment every worker consumes."""

    rate: float  # messages/s, wall
    per_cpu: float  # messages per CPU second of the workers
    cores: list[float]  # each worker's CPU share over the window
    others: float  # cores everything else on the machine used meanwhile (broker, bench, kernel)
    stolen: float  # cores the hypervisor stole meanwhile
    busy_s: list[float]  # how long each worker worked (the last to finish: the window)


class Round(NamedTuple):
    """One round of parts 1-3."""

    base: float  # plain read, messages/s, wall
    base_cpu: float  # plain read, messages per CPU s
    one: Stage1Run
    two: Stage1Run


def machine_cpu() -> tuple[float, float]:
    """This machine's CPU seconds so far, all cores together (/proc/stat): (busy, stolen by the
    hypervisor)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    # user nice system idle iowait irq softirq steal (guest time is counted in user already)
    busy = sum(fields[:8]) - fields[3] - fields[4] - fields[7]
    return busy / CLK_TCK, fields[7] / CLK_TCK


def stage1_rate(workers: list[Worker], topic: str, total: int, timeout: float = 600) -> Stage1Run:
    """Messages/s from the moment every worker consumes until all ``total`` are read."""
    labels = f'stage="detect",topic="{topic}"'
    deadline = time.monotonic() + timeout
    start: tuple[float, float, list[float]] | None = None
    # each worker's CPU time, sampled often (reading /proc costs the worker nothing): when did each
    # stop working (its share of the partitions read)
    cpu_seen: list[list[tuple[float, float]]] = [[] for _ in workers]
    counts = [0.0 for _ in workers]
    next_look = time.perf_counter()
    while True:
        now = time.perf_counter()
        for seen, w in zip(cpu_seen, workers, strict=True):
            seen.append((now, w.cpu_s()))
        if now >= next_look:
            counts = [w.counter("fleetmedic_messages_in_total", labels) for w in workers]
            now = time.perf_counter()
            if start is None and all(c > 0 for c in counts):
                start = (now, sum(counts), [w.cpu_s() for w in workers])
                machine0 = machine_cpu()
            if sum(counts) >= total and start is not None:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"stage 1 read {sum(counts)} of {total} in {timeout}s")
            # each look renders the worker's metrics page (a few ms of its CPU): look twice a second
            # while it reads, then often near the end, whose moment sets the wall-time rate
            wait = 0.1
            if start is not None and sum(counts) > start[1]:
                left = (total - sum(counts)) * (now - start[0]) / (sum(counts) - start[1])
                wait = 0.05 if left < 1.0 else min(0.5, left / 2)
            next_look = now + wait
        time.sleep(0.02)
    cpu = [w.cpu_s() - c for w, c in zip(workers, start[2], strict=True)]
    busy, stolen = (b - a for a, b in zip(machine0, machine_cpu(), strict=True))
    wall = now - start[0]
    done = sum(counts) - start[1]
    return Stage1Run(done / wall, done / max(sum(cpu), 1e-9), [c / wall for c in cpu], (busy - sum(cpu)) / wall,
                     stolen / wall, [_busy_until(seen, start[0]) for seen in cpu_seen])


def _busy_until(seen: list[tuple[float, float]], since: float) -> float:
    """Seconds from ``since`` to the last 0.1 s in which the worker used over half a core."""
    last = since
    for (t0, c0), (t1, c1) in zip(seen, seen[5:], strict=False):  # samples 20 ms apart: 0.1 s windows
        if t0 >= since and (c1 - c0) > 0.5 * (t1 - t0):
            last = t1
    return last - since


async def latency_run(bootstrap: str, settings: Settings, rate: float, seconds: float,
                      template: list[r.GpuTelemetry]) -> tuple[list[float], list[float]]:
    """Steady load at ``rate`` messages/s and a fault a second; per fault, in seconds: produced ->
    first command, and produced -> first finding (stage 1's share)."""
    gpu, commands = settings.topics.topic("telemetry.gpu"), settings.topics.topic("remediation.commands")
    findings = settings.topics.topic("findings")
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5, max_batch_size=1 << 20)
    consumer = AIOKafkaConsumer(commands, findings, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                enable_auto_commit=False, metadata_max_age_ms=1000)
    await producer.start()
    await consumer.start()
    faults: dict[str, float] = {}
    first_cmd: dict[str, float] = {}
    first_finding: dict[str, float] = {}

    async def read_commands() -> None:
        while True:
            for tp, recs in (await consumer.getmany(timeout_ms=200)).items():
                for rec in recs:
                    if tp.topic == findings:
                        node = r.decode(r.Finding, rec.value).node
                        if node.startswith("fault-node-"):
                            first_finding.setdefault(node, rec.timestamp / 1000)
                        continue
                    m = re.search(r":node:(fault-node-\d+):", r.decode(r.RemediationCommand, rec.value).incident_id)
                    if m and m.group(1) not in first_cmd:
                        first_cmd[m.group(1)] = rec.timestamp / 1000

    reader = asyncio.create_task(read_commands())
    # the fleet: ``rate`` nodes, each sending once a second (telemetry time runs with the
    # wall clock, so windows close and the model refits as often as in a real fleet); the message
    # bodies cycle through the template's. Each node's body is encoded once and its timestamp
    # written in per send: the load generator shares this machine's cores with the worker
    mark = 1234567890.125
    partitions = sorted(await producer.partitions_for(gpu))
    choose = DefaultPartitioner()
    fleet: list[tuple[bytes, bytes, bytes, int]] = []
    for k in range(max(1, round(rate))):
        key = f"lat-node-{k:05d}".encode()
        body = r.encode(msgspec.structs.replace(template[k % len(template)], node=key.decode(), ts=mark))
        head, _, tail = body.partition(b'"ts":%r' % mark)
        assert tail and body.count(b"%r" % mark) == 1, "the timestamp must appear once in a body"
        fleet.append((key, head + b'"ts":', tail, choose(key, partitions, partitions)))
    try:
        t_start, c_start, sent, tick = time.perf_counter(), time.process_time(), 0, 0
        next_fault = t_start + FIRST_FAULT_S
        ts0 = 1.8e9
        while time.perf_counter() - t_start < seconds:
            tick += 1
            stamp = b"%r" % (ts0 + tick)
            # 200 messages at a time, one batch per partition (a record at a time through send() took
            # twice the CPU: 0.29 cores instead of 0.14), keyed and partitioned as send() would
            for lo in range(0, len(fleet), 200):
                batches: dict[int, BatchBuilder] = {}
                for key, head, tail, partition in fleet[lo:lo + 200]:
                    batch = batches.get(partition) or batches.setdefault(partition, producer.create_batch())
                    if batch.append(key=key, value=head + stamp + tail, timestamp=None) is None:  # full
                        await producer.send_batch(batch, gpu, partition=partition)
                        batch = batches[partition] = producer.create_batch()
                        if batch.append(key=key, value=head + stamp + tail, timestamp=None) is None:
                            raise RuntimeError("a telemetry message larger than the producer's max_batch_size")
                for partition, batch in batches.items():
                    await producer.send_batch(batch, gpu, partition=partition)
                sent += min(200, len(fleet) - lo)
                ahead = sent / rate - (time.perf_counter() - t_start)
                if ahead > 0:
                    await asyncio.sleep(ahead)
                if time.perf_counter() >= next_fault:
                    node = f"fault-node-{len(faults)}"
                    fault = msgspec.structs.replace(template[0], node=node, ts=ts0 + tick,
                                                    xids=[r.XidEvent(gpu=3, xid=79, ts=ts0 + tick)])
                    faults[node] = time.time()
                    await producer.send(gpu, key=node.encode(), value=r.encode(fault))
                    next_fault += 1.0
        took = time.perf_counter() - t_start
        achieved, generator = sent / took, (time.process_time() - c_start) / took
        deadline = time.perf_counter() + 30
        while len(first_cmd) < len(faults) and time.perf_counter() < deadline:
            await asyncio.sleep(0.2)
    finally:
        reader.cancel()
        await producer.stop()
        await consumer.stop()
    print(f"  load {achieved:,.0f} messages/s = {8 * achieved:,.0f} GPU samples/s for {seconds:.0f} s; "
          f"{len(faults)} faults, {len(first_cmd)} answered; the load generator used {generator:.2f} cores")
    inf = float("inf")
    return ([first_cmd[n] - t if n in first_cmd else inf for n, t in faults.items()],
            [first_finding[n] - t if n in first_finding else inf for n, t in faults.items()])


def state_costs(wire: list[bytes], settings: Settings) -> None:
    dec = r.decoder_for(r.GpuTelemetry)
    msgs = [dec.decode(b) for b in wire]
    stage = NodeDetection(settings.detection)
    for i in range(0, len(msgs), 256):
        stage.on_gpu(msgs[i:i + 256])
    nodes = stage.gpu.nodes()
    sizes = [len(msgspec.msgpack.encode(NodeStageState(gpu=stage.gpu.node_bytes(n),
                                                       ports=stage.ports.node_bytes(n), written_at=0.0))) + len(n)
             for n in nodes]
    per_node = float(np.mean(sizes))
    telemetry = float(np.mean([len(b) for b in wire]))
    every = settings.streams.detect_snapshot_every_s / settings.detection.sample_interval_s  # messages per write
    print("stage-1 state written per telemetry message (telemetry itself: "
          f"{telemetry:,.0f} bytes/message)")
    print(f"  whole node state per message (table)  {per_node:10,.0f} bytes   {per_node / telemetry:5.2f}x telemetry")
    print(f"  per-node snapshot every {settings.streams.detect_snapshot_every_s:.0f} s         "
          f"{per_node / every:10,.0f} bytes   {per_node / every / telemetry:5.2f}x telemetry")

    enc = msgspec.msgpack.Encoder()
    batches = [summary_columns(msgs[i:i + 256]) for i in range(0, len(msgs), 256)]
    summary_bytes = sum(len(enc.encode(b)) for b in batches) / len(msgs)
    decode_batch = msgspec.msgpack.Decoder(SummaryColumns).decode
    wire_batches = [enc.encode(b) for b in batches]
    c0 = time.process_time()
    for b in wire:
        summarise(dec.decode(b))
    raw_cpu = (time.process_time() - c0) / len(wire)
    c0 = time.process_time()
    for wb in wire_batches:
        decode_batch(wb).summaries()  # as the decision stage does: one NodeSummary per node sample
    sum_cpu = (time.process_time() - c0) / len(wire)
    print("decision stage's peer input per node sample")
    print(f"  raw telemetry (decode + summarise)    {telemetry:10,.0f} bytes   {raw_cpu * 1e6:6.1f} us CPU")
    print(f"  stage 1's node summaries (batched)    {summary_bytes:10,.0f} bytes   {sum_cpu * 1e6:6.1f} us CPU   "
          f"({telemetry / summary_bytes:.0f}x fewer bytes, {raw_cpu / max(sum_cpu, 1e-12):.0f}x less CPU)")


def throughput(work: Path, bootstrap: str, u: str, wire: list[bytes], keys: list[bytes], rounds: int,
               streams: str = "") -> float:
    """Parts 1-3 in ``rounds`` rounds (plain read, one worker, two workers; a last plain read):
    each ratio is taken between runs next to each other, as this machine's speed drifts by tens
    of percent over minutes; the median round counts. Returns one worker's median messages/s."""
    total = len(wire)
    prefix = f"bench{u}."
    _, s1 = config(work, bootstrap, prefix, f"bench{u}-setup")
    asyncio.run(ensure_topics(s1))
    topic = s1.topics.topic("telemetry.gpu")
    took = asyncio.run(produce_all(bootstrap, topic, wire, keys))
    print(f"pre-produced in {took:.1f} s ({total / took:,.0f} messages/s)\n")
    reads = [asyncio.run(plain_consumer(bootstrap, topic, total))]
    rows: list[Round] = []
    others: list[list[float]] = []  # per round, per CPU s: plain read decoding as the worker does, no decoding
    for k in range(rounds):
        cfg1, _ = config(work, bootstrap, prefix, f"bench{u}-one{k}", streams)  # a new group each time: fresh state
        one = Worker(cfg1, "detect", work, f"one-{k}")
        try:
            run1 = stage1_rate([one], topic, total)
        finally:
            one.stop()
        # a new group; the broker's group.initial.rebalance.delay.ms (see broker()) lets both workers
        # join before the first assignment, else the first would read both partitions alone
        cfg2, _ = config(work, bootstrap, prefix, f"bench{u}-two{k}", streams)
        two = [Worker(cfg2, "detect", work, f"two-{k}-{i}") for i in range(2)]
        try:
            alone = wait_for_partitions(two, topic)
            run2 = stage1_rate(two, topic, total)
        finally:
            for w in two:
                w.stop()
        if alone:
            print(f"  round {k + 1}: not a scale-out figure: {alone}")
        reads.append(asyncio.run(plain_consumer(bootstrap, topic, total)))
        # other baselines, for the record: decoding only what the worker decodes, and no decoding
        other = [asyncio.run(plain_consumer(bootstrap, topic, total, rec)) for rec in (r.DetectionTelemetry, None)]
        others.append([total / c for _, c in other])
        # the faster of the plain reads before and after: a slow spell in one would flatter the ratio
        base = total / min(w for w, _ in reads[-2:])
        base_cpu = total / min(c for _, c in reads[-2:])
        rows.append(Round(base, base_cpu, run1, run2))
    print("round  plain read (GPU samples/s, per CPU s)   1 worker (wall, per CPU s; x plain wall, CPU; cores)"
          "          2 workers (wall, per CPU s; x 1 worker = x per CPU s * x cores; cores each; others, stolen; "
          "s each worked)")
    for k, row in enumerate(rows):
        one, two = row.one, row.two
        print(f"{k + 1:5d}  {8 * row.base:10,.0f} {8 * row.base_cpu:10,.0f}              "
              f"{8 * one.rate:10,.0f} {8 * one.per_cpu:10,.0f}  {one.rate / row.base:4.2f}x "
              f"{one.per_cpu / row.base_cpu:4.2f}x  {one.cores[0]:.2f}"
              f"          {8 * two.rate:10,.0f} {8 * two.per_cpu:10,.0f}  {two.rate / one.rate:4.2f}x = "
              f"{two.per_cpu / one.per_cpu:4.2f} * {sum(two.cores) / one.cores[0]:4.2f}; "
              f"{', '.join(f'{c:.2f}' for c in two.cores)}; {two.others:.2f}, {two.stolen:.2f}; "
              f"{', '.join(f'{b:.1f}' for b in two.busy_s)}")

    rate1 = float(np.median([row.one.rate for row in rows]))
    print(f"median: 1 detect worker {8 * rate1:,.0f} GPU samples/s (target >= 100k), "
          f"{np.median([row.one.rate / row.base for row in rows]):.2f}x wall and "
          f"{np.median([row.one.per_cpu / row.base_cpu for row in rows]):.2f}x CPU of the plain consumer "
          f"(target >= 0.5x); 2 workers {np.median([row.two.rate / row.one.rate for row in rows]):.2f}x one "
          f"(target >= 1.7x) on {os.cpu_count()} cores shared with the broker and the bench")
    efficiency = np.median([row.two.per_cpu / row.one.per_cpu for row in rows])
    cores = np.median([sum(row.two.cores) / row.one.cores[0] for row in rows])
    print(f"  two workers: each did {efficiency:.2f}x of one alone per CPU second and they got {cores:.2f}x "
          f"its cores; everything else (broker, bench, kernel) used {np.median([row.two.others for row in rows]):.2f} "
          f"cores meanwhile, the hypervisor stole {np.median([row.two.stolen for row in rows]):.2f} (medians)")
    lean, raw = (np.median([row.one.per_cpu / o[j] for row, o in zip(rows, others, strict=True)]) for j in (0, 1))
    print(f"  the same worker per CPU s against other plain reads: {lean:.2f}x of one decoding only what the worker "
          f"decodes (DetectionTelemetry, {8 * np.median([o[0] for o in others]):,.0f}/s), {raw:.2f}x of one not "
          f"decoding at all ({8 * np.median([o[1] for o in others]):,.0f}/s)")
    return rate1


def latency(work: Path, bootstrap: str, u: str, template: list[r.GpuTelemetry], rate: float, seconds: float) -> None:
    """Part 4, at ``rate`` messages/s."""
    # a fault a second on fresh nodes trips the breaker (3 suspects in 5 min) within seconds, and
    # a tripped breaker holds commands back: measure latency with the budgets out of the way
    relaxed = ("safety: {max_new_isolations: 100000, max_quarantined_count: 100000, max_quarantined_fraction: 1.0,"
               " max_per_rack: 100000, max_per_switch: 100000,"
               " breaker: {trip_min_nodes: 100000, signature_min_nodes: 100000, domain_min_nodes: 100000}}\n")
    cfg, settings = config(work, bootstrap, f"bench{u}l.", f"bench{u}-lat", relaxed)
    asyncio.run(ensure_topics(settings))
    worker = Worker(cfg, "all", work, "latency")
    try:
        deadline = time.monotonic() + 120
        while "Ready" not in worker.log.read_text(errors="replace") and time.monotonic() < deadline:
            worker.counter("fleetmedic_messages_in_total", "")  # raises if it died
            time.sleep(0.2)
        print(f"\ningest -> command latency, one --role all worker, target load {8 * rate:,.0f} GPU samples/s")
        to_command, to_finding = asyncio.run(latency_run(bootstrap, settings, rate, seconds, template))
        lat, stage1 = np.array(to_command), np.array(to_finding)
        busy = {st: (worker.counter("fleetmedic_processing_seconds_sum", f'stage="{st}"'),
                     worker.counter("fleetmedic_processing_seconds_count", f'stage="{st}"'))
                for st in ("detect", "decide", "tick")}
        print("  worker time per stage: "
              + ", ".join(f"{st} {t:.1f} s in {n:.0f} calls" for st, (t, n) in busy.items()))
    finally:
        worker.stop()
    if len(lat):
        print("  each fault, in order (s): " + " ".join(f"{x:.2f}" for x in lat))
        print("  of which to its finding:  " + " ".join(f"{x:.2f}" for x in stage1))

        def line(label: str, x: NDArray[np.float64], y: NDArray[np.float64]) -> str:
            p50, p99, f50, f99 = np.percentile(x, 50), np.percentile(x, 99), np.percentile(y, 50), np.percentile(y, 99)
            return (f"  {label:<34} p50 {p50:.3f} s  p99 {p99:.3f} s  max {x.max():.3f} s   "
                    f"(to the finding: p50 {f50:.3f} s, p99 {f99:.3f} s)")

        steady = np.arange(len(lat)) + FIRST_FAULT_S >= STEADY_AFTER_S
        print(line("latency, every fault", lat, stage1))
        print(line(f"  from {STEADY_AFTER_S:.0f} s on (steady)", lat[steady], stage1[steady])
              + "   (target p99 <= 1 s)\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # 280,000: one worker reads for 8-12 s here and two for 4-7 s, long enough that their start
    # (first fetches) does not decide the rate; at 120,000 two workers read for about 2 s and their
    # ratio to one ranged from 1.64x to 2.22x between the rounds of one run. 280 messages per node,
    # 1 s apart: under multivariate.window_s (300 s), so no window closes and no model is fitted
    # in the measured seconds (a fleet does that once per window_s and refit_interval_s)
    ap.add_argument("--messages", type=int, default=280_000, help="pre-produced GpuTelemetry messages")
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--latency-s", type=float, default=30.0)
    ap.add_argument("--latency-rate", type=float, help="messages/s for part 4 (default: from part 2)")
    ap.add_argument("--interval-s", type=float, default=1.0, help="telemetry time between a node's messages")
    ap.add_argument("--batch-size", type=int, help="the workers' streams.batch_size (default: the config's)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of parts 1-3 (the median counts)")
    ap.add_argument("--only", choices=["throughput", "latency", "costs"], help="run one part")
    args = ap.parse_args()
    ticks = max(1, args.messages // args.nodes)
    # 1 Hz, the fleet: at the default 10 s the bench's few seconds would span minutes of
    # telemetry, closing every node's multivariate window and fitting the model (0.5 s of MinCovDet
    # on 1,000 windows) in them, work a real fleet does once per window_s and refit_interval_s
    wire = make_messages(args.nodes, ticks, interval_s=args.interval_s)
    total, samples = len(wire), 8 * len(wire)
    keys = [f"gpu-node-{i % args.nodes:05d}".encode() for i in range(total)]
    print(f"{total} messages ({samples} GPU samples, {np.mean([len(b) for b in wire]):,.0f} bytes each), "
          f"{args.nodes} nodes; machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
    if args.only in (None, "throughput", "latency"):
        with tempfile.TemporaryDirectory(prefix="fm-bench-") as tmp, broker(Path(tmp)) as bootstrap:
            u = uuid.uuid4().hex[:8]
            rate = args.latency_rate or 100_000 / 8
            if args.only in (None, "throughput"):
                streams = f"streams: {{batch_size: {args.batch_size}}}\n" if args.batch_size else ""
                measured = throughput(Path(tmp), bootstrap, u, wire, keys, args.rounds, streams)
                rate = args.latency_rate or min(100_000 / 8, 0.7 * measured)
            if args.only in (None, "latency"):
                template = [r.decode(r.GpuTelemetry, b) for b in wire[: args.nodes]]
                latency(Path(tmp), bootstrap, u, template, rate, args.latency_s)
    if args.only in (None, "costs"):
        state_costs(wire[: args.nodes * min(ticks, 30)], Settings())


if __name__ == "__main__":
    main()
