"""Detection wired as the pipeline's stages, pure: records in, findings out.

- :class:`NodeDetection` is stage 1 (partitioned by node): GPU baselines and rules, the node's own
  NIC ports, and the multivariate model's per-node windows. Everything it keeps is per node, so
  any number of workers can split the nodes between them.
- :class:`FleetDetection` runs where many nodes are seen together (the correlation stage): a node
  against its job's peers and its SKU fleet, stragglers from per-rank step times, switch ports.

Both are driven by the Kafka pipeline (:class:`NodeDetection` by stage 1's consumer-group loop,
:class:`FleetDetection` by the decision stage), the embedded engine and ``fleetmedic backtest``
alike. Time comes from the records and from the ``now`` passed to :meth:`FleetDetection.tick`.

State (:mod:`fleetmedic.models.state`): :class:`NodeDetection` saves and loads a node at a time
(its detectors' ``node_bytes`` / ``load_node``, its own :meth:`NodeDetection.multivariate_bytes`;
the model's rows by partition, :meth:`MultivariateModel.state_bytes`), :class:`FleetDetection` as a
whole (:meth:`FleetDetection.state_bytes`).

Bounded memory: :class:`NodeDetection` remembers when it last saw each node, in event
time (its clock is the newest record stamp it has seen, never the wall clock), and forgets a node
silent for ``detection.evict_node_after_s`` (checked every twentieth of that span of event time, at
most every hour) and, beyond ``detection.max_nodes_per_worker`` nodes, the least recently seen one,
after every micro-batch: its baselines and rule state, NIC ports, multivariate window, outlier streak
and training rows. ``on_evict(node, reason)`` tells the owner (stage 1 deletes the node's saved
state). A forgotten node that returns starts fresh: its baselines warm up again
(``baseline.warmup_samples``) before they judge it. :class:`FleetDetection` forgets, on its tick, the
nodes without a summary for ``detection.evict_node_after_s`` (their peer summaries, outlier clocks,
usual deviations and SKU groups).
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from operator import attrgetter

import msgspec
import numpy as np

from fleetmedic.config import DetectionSettings, PeerSettings
from fleetmedic.models import sample_columns as sc
from fleetmedic.models.detector import NodeDetector
from fleetmedic.models.gpu_detector import GpuDetector, metricless
from fleetmedic.models.gpu_signals import USED_METRICS, median, reported
from fleetmedic.models.kernel_events import KernelEventDetector
from fleetmedic.models.multivariate import SAMPLE_METRICS, Fit, MultivariateModel, NodeWindowFeatures, RefitJob
from fleetmedic.models.peers import SUMMARY_METRICS, PeerComparison, node_summary
from fleetmedic.models.port_detector import PortDetector
from fleetmedic.models.state import State
from fleetmedic.models.straggler import StragglerDetector
from fleetmedic.records import DetectionTelemetry, Finding, JobEvent, KernelEvent, PortTelemetry

log = logging.getLogger(__name__)


@dataclass
class NodeDetection:
    settings: DetectionSettings
    #: the stage's detectors (:class:`~fleetmedic.models.detector.NodeDetector`, each called as
    #: ``detect(records, now)``, its state per node)
    gpu: GpuDetector = field(init=False)
    kernel: KernelEventDetector = field(init=False)
    ports: PortDetector = field(init=False)
    windows: NodeWindowFeatures = field(init=False)
    model: MultivariateModel = field(init=False)
    #: where the multivariate model's refits run: None = here, at once; a worker passes a thread
    #: pool's ``submit`` so that its loop keeps consuming (and judging with the current fit) meanwhile
    refit_runner: Callable[[Callable[[], Fit]], Future[Fit]] | None = None
    _refit: tuple[RefitJob, Future[Fit]] | None = None
    _flagged_since: dict[str, float] = field(default_factory=dict)
    _outlier_streak: dict[str, int] = field(default_factory=dict)
    #: told of each node forgotten by eviction, with the reason ("silence" or "capacity")
    on_evict: Callable[[str, str], None] | None = None
    #: node -> the clock when it was last seen, least recently seen first
    _seen: OrderedDict[str, float] = field(default_factory=OrderedDict)
    clock: float = -math.inf  # event time: the newest record stamp seen
    _swept: float = -math.inf  # the clock at the last sweep for silent nodes

    def __post_init__(self) -> None:
        self.gpu = GpuDetector(self.settings)
        self.kernel = KernelEventDetector(self.settings, self.gpu)
        self.ports = PortDetector(self.settings)
        self.windows = NodeWindowFeatures(self.settings.multivariate.window_s, self.settings.multivariate.busy_util)
        self.model = MultivariateModel(self.settings.multivariate)

    def on_gpu(self, msgs: Sequence[DetectionTelemetry], batch: sc.MetricBatch | None = None) -> list[Finding]:
        """Findings for a micro-batch; ``batch`` (:func:`stage1_batch`) when the caller converted the
        messages' columns already (it also needs them for :func:`summarise_batch`)."""
        batch = batch or stage1_batch(msgs)
        now = max(map(float, map(_TS, msgs))) if msgs else self.clock
        findings = self.gpu.detect(msgs, now, batch=batch)
        for f in findings:
            if f.kind != "telemetry":  # a gap in the node's data says nothing about its windows
                self._flagged_since[f.node] = max(self._flagged_since.get(f.node, f.ts), f.ts)
        if self.settings.multivariate.enabled:
            # a record without metrics (XIDs only) is no sample of the node's window
            sampled = [m for m in msgs if not metricless(m)] if any(map(metricless, msgs)) else msgs
            if sampled:
                findings.extend(self._windows(sampled, batch if sampled is msgs else stage1_batch(sampled)))
        if msgs:
            self._saw(map(_NODE, msgs), now)
        return findings

    def on_kernel(self, ev: KernelEvent) -> list[Finding]:
        """A line of the node's kernel log (:mod:`fleetmedic.models.kernel_events`): its XID joins
        the same XID from the node's telemetry as one event; an SXid, an AER error or a machine
        check is a finding naming its device. No metric state moves."""
        now = float(ev.ts)
        findings = self.kernel.detect((ev,), now)
        self._saw((ev.node,), now)
        return findings

    def on_port(self, msg: PortTelemetry) -> list[Finding]:
        now = float(msg.ts)
        findings = self.ports.detect((msg,), now)
        self._saw((msg.device,), now)
        return findings

    # --- bounded memory ------------------------------------------------------------------------

    def tracked(self) -> int:
        """How many nodes the stage remembers."""
        return len(self._seen)

    def last_seen(self, node: str) -> float | None:
        """The clock (event time) when ``node`` was last seen, or None if it is not remembered."""
        return self._seen.get(node)

    def restore_seen(self, seen: dict[str, float]) -> None:
        """After loading saved node states: when each was last seen (its saved ``seen_at``; the
        clock when unknown), put in order, least recently seen first."""
        self.clock = max([self.clock, *(at for at in seen.values() if at == at)])
        for node, at in seen.items():
            self._seen[node] = at if at == at else self.clock
        if seen:
            self._seen = OrderedDict(sorted(self._seen.items(), key=lambda kv: kv[1]))

    def _saw(self, nodes: Iterable[str], ts: float) -> None:
        """Nodes seen in a record stamped up to ``ts``: they move to the end of the eviction order,
        seen at the clock; then forget what is due."""
        if ts == ts:
            self.clock = max(self.clock, ts)
        clock, seen = self.clock, self._seen
        for node in nodes:
            seen[node] = clock
            seen.move_to_end(node)
        self._evict()

    def _evict(self) -> None:
        s, seen = self.settings, self._seen
        gone: list[tuple[str, str]] = []
        while len(seen) > s.max_nodes_per_worker:
            gone.append((seen.popitem(last=False)[0], "capacity"))
        if self.clock - self._swept >= min(s.evict_node_after_s / 20, 3600.0):
            cutoff, self._swept = self.clock - s.evict_node_after_s, self.clock
            silent = [n for n, at in seen.items() if at < cutoff]
            for node in silent:
                del seen[node]
            gone += [(n, "silence") for n in silent]
        if gone:
            self._forget(n for n, _ in gone)
            if self.on_evict is not None:
                for node, reason in gone:
                    self.on_evict(node, reason)

    def forget(self, nodes: Iterable[str]) -> None:
        """Drop everything kept for ``nodes`` (another worker carries on with them), not counted as
        evicted."""
        nodes = list(nodes)
        for node in nodes:
            self._seen.pop(node, None)
        self._forget(nodes)

    def _detectors(self) -> tuple[NodeDetector[DetectionTelemetry], NodeDetector[KernelEvent],
                                  NodeDetector[PortTelemetry]]:
        return self.gpu, self.kernel, self.ports

    def _forget(self, nodes: Iterable[str]) -> None:
        dropped = set(nodes)
        detectors = self._detectors()
        for node in dropped:
            for detector in detectors:
                detector.forget(node)
            self.windows.forget(node)
            self._flagged_since.pop(node, None)
            self._outlier_streak.pop(node, None)
        self.model.forget(dropped)

    def multivariate_bytes(self, node: str) -> bytes:
        """The node's part of the multivariate state (msgpack): its open window, outlier streak and
        latest finding time. The model itself is saved apart (:meth:`MultivariateModel.state_bytes`)."""
        return msgspec.msgpack.encode((self.windows.node_bytes(node), self._outlier_streak.get(node, 0),
                                       self._flagged_since.get(node)))

    def load_multivariate(self, node: str, data: bytes) -> None:
        """Load what :meth:`multivariate_bytes` wrote."""
        window, streak, flagged = msgspec.msgpack.decode(data, type=tuple[bytes | None, int, float | None])
        self.windows.load_node(node, window)
        self._outlier_streak[node] = streak
        if flagged is not None:
            self._flagged_since[node] = flagged

    def _windows(self, msgs: Sequence[DetectionTelemetry], batch: sc.MetricBatch) -> list[Finding]:
        out: list[Finding] = []
        for msg, vec in zip(msgs, self.windows.add_batch(msgs, batch), strict=True):
            if vec is None:
                continue
            now = float(msg.ts)
            finding = self.model.judge(msg.node, vec, now)
            streak = self._outlier_streak[msg.node] = self._outlier_streak.get(msg.node, 0) + 1 if finding else 0
            if finding is not None:
                if streak >= self.settings.multivariate.consecutive_windows:
                    out.append(finding)  # an outlier several windows in a row (continuity, as Minder)
            elif now - self._flagged_since.get(msg.node, float("-inf")) > self.settings.multivariate.window_s:
                self.model.learn(vec, msg.node, now)  # a window with no finding on its node counts as healthy
            if self.refit_runner is None:
                self.model.maybe_refit(now)
            else:
                self._refit_elsewhere(now)
        return out

    def _refit_elsewhere(self, now: float) -> None:
        """Install a refit that finished; plan and submit the next when due, at the same window as an
        in-place refit (so the rows it fits on do not depend on timing). A refit due while the last
        still runs waits for it: fits are never planned on rows older than the fit in place."""
        if self._refit is not None and (self._refit[1].done() or self.model.refit_due(now)):
            self.install_refit()
        job = self.model.plan_refit(now)
        if job is not None and self.refit_runner is not None:
            self._refit = (job, self.refit_runner(job.run))

    def refit_running(self) -> Future[Fit] | None:
        """The refit submitted and not yet installed (a checkpoint waits for it), or None."""
        return None if self._refit is None else self._refit[1]

    def install_refit(self) -> None:
        """Put the submitted refit in place, waiting for it if it still runs. A failed fit keeps the
        current one (the error is logged) and is planned again at the next window."""
        if self._refit is None:
            return
        (job, running), self._refit = self._refit, None
        try:
            self.model.install(job, running.result())
        except Exception:
            log.exception("refitting the multivariate model failed; the current fit stays")
            self.model.cancel_refit()


@dataclass
class FleetDetection:
    settings: DetectionSettings
    peers: PeerComparison = field(init=False)
    sku_peers: PeerComparison = field(init=False)
    #: the detectors of records (:class:`~fleetmedic.models.detector.FleetDetector`, each called as
    #: ``detect(records, now)``, its state saved whole); the peers are judged on :meth:`tick`
    stragglers: StragglerDetector = field(init=False)
    switch_ports: PortDetector = field(init=False)
    _jobs: dict[str, set[str]] = field(default_factory=dict)  # job -> nodes
    _skus: dict[str, set[str]] = field(default_factory=dict)  # sku -> nodes
    _placed: dict[str, int] = field(default_factory=dict)  # node -> jobs placed on it
    _swept: float = -math.inf  # the ``now`` of the last sweep for silent nodes

    def __post_init__(self) -> None:
        s = self.settings
        # a node cooler than its job's peers is doing less work, not overheating: only a hotter one is
        # suspect on temperature (as the baselines watch temperatures upwards); less work shows in power
        # and clocks, compared both ways
        self.peers = PeerComparison(s.peers, reassert_s=s.reassert_s, detector="job_peers",
                                    upper_only=("gpu_temp", "memory_temp"))
        # across a SKU fleet only temperatures compare (clocks and power follow each job's workload),
        # and only a node hotter than its peers is suspect (a cooler one is doing less work)
        self.sku_peers = PeerComparison(s.peers, reassert_s=s.reassert_s, detector="sku_peers",
                                        metrics=("gpu_temp", "memory_temp"), upper_only=("gpu_temp", "memory_temp"),
                                        adjust_by=s.peers.sku_adjust_by,
                                        learn_offsets=s.peers.offset_halflife_s > 0,
                                        min_scale={"gpu_temp": s.peers.sku_min_temp_spread_c,
                                                   "memory_temp": s.peers.sku_min_temp_spread_c})
        self.stragglers = StragglerDetector(s.straggler)
        self.switch_ports = PortDetector(s)

    def on_gpu(self, msg: DetectionTelemetry) -> None:
        self.on_summary(summarise(msg, self.settings.peers))

    def on_summary(self, s: NodeSummary) -> None:
        """What :meth:`on_gpu` keeps of a message (stage 1 sends these when it runs elsewhere)."""
        self.peers.observe(s.node, s.ts, s.values)
        self.sku_peers.observe(s.node, s.ts, s.values)
        for nodes in self._skus.values():
            nodes.discard(s.node)
        # a SKU fleet runs many workloads: compare a node only with nodes under a similar load; idle
        # means no job (a job's GPUs waiting on a checkpoint or its input are not idle like an empty node)
        band = "" if s.band == "idle" and s.node in self._placed else s.band
        if s.sku and band:
            self._skus.setdefault(f"{s.sku} {band}", set()).add(s.node)

    def on_job(self, event: JobEvent) -> list[Finding]:
        if event.event == "placement":
            self._place(event.job, {p.node for p in event.placement})
        elif event.event in ("completion", "failure"):
            self._place(event.job, set())
        return self.stragglers.detect((event,), float(event.ts))

    def _place(self, job: str, nodes: set[str]) -> None:
        for n in self._jobs.pop(job, set()):
            left = self._placed.get(n, 0) - 1
            if left > 0:
                self._placed[n] = left
            else:
                self._placed.pop(n, None)
        if nodes:
            self._jobs[job] = nodes
            for n in nodes:
                self._placed[n] = self._placed.get(n, 0) + 1

    def on_port(self, msg: PortTelemetry) -> list[Finding]:
        return self.switch_ports.detect((msg,), float(msg.ts))

    def _detectors(self) -> tuple[State, State, State, State]:
        return self.peers, self.sku_peers, self.stragglers, self.switch_ports

    def state_bytes(self) -> bytes:
        """The whole state (msgpack): peers, stragglers, switch ports, jobs and SKU groups."""
        return msgspec.msgpack.encode([*(d.state_bytes() for d in self._detectors()),
                                       {k: sorted(v) for k, v in self._jobs.items()},
                                       {k: sorted(v) for k, v in self._skus.items()}])

    def load_state(self, data: bytes) -> None:
        """Replace the state with what :meth:`state_bytes` wrote (same settings)."""
        *detectors, jobs, skus = msgspec.msgpack.decode(
            data, type=tuple[bytes, bytes, bytes, bytes, dict[str, list[str]], dict[str, list[str]]])
        for detector, part in zip(self._detectors(), detectors, strict=True):
            detector.load_state(part)
        self._jobs, self._placed = {}, {}
        for job, nodes in jobs.items():
            self._place(job, set(nodes))
        self._skus = {k: set(v) for k, v in skus.items()}

    def tick(self, now: float) -> list[Finding]:
        """Compare peers; call once per sample interval. Nodes with no summary for
        ``detection.evict_node_after_s`` are forgotten (checked as in :class:`NodeDetection`)."""
        s = self.settings
        if now - self._swept >= min(s.evict_node_after_s / 20, 3600.0):
            self._swept = now
            gone = self.peers.forget_silent(now - s.evict_node_after_s)
            gone |= self.sku_peers.forget_silent(now - s.evict_node_after_s)
            if gone:
                for nodes in self._skus.values():
                    nodes -= gone
                self._skus = {k: v for k, v in self._skus.items() if v}
        max_age = 3 * self.settings.sample_interval_s
        out: list[Finding] = []
        for job, nodes in sorted(self._jobs.items()):
            out.extend(self.peers.evaluate(job, sorted(nodes), now, max_age))
        for sku, nodes in sorted(self._skus.items()):
            # idle nodes draw the same idle power: their temperatures are compared as they are, each
            # against its usual place (a warm rack slot); busy ones against what their power predicts
            idle = sku.endswith(" idle")
            out.extend(self.sku_peers.evaluate(f"sku {sku}", sorted(nodes), now, max_age, adjust=not idle,
                                               usual=idle))
        return out


class NodeSummary(msgspec.Struct, frozen=True, array_like=True):
    """A node's sample as the fleet stage needs it: per-metric medians and its load band."""

    node: str
    ts: float
    sku: str
    band: str
    values: dict[str, float]


_PEERS = PeerSettings()


def summarise(msg: DetectionTelemetry, peers: PeerSettings = _PEERS) -> NodeSummary:
    """The message's summary; its load band by ``peers.idle_below_util`` and ``peers.busy_above_util``."""
    return NodeSummary(msg.node, float(msg.ts), msg.sku or "", _load_band(msg, peers), node_summary(msg))


_BATCH_METRICS = (*SUMMARY_METRICS, "gpu_util")


#: every metric stage 1 reads, converted once per micro-batch (:func:`stage1_batch`)
STAGE1_METRICS = tuple(dict.fromkeys((*USED_METRICS, *SAMPLE_METRICS, *_BATCH_METRICS)))


def stage1_batch(msgs: Sequence[DetectionTelemetry]) -> sc.MetricBatch:
    """The micro-batch's columns for :meth:`NodeDetection.on_gpu` and :func:`summarise_batch`."""
    batch = sc.MetricBatch.of(msgs, STAGE1_METRICS)
    for group, x in enumerate(batch.arrays):
        if x is not None:  # the peer summaries' medians; the windows' busy test reads gpu_util's from them
            batch.medians(group, _BATCH_METRICS)
    return batch


class SummaryColumns(msgspec.Struct, frozen=True, array_like=True):
    """A micro-batch's node summaries column by column: what stage 1 sends the fleet stage, one
    message per poll (msgpack). ``values[i][j]`` is node ``i``'s median of ``metrics[j]`` (NaN: not
    reported; ``holes[i]`` says whether its row has any); ``bands[i]`` its load band. Built from the
    batch's arrays without one object per node (the fleet stage makes them: :meth:`summaries`)."""

    nodes: list[str]
    ts: list[float]
    skus: list[str]
    bands: list[str]
    metrics: list[str]
    values: list[list[float]]
    holes: list[bool]

    def __post_init__(self) -> None:
        n = len(self.nodes)
        for name in ("ts", "skus", "bands", "values", "holes"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"`{name}` has {len(getattr(self, name))} entries for {n} nodes")
        if any(len(row) != len(self.metrics) for row in self.values):
            raise ValueError(f"a row of `values` does not have {len(self.metrics)} entries")

    def summaries(self) -> list[NodeSummary]:
        """One :class:`NodeSummary` per node, its metrics not reported left out."""
        metrics = self.metrics
        return [NodeSummary(node, ts, sku, band, {k: v for k, v in zip(metrics, row, strict=True) if v == v}
                            if hole else dict(zip(metrics, row, strict=True)))
                for node, ts, sku, band, row, hole in zip(self.nodes, self.ts, self.skus, self.bands, self.values,
                                                          self.holes, strict=True)]


_BANDS = ("", "idle", "busy")
_NODE, _TS, _SKU = (attrgetter(a) for a in ("node", "ts", "sku"))


def summary_columns(msgs: Sequence[DetectionTelemetry], batch: sc.MetricBatch | None = None,
                    peers: PeerSettings = _PEERS) -> SummaryColumns:
    """:func:`summarise` of each message, as columns, with the medians of the whole batch computed
    at once (from ``batch``'s converted columns when given)."""
    batch = batch or sc.MetricBatch.of(msgs, _BATCH_METRICS)
    if len(batch.groups) == 1 and msgs and msgs[0].gpus:
        medians = batch.medians(0, _BATCH_METRICS)
    else:
        medians = np.full((len(msgs), len(_BATCH_METRICS)), np.nan)
        for group, idx in enumerate(batch.groups):
            if msgs[idx[0]].gpus:  # a message without GPUs reports nothing: NaN
                medians[idx] = batch.medians(group, _BATCH_METRICS)
    util, values = medians[:, -1], medians[:, : len(SUMMARY_METRICS)]
    # NaN (not reported): neither band, ""
    codes: list[int] = ((util < peers.idle_below_util) + 2 * (util > peers.busy_above_util)).tolist()
    holes: list[bool] = np.isnan(values).any(axis=1).tolist()  # type: ignore[assignment]
    return SummaryColumns(list(map(_NODE, msgs)), list(map(float, map(_TS, msgs))),
                          [sku or "" for sku in map(_SKU, msgs)], [_BANDS[c] for c in codes],
                          list(SUMMARY_METRICS), values.tolist(), holes)


def summarise_batch(msgs: Sequence[DetectionTelemetry], batch: sc.MetricBatch | None = None,
                    peers: PeerSettings = _PEERS) -> list[NodeSummary]:
    """:func:`summarise` of each message (:func:`summary_columns`, made into one object each)."""
    return summary_columns(msgs, batch, peers).summaries()


def _load_band(msg: DetectionTelemetry, peers: PeerSettings) -> str:
    """The load band of a node's median GPU utilisation ("": not reported, or in between)."""
    util = median(reported(msg, "gpu_util"))
    if util != util:  # not reported
        return ""
    return "idle" if util < peers.idle_below_util else ("busy" if util > peers.busy_above_util else "")
