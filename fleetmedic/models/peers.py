"""Peer comparison across nodes: a node against the other nodes of its job, or of its SKU fleet.

The nodes of one training job run the same code in lock-step, so their telemetry should look
alike. Following Minder (NSDI'25), :class:`PeerComparison` keeps each node's latest *summary
vector* (per-metric medians over the node's GPUs, see :func:`node_summary`), standardises every
metric across the peer group with the median and MAD (robust to the outlier it is looking for),
and flags a node whose largest robust z-score stays above ``peers.z_threshold`` for
``peers.continuity_window_s``. Groups smaller than ``peers.min_peers`` are not judged. For the
metrics in ``upper_only`` only a node above its peers counts (across a SKU fleet a node cooler than
the others is doing less work, e.g. spinning in NCCL at 100 % "utilisation"; a cooling fault
makes it hotter).

With ``adjust_by`` (the SKU comparison of busy nodes: ``peers.sku_adjust_by``, power by default),
a metric is judged by its residual from a robust straight-line fit against that metric across the
group: a GPU's temperature rises with the power it draws, so a node running a heavier job than its
peers is not hotter *than it should be*; a failing fan or a blocked inlet makes it hotter at the
same power. Idle nodes all draw idle power: a line fitted to its noise explains nothing and only
shrinks the spread the outlier is measured against, so they are compared as they are.

With ``learn_offsets`` (the SKU comparison of idle nodes: ``peers.offset_halflife_s``), each node's usual place
among its peers is learned as a slow exponential average of its deviation from the group median
(half-life ``offset_halflife_s``, per group and metric; frozen while the node stands out) and a
node is judged by how far it is from *its usual place*: a node in the warm slot of a rack, or with
a warmer inlet, is a few degrees above its SKU's median every day, which is not a fault; a
failing fan moves it away from where it usually is within minutes, far faster than the average
follows. Busy nodes are not judged this way: their place among their peers follows the jobs they
run (a node hosting a cooler job for hours would learn a cool place and then stand out on its
next, ordinary job), and the power line above accounts for the job.

This catches what per-GPU baselines cannot: a whole node drifting together (a failing fan or
PSU heats all eight GPUs, so sibling residuals stay flat). It runs where several nodes are seen
together (the correlation stage). Pure; ``now`` is injected.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import msgspec
import numpy as np

from fleetmedic.config import PeerSettings
from fleetmedic.models.gpu_signals import median, nanmedian_last_axis, reported
from fleetmedic.models.state import require_finite
from fleetmedic.records import DetectionTelemetry, Evidence, Finding

SUMMARY_METRICS: tuple[str, ...] = ("gpu_temp", "memory_temp", "power_usage", "sm_clock", "mem_clock")
MAD_TO_STD = 1.4826


def node_summary(msg: DetectionTelemetry) -> dict[str, float]:
    """Per-metric median over the node's GPUs; metrics not reported are left out.
    (Plain Python: on 8 values numpy's per-call overhead is most of the cost.)"""
    out: dict[str, float] = {}
    for name in SUMMARY_METRICS:
        vals = reported(msg, name)
        if vals:
            out[name] = median(vals)
    return out


class _Seen(msgspec.Struct):
    ts: float
    values: dict[str, float]


@dataclass
class PeerComparison:
    settings: PeerSettings
    reassert_s: float = 600.0
    detector: str = "job_peers"
    metrics: tuple[str, ...] = SUMMARY_METRICS
    upper_only: tuple[str, ...] = ()
    learn_offsets: bool = False  # judge a node against its own usual deviation from the group (offset_halflife_s)
    adjust_by: str = ""  # judge metrics by their residual from a fit against this one ("": as they are)
    min_scale: Mapping[str, float] = field(
        default_factory=lambda: {"gpu_temp": 1.0, "memory_temp": 1.0, "power_usage": 10.0, "sm_clock": 15.0,
                                 "mem_clock": 15.0}
    )
    _latest: dict[str, _Seen] = field(default_factory=dict)
    _since: dict[str, float] = field(default_factory=dict)  # node -> when it first stood out
    _reported: dict[str, float] = field(default_factory=dict)
    _offsets: dict[str, _Offset] = field(default_factory=dict)  # "<group>|<node>" -> its usual deviation

    def state_bytes(self) -> bytes:
        """The whole state (msgpack): latest summaries, when nodes stood out and were reported, offsets."""
        return msgspec.msgpack.encode([self._latest, self._since, self._reported, self._offsets])

    def load_state(self, data: bytes) -> None:
        """Replace the state with what :meth:`state_bytes` wrote (one without offsets too)."""
        parts = msgspec.msgpack.decode(data, type=list[msgspec.Raw])
        if len(parts) not in (3, 4):
            raise ValueError(f"peer comparison state: {len(parts)} parts, not 3 or 4")
        latest = msgspec.msgpack.decode(parts[0], type=dict[str, _Seen])
        since = msgspec.msgpack.decode(parts[1], type=dict[str, float])
        reported_at = msgspec.msgpack.decode(parts[2], type=dict[str, float])
        offsets = msgspec.msgpack.decode(parts[3], type=dict[str, _Offset]) if len(parts) == 4 else {}
        require_finite("peer comparison times", [*since.values(), *reported_at.values(),
                                                 *(s.ts for s in latest.values()), *(o.ts for o in offsets.values())])
        values = [v for s in latest.values() for v in s.values.values()]
        values += [v for o in offsets.values() for v in o.values.values()]
        require_finite("peer comparison values", values, nan_is_none=True)
        self._latest, self._since, self._reported, self._offsets = latest, since, reported_at, offsets

    def observe(self, node: str, ts: float, summary: Mapping[str, float]) -> None:
        self._latest[node] = _Seen(float(ts), dict(summary))

    def forget_silent(self, before: float) -> set[str]:
        """Forget the nodes whose latest summary is older than ``before`` (with their outlier clocks
        and usual deviations); return them."""
        gone = {n for n, seen in self._latest.items() if seen.ts < before}
        if gone:
            for node in gone:
                del self._latest[node]
                self._since.pop(node, None)
                self._reported.pop(node, None)
            self._offsets = {k: v for k, v in self._offsets.items() if k.rpartition("|")[2] not in gone}
        return gone

    def evaluate(self, group: str, nodes: Iterable[str], now: float, max_age_s: float = 60.0,
                 adjust: bool = True, usual: bool = True) -> list[Finding]:
        """Judge the nodes of one peer group (a job, or a SKU fleet); return findings for outliers.
        ``adjust=False`` compares the metrics as they are even with ``adjust_by`` set; ``usual=False``
        compares against the group median even with ``learn_offsets`` (a group whose deviations
        follow the jobs it runs, not the nodes)."""
        fresh = [n for n in nodes if n in self._latest and now - self._latest[n].ts <= max_age_s]
        if len(fresh) < self.settings.min_peers:
            for n in fresh:
                self._since.pop(n, None)
            return []
        metrics = sorted({m for n in fresh for m in self._latest[n].values if m in self.metrics})
        x = np.array([[self._latest[n].values.get(m, np.nan) for m in metrics] for n in fresh])
        expected = np.zeros_like(x)
        if self.adjust_by and adjust:
            by = np.array([self._latest[n].values.get(self.adjust_by, np.nan) for n in fresh])
            expected = np.stack([_robust_line(by, x[:, j]) for j in range(len(metrics))], axis=1)
        x = x - expected
        med = nanmedian_last_axis(x.T)[:, 0]
        dev = x - med
        learn = self.learn_offsets and usual
        place = self._usual(group, fresh, metrics) if learn else np.zeros_like(dev)
        mad = nanmedian_last_axis(np.abs(dev - place).T)[:, 0] * MAD_TO_STD
        floor = np.array([self.min_scale.get(m, 1e-9) for m in metrics])
        signed = (dev - place) / np.maximum(mad, floor)
        z = np.where([m in self.upper_only for m in metrics], np.maximum(signed, 0.0), np.abs(signed))
        z = np.nan_to_num(z, nan=0.0)
        worst = z.argmax(axis=1)
        out: list[Finding] = []
        for i, node in enumerate(fresh):
            score = float(z[i, worst[i]])
            if score < self.settings.z_threshold:
                self._since.pop(node, None)
                if learn:
                    self._learn(group, node, metrics, dev[i], now)
                continue
            since = self._since.setdefault(node, now)
            if now - since < self.settings.continuity_window_s:
                continue
            last = self._reported.get(node)
            if last is not None and now - last < self.reassert_s:
                continue
            self._reported[node] = now
            m = metrics[worst[i]]
            j = worst[i]
            adjusted = f", expected at its {self.adjust_by}" if self.adjust_by and expected[i, j] else ""
            ev = Evidence(detector=self.detector, metric=m, value=float(x[i, j] + expected[i, j]),
                          baseline=float(med[j] + place[i, j] + expected[i, j]), score=score,
                          threshold=self.settings.z_threshold,
                          window_s=now - since, ts=now, note=f"against {len(fresh) - 1} peers in {group}{adjusted}")
            out.append(Finding(id=f"{node}:{self.detector}:{m}:{now:.3f}", ts=now, node=node, detector=self.detector,
                               kind="degradation", severity="warning",
                               summary=f"{node} {m} unlike its {len(fresh) - 1} peers in {group} (z={score:.1f})",
                               evidence=[ev], job=group if self.detector == "job_peers" else ""))
        return out


    def _usual(self, group: str, nodes: list[str], metrics: list[str]) -> np.ndarray:
        """Each node's learned usual deviation from the group median, per metric (0 when unknown)."""
        out = np.zeros((len(nodes), len(metrics)))
        for i, node in enumerate(nodes):
            off = self._offsets.get(f"{group}|{node}")
            if off is not None:
                out[i] = [off.values.get(m, 0.0) for m in metrics]
        return out

    def _learn(self, group: str, node: str, metrics: list[str], dev: np.ndarray, now: float) -> None:
        """Move the node's usual deviation toward what it is now (it does not stand out)."""
        half = self.settings.offset_halflife_s
        key = f"{group}|{node}"
        off = self._offsets.get(key)
        if off is None:
            off = self._offsets[key] = _Offset(ts=now, values={})
        a = 1.0 - 0.5 ** (max(0.0, now - off.ts) / half) if half > 0 else 0.0
        for m, d in zip(metrics, dev.tolist(), strict=True):
            if d == d:  # NaN: not reported
                prev = off.values.get(m, 0.0)
                off.values[m] = prev + a * (d - prev)
        off.ts = now


class _Offset(msgspec.Struct):
    ts: float
    values: dict[str, float]


def _robust_line(x: np.ndarray, y: np.ndarray, max_points: int = 200) -> np.ndarray:
    """``y`` expected from ``x`` by a Theil-Sen line (the median of the pairwise slopes, so the
    outlier being looked for cannot tilt it; never negative: a GPU does not cool as it draws more
    power); zeros where no line can be fitted (fewer than 4 points, ``x`` constant), so that ``y`` is
    then judged as it is; NaN for a point without ``x`` when the line is used. At most
    ``max_points`` evenly spaced points are paired (the cost grows with their square)."""
    ok = np.flatnonzero(np.isfinite(x) & np.isfinite(y))
    if ok.size < 4:
        return np.zeros_like(y)
    pts = ok[np.linspace(0, ok.size - 1, min(ok.size, max_points)).astype(int)]
    dx = x[pts][:, None] - x[pts][None, :]
    dy = y[pts][:, None] - y[pts][None, :]
    upper = np.triu(np.abs(dx) > 0, k=1)
    if not upper.any():
        return np.zeros_like(y)
    slope = max(0.0, float(np.median(dy[upper] / dx[upper])))
    icpt = float(np.median(y[ok] - slope * x[ok]))
    out = np.full_like(y, np.nan)  # a node without the other metric is not judged
    out[ok] = slope * x[ok] + icpt
    return out
