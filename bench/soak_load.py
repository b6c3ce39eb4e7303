"""The soak's load generator (``bench/soak.py`` starts it as its own process): what Prometheus
sends a remote-write receiver for a fleet of dcgm-exporters, and the faults the soak asked for.

Every node is a scrape target scraped every ``interval_s`` at its own offset in the interval (as
Prometheus spreads its targets); each scrape's samples are posted as remote write 1.0 (a snappy
block of a ``prometheus.WriteRequest``, at most :data:`MAX_SAMPLES_PER_SEND` samples a request,
the queue manager's layout: a series' labels, then its one sample), with the sample timestamp the
scrape's wall time. A request the receiver refuses with 5xx or that fails is sent again after a
back-off, as Prometheus retries (4xx is not retried).

The series are those of dcgm-exporter's default set with its labels (``Hostname`` is the node),
plus ``instance`` and ``job``, the target labels Prometheus adds; three of them (encoder,
decoder, vGPU licence) are ones fleetmedic does not read. Values are a busy training job's with
noise. The bodies are encoded once as a byte template per request; each scrape writes only its
values and its timestamp into it (a varint of 6 bytes for any millisecond time between 2004 and
2109), so the generator's CPU stays small beside the pipeline's.

Faults (``plan["faults"]``, each ``{at_s, node, kind, gpu, xid}`` from the load's start):

- ``hard``: ``DCGM_FI_DEV_XID_ERRORS`` of the GPU reads the XID from then on (dcgm-exporter's
  gauge holds the last XID);
- ``degrade``: the GPU runs hot and throttled: +15 C, SM clock -25 %, clock-event reason HW
  thermal slowdown, its thermal-violation counter rising;
- ``control``: a negative control, the node's job pauses: every GPU idle (utilisation 0, power
  and temperature at idle). The soak gives it to every node of a job at once. Nothing is wrong.

Each fault's first sample (its timestamp) is appended to ``plan["truth"]`` as one JSON line: the
soak's truth. Once a second a line of counters goes to ``plan["stats"]``.
"""

from __future__ import annotations

import http.client
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cramjam
import numpy as np

MAX_SAMPLES_PER_SEND = 2000  # Prometheus's queue_config default
HEADERS = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy",
           "X-Prometheus-Remote-Write-Version": "0.1.0", "User-Agent": "Prometheus/2.53.0"}
GPUS = 8
#: dcgm-exporter's default counters (the field names of its default-counters.csv)
SERIES = ["DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_SM_CLOCK",
          "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL",
          "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_POWER_VIOLATION", "DCGM_FI_DEV_THERMAL_VIOLATION",
          "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED",
          "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
          "DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL", "DCGM_FI_DEV_VGPU_LICENSE_STATUS"]
S = {name: i for i, name in enumerate(SERIES)}
HW_THERMAL_SLOWDOWN = 0x40  # DCGM_CLOCKS_EVENT_REASON_HW_THERMAL


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(tag: int, payload: bytes) -> bytes:
    return bytes([tag]) + _varint(len(payload)) + payload


def _labels(node: str, index: int, gpu: int, name: str) -> bytes:
    labels = {"__name__": name, "DCGM_FI_DRIVER_VERSION": "570.124.06", "Hostname": node, "UUID":
              f"GPU-{index:08x}-0000-4000-8000-{gpu:012x}", "device": f"nvidia{gpu}", "gpu": str(gpu),
              "instance": f"10.{index >> 16 & 255}.{index >> 8 & 255}.{index & 255}:9400",
              "job": "dcgm-exporter", "modelName": "NVIDIA H100 80GB HBM3",
              "pci_bus_id": f"00000000:{0x18 + 16 * gpu:02X}:00.0"}
    return b"".join(_field(0x0A, _field(0x0A, k.encode()) + _field(0x12, v.encode()))
                    for k, v in sorted(labels.items()))


@dataclass
class Request:
    """One request's byte template: the rows of :class:`Fleet`'s value matrix it carries, and
    where each sample's value and the timestamp go."""

    template: np.ndarray  # uint8
    rows: np.ndarray  # (series,) flat index into the fleet's values
    value_at: np.ndarray  # (series, 8) byte positions
    ts_at: np.ndarray  # (series, 6)
    nodes: list[int]


def build_requests(names: list[str], nodes: list[int]) -> list[Request]:
    """The requests of one scrape of ``nodes`` (indices into ``names``), cut at
    :data:`MAX_SAMPLES_PER_SEND` samples as the queue manager does."""
    per_node = GPUS * len(SERIES)
    out: list[Request] = []
    k = 0
    while k < len(nodes):
        take = max(1, MAX_SAMPLES_PER_SEND // per_node)
        chunk = nodes[k:k + take]
        k += take
        parts: list[bytes] = []
        rows, value_at, ts_at = [], [], []
        pos = 0
        for n in chunk:
            for g in range(GPUS):
                for s, name in enumerate(SERIES):
                    labels = _labels(names[n], n, g, name)
                    sample = b"\x09" + b"\0" * 8 + b"\x10" + b"\x80" * 5 + b"\x01"  # value, timestamp (6 bytes)
                    series = labels + _field(0x12, sample)
                    head = b"\x0A" + _varint(len(series))
                    base = pos + len(head) + len(labels) + 2  # the sample's tag and length
                    value_at.append(np.arange(base + 1, base + 9))
                    ts_at.append(np.arange(base + 10, base + 16))
                    rows.append((n * GPUS + g) * len(SERIES) + s)
                    parts.append(head + series)
                    pos += len(head) + len(series)
        out.append(Request(np.frombuffer(b"".join(parts), dtype=np.uint8).copy(), np.array(rows),
                           np.array(value_at), np.array(ts_at), list(chunk)))
    return out


def ts_varint(ms: int) -> np.ndarray:
    raw = _varint(ms)
    if len(raw) != 6:
        raise ValueError(f"timestamp {ms} ms is not a 6-byte varint")
    return np.frombuffer(raw, dtype=np.uint8)


class Fleet:
    """The value of every series of every node: (nodes, GPUs, series), refreshed per scrape."""

    def __init__(self, nodes: int, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.n = nodes
        self.offset = self.rng.normal(0, 1.5, (nodes, GPUS))  # each GPU runs a little warmer or cooler
        self.values = np.zeros((nodes, GPUS, len(SERIES)))
        self.counters = np.zeros((nodes, GPUS, 3))  # power violation, thermal violation, pcie replays
        self.hard: dict[int, tuple[int, int]] = {}  # node -> (gpu, xid)
        self.degraded: dict[int, int] = {}  # node -> gpu
        self.idle: set[int] = set()

    def scrape(self, nodes: np.ndarray, dt: float) -> None:
        """New values for ``nodes`` (an index array), ``dt`` s after their last scrape."""
        k = len(nodes)
        v = self.values
        load = np.ones((k, 1))
        idle = np.array([n in self.idle for n in nodes])
        load[idle] = 0.0
        temp = 35 + 30 * load + self.offset[nodes] + self.rng.normal(0, 0.6, (k, GPUS))
        v[nodes, :, S["DCGM_FI_DEV_GPU_TEMP"]] = temp.round()
        v[nodes, :, S["DCGM_FI_DEV_MEMORY_TEMP"]] = (temp + 4).round()
        v[nodes, :, S["DCGM_FI_DEV_POWER_USAGE"]] = (90 + 560 * load + self.rng.normal(0, 6, (k, GPUS))).round(3)
        v[nodes, :, S["DCGM_FI_DEV_SM_CLOCK"]] = 1980.0 - np.abs(self.rng.normal(0, 6, (k, GPUS))).round()
        v[nodes, :, S["DCGM_FI_DEV_MEM_CLOCK"]] = 2619.0
        util = 100 * load - np.abs(self.rng.normal(0, 2, (k, GPUS)))
        v[nodes, :, S["DCGM_FI_DEV_GPU_UTIL"]] = np.clip(util, 0, 100).round()
        copy = 40 * load + self.rng.normal(0, 2, (k, GPUS))
        v[nodes, :, S["DCGM_FI_DEV_MEM_COPY_UTIL"]] = np.clip(copy, 0, 100).round()
        v[nodes, :, S["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"]] = 0.0
        v[nodes, :, S["DCGM_FI_DEV_FB_USED"]] = 70000.0 * load
        v[nodes, :, S["DCGM_FI_DEV_FB_FREE"]] = 81559.0 - 70000.0 * load
        v[nodes, :, S["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"]] = np.clip(0.6 * load + self.rng.normal(0, 0.02, (k, GPUS)),
                                                                   0, 1)
        v[nodes, :, S["DCGM_FI_PROF_DRAM_ACTIVE"]] = np.clip(0.5 * load + self.rng.normal(0, 0.02, (k, GPUS)), 0, 1)
        v[nodes, :, S["DCGM_FI_DEV_XID_ERRORS"]] = 0.0
        for n in nodes:
            if n in self.degraded:
                g = self.degraded[n]
                v[n, g, S["DCGM_FI_DEV_GPU_TEMP"]] += 15
                v[n, g, S["DCGM_FI_DEV_MEMORY_TEMP"]] += 15
                v[n, g, S["DCGM_FI_DEV_SM_CLOCK"]] = round(v[n, g, S["DCGM_FI_DEV_SM_CLOCK"]] * 0.75)
                v[n, g, S["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"]] = HW_THERMAL_SLOWDOWN
                self.counters[n, g, 1] += dt * 1e6 * 0.6  # us of thermal violation
            if n in self.hard:
                g, xid = self.hard[n]
                v[n, g, S["DCGM_FI_DEV_XID_ERRORS"]] = xid
        v[nodes, :, S["DCGM_FI_DEV_POWER_VIOLATION"]] = self.counters[nodes, :, 0]
        v[nodes, :, S["DCGM_FI_DEV_THERMAL_VIOLATION"]] = self.counters[nodes, :, 1]
        v[nodes, :, S["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"]] = self.counters[nodes, :, 2]


class Sender:
    """One keep-alive HTTP connection to the receiver; retries as Prometheus does."""

    def __init__(self, url: str) -> None:
        host, port = url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
        self.host, self.port = host, int(port)
        self.path = "/" + url.split("//", 1)[1].split("/", 1)[1]
        self.conn: http.client.HTTPConnection | None = None
        self.retries = 0
        self.failed_posts = 0
        self.refused = 0  # 4xx, not retried

    def post(self, body: bytes, deadline: float) -> bool:
        backoff = 0.03
        while True:
            try:
                if self.conn is None:
                    self.conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
                self.conn.request("POST", self.path, body=body, headers={**HEADERS, "Content-Length": str(len(body))})
                resp = self.conn.getresponse()
                resp.read()
                if resp.status < 300:
                    return True
                if resp.status < 500 and resp.status != 429:
                    self.refused += 1
                    return False
            except (OSError, http.client.HTTPException):
                if self.conn is not None:
                    self.conn.close()
                self.conn = None
            self.failed_posts += 1
            if time.time() > deadline:
                return False
            self.retries += 1
            time.sleep(backoff)
            backoff = min(backoff * 2, 5.0)


def run(plan: dict[str, Any]) -> None:
    names: list[str] = plan["nodes"]
    interval = float(plan["interval_s"])
    fleet = Fleet(len(names), int(plan.get("seed", 1)))
    index = {n: i for i, n in enumerate(names)}
    # targets spread over the interval: a slot every 0.25 s, each slot's nodes scraped together
    slots = max(1, int(interval / 0.25))
    by_slot = [list(range(s, len(names), slots)) for s in range(slots)]
    requests = [build_requests(names, nodes) for nodes in by_slot]
    faults = sorted(plan["faults"], key=lambda f: f["at_s"])
    pending = list(faults)
    with Path(plan["truth"]).open("a", buffering=1) as truth, Path(plan["stats"]).open("a", buffering=1) as stats:
        _send(plan, fleet, requests, by_slot, pending, index, truth, stats)


def _send(plan: dict[str, Any], fleet: Fleet, requests: list[list[Request]], by_slot: list[list[int]],
          pending: list[dict[str, Any]], index: dict[str, int], truth: Any, stats_out: Any) -> None:
    """Scrape and post until the plan's end, one slot of targets every quarter second."""
    interval = float(plan["interval_s"])
    t0, until = float(plan["start"]), float(plan["start"]) + float(plan["seconds"])
    slots = len(by_slot)
    seen_fault: dict[int, dict[str, Any]] = {}
    sender = Sender(plan["url"])
    samples = posts = late_s = 0.0
    last_stats = time.time()
    tick = 0
    while True:
        slot = tick % slots
        due = t0 + tick * (interval / slots)
        now = time.time()
        if due > until:
            break
        if due > now:
            time.sleep(due - now)
        else:
            late_s = max(late_s, now - due)
        while pending and t0 + pending[0]["at_s"] <= due:
            f = pending.pop(0)
            n = index[f["node"]]
            if f["kind"] == "hard":
                fleet.hard[n] = (int(f["gpu"]), int(f["xid"]))
            elif f["kind"] == "degrade":
                fleet.degraded[n] = int(f["gpu"])
            elif f["kind"] == "control":
                fleet.idle.add(n)
            seen_fault[n] = f
        nodes = np.array(by_slot[slot])
        fleet.scrape(nodes, interval)
        ms = int(due * 1000)
        stamp = ts_varint(ms)
        flat = fleet.values.reshape(-1)
        for req in requests[slot]:
            raw = flat[req.rows].astype("<f8").view(np.uint8).reshape(-1, 8)
            req.template[req.value_at] = raw
            req.template[req.ts_at] = stamp
            body = bytes(cramjam.snappy.compress_raw(req.template.tobytes()))
            sender.post(body, due + 60)
            posts += 1
            samples += len(req.rows)
            for n in req.nodes:
                f = seen_fault.pop(n, None)
                if f is not None:
                    truth.write(json.dumps({**f, "sample_ts": ms / 1000, "sent_at": time.time()}) + "\n")
        tick += 1
        if time.time() - last_stats >= 1.0:
            last_stats = time.time()
            stats_out.write(json.dumps({"t": last_stats, "samples": samples, "posts": posts,
                                        "retries": sender.retries, "failed_posts": sender.failed_posts,
                                        "refused": sender.refused, "late_s": round(late_s, 3),
                                        "cpu_s": time.process_time()}) + "\n")
            late_s = 0.0
    stats_out.write(json.dumps({"t": time.time(), "samples": samples, "posts": posts, "retries": sender.retries,
                                "failed_posts": sender.failed_posts, "refused": sender.refused, "late_s": late_s,
                                "cpu_s": time.process_time(), "done": True}) + "\n")


if __name__ == "__main__":
    run(json.loads(Path(sys.argv[1]).read_text()))
