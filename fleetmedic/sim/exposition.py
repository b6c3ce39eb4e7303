"""Prometheus text exposition of simulated telemetry, as dcgm-exporter and node-exporter write it.

- GPUs: dcgm-exporter series (``DCGM_FI_DEV_GPU_TEMP``, ``DCGM_FI_PROF_SM_ACTIVE`` …, names from
  :data:`fleetmedic.records.DCGM_NAMES`) with dcgm-exporter's labels ``gpu``, ``UUID``,
  ``pci_bus_id``, ``device``, ``modelName``, ``Hostname`` and ``DCGM_FI_DRIVER_VERSION``; counters
  are typed ``counter``, the rest ``gauge``; fields a GPU does not report are not written.
- Host InfiniBand ports: node-exporter's infiniband collector series (``node_infiniband_symbol_error_total``
  …, ``node_infiniband_state_id`` 4 = ACTIVE / 1 = DOWN, ``node_infiniband_physical_state_id``,
  ``node_infiniband_rate_bytes_per_second``; data counters in bytes, i.e. IB's 4-byte words x 4) with
  labels ``device`` (``mlx5_3``), ``port`` (``1``) and ``node`` (node-exporter itself has no host label;
  Prometheus relabelling usually adds one). Switch ports are not node-exporter's and are left out
  (they stay in the JSONL port telemetry); so is ``effective_ber``, which has no exporter series.
  ``nvlink_links_down`` goes out as ``DCGM_FI_DEV_NVLINK_LINKS_DOWN``, fleetmedic's own series.
- Every sample carries its timestamp in milliseconds (the node's clock, as sampled).

:func:`gpu_exposition` / :func:`port_exposition` render one round (a valid exposition when
``with_meta``); :class:`ExpositionWriter` appends rounds to ``gpu.prom`` and ``ports.prom`` with
``# HELP``/``# TYPE`` once at the top — the layout ``fleetmedic backtest``'s reader takes (scrapes
appended to a file, in time order).
"""

from __future__ import annotations

from pathlib import Path
from typing import IO

import numpy as np

from fleetmedic.records import COUNTER_METRICS, DCGM_NAMES
from fleetmedic.sim.batch import GPU_FIELDS, GPU_INT_MASK, LINK_UP, PORT_FIELD_INDEX, GpuBatch, PortBatch

_SKIP: frozenset[str] = frozenset()
_GPU_EXPORT = [(i, f) for i, f in enumerate(GPU_FIELDS) if f not in _SKIP]

GPU_HELP: dict[str, str] = {
    "gpu_temp": "GPU temperature (in C).",
    "memory_temp": "Memory temperature (in C).",
    "power_usage": "Power draw (in W).",
    "sm_clock": "SM clock frequency (in MHz).",
    "mem_clock": "Memory clock frequency (in MHz).",
    "gpu_util": "GPU utilization (in %).",
    "mem_copy_util": "Memory utilization (in %).",
    "fb_used": "Framebuffer memory used (in MiB).",
    "fb_free": "Framebuffer memory free (in MiB).",
    "clocks_event_reasons": "Current clock event reasons (bitmask).",
    "power_violation": "Throttling duration due to power constraints (in us).",
    "thermal_violation": "Throttling duration due to thermal constraints (in us).",
    "ecc_sbe_vol_total": "Total number of single-bit volatile ECC errors.",
    "ecc_dbe_vol_total": "Total number of double-bit volatile ECC errors.",
    "retired_sbe": "Total number of retired pages due to single-bit errors.",
    "retired_dbe": "Total number of retired pages due to double-bit errors.",
    "retired_pending": "Total number of pages pending retirement.",
    "uncorrectable_remapped_rows": "Number of remapped rows for uncorrectable errors",
    "correctable_remapped_rows": "Number of remapped rows for correctable errors",
    "row_remap_failure": "Whether remapping of rows has failed",
    "row_remap_pending": "Whether a row remap is pending (a GPU reset applies it).",
    "pcie_replay_counter": "Total number of PCIe retries.",
    "pcie_link_gen": "PCIe current link generation.",
    "pcie_link_width": "PCIe current link width.",
    "nvlink_crc_flit_error_count_total": "Total number of NVLink flow-control CRC errors.",
    "nvlink_crc_data_error_count_total": "Total number of NVLink data CRC errors.",
    "nvlink_replay_error_count_total": "Total number of NVLink retries.",
    "nvlink_recovery_error_count_total": "Total number of NVLink recovery errors.",
    "xid_errors": "Value of the last XID error encountered.",
    "nvlink_links_down": "Number of NVLink links not up (fleetmedic's series, from NVML link state).",
    "prof_sm_active": "The ratio of cycles an SM has at least 1 warp assigned (in %).",
    "prof_pipe_tensor_active": "Ratio of cycles the tensor (HMMA) pipe is active (in %).",
    "prof_dram_active": "Ratio of cycles the device memory interface is active sending or receiving data (in %).",
}

#: node-exporter series -> (PortSample field, multiplier, help)
IB_SERIES: dict[str, tuple[str, float, str]] = {
    "node_infiniband_symbol_error_total": (
        "symbol_error_counter", 1, "Number of minor link errors detected on one or more physical lanes."),
    "node_infiniband_link_error_recovery_total": (
        "link_error_recovery_counter", 1, "Number of times the link successfully recovered from an error state."),
    "node_infiniband_link_downed_total": (
        "link_downed_counter", 1, "Number of times the link failed to recover from an error state and went down."),
    "node_infiniband_port_errors_received_total": (
        "port_rcv_errors", 1, "Number of packets containing an error that were received on this port."),
    "node_infiniband_port_receive_remote_physical_errors_total": (
        "port_rcv_remote_physical_errors", 1, "Number of packets marked with the EBP delimiter received on the port."),
    "node_infiniband_port_discards_transmitted_total": (
        "port_xmit_discards", 1, "Number of outbound packets discarded by the port because it is down or congested."),
    "node_infiniband_local_link_integrity_errors_total": (
        "local_link_integrity_errors", 1, "Number of times the count of local physical errors exceeded the threshold."),
    "node_infiniband_excessive_buffer_overrun_errors_total": (
        "excessive_buffer_overrun_errors", 1, "Number of times consecutive flow control update periods had overruns."),
    "node_infiniband_port_transmit_wait_total": (
        "port_xmit_wait", 1, "Number of ticks during which the port had data to transmit but no data was sent."),
    "node_infiniband_port_data_transmitted_bytes_total": (
        "port_xmit_data", 4, "Number of data octets transmitted on all links"),
    "node_infiniband_port_data_received_bytes_total": (
        "port_rcv_data", 4, "Number of data octets received on all links"),
}


def _num(v: float, integral: bool) -> str:
    """As dcgm-exporter prints: integer-valued fields (temperatures, clocks, MiB, counters) without a
    decimal point."""
    return str(int(v)) if integral or v.is_integer() else repr(round(v, 6))


def _gpu_labels(batch: GpuBatch, node: int) -> list[str]:
    cache = batch.identity.label_cache
    got = cache.get(node)
    if got is None:
        fleet = batch.identity.fleet
        sku = fleet.sku_of(node)
        name = fleet.node_names[node]
        got = [
            f'gpu="{g}",UUID="{fleet.gpu_uuid[node][g]}",pci_bus_id="00000000:{fleet.pci(g)}:00.0",'
            f'device="nvidia{g}",modelName="{sku.model_name}",Hostname="{name}",'
            f'DCGM_FI_DRIVER_VERSION="{sku.driver_version}"'
            for g in range(fleet.g)
        ]
        cache[node] = got
    return got


def gpu_meta_lines() -> list[str]:
    out = []
    for _, f in _GPU_EXPORT:
        name = DCGM_NAMES[f]
        out.append(f"# HELP {name} {GPU_HELP.get(f, f)}")
        out.append(f"# TYPE {name} {'counter' if f in COUNTER_METRICS else 'gauge'}")
    return out


def port_meta_lines() -> list[str]:
    out = []
    for name, (_, _, help_text) in IB_SERIES.items():
        out += [f"# HELP {name} {help_text}", f"# TYPE {name} counter"]
    out += [
        "# HELP node_infiniband_state_id State of the InfiniBand port (1: down, 2: init, 3: armed, 4: active)",
        "# TYPE node_infiniband_state_id gauge",
        "# HELP node_infiniband_physical_state_id Physical state of the InfiniBand port (3: disabled, 5: link up)",
        "# TYPE node_infiniband_physical_state_id gauge",
        "# HELP node_infiniband_rate_bytes_per_second Maximum signal transfer rate",
        "# TYPE node_infiniband_rate_bytes_per_second gauge",
    ]
    return out


def gpu_exposition(batch: GpuBatch, with_meta: bool = True) -> str:
    """One round of dcgm-exporter output for every node in the batch (family by family)."""
    lines = gpu_meta_lines() if with_meta else []
    data = batch.data
    nodes = batch.node.tolist()
    ts_ms = [round(t * 1000) for t in batch.ts.tolist()]
    labels = [_gpu_labels(batch, n) for n in nodes]
    for i, f in _GPU_EXPORT:
        name = DCGM_NAMES[f]
        col = data[i]
        if np.isnan(col).all():
            continue
        integral = bool(GPU_INT_MASK[i])
        vals = col.tolist()
        for r, row in enumerate(vals):
            lab = labels[r]
            tsr = ts_ms[r]
            for g, v in enumerate(row):
                if v == v:
                    lines.append(f"{name}{{{lab[g]}}} {_num(v, integral)} {tsr}")
    return "\n".join(lines) + "\n"


def port_exposition(batch: PortBatch, with_meta: bool = True) -> str:
    """One round of node-exporter infiniband output for the host ports in the batch."""
    lines = port_meta_lines() if with_meta else []
    fleet = batch.identity.fleet
    pi = fleet.ports
    host = pi.device_is_host[pi.device[batch.port]]
    rows = np.flatnonzero(host)
    if rows.size == 0:
        return "\n".join(lines) + "\n"
    ports = batch.port[rows].tolist()
    ts_ms = [round(t * 1000) for t in batch.ts[rows].tolist()]
    labs = [f'device="{pi.name[p]}",port="1",node="{fleet.node_names[int(pi.node[p])]}"' for p in ports]
    for name, (fieldname, mul, _) in IB_SERIES.items():
        vals = (batch.data[PORT_FIELD_INDEX[fieldname], rows] * mul).tolist()
        lines.extend(f"{name}{{{lab}}} {int(v)} {t}" for lab, v, t in zip(labs, vals, ts_ms, strict=True))
    up = (batch.data[PORT_FIELD_INDEX["link_state"], rows] == LINK_UP).tolist()
    speed = batch.data[PORT_FIELD_INDEX["speed_gbps"], rows].tolist()
    for lab, u, t in zip(labs, up, ts_ms, strict=True):
        lines.append(f"node_infiniband_state_id{{{lab}}} {4 if u else 1} {t}")
    for lab, u, t in zip(labs, up, ts_ms, strict=True):
        lines.append(f"node_infiniband_physical_state_id{{{lab}}} {5 if u else 3} {t}")
    for lab, s, t in zip(labs, speed, ts_ms, strict=True):
        lines.append(f"node_infiniband_rate_bytes_per_second{{{lab}}} {int(s * 1e9 / 8)} {t}")
    return "\n".join(lines) + "\n"


class ExpositionWriter:
    """Appends rounds to ``<dir>/gpu.prom`` and ``<dir>/ports.prom``, every ``every_s`` of sim time."""

    def __init__(self, directory: Path, every_s: float = 60.0) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.every = every_s
        self._gpu: IO[str] = (directory / "gpu.prom").open("w", encoding="utf-8")
        self._ports: IO[str] = (directory / "ports.prom").open("w", encoding="utf-8")
        self._gpu.write("\n".join(gpu_meta_lines()) + "\n")
        self._ports.write("\n".join(port_meta_lines()) + "\n")
        self._next_gpu = float("-inf")
        self._next_port = float("-inf")

    def gpu(self, batch: GpuBatch) -> None:
        if batch.emitted_at >= self._next_gpu:
            self._gpu.write(gpu_exposition(batch, with_meta=False))
            self._next_gpu = batch.emitted_at + self.every - 1e-6

    def ports(self, batch: PortBatch) -> None:
        if batch.emitted_at >= self._next_port:
            self._ports.write(port_exposition(batch, with_meta=False))
            self._next_port = batch.emitted_at + self.every - 1e-6

    def close(self) -> None:
        self._gpu.close()
        self._ports.close()
