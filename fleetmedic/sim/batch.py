"""Columnar telemetry batches: what the generator produces, what a detector can consume directly.

:class:`GpuBatch` is one exporter round over the fleet: ``R`` rows (one per node sample delivered in
this round), ``G`` GPUs per row, ``F`` = ``len(GPU_FIELDS)`` fields, the metrics of
:class:`fleetmedic.records.GpuMetrics` in their order.

- ``data`` is **field-major**, shape ``(F, R, G)``, float64: ``data[GPU_FIELD_INDEX["gpu_temp"]]`` (or
  ``batch.column("gpu_temp")``) is a contiguous ``(R, G)`` block. ``NaN`` means "not reported" (a GPU
  that fell off the bus, a field the SKU does not support — e.g. ``retired_*`` on GPUs that remap
  rows instead of retiring pages). Counter and bitmask fields hold integral values.
- ``node[r]`` is the fleet node index of row ``r``, ``ts[r]`` the timestamp the node stamped on it
  (its own clock: skewed, jittered), ``boot[r]`` the node's boot counter when sampled (``boot_id``
  changes with it; cumulative counters restart from zero after a reboot).
- Rows are not unique or ordered by time: a batch may hold a late sample from an earlier round
  (``ts`` older than ``emitted_at``) or the same sample twice (a duplicate), and may lack nodes whose
  sample was lost; nodes that are down are absent.
- ``xid_*`` arrays list XID events (NVML events, unlike the ``xid_errors`` last-value gauge) carried
  by row ``xid_row``.

:class:`PortBatch` is the same for port counters: ``data`` is ``(len(PORT_FIELDS), R)``, one row per
port, rows of one device sample contiguous; ``port[r]`` indexes :class:`~fleetmedic.sim.fleet.PortIndex`.
``link_state`` is coded by :data:`LINK_STATES`.

:meth:`GpuBatch.to_records` / :meth:`PortBatch.to_records` materialise the project's wire records
(one :class:`~fleetmedic.records.GpuTelemetry` per row, one :class:`~fleetmedic.records.PortTelemetry`
per device sample); :meth:`encode_jsonl` adds JSON encoding. Materialising is much slower than
generating: consumers in the same process should read the arrays.
"""

from __future__ import annotations

import hashlib
import itertools
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from fleetmedic.records import GPU_METRICS, GpuMetrics, GpuTelemetry, PortSample, PortTelemetry, XidEvent, encode
from fleetmedic.sim.fleet import Fleet

GPU_FIELDS: Final[tuple[str, ...]] = GPU_METRICS
GPU_FIELD_INDEX: Final[dict[str, int]] = {name: i for i, name in enumerate(GPU_FIELDS)}
GPU_FLOAT_FIELDS: Final[frozenset[str]] = frozenset(
    {"gpu_temp", "memory_temp", "power_usage", "sm_clock", "mem_clock", "gpu_util", "mem_copy_util",
     "fb_used", "fb_free", "prof_sm_active", "prof_pipe_tensor_active", "prof_dram_active"}
)
#: True where a GPU field holds integers (counters, bitmasks, link gen/width, XID)
GPU_INT_MASK: Final = np.array([name not in GPU_FLOAT_FIELDS for name in GPU_FIELDS])
_IS_INT = GPU_INT_MASK

PORT_FIELDS: Final[tuple[str, ...]] = (
    "link_state",
    "speed_gbps",
    "width",
    "symbol_error_counter",
    "link_error_recovery_counter",
    "link_downed_counter",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "port_xmit_discards",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "port_xmit_wait",
    "port_xmit_data",
    "port_rcv_data",
    "effective_ber",
)
PORT_FIELD_INDEX: Final[dict[str, int]] = {name: i for i, name in enumerate(PORT_FIELDS)}
PORT_COUNTERS: Final[tuple[str, ...]] = PORT_FIELDS[3:14]
LINK_STATES: Final[tuple[str, ...]] = ("unknown", "down", "init", "up")
LINK_UP: Final = 3
LINK_DOWN: Final = 1
_PORT_FLOAT = np.array([name in ("speed_gbps", "effective_ber") for name in PORT_FIELDS])

SOURCE: Final = "fleetmedic-simulator"


@dataclass
class Identity:
    """Names and ids the records carry, shared by all batches of one run."""

    fleet: Fleet
    seed: int
    _boot_ids: dict[tuple[int, int], str] = field(default_factory=dict)
    label_cache: dict[int, list[str]] = field(default_factory=dict)  # exposition labels per node

    def boot_id(self, device: int, boot: int) -> str:
        key = (device, boot)
        bid = self._boot_ids.get(key)
        if bid is None:
            digest = hashlib.blake2b(f"{self.seed}:{device}:{boot}".encode(), digest_size=16).digest()
            bid = self._boot_ids[key] = str(uuid.UUID(bytes=digest, version=4))
        return bid


@dataclass(eq=False)
class GpuBatch:
    emitted_at: float
    node: np.ndarray  # (R,) int32
    ts: np.ndarray  # (R,) float64
    boot: np.ndarray  # (R,) int32
    data: np.ndarray  # (F, R, G) float64
    xid_row: np.ndarray  # (X,) int32
    xid_gpu: np.ndarray  # (X,) int32
    xid_code: np.ndarray  # (X,) int32
    xid_ts: np.ndarray  # (X,) float64
    xid_msg: list[str]
    identity: Identity

    @property
    def rows(self) -> int:
        return int(self.node.shape[0])

    @property
    def samples(self) -> int:
        """GPU samples in the batch (rows x GPUs)."""
        return int(self.data.shape[1] * self.data.shape[2])

    @property
    def values(self) -> np.ndarray:
        """``(R, G, F)`` view of ``data`` (no copy)."""
        return self.data.transpose(1, 2, 0)

    def column(self, name: str) -> np.ndarray:
        """``(R, G)`` view of one field."""
        out: np.ndarray = self.data[GPU_FIELD_INDEX[name]]
        return out

    def metrics_array(self, fields: Sequence[str] = GPU_FIELDS) -> np.ndarray:
        """``[rows, fields, gpus]`` float64 (NaN = not reported): the layout of
        :func:`fleetmedic.models.gpu_detector.metrics_batch`, without building records."""
        idx = [GPU_FIELD_INDEX[f] for f in fields]
        out: np.ndarray = np.take(self.data, idx, axis=0).transpose(1, 0, 2)
        return out

    def node_names(self) -> list[str]:
        names = self.identity.fleet.node_names
        return [names[i] for i in self.node.tolist()]

    def to_records(self) -> list[GpuTelemetry]:
        """One column-major :class:`~fleetmedic.records.GpuTelemetry` per row. A GPU with no field
        reported (fallen off the bus) is left out of ``gpus``, as dcgm-exporter stops exporting it."""
        fleet = self.identity.fleet
        data = self.data
        n_rows, n_gpus = data.shape[1], data.shape[2]
        if n_rows == 0:
            return []
        nan = np.isnan(data)
        present = np.flatnonzero(~nan.all(axis=(1, 2)))
        fidx = present[~_IS_INT[present]]
        iidx = present[_IS_INT[present]]
        names = [GPU_FIELDS[i] for i in fidx] + [GPU_FIELDS[i] for i in iidx]
        fl = data[fidx].transpose(1, 0, 2).tolist()  # [R][Ff][G]
        il = np.nan_to_num(data[iidx], nan=-1.0).astype(np.int64).transpose(1, 0, 2).tolist()
        sub_nan = nan[present]  # (F', R, G)
        row_holes = sub_nan.any(axis=(0, 2)).tolist()
        gone = sub_nan.all(axis=0)  # (R, G): GPU not reported at all
        xids: dict[int, list[XidEvent]] = {}
        for r, gpu, code, ts, msg in zip(
            self.xid_row.tolist(), self.xid_gpu.tolist(), self.xid_code.tolist(), self.xid_ts.tolist(),
            self.xid_msg, strict=True,
        ):
            xids.setdefault(r, []).append(XidEvent(gpu=gpu, xid=code, ts=ts, message=msg))
        all_gpus = list(range(n_gpus))
        out: list[GpuTelemetry] = []
        nodes = self.node.tolist()
        tss = self.ts.tolist()
        boots = self.boot.tolist()
        n_float = len(fidx)
        for r in range(n_rows):
            node = nodes[r]
            cols = fl[r] + il[r]
            gpus = all_gpus
            uuids = fleet.gpu_uuid[node]
            if row_holes[r]:
                keep = [g for g in all_gpus if not gone[r, g]]
                gpus = keep
                uuids = [uuids[g] for g in keep]
                cols = [[None if (v != v if j < n_float else v == -1) else v for v in (c[g] for g in keep)]
                        for j, c in enumerate(cols)]
            sku = fleet.sku_of(node)
            out.append(
                GpuTelemetry(
                    node=fleet.node_names[node],
                    ts=tss[r],
                    gpus=gpus,
                    metrics=GpuMetrics(**dict(zip(names, cols, strict=True))),
                    uuids=uuids,
                    xids=xids.get(r, []),
                    sku=sku.model_name,
                    driver_version=sku.driver_version,
                    boot_id=self.identity.boot_id(node, boots[r]),
                    source=SOURCE,
                )
            )
        return out

    def encode_jsonl(self) -> bytes:
        recs = self.to_records()
        return b"".join(encode(r) + b"\n" for r in recs)


@dataclass(eq=False)
class PortBatch:
    emitted_at: float
    port: np.ndarray  # (R,) int32 rows of fleet.ports
    ts: np.ndarray  # (R,) float64
    boot: np.ndarray  # (R,) int32
    data: np.ndarray  # (len(PORT_FIELDS), R) float64
    identity: Identity

    @property
    def rows(self) -> int:
        return int(self.port.shape[0])

    def column(self, name: str) -> np.ndarray:
        """``(R,)`` view of one field."""
        out: np.ndarray = self.data[PORT_FIELD_INDEX[name]]
        return out

    def device(self) -> np.ndarray:
        """``(R,)`` device index of each row."""
        out: np.ndarray = self.identity.fleet.ports.device[self.port]
        return out

    def to_records(self) -> list[PortTelemetry]:
        ports = self.identity.fleet.ports
        names = self.identity.fleet.node_names
        if self.rows == 0:
            return []
        dev = ports.device[self.port]
        brk = np.flatnonzero((np.diff(dev) != 0) | (np.diff(self.ts) != 0) | (np.diff(self.port) <= 0)) + 1
        starts = [0, *brk.tolist(), self.rows]
        fl = self.data[_PORT_FLOAT].T.tolist()
        il = self.data[~_PORT_FLOAT].astype(np.int64).T.tolist()
        fnames = [n for n, f in zip(PORT_FIELDS, _PORT_FLOAT, strict=True) if f]
        inames = [n for n, f in zip(PORT_FIELDS, _PORT_FLOAT, strict=True) if not f]
        li = inames.index("link_state")
        prow = self.port.tolist()
        tss = self.ts.tolist()
        boots = self.boot.tolist()
        devl = dev.tolist()
        out: list[PortTelemetry] = []
        for a, b in itertools.pairwise(starts):
            samples = []
            for r in range(a, b):
                p = prow[r]
                ivals = il[r]
                kw: dict[str, Any] = dict(zip(fnames, fl[r], strict=True))
                kw.update(zip(inames, ivals, strict=True))
                kw["link_state"] = LINK_STATES[ivals[li]]
                node = int(ports.node[p])
                samples.append(
                    PortSample(port=ports.name[p], node=names[node] if node >= 0 else "", peer=ports.peer[p], **kw)
                )
            d = devl[a]
            out.append(
                PortTelemetry(
                    device=ports.device_names[d],
                    device_kind="host" if ports.device_is_host[d] else "switch",
                    ts=tss[a],
                    ports=samples,
                    boot_id=self.identity.boot_id(100_000_000 + d, boots[a]),
                    source=SOURCE,
                )
            )
        return out

    def encode_jsonl(self) -> bytes:
        return b"".join(encode(r) + b"\n" for r in self.to_records())
