"""A held-out 32-node fleet in stock exporter format (no tests here).

Written for the held-out evaluation (tests/evaluation/test_fleet32.py) without fleetmedic's
simulator: its telemetry is what stock dcgm-exporter (4.5.3-4.8.2, ``default-counters.csv``) and
node-exporter (1.12.1, infiniband collector) publish, as Prometheus stores it after scraping, for
32 DGX-H100-like nodes (8 GPUs, 8 InfiniBand compute ports each) over 3 h at a 30 s scrape interval.

Series and labels come from the field corpus (tests/data/field/): dcgm-exporter's default counter
set, plus the ECC volatile counters (the default set comments them out; the double-bit error below
needs them) and, of the four NVLink error counters, only ``DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL``
(many users enable only that one). dcgm-exporter's labels are ``gpu``, ``UUID``, ``pci_bus_id``,
``device``, ``modelName``, ``Hostname`` (the node name, as gpu-operator sets it) and
``DCGM_FI_DRIVER_VERSION``, with ``err_code``/``err_msg`` on the XID gauge; node-exporter's are
``device`` and ``port``. Prometheus adds ``instance`` and ``job``. The default counter set has no
clock-event bitmask and no violation counters, so the thermal throttle below shows only as what it
carries: the GPU's temperature rising and its SM clock and power falling under load.

The fleet (:data:`HARD`, :data:`DEGRADED`, :data:`TRAPS` name the nodes):

- workload: three jobs keep 30 nodes busy (a checkpoint dip every 40 min, one job restarting
  for 8 min), two nodes run light; each hard fault stops its whole job for 8-10 min (lock-step
  ranks), and after the XID 79 the job restarts on a spare (one of the light nodes) instead;
  temperatures, power, clocks and utilisation vary per node and GPU, with a slow (daily) ambient
  drift and jitter; counters only grow (a few healthy GPUs and
  ports count a stray PCIe replay, SBE or symbol error now and then; busy ports count transmit
  waits: congestion);
- 3 hard faults: XID 79 (fallen off the bus: the gauge shows 79 for two scrapes, then the GPU is
  gone from every series and its job stops), a double-bit ECC error (the volatile DBE count rises
  0 -> 1 -> 2), an InfiniBand port going down (``state_id`` 4 -> 1, ``physical_state_id`` 5 -> 3,
  ``link_downed`` +1, no more traffic);
- 4 degradations: a PCIe replay counter rising 30-40 per 30 s on one GPU (z ~ 140 against its
  history at the detector's floor), one port's symbol errors rising 30-120 per 30 s (no other port
  of the fleet rising), one GPU's NVLink CRC flit errors rising 40-90 per 30 s (its 7 siblings at
  0), one GPU throttling thermally under load (temperature +15 C over 10 min, SM clock 1980 ->
  ~1450 MHz, power down ~115 W);
- healthy but odd (no node here may be isolated): a node 4 C hotter than the rest all along, a
  node whose scrapes are missed now and then (twice two in a row), a node whose exporters restart
  (4 scrapes missed, every counter back at 0 after), a GPU whose XID gauge shows an old XID 13
  throughout (the gauge keeps the last XID).

Each node's temperature carries a random offset too (sd 1.2 C): with the default seed the hot
node runs 3.9 C above the fleet's power-adjusted median, whose robust spread is 1.4 C (z 2.7
against ``peers.z_threshold`` 3.5); other seeds place it differently (seed 3: 4.9 C at a spread of
1.0 C, z 4.8, and ``sku_peers`` flags it).

Faults begin after the baselines' warm-up (``baseline.warmup_samples`` 30 samples: 15 min at
30 s; the first fault is 70 min in), at different times, on different nodes.
"""

from __future__ import annotations

import math
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

NODES = 32
GPUS = 8
PORTS = 8
STEP = 30  # s, the scrape interval
TICKS = 360  # 3 h
DRIVER = "550.90.07"
MODEL = "NVIDIA H100 80GB HBM3"
#: DGX H100's GPU PCI addresses, GPU 0-7
PCI = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")


def node_name(i: int) -> str:
    return f"dgx-h100-{i:03d}"


#: hard faults: node -> what
HARD: dict[str, str] = {
    node_name(4): "XID 79 on GPU 5 at 75 min: the GPU fell off the bus",
    node_name(10): "double-bit ECC error on GPU 2 at 90 min (DBE volatile 0 -> 1 -> 2)",
    node_name(15): "InfiniBand port mlx5_3 down at 105 min (state 4 -> 1, physical 5 -> 3)",
}
#: degradations: node -> what
DEGRADED: dict[str, str] = {
    node_name(20): "PCIe replays on GPU 6 rising 30-40 per 30 s from 70 min",
    node_name(23): "symbol errors on mlx5_5 rising 30-120 per 30 s from 95 min",
    node_name(27): "NVLink CRC flit errors on GPU 1 rising 40-90 per 30 s from 115 min (siblings at 0)",
    node_name(30): "GPU 4 throttling thermally under load from 125 min (+15 C, SM clock ~1450 MHz)",
}
#: healthy nodes with something odd about them
TRAPS: dict[str, str] = {
    node_name(6): "4 C hotter than the rest, all along",
    node_name(12): "scrapes missed now and then",
    node_name(18): "exporters restarted at 100 min: 4 scrapes missed, counters back at 0",
    node_name(8): "GPU 3's XID gauge shows an old XID 13 throughout",
}

XID79 = (4, 5, 150)
DBE = (10, 2, 180)
IB_DOWN = (15, 3, 210)
PCIE = (20, 6, 140)
SYMBOL = (23, 5, 190)
NVLINK = (27, 1, 230)
THERMAL = (30, 4, 250)
HOT_NODE = 6
FLAKY_NODE = 12
RESTART = (18, 200, 4)  # node, tick, scrapes missed
OLD_XID = (8, 3)

#: dcgm-exporter series: name, exposition type, HELP (default-counters.csv 4.5.3-4.8.2, plus ECC
#: volatile and NVLink CRC flit)
DCGM_SERIES: tuple[tuple[str, str, str], ...] = (
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C)."),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot (in mJ)."),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries."),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %)."),
    ("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %)."),
    ("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %)."),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB)."),
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", "Total number of single-bit volatile ECC errors."),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Total number of double-bit volatile ECC errors."),
    ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink flow-control CRC errors."),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter", "Total number of NVLink bandwidth counters for all lanes."),
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge", "vGPU License status"),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for uncorrectable errors"),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for correctable errors"),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed"),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active."),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor (HMMA) pipe is active."),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "gauge",
     "Ratio of cycles the device memory interface is active sending or receiving data."),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge", "The rate of data transmitted over the PCIe bus - including both "
     "protocol headers and data payloads - in bytes per second."),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge", "The rate of data received over the PCIe bus - including both "
     "protocol headers and data payloads - in bytes per second."),
)
#: node-exporter infiniband series: name, type, HELP (collector/infiniband_linux.go, v1.12.1)
IB_SERIES: tuple[tuple[str, str, str], ...] = (
    ("node_infiniband_excessive_buffer_overrun_errors_total", "counter",
     "Number of times that OverrunErrors consecutive flow control update periods occurred, each having at least "
     "one overrun error."),
    ("node_infiniband_link_downed_total", "counter",
     "Number of times the link failed to recover from an error state and went down"),
    ("node_infiniband_link_error_recovery_total", "counter",
     "Number of times the link successfully recovered from an error state"),
    ("node_infiniband_local_link_integrity_errors_total", "counter",
     "Number of times that the count of local physical errors exceeded the threshold specified by "
     "LocalPhyErrors."),
    ("node_infiniband_multicast_packets_received_total", "counter", "Number of multicast packets received"),
    ("node_infiniband_multicast_packets_transmitted_total", "counter", "Number of multicast packets transmitted"),
    ("node_infiniband_physical_state_id", "gauge", "Physical state of the InfiniBand port (0: no change, 1: "
     "sleep, 2: polling, 3: disable, 4: shift, 5: link up, 6: link error recover, 7: phytest)"),
    ("node_infiniband_port_constraint_errors_received_total", "counter",
     "Number of packets received on the switch physical port that are discarded"),
    ("node_infiniband_port_constraint_errors_transmitted_total", "counter",
     "Number of packets not transmitted from the switch physical port"),
    ("node_infiniband_port_data_received_bytes_total", "counter", "Number of data octets received on all links"),
    ("node_infiniband_port_data_transmitted_bytes_total", "counter",
     "Number of data octets transmitted on all links"),
    ("node_infiniband_port_discards_received_total", "counter",
     "Number of inbound packets discarded by the port because the port is down or congested"),
    ("node_infiniband_port_discards_transmitted_total", "counter",
     "Number of outbound packets discarded by the port because the port is down or congested"),
    ("node_infiniband_port_errors_received_total", "counter", "Number of packets containing an error that were "
     "received on this port"),
    ("node_infiniband_port_packets_received_total", "counter", "Number of packets received on all VLs by this "
     "port (including errors)"),
    ("node_infiniband_port_packets_transmitted_total", "counter", "Number of packets transmitted on all VLs from "
     "this port (including errors)"),
    ("node_infiniband_port_transmit_wait_total", "counter",
     "Number of ticks during which the port had data to transmit but no data was sent during the entire tick"),
    ("node_infiniband_rate_bytes_per_second", "gauge", "Maximum signal transfer rate"),
    ("node_infiniband_state_id", "gauge", "State of the InfiniBand port (0: no change, 1: down, 2: init, 3: "
     "armed, 4: active, 5: act defer)"),
    ("node_infiniband_unicast_packets_received_total", "counter", "Number of unicast packets received"),
    ("node_infiniband_unicast_packets_transmitted_total", "counter", "Number of unicast packets transmitted"),
    ("node_infiniband_port_receive_remote_physical_errors_total", "counter",
     "Number of packets marked with the EBP (End of Bad Packet) delimiter received on the port."),
    ("node_infiniband_port_receive_switch_relay_errors_total", "counter",
     "Number of packets that could not be forwarded by the switch."),
    ("node_infiniband_symbol_error_total", "counter", "Number of minor link errors detected on one or more "
     "physical lanes."),
    ("node_infiniband_vl15_dropped_total", "counter", "Number of incoming VL15 packets dropped due to resource "
     "limitations."),
)
XID_TEXT = {0: "No Error", 13: "Graphics Engine Exception", 79: "GPU has fallen off the bus"}


@dataclass
class Fleet:
    """The fleet's values: ``dcgm[series][node]`` is ``[TICKS, GPUS]``, ``ib[series][node]``
    ``[TICKS, PORTS]``; ``scraped[exporter][node, tick]`` whether that scrape happened;
    ``gpu_listed[node][tick, gpu]`` whether the exporter lists the GPU."""

    start: int
    dcgm: dict[str, np.ndarray]
    ib: dict[str, np.ndarray]
    scraped: dict[str, np.ndarray]
    gpu_listed: np.ndarray
    uuids: list[list[str]]
    dcgm_ip: list[str]
    labels: dict[tuple[int, int], str] = field(default_factory=dict)  # a GPU's dcgm-exporter labels

    def ts(self, k: int) -> int:
        return self.start + STEP * k


def _load(t_s: np.ndarray, node: int, on: set[str]) -> np.ndarray:
    """The node's job load (0-1) at each time (seconds from the start). A hard fault stops its
    whole job (the ranks run in lock-step): every node of it idles until the job restarts from its
    checkpoint 8-10 min later; after the XID 79 the job restarts without that node, on the spare
    dgx-h100-031 instead."""
    minute = t_s / 60.0
    job = 0 if node <= 12 else 1 if node <= 24 else 2
    if node == 31 and "xid79" in on:  # light work, then the spare that job A restarts on
        job = 0
    elif node in (31, 32):  # light inference work
        return 0.25 + 0.1 * np.sin(minute / 17.0 + node)
    # checkpoint dips: every 40 min, 1.5 min at 10 %, at a job's own phase
    phase = (7.0, 19.0, 31.0)[job]
    load = np.where(((minute - phase) % 40.0) < 1.5, 0.1, 1.0)
    stops = [(80.0, 88.0)] if job == 1 else []  # job B restarts from its checkpoint once anyway
    if job == 0 and "xid79" in on:
        stops.append((XID79[2] * STEP / 60.0, XID79[2] * STEP / 60.0 + 10.0))
    if job == 0 and "dbe" in on:
        stops.append((DBE[2] * STEP / 60.0, DBE[2] * STEP / 60.0 + 10.0))
    if job == 1 and "ib_down" in on:
        stops.append((IB_DOWN[2] * STEP / 60.0, IB_DOWN[2] * STEP / 60.0 + 8.0))
    for begin, end in stops:
        load = np.where((minute >= begin) & (minute < end), 0.0, load)
    if node == 31:
        light = 0.25 + 0.1 * np.sin(minute / 17.0 + node)
        load = np.where(minute < XID79[2] * STEP / 60.0 + 10.0, light, load)
    if node == XID79[0] and "xid79" in on:
        load = np.where(minute >= XID79[2] * STEP / 60.0, 0.0, load)
    return load


def build(start: int, seed: int = 34, faults: tuple[str, ...] = ("all",), extra: tuple[str, ...] = ()) -> Fleet:
    """The fleet's telemetry from ``start`` (Unix seconds). ``faults``: the fault names to inject
    (``xid79``, ``dbe``, ``ib_down``, ``pcie``, ``symbol``, ``nvlink``, ``thermal``, or ``all``);
    ``extra``: a fault on a node counted healthy, to see the judgement fail (``dbe_on_healthy``:
    a double-bit error on dgx-h100-002's GPU 0 at 110 min)."""
    on = set(faults) if "all" not in faults else {"xid79", "dbe", "ib_down", "pcie", "symbol", "nvlink", "thermal"}
    rng = np.random.default_rng(seed)
    t = np.arange(TICKS) * float(STEP)
    # the data hall's day, from a fixed time of day whatever ``start`` is: the same values every run
    ambient = 1.5 * np.sin(2 * math.pi * (t + 9 * 3600.0) / 86400.0)
    dcgm = {name: np.zeros((NODES, TICKS, GPUS)) for name, _, _ in DCGM_SERIES}
    ib = {name: np.zeros((NODES, TICKS, PORTS)) for name, _, _ in IB_SERIES}
    gpu_listed = np.ones((NODES, TICKS, GPUS), dtype=bool)
    scraped = {"dcgm": np.ones((NODES, TICKS), dtype=bool), "node": np.ones((NODES, TICKS), dtype=bool)}
    uuids = [[str(uuid.UUID(int=int(rng.integers(0, 2**63)) << 64 | int(rng.integers(0, 2**63)), version=4))
              for _ in range(GPUS)] for _ in range(NODES)]
    for n in range(NODES):
        i = n + 1
        load = _load(t, i, on)[:, None] * np.ones((1, GPUS))
        node_off = rng.normal(0.0, 1.2) + (4.0 if i == HOT_NODE else 0.0)
        gpu_off = rng.normal(0.0, 1.5, GPUS)
        power_off = rng.normal(0.0, 12.0, GPUS)
        busy = load > 0.05
        util = np.clip(load * 97.0 + rng.normal(0, 1.5, (TICKS, GPUS)) * busy, 0, 100).round()
        power = np.where(busy, 90.0 + load * 560.0 + power_off + rng.normal(0, 18, (TICKS, GPUS)),
                         70.0 + rng.normal(0, 2.0, (TICKS, GPUS)))
        sm = np.where(busy, 1980.0 - np.abs(rng.normal(0, 18, (TICKS, GPUS))), 345.0)
        if on >= {"thermal"} and i == THERMAL[0]:
            k0, g = THERMAL[2], THERMAL[1]
            ramp = np.clip((np.arange(TICKS) - k0) / 20.0, 0.0, 1.0)  # 10 min to full effect
            sm[:, g] -= ramp * (530.0 + rng.normal(0, 40, TICKS)) * busy[:, g]
            power[:, g] -= ramp * 0.2 * (power[:, g] - 70.0) * busy[:, g]
        # temperature follows power with a lag (a minute's time constant: half a step per scrape)
        target = 27.0 + ambient[:, None] + node_off + gpu_off + 0.062 * power
        temp = np.empty_like(target)
        temp[0] = target[0]
        for k in range(1, TICKS):
            temp[k] = temp[k - 1] + 0.6 * (target[k] - temp[k - 1])
        if on >= {"thermal"} and i == THERMAL[0]:
            temp[:, THERMAL[1]] += np.clip((np.arange(TICKS) - THERMAL[2]) / 20.0, 0.0, 1.0) * 15.0
        temp += rng.normal(0, 0.4, temp.shape)
        d = {key: dcgm[key][n] for key in dcgm}
        d["DCGM_FI_DEV_GPU_TEMP"][:] = temp.round()
        d["DCGM_FI_DEV_MEMORY_TEMP"][:] = (temp + 5.0 + rng.normal(0, 0.5, temp.shape)).round()
        d["DCGM_FI_DEV_POWER_USAGE"][:] = power.round(3)
        d["DCGM_FI_DEV_SM_CLOCK"][:] = sm.round()
        d["DCGM_FI_DEV_MEM_CLOCK"][:] = 2619.0
        d["DCGM_FI_DEV_GPU_UTIL"][:] = util
        d["DCGM_FI_DEV_MEM_COPY_UTIL"][:] = np.clip(util * 0.42 + rng.normal(0, 2, util.shape), 0, 100).round()
        fb_used = np.where(busy, 71_000.0 + rng.normal(0, 400, (TICKS, GPUS)).round(), 0.0)
        d["DCGM_FI_DEV_FB_USED"][:] = fb_used
        d["DCGM_FI_DEV_FB_RESERVED"][:] = 520.0
        d["DCGM_FI_DEV_FB_FREE"][:] = 81_559.0 - 520.0 - fb_used
        d["DCGM_FI_PROF_GR_ENGINE_ACTIVE"][:] = (util / 100.0 * 0.96).round(6)
        d["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"][:] = np.clip(load * 0.55 + rng.normal(0, 0.02, util.shape) * busy,
                                                          0, 1).round(6)
        d["DCGM_FI_PROF_DRAM_ACTIVE"][:] = np.clip(load * 0.42 + rng.normal(0, 0.02, util.shape) * busy,
                                                   0, 1).round(6)
        d["DCGM_FI_PROF_PCIE_TX_BYTES"][:] = (load * 2.1e9 + np.abs(rng.normal(0, 5e7, util.shape))).round()
        d["DCGM_FI_PROF_PCIE_RX_BYTES"][:] = (load * 3.4e9 + np.abs(rng.normal(0, 5e7, util.shape))).round()
        d["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"][:] = 8.1e11 + np.cumsum(power * STEP * 1000.0, axis=0).round()
        d["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"][:] = np.cumsum(load * 1.9e11 * STEP, axis=0).round()
        # counters: a few GPUs carry old counts, a few count a stray error now and then
        d["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"][:] = (rng.random(GPUS) < 0.2) * rng.integers(1, 6, GPUS) + np.cumsum(
            rng.random((TICKS, GPUS)) < 0.002, axis=0)
        d["DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"][:] = (rng.random(GPUS) < 0.15) * rng.integers(1, 30, GPUS) + np.cumsum(
            rng.random((TICKS, GPUS)) < 0.003, axis=0)
        d["DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"][:] = np.cumsum(rng.random((TICKS, GPUS)) < 0.0005, axis=0)
        d["DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"][:] = (rng.random(GPUS) < 0.1) * rng.integers(1, 3, GPUS)
        if i == OLD_XID[0]:
            d["DCGM_FI_DEV_XID_ERRORS"][:, OLD_XID[1]] = 13
        if on >= {"xid79"} and i == XID79[0]:
            k0, g = XID79[2], XID79[1]
            d["DCGM_FI_DEV_XID_ERRORS"][k0:, g] = 79
            gpu_listed[n, k0 + 2:, g] = False
        if on >= {"dbe"} and i == DBE[0]:
            d["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"][DBE[2]:, DBE[1]] = 1
            d["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"][DBE[2] + 20:, DBE[1]] = 2
        if "dbe_on_healthy" in extra and i == 2:
            d["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"][220:, 0] = 1
        if on >= {"pcie"} and i == PCIE[0]:
            k0, g = PCIE[2], PCIE[1]
            d["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"][k0:, g] += np.cumsum(rng.integers(30, 41, TICKS - k0))
        if on >= {"nvlink"} and i == NVLINK[0]:
            k0, g = NVLINK[2], NVLINK[1]
            d["DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"][:, :] = 0
            d["DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"][k0:, g] = np.cumsum(rng.integers(40, 91, TICKS - k0))
        # node-exporter: 8 compute ports at 400 Gb/s
        p = {key: ib[key][n] for key in ib}
        port_load = _load(t, i, on)[:, None] * np.ones((1, PORTS))
        traffic = port_load * 1.8e10 * STEP * (1 + rng.normal(0, 0.05, (TICKS, PORTS)))
        up = np.ones((TICKS, PORTS), dtype=bool)
        if on >= {"ib_down"} and i == IB_DOWN[0]:
            up[IB_DOWN[2]:, IB_DOWN[1]] = False
        traffic = np.where(up, np.clip(traffic, 0, None), 0.0)
        p["node_infiniband_port_data_received_bytes_total"][:] = 4.2e14 + np.cumsum(traffic, axis=0).round()
        p["node_infiniband_port_data_transmitted_bytes_total"][:] = 4.1e14 + np.cumsum(traffic * 0.98, axis=0).round()
        packets = np.cumsum((traffic / 4096.0).round(), axis=0)
        p["node_infiniband_port_packets_received_total"][:] = 1.1e11 + packets
        p["node_infiniband_port_packets_transmitted_total"][:] = 1.0e11 + packets
        p["node_infiniband_unicast_packets_received_total"][:] = 1.1e11 + packets
        p["node_infiniband_unicast_packets_transmitted_total"][:] = 1.0e11 + packets
        p["node_infiniband_multicast_packets_received_total"][:] = 4_112 + np.cumsum(up * 2, axis=0)
        p["node_infiniband_multicast_packets_transmitted_total"][:] = 1_026 + np.cumsum(up * 1, axis=0)
        p["node_infiniband_port_transmit_wait_total"][:] = 3.0e9 + np.cumsum(
            (port_load * rng.integers(20_000, 120_000, (TICKS, PORTS))) * up, axis=0)
        p["node_infiniband_symbol_error_total"][:] = (rng.random(PORTS) < 0.25) * rng.integers(1, 40, PORTS) + \
            np.cumsum(rng.random((TICKS, PORTS)) < 0.003, axis=0) * rng.integers(1, 4, (TICKS, PORTS))
        p["node_infiniband_link_error_recovery_total"][:] = (rng.random(PORTS) < 0.2) * rng.integers(1, 4, PORTS)
        p["node_infiniband_link_downed_total"][:] = (rng.random(PORTS) < 0.1) * 1
        p["node_infiniband_port_errors_received_total"][:] = np.cumsum(rng.random((TICKS, PORTS)) < 0.002, axis=0)
        p["node_infiniband_rate_bytes_per_second"][:] = 5.0e10
        p["node_infiniband_state_id"][:] = np.where(up, 4, 1)
        p["node_infiniband_physical_state_id"][:] = np.where(up, 5, 3)
        if on >= {"ib_down"} and i == IB_DOWN[0]:
            p["node_infiniband_link_downed_total"][IB_DOWN[2]:, IB_DOWN[1]] += 1
        if on >= {"symbol"} and i == SYMBOL[0]:
            k0, port = SYMBOL[2], SYMBOL[1]
            p["node_infiniband_symbol_error_total"][k0:, port] += np.cumsum(rng.integers(30, 121, TICKS - k0))
        if i == RESTART[0]:  # the exporters (and the driver's counters with them) start over
            k0, missed = RESTART[1], RESTART[2]
            scraped["dcgm"][n, k0:k0 + missed] = False
            scraped["node"][n, k0:k0 + missed] = False
            for table in (d, p):
                for key, arr in table.items():
                    if key.endswith(("_TOTAL", "_COUNTER", "_ROWS", "_total")) and "REMAPPED" not in key:
                        arr[k0:] -= arr[k0 + missed - 1]
                        arr[k0:] = np.clip(arr[k0:], 0, None)
        if i == FLAKY_NODE:
            for exporter in scraped:
                miss = rng.random(TICKS) < 0.06
                scraped[exporter][n] &= ~miss
            for k in (95, 260):  # twice two in a row
                scraped["dcgm"][n, k:k + 2] = False
    ips = [f"10.42.{n // 8}.{17 + n}" for n in range(NODES)]
    return Fleet(start=start, dcgm=dcgm, ib=ib, scraped=scraped, gpu_listed=gpu_listed, uuids=uuids, dcgm_ip=ips)


def _num(v: float) -> str:
    return str(int(v)) if v == int(v) and abs(v) < 1e15 else repr(float(v))


def _gpu_labels(fleet: Fleet, n: int, g: int) -> str:
    key = (n, g)
    if key not in fleet.labels:
        fleet.labels[key] = (
            f'gpu="{g}",UUID="GPU-{fleet.uuids[n][g]}",pci_bus_id="00000000:{PCI[g].upper()}:00.0",'
            f'device="nvidia{g}",modelName="{MODEL}",Hostname="{node_name(n + 1)}",DCGM_FI_DRIVER_VERSION="{DRIVER}"')
    return fleet.labels[key]


def _xid_labels(code: float) -> str:
    c = int(code)
    return f',err_code="{c}",err_msg="{XID_TEXT.get(c, "Unknown Error")}"'


def raw_dcgm(fleet: Fleet, n: int, k: int, target: str = "", stamp: str = "") -> str:
    """One dcgm-exporter ``/metrics`` answer of node ``n`` (0-based) at tick ``k``: no timestamps,
    no target labels (``target``, ``stamp``: as Prometheus stores the scrape, with its target
    labels and the scrape time)."""
    out: list[str] = []
    listed = [g for g in range(GPUS) if fleet.gpu_listed[n, k, g]]
    labels = [_gpu_labels(fleet, n, g) for g in range(GPUS)]
    after = (f",{target}}} " if target else "} ")
    tail = f" {stamp}" if stamp else ""
    for name, kind, help_text in DCGM_SERIES:
        out.append(f"# HELP {name} {help_text}\n# TYPE {name} {kind}")
        col = fleet.dcgm[name][n, k].tolist()
        xid = name == "DCGM_FI_DEV_XID_ERRORS"
        out += [f"{name}{{{labels[g]}{_xid_labels(col[g]) if xid else ''}{after}{_num(col[g])}{tail}" for g in listed]
    return "\n".join(out) + "\n"


def raw_node_exporter(fleet: Fleet, n: int, k: int, target: str = "", stamp: str = "") -> str:
    """node-exporter's infiniband families of node ``n`` at tick ``k``: no timestamps, no target
    labels (``target``, ``stamp``: as :func:`raw_dcgm`)."""
    after = (f",{target}}} " if target else "} ")
    tail = f" {stamp}" if stamp else ""
    out = ["# HELP node_infiniband_info Non-numeric data from /sys/class/infiniband/<device>, value is always 1.",
           "# TYPE node_infiniband_info gauge"]
    out += [f'node_infiniband_info{{board_id="MT_0000000838",device="mlx5_{q}",firmware_version="28.39.1002",'
            f'hca_type="MT4129"{after}1{tail}' for q in range(PORTS)]
    for name, kind, help_text in IB_SERIES:
        out.append(f"# HELP {name} {help_text}\n# TYPE {name} {kind}")
        col = fleet.ib[name][n, k].tolist()
        out += [f'{name}{{device="mlx5_{q}",port="1"{after}{_num(col[q])}{tail}' for q in range(PORTS)]
    return "\n".join(out) + "\n"


def _dcgm_target(fleet: Fleet, n: int) -> str:
    return f'instance="{fleet.dcgm_ip[n]}:9400",job="gpu-metrics"'


def _node_target(n: int) -> str:
    return f'instance="{node_name(n + 1)}:9100",job="node-exporter"'


def openmetrics(fleet: Fleet) -> Iterator[str]:
    """The fleet's history as Prometheus stores it (target labels added, each sample stamped with
    its scrape time), in OpenMetrics series by series, as ``promtool tsdb dump-openmetrics``
    writes it and ``promtool tsdb create-blocks-from openmetrics`` reads it. dcgm-exporter's
    counters have no ``_total`` suffix, so they are typed ``unknown`` (OpenMetrics requires it of a
    counter)."""
    for name, kind, _ in DCGM_SERIES:
        yield f"# TYPE {name} {'gauge' if kind == 'gauge' else 'unknown'}\n"
        for n in range(NODES):
            col = fleet.dcgm[name][n]
            ok = fleet.scraped["dcgm"][n]
            for g in range(GPUS):
                base = f"{_gpu_labels(fleet, n, g)},{_dcgm_target(fleet, n)}"
                listed = fleet.gpu_listed[n, :, g] & ok
                if name == "DCGM_FI_DEV_XID_ERRORS":  # one series per err_code: a new XID is a new series
                    for code in sorted(set(col[listed, g].tolist())):
                        lab = base + _xid_labels(code)
                        yield "".join(f"{name}{{{lab}}} {_num(code)} {fleet.ts(k)}\n"
                                      for k in np.flatnonzero(listed & (col[:, g] == code)))
                    continue
                yield "".join(f"{name}{{{base}}} {_num(col[k, g])} {fleet.ts(k)}\n" for k in np.flatnonzero(listed))
    for name, kind, _ in IB_SERIES:
        family = name.removesuffix("_total") if kind == "counter" else name
        yield f"# TYPE {family} {kind}\n"
        for n in range(NODES):
            col = fleet.ib[name][n]
            ok = np.flatnonzero(fleet.scraped["node"][n])
            for q in range(PORTS):
                lab = f'device="mlx5_{q}",port="1",{_node_target(n)}'
                yield "".join(f"{name}{{{lab}}} {_num(col[k, q])} {fleet.ts(k)}\n" for k in ok)
    yield "# EOF\n"


def exposition_with_timestamps(fleet: Fleet, exporters: tuple[str, ...] = ("dcgm", "node")) -> Iterator[str]:
    """The same history scrape by scrape in Prometheus text (each sample stamped in milliseconds
    with its scrape time, target labels added), as scrapes appended to a file."""
    for k in range(TICKS):
        ms = str(fleet.ts(k) * 1000)
        for n in range(NODES):
            if "dcgm" in exporters and fleet.scraped["dcgm"][n, k]:
                yield raw_dcgm(fleet, n, k, _dcgm_target(fleet, n), ms)
            if "node" in exporters and fleet.scraped["node"][n, k]:
                yield raw_node_exporter(fleet, n, k, _node_target(n), ms)


def write_exposition(fleet: Fleet, path: Path, exporters: tuple[str, ...] = ("dcgm", "node")) -> Path:
    with path.open("w", encoding="utf-8") as fh:
        fh.writelines(exposition_with_timestamps(fleet, exporters))
    return path


def write_openmetrics(fleet: Fleet, path: Path) -> Path:
    with path.open("w", encoding="utf-8") as fh:
        fh.writelines(openmetrics(fleet))
    return path


def write_raw_scrapes(fleet: Fleet, directory: Path, exporters: tuple[str, ...] = ("dcgm", "node")) -> Path:
    """Each exporter's answer to each scrape as its own file, as ``curl -s http://$node:9400/metrics
    > scrapes/$node/dcgm-$tick.prom`` saves it: no sample timestamps, no target labels, the file's
    modification time its scrape time (``<node>/dcgm-<tick>.prom``, ``<node>/node-<tick>.prom``)."""
    for n in range(NODES):
        d = directory / node_name(n + 1)
        d.mkdir(parents=True, exist_ok=True)
        for k in range(TICKS):
            when = fleet.ts(k)
            for exporter in exporters:
                if not fleet.scraped[exporter][n, k]:
                    continue
                f = d / f"{exporter}-{k:04d}.prom"
                f.write_text(raw_dcgm(fleet, n, k) if exporter == "dcgm" else raw_node_exporter(fleet, n, k),
                             encoding="utf-8")
                os.utime(f, (when, when))
    return directory
