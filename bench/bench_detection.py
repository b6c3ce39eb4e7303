"""Detection throughput: decode + baselines + detectors, against decode alone, in the same run.

    .venv/bin/python bench/bench_detection.py [--nodes 512] [--ticks 40] [--batch 256]

Prints GPU samples/s for (a) msgspec decode only (the floor no pipeline beats), (b) decode + numpy
conversion, (c) decode + the full GPU detector with micro-batches (baselines, drift, rules, XIDs),
(e) decode + everything stage 1 does per message (c + the multivariate model's windows and the
per-node summaries for the peer comparisons), (d) the GPU detector one message at a time; the
ratios to (a) (target >= 0.4), the absolute rate (target >= 200k GPU samples/s per core), and the
detector state size per GPU (target <= 4 KB). Single process, single thread; rates are in the
process's CPU time, so a busy machine disturbs them less than wall-clock time would; the variants
run in interleaved rounds (`--rounds`) and the best of each counts, so a busy spell hits them alike.
"""

from __future__ import annotations

import argparse
import gc
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np

from fleetmedic import records as r
from fleetmedic.config import Settings
from fleetmedic.models.gpu_detector import GpuDetector, metrics_array
from fleetmedic.models.stages import NodeDetection, stage1_batch, summarise_batch


def make_messages(nodes: int, ticks: int, seed: int = 0, interval_s: float = 10.0) -> list[bytes]:
    """A realistic 8-GPU dcgm field set per node and tick (all metrics present, counters growing),
    ticks ``interval_s`` apart."""
    rng = np.random.default_rng(seed)
    out = []
    for t in range(ticks):
        for n in range(nodes):
            temp = 60 + rng.normal(0, 1, 8)
            m = r.GpuMetrics(
                gpu_temp=temp.round(1).tolist(),
                memory_temp=(temp + 6).round(1).tolist(),
                power_usage=(650 + rng.normal(0, 8, 8)).round(2).tolist(),
                sm_clock=[1980.0] * 8,
                mem_clock=[2619.0] * 8,
                gpu_util=[99.0] * 8,
                mem_copy_util=[40.0] * 8,
                fb_used=[61000.0] * 8,
                fb_free=[20000.0] * 8,
                clocks_event_reasons=[0] * 8,
                power_violation=[0] * 8,
                thermal_violation=[0] * 8,
                ecc_sbe_vol_total=[t // 7] * 8,
                ecc_dbe_vol_total=[0] * 8,
                retired_sbe=[0] * 8,
                retired_dbe=[0] * 8,
                retired_pending=[0] * 8,
                uncorrectable_remapped_rows=[0] * 8,
                correctable_remapped_rows=[2] * 8,
                row_remap_failure=[0] * 8,
                row_remap_pending=[0] * 8,
                pcie_replay_counter=[t // 11] * 8,
                pcie_link_gen=[5] * 8,
                pcie_link_width=[16] * 8,
                nvlink_crc_flit_error_count_total=[0] * 8,
                nvlink_crc_data_error_count_total=[0] * 8,
                nvlink_replay_error_count_total=[0] * 8,
                nvlink_recovery_error_count_total=[0] * 8,
                nvlink_links_down=[0] * 8,
                xid_errors=[0] * 8,
                prof_sm_active=[0.8] * 8,
                prof_pipe_tensor_active=[0.55] * 8,
                prof_dram_active=[0.4] * 8,
            )
            msg = r.GpuTelemetry(node=f"gpu-node-{n:05d}", ts=1.79e9 + interval_s * t, gpus=list(range(8)), metrics=m,
                                 uuids=[f"GPU-{n:05d}-{g}" for g in range(8)], sku="H100-SXM5-80GB", boot_id="b0")
            out.append(r.encode(msg))
    return out


def rate(fn, samples: int, repeat: int = 3) -> float:
    """Best of ``repeat`` runs, in this process's CPU time (robust on a shared machine; one thread)."""
    best = float("inf")
    gc.collect()
    gc.disable()  # as timeit does: a collection landing in one run would decide the figure
    try:
        for _ in range(repeat):
            t0 = time.process_time()
            fn()
            best = min(best, time.process_time() - t0)
    finally:
        gc.enable()
    return samples / best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=512)
    ap.add_argument("--ticks", type=int, default=40)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds; the best of each variant counts")
    args = ap.parse_args()
    wire = make_messages(args.nodes, args.ticks)
    samples = 8 * len(wire)
    dec = r.decoder_for(r.GpuTelemetry)
    settings = Settings().detection

    def decode_only() -> None:
        for b in wire:
            dec.decode(b)

    def decode_numpy() -> None:
        for b in wire:
            metrics_array(dec.decode(b))

    def full_batched() -> None:
        det = GpuDetector(settings)
        for i in range(0, len(wire), args.batch):
            det.observe_batch([dec.decode(b) for b in wire[i : i + args.batch]])

    def stage1() -> None:
        stage = NodeDetection(settings)
        for i in range(0, len(wire), args.batch):
            msgs = [dec.decode(b) for b in wire[i : i + args.batch]]
            batch = stage1_batch(msgs)  # as the detect worker does: the columns converted once for both
            stage.on_gpu(msgs, batch)
            summarise_batch(msgs, batch)

    def full_single() -> None:
        det = GpuDetector(settings)
        for b in wire:
            det.observe(dec.decode(b))

    print(f"{len(wire)} messages, {samples} GPU samples, {len(wire[0])} bytes/message, batch {args.batch}")
    # interleaved rounds, best of each: a busy spell on a shared machine hits every variant alike
    best = {"decode": 0.0, "numpy": 0.0, "full": 0.0, "stage1": 0.0}
    for _ in range(args.rounds):
        for name, fn in (("decode", decode_only), ("numpy", decode_numpy), ("full", full_batched), ("stage1", stage1)):
            best[name] = max(best[name], rate(fn, samples, repeat=1))
    base, r_np, r_full = best["decode"], best["numpy"], best["full"]
    print(f"decode only                 {base:12,.0f} GPU samples/s   (baseline)")
    print(f"decode + numpy              {r_np:12,.0f} GPU samples/s   {r_np / base:5.2f}x")
    print(f"decode + detect (batched)   {r_full:12,.0f} GPU samples/s   {r_full / base:5.2f}x"
          "   (targets: >=200k, >=0.4x)")
    r_s1 = best["stage1"]
    print(f"decode + stage 1            {r_s1:12,.0f} GPU samples/s   {r_s1 / base:5.2f}x"
          "   (+ multivariate windows and peer summaries, as the detect worker runs them)")
    r_one = rate(full_single, samples, repeat=1)
    print(f"decode + detect (1 by 1)    {r_one:12,.0f} GPU samples/s   {r_one / base:5.2f}x")
    det = GpuDetector(settings)
    for i in range(0, len(wire), args.batch):
        det.observe_batch([dec.decode(b) for b in wire[i : i + args.batch]])
    sizes = [len(det.node_bytes(n) or b"") for n in det.nodes()]
    print(f"detector state              {np.mean(sizes) / 8:12,.0f} bytes per GPU (serialised; target <= 4096)")


if __name__ == "__main__":
    main()
