"""Stage 1's memory under a stream of distinct node names (without eviction
250k names would grow it to about 951 MB, linearly).

    .venv/bin/python bench/bench_stage1_names.py [--names 250000] [--batch 1000] [--tracemalloc]

Runs stage 1 (:class:`~fleetmedic.streams.detect.DetectStage`: decode, the detectors, the
summaries, a checkpoint every ``--checkpoint-every`` polls; its sends are discarded) over
``--names`` GPU records of 8 GPUs, every one from a new node name, 10 s apart per poll, twice, each
in a fresh process: with eviction off (``max_nodes_per_worker`` and ``evict_node_after_s`` at
their maxima: the behaviour before) and with the shipped defaults (50,000 nodes). Prints, per
run, the nodes kept, the resident set size (RSS, from /proc) growth over the run and, with
``--tracemalloc``, the Python heap that stays allocated at the end (slower).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import subprocess
import sys
import time
import tracemalloc
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord
from prometheus_client import CollectorRegistry

from fleetmedic import records as r
from fleetmedic.config import Settings, parse_config
from fleetmedic.streams.detect import DetectStage
from fleetmedic.streams.metrics import PipelineMetrics
from fleetmedic.streams.outputs import Outputs

OFF = "detection: {max_nodes_per_worker: 1000000000, evict_node_after_s: 1000000000.0}"


class Discard(Outputs):
    """Outputs that send nothing (the bench measures the stage's own memory)."""

    async def send_raw(self, topic: str, key: bytes, value: bytes | None, partition: int | None = None,
                       headers: Any = None) -> Any:
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    async def flush(self) -> None:
        return None


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def template(ts: float) -> r.GpuTelemetry:
    g = 8
    m = r.GpuMetrics(gpu_temp=[60.0] * g, memory_temp=[66.0] * g, power_usage=[650.0] * g, sm_clock=[1980.0] * g,
                     mem_clock=[2619.0] * g, gpu_util=[99.0] * g, fb_used=[61000.0] * g, fb_free=[20000.0] * g,
                     clocks_event_reasons=[0] * g, ecc_sbe_vol_total=[0] * g, ecc_dbe_vol_total=[0] * g,
                     pcie_replay_counter=[0] * g, nvlink_crc_flit_error_count_total=[0] * g, xid_errors=[0] * g)
    return r.GpuTelemetry(node="x", ts=ts, gpus=list(range(g)), metrics=m, sku="H100-SXM5-80GB", boot_id="b0")


def run(names: int, batch: int, config: str, checkpoint_every: int, trace: bool) -> dict[str, Any]:
    settings: Settings = parse_config(config, env={}) if config else Settings()
    metrics = PipelineMetrics(CollectorRegistry())
    stage = DetectStage(settings, Discard(settings, metrics), metrics, batch, 0.5, 60.0, 10.0)
    tp = TopicPartition(stage.gpu_topic, 0)
    base = r.encode(template(1.79e9)).replace(b'"node":"x"', b'"node":"%s"').replace(b'"ts":1790000000.0', b'"ts":%s')
    assert base.count(b"%s") == 2, base[:200]
    if trace:
        tracemalloc.start()
    gc.collect()
    start_rss, started = rss_bytes(), time.process_time()

    async def main() -> None:
        offset = 0
        for poll, first in enumerate(range(0, names, batch)):
            ts = str(1.79e9 + 10.0 * poll).encode()
            recs = []
            for i in range(first, min(names, first + batch)):
                node = f"probe-node-{i:07d}".encode()
                value = base % (node, ts)
                recs.append(ConsumerRecord(tp.topic, 0, offset, -1, 0, node, value, None, len(node), len(value), ()))
                offset += 1
            await stage._process({tp: recs})
            if (poll + 1) % checkpoint_every == 0:
                await stage.checkpoint()
        await stage.checkpoint()

    asyncio.run(main())
    gc.collect()
    out = {"names": names, "kept": stage.node_stage.tracked(), "gpu_state_nodes": len(stage.node_stage.gpu.nodes()),
           "partition_of": len(stage.partition_of), "rss_growth_mb": round((rss_bytes() - start_rss) / 2**20, 1),
           "cpu_s": round(time.process_time() - started, 1),
           "evicted": {k: metrics.registry.get_sample_value("fleetmedic_stage1_nodes_evicted_total", {"reason": k})
                       for k in ("capacity", "silence")}}
    if trace:
        current, peak = tracemalloc.get_traced_memory()
        out |= {"heap_mb": round(current / 2**20, 1), "heap_peak_mb": round(peak / 2**20, 1)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--names", type=int, default=250_000)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--checkpoint-every", type=int, default=20, help="polls between checkpoints")
    ap.add_argument("--tracemalloc", action="store_true")
    ap.add_argument("--one", choices=("off", "defaults"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(run(a.names, a.batch, OFF if a.one == "off" else "", a.checkpoint_every, a.tracemalloc)))
        return
    for label, one in (("eviction off (before)", "off"), ("shipped defaults (after)", "defaults")):
        argv = [sys.executable, __file__, "--one", one, "--names", str(a.names), "--batch", str(a.batch),
                "--checkpoint-every", str(a.checkpoint_every), *(["--tracemalloc"] if a.tracemalloc else [])]
        done = subprocess.run(argv, capture_output=True, text=True, check=True)
        print(f"{label:26s} {done.stdout.strip()}")


if __name__ == "__main__":
    main()
