"""GPU detection for a node's telemetry: baselines, drift, throttling, hard-fault rules and XIDs.

:class:`GpuDetector` turns :class:`~fleetmedic.records.GpuTelemetry` into
:class:`~fleetmedic.records.Finding` values. Its state is one
:class:`~fleetmedic.models.gpu_state.NodeGpuState` per node, kept in the slabs of
:class:`~fleetmedic.models.gpu_state.GpuNodeStates` (this module holds the rules), saved and loaded
a node at a time (:class:`~fleetmedic.models.state.NodeState`: stage 1 writes it
to its compacted state topic, key: node). Two entry points:

- :meth:`GpuDetector.observe` for one message;
- :meth:`GpuDetector.observe_batch` for a micro-batch: the arithmetic runs once over every node of
  the batch (per-message numpy calls on ``8x25`` arrays cost more than the arithmetic itself).

What becomes a finding:

================  ===========  =============================================================
detector          kind         condition
================  ===========  =============================================================
gpu_baseline      degradation  a signal beyond ``z_warning`` and ``min_delta`` of its baseline
                               for ``continuity_samples`` samples in a row
gpu_drift         degradation  CUSUM of the signal's z-score above ``cusum.threshold_h``
gpu_throttle      degradation  share of samples in thermal/power slowdown above
                               ``thermal_throttle_fraction`` (EWMA over the baseline half-life;
                               it restarts after a reboot or a gap over ``max_sample_gap_s``),
                               reported in samples that are throttled (not while it decays)
pcie_width        degradation  PCIe link width below the widest seen on that GPU
hbm_rows          degradation  uncorrectable remapped rows went up (a pending remap is ``info``
                               evidence: one remap is normal wear; repeated ones trend)
gpu_siblings      degradation  a GPU's error rate (``siblings.signals``: NVLink errors) above
                               the median of its node's GPUs by ``min_excess`` per minute and
                               ``ratio`` times (smoothed per GPU): one GPU's errors rising while
                               its siblings stay flat, however slowly (critical beyond
                               ``critical_excess``)
hard_rules        hard_fault   DBE increase >= ``dbe_threshold``; row-remap failure; NVLink
                               link down; a GPU lost (fell off the bus: absent from
                               ``gpu_missing_after_samples`` records in a row spanning
                               ``gpu_missing_after_s``, or at once with XID 79 for it); HW
                               thermal slowdown on a GPU (cooling failed; ``hw_thermal_is_hard``)
power_brake       hard_fault   HW power brake on >= ``power_brake_min_gpu_fraction`` of the
                               node's GPUs in one sample (power delivery / PSU; one per node)
xid_rules         hard_fault   an XID whose action isolates (catalog + overrides); others as
                               ``info`` evidence for triage
xid_repeat        hard_fault   an application-class XID repeated on one GPU within a window
                               (occurrences on more than ``repeat_max_gpus`` GPUs of the node
                               at once are the application's every rank faulting: not counted)
xid_trend         degradation  row-remap/contained-error XIDs trending on one GPU
telemetry_gap     telemetry    (``info``) the node sent nothing for longer than
                               ``max_sample_gap_s``: missing data, never a hardware finding
================  ===========  =============================================================

A condition is reported when it starts and again every ``reassert_s`` while it lasts.
Pure: time comes from the messages (``ts``).

Missing data is not a fault. A node keeps the columns of every GPU it has reported; a record that
lacks some (a partial scrape, or a scrape whose series were stamped apart and so split into two
records) leaves them NaN: their baselines, counters and smoothed rates wait as they were, and a GPU
that comes back continues with them (its first counter rate after the absence is not computed: the
counters moved over more than the node's last interval). Residual signals are not computed from a
record holding less than half of the node's GPUs (the median of a few GPUs is not the node's).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from operator import attrgetter

import numpy as np
from numpy.typing import NDArray

from fleetmedic.config import DetectionSettings
from fleetmedic.models import event_dedup
from fleetmedic.models.baseline import alpha_for_halflife
from fleetmedic.models.event_dedup import KERNEL, TELEMETRY
from fleetmedic.models.gpu_signals import (
    HW_POWER_BRAKE,
    HW_THERMAL,
    KNOWN_SIGNALS,
    MEAN,
    RATE_SIGNALS,
    RESIDUAL_SIGNALS,
    THROTTLE_MASK,
    USED_METRICS,
    VAR,
    BaselineParams,
    M,
    SignalPlan,
    StepResult,
    W,
    nanmedian_last_axis,
    signals_at,
    step_baselines_at,
)
from fleetmedic.models.gpu_state import F64, GpuNodeStates, LiveNode, Slab
from fleetmedic.models.sample_columns import MetricBatch, bit_fields, columns
from fleetmedic.models.xid_catalog import XidCatalog, default_catalog
from fleetmedic.records import (
    DetectionMetrics,
    DetectionTelemetry,
    Evidence,
    Finding,
    FindingKind,
    GpuMetrics,
    Severity,
    XidEvent,
)


def metrics_array(msg: DetectionTelemetry) -> F64:
    """The message's metrics detection uses as a ``[USED_METRICS, gpus]`` float array (NaN = not reported)."""
    one: F64 = metrics_batch([msg])[0]
    return one


def metrics_batch(msgs: Sequence[DetectionTelemetry]) -> F64:
    """``[messages, USED_METRICS, gpus]`` for messages with the same GPU count, in one pass."""
    return columns(msgs, USED_METRICS)


_NODE, _GPUS, _BOOT_ID, _XIDS, _TS = (attrgetter(a) for a in ("node", "gpus", "boot_id", "xids", "ts"))
_GPU_LIST, _XID_LOG, _ACTIVE, _SLOT, _ABSENT = (
    attrgetter(a) for a in ("gpu_list", "xid_log", "active", "slot", "absent"))


class GpuDetector:
    """Findings from GPU telemetry. Holds per-node state; see the module docstring."""

    def __init__(self, settings: DetectionSettings, catalog: XidCatalog | None = None) -> None:
        unknown = sorted(set(settings.metrics) - set(KNOWN_SIGNALS))
        if unknown:
            raise ValueError(f"detection.metrics: unknown signal(s) {unknown}; known: {list(KNOWN_SIGNALS)}")
        self.settings = settings
        self.catalog = catalog or default_catalog(settings.xid.action_overrides)
        names = tuple(n for n in KNOWN_SIGNALS if n in settings.metrics)
        residual = [n for n in names if n in RESIDUAL_SIGNALS]
        rates = [n for n in names if n in RATE_SIGNALS]
        self.names = (*residual, *rates)
        th = [settings.metrics[n] for n in self.names]
        self.plan = SignalPlan(
            names=self.names,
            residual_idx=np.array([M[RESIDUAL_SIGNALS[n]] for n in residual], dtype=np.intp),
            n_residual=len(residual),
            rate_groups=tuple(np.array([W[c] for c in RATE_SIGNALS[n]], dtype=np.intp) for n in rates),
            sign=np.array([{"up": 1.0, "down": -1.0, "both": 0.0}[t.direction] for t in th])[:, None],
            z_warning=np.array([t.z_warning for t in th])[:, None],
            z_critical=np.array([t.z_critical for t in th])[:, None],
            min_delta=np.array([t.min_delta for t in th])[:, None],
            # a deviation of min_delta scores at most z_warning: a nearly constant signal (clocks)
            # has a tiny variance, and its z-scores would otherwise explode on a few MHz
            std_floor=np.array([max(settings.baseline.min_std, t.min_delta / t.z_warning) for t in th])[:, None],
        )
        self._residual_names = tuple(RESIDUAL_SIGNALS[n] for n in residual)  # the metrics, as in a MetricBatch
        sib = settings.siblings
        #: the rate signals compared with the node's other GPUs: those of ``siblings.signals`` that
        #: ``metrics`` monitors (a signal not monitored has no rate to compare)
        self.sibling_names = tuple(n for n in dict.fromkeys(sib.signals) if n in rates)
        #: rows of the signals (``[B, S, G]``) compared with their siblings, and their counters (watched rows)
        self._sib_rows = np.array([self.names.index(n) for n in self.sibling_names], dtype=np.intp)
        counters = [c for n in self.sibling_names for c in RATE_SIGNALS[n]]
        self._sib_metric_rows = np.array([M[c] for c in counters], dtype=np.intp)
        self._sib_watched_rows = np.array([W[c] for c in counters], dtype=np.intp)
        self._sib_spans: list[tuple[int, int]] = []  # each signal's counters in those rows
        for n in self.sibling_names:
            lo = self._sib_spans[-1][1] if self._sib_spans else 0
            self._sib_spans.append((lo, lo + len(RATE_SIGNALS[n])))
        self._sib_alpha = alpha_for_halflife(sib.halflife_samples)
        self.alpha = alpha_for_halflife(settings.baseline.halflife_samples)
        self.baseline_params = BaselineParams(
            alpha=self.alpha, warmup=settings.baseline.warmup_samples, min_std=settings.baseline.min_std,
            protect_z=settings.baseline.protect_z, continuity=settings.continuity_samples,
            cusum_k=settings.cusum.drift_k, cusum_h=settings.cusum.threshold_h)
        self.states = GpuNodeStates(self.names, len(self.sibling_names))

    # --- state ---------------------------------------------------------------------------------

    def nodes(self) -> list[str]:
        return list(self.states.live)

    def node_bytes(self, node: str) -> bytes | None:
        """The node's state (a :class:`~fleetmedic.models.gpu_state.NodeGpuState`, msgpack), or None
        before its first message."""
        return self.states.node_bytes(node)

    def load_node(self, node: str, data: bytes) -> None:
        """Replace the node's state with what :meth:`node_bytes` wrote; :class:`ValueError` (the
        node's state left as it was) for a baseline, counter or time that is not finite."""
        self.states.load_node(node, data)
    def signals(self, node: str) -> tuple[tuple[str, ...], F64, F64, F64] | None:
        """The node's latest signals and their baselines: ``(names, value, mean, std)``, each ``[S, G]``
        (for reports and debugging; ``None`` before the node's first sample)."""
        live = self.states.live.get(node)
        if live is None or live.samples == 0:
            return None
        std = np.maximum(np.sqrt(live.planes[VAR]), self.plan.std_floor)
        return self.names, live.slab.last[live.slot].copy(), live.planes[MEAN].copy(), std

    def last_sample_ts(self, node: str) -> float | None:
        """The time of the node's latest sample taken into its baselines (None: none yet). Stage 1
        does not take a sample stamped before it again: a restart that resumes from offsets older
        than the node state it loaded replays samples the state already holds."""
        live = self.states.live.get(node)
        return live.prev_ts if live is not None and live.samples > 0 else None

    def forget(self, node: str) -> None:
        """Drop a node's state (e.g. after repair: baselines start again)."""
        self.states.forget(node)

    # --- observing -----------------------------------------------------------------------------

    def detect(self, records: Sequence[DetectionTelemetry], now: float, *,
               batch: MetricBatch | None = None) -> list[Finding]:
        """Findings for a micro-batch (:class:`~fleetmedic.models.detector.Detector`): the messages'
        own stamps time them, ``now`` is not read. ``batch``: their columns already converted."""
        return self.observe_batch(records, batch)

    def observe(self, msg: DetectionTelemetry) -> list[Finding]:
        return self.observe_batch([msg])

    def observe_batch(self, msgs: Sequence[DetectionTelemetry], batch: MetricBatch | None = None) -> list[Finding]:
        """Findings for a batch of messages, in message order per node. ``batch``: the messages'
        columns already converted (:class:`~fleetmedic.models.sample_columns.MetricBatch`).

        A message without any metric (only XIDs) is no sample: its XIDs go through
        :meth:`observe_events`, and the node's metric clock, baselines and GPU columns stay as they are."""
        if any(map(metricless, msgs)):
            alone = [f for m in msgs if metricless(m)
                     for f in self.observe_events(m.node, float(m.ts), m.xids, m.gpus, TELEMETRY)]
            rest = [m for m in msgs if not metricless(m)]
            return alone + (self.observe_batch(rest) if rest else [])
        pending = list(msgs)
        if (pending and len({m.node for m in pending}) == len(pending) and len({len(m.gpus) for m in pending}) == 1
                and self._aligned(pending)):
            # the usual micro-batch: one message per node, one GPU count, every node's GPUs as before
            if batch is not None and len(batch.groups) == 1 and pending[0].gpus:  # its columns, and medians
                return self._observe_distinct(pending, batch.take(0, USED_METRICS),
                                              batch.medians(0, self._residual_names))
            return self._observe_distinct(pending)
        findings: list[Finding] = []
        while pending:
            wave, pending = _split_waves(pending)
            by_width: dict[int, list[DetectionTelemetry]] = {}
            for msg in wave:
                by_width.setdefault(self._width(msg), []).append(msg)
            for group in by_width.values():
                findings.extend(self._observe_distinct(group))
        return findings

    def _aligned(self, msgs: Sequence[DetectionTelemetry]) -> bool:
        """Whether every message's node is new or reports the GPUs it has reported before, in order."""
        lives = list(map(self.states.live.get, map(_NODE, msgs)))
        if None not in lives and list(map(_GPU_LIST, lives)) == list(map(_GPUS, msgs)):
            return True
        return all(lv is None or lv.gpu_list == m.gpus for lv, m in zip(lives, msgs, strict=True))

    def _width(self, msg: DetectionTelemetry) -> int:
        """The GPU count of the slab the message's node is observed in: the GPUs it reports and those
        it reported before (a record lacking some leaves their columns empty)."""
        live = self.states.live.get(msg.node)
        if live is None or live.gpu_list == msg.gpus or live.samples == 0:  # samples 0: see _observe_distinct
            return len(msg.gpus)
        return len(set(live.gpus).union(msg.gpus))

    def _observe_distinct(self, msgs: list[DetectionTelemetry], x: F64 | None = None,
                          medians: F64 | None = None) -> list[Finding]:
        """One message per node, all for the same slab (:meth:`_width`); ``x``: their
        :func:`metrics_batch`, when already converted; ``medians``: the medians of the residual
        signals' gauges (``[messages, gauges]``), when already computed (both only when every
        message holds exactly its node's GPUs)."""
        s = self.settings
        findings: list[Finding] = []
        # per-message Python work is a few comprehensions; the rare cases (a new node, a changed GPU
        # set, a reboot, a GPU missing) are handled for those messages only
        n = len(msgs)
        nodes = self.states.live
        lives = list(map(nodes.get, map(_NODE, msgs)))
        # each test below is one C-level comparison of two lists in the usual case; the Python loop
        # over the messages runs only when it fails
        odd = [] if None not in lives and list(map(_GPU_LIST, lives)) == list(map(_GPUS, msgs)) else [
            i for i, (lv, m) in enumerate(zip(lives, msgs, strict=True)) if lv is None or lv.gpu_list != m.gpus]
        spread: dict[int, list[int]] = {}  # message -> the node's columns of its GPUs (it lacks some)
        for i in odd:
            msg, live, gpus = msgs[i], lives[i], tuple(msgs[i].gpus)
            if live is None:
                live = nodes[msg.node] = self.states.new(gpus)
            elif live.samples == 0:  # known from XIDs alone (observe_events): the telemetry says its GPUs
                live = nodes[msg.node] = self.states.realigned(live, gpus)
            else:
                if not set(gpus) <= set(live.gpus):  # a GPU not seen before: the node's columns grow
                    live = nodes[msg.node] = self.states.realigned(live, tuple(sorted({*live.gpus, *gpus})))
                if live.gpu_list != msg.gpus:
                    where = {g: j for j, g in enumerate(live.gpus)}
                    spread[i] = [where[g] for g in gpus]
            lives[i] = live
        known: list[LiveNode] = lives  # type: ignore[assignment]  # every entry is set above
        boot_changed = np.zeros(n, dtype=bool)
        if list(map(_BOOT_ID, known)) != list(map(_BOOT_ID, msgs)):
            for i in [i for i, (lv, m) in enumerate(zip(known, msgs, strict=True)) if lv.boot_id != m.boot_id]:
                boot_changed[i] = True
                known[i].boot_id = msgs[i].boot_id
        attention = np.zeros(n, dtype=bool)
        if any(map(_XIDS, msgs)) or any(map(_XID_LOG, known)) or any(map(_ACTIVE, known)):
            pairs = zip(known, msgs, strict=True)
            attention[[i for i, (lv, m) in enumerate(pairs) if m.xids or lv.xid_log or lv.active]] = True
        slab = known[0].slab
        idx = np.fromiter(map(_SLOT, known), dtype=np.intp, count=n)
        ts = np.fromiter(map(_TS, msgs), dtype=np.float64, count=n)
        seen = slab.samples[idx] > 0
        reset = boot_changed & seen
        dt = np.where(seen, ts - slab.prev_ts[idx], np.nan)
        if spread:
            x, medians = _spread(msgs, spread, slab.g), None
        elif x is None:
            x = metrics_batch(msgs)
        # which GPUs reported anything detection reads; one missing while others of its node report is
        # missing data until it stays away (or XID 79 says it is lost)
        present: NDArray[np.bool_] = np.asarray(np.isfinite(x).any(axis=1))
        everyone = bool(present.all())  # the usual case: every GPU of every node reported
        reporting = np.full(n, slab.g) if everyone else present.sum(axis=1)
        lost: dict[int, list[_Condition]] = {}
        back: list[tuple[int, int]] = []  # (message, column): a GPU back after an absence
        if not everyone or any(map(_ABSENT, known)):
            gone = ~present & (reporting > 0)[:, None]
            for i in [i for i in range(n) if known[i].absent or gone[i].any()]:
                conditions, returned = self._absence(msgs[i], known[i], gone[i], int(reporting[i]))
                back.extend((i, j) for j in returned)
                if conditions:
                    lost[i] = conditions
                    attention[i] = True
        prev = slab.prev[idx]  # as it was: the hard conditions below compare with it
        y = signals_at(x, prev, slab.prev, idx, dt, reset, self.plan, s.max_sample_gap_s, medians)
        if back:
            # its counters moved over more than the node's last interval: no rate from this sample
            rows, cols = zip(*back, strict=True)
            y[list(rows), self.plan.n_residual:, list(cols)] = np.nan
        if not everyone and self.plan.n_residual:  # the median of a few GPUs is not the node's
            y[reporting * 2 < slab.g, : self.plan.n_residual, :] = np.nan
        res = step_baselines_at(y, slab.planes, idx, self.plan, self.baseline_params)  # the slab's rows, in place
        hard = _hard_conditions(x, prev, reset, s.dbe_threshold)
        # the share of time throttled restarts after a reboot or a long silence (repair, maintenance):
        # what the GPU did before says nothing about it now
        stale = reset | ~(dt <= s.max_sample_gap_s)
        gap = seen & (dt > s.max_sample_gap_s)  # the node was silent: reported as missing data
        throttle = np.where(stale[:, None], 0.0, slab.throttle[idx])
        reasons = x[:, M["clocks_event_reasons"], :]
        bits = bit_fields(reasons)
        slowed = (bits & THROTTLE_MASK) != 0
        if s.hw_thermal_is_hard:
            hard["hw_thermal"] = (bits & HW_THERMAL) != 0
        braking = (bits & HW_POWER_BRAKE) != 0
        min_braking = max(1, int(np.ceil(s.power_brake_min_gpu_fraction * bits.shape[1])))
        power_brake = (braking.sum(axis=1) >= min_braking) & (s.power_brake_min_gpu_fraction > 0)
        throttle += self.alpha * (np.where(np.isfinite(reasons), slowed, throttle) - throttle)
        # reported while it happens: the share decays slowly once the cause is gone (a recovered GPU)
        throttled = (throttle > s.thermal_throttle_fraction) & slowed
        widths = x[:, M["pcie_link_width"], :]
        max_width = np.fmax(slab.max_width[idx], widths)
        narrow = np.isfinite(widths) & (widths < max_width)
        gauge, gauge_before = x[:, M["xid_errors"], :], prev[:, W["xid_errors"], :]
        xid_changed = np.isfinite(gauge) & (gauge > 0) & ~(gauge == gauge_before)
        sib = self._siblings(y, x, prev, reset, slab, idx, present, reporting)  # None: none flagged
        # which nodes have anything to say: only those pay for per-node Python work
        busy = (
            attention
            | (res.persistent | res.drifting).any(axis=(1, 2))
            | throttled.any(axis=1)
            | narrow.any(axis=1)
            | xid_changed.any(axis=1)
            | power_brake
            | gap
        )
        if sib is not None:
            busy |= sib[0].any(axis=(1, 2))
        for mask in hard.values():
            busy |= mask.any(axis=1)
        slab.last[idx], slab.throttle[idx], slab.max_width[idx] = y, throttle, max_width
        slab.prev_ts[idx] = ts
        slab.samples[idx] += 1
        for i in map(int, np.flatnonzero(busy)):
            msg, live = msgs[i], known[i]
            conditions = self._conditions(i, msg, live.gpus, res, hard, throttle[i], throttled[i], narrow[i], x[i],
                                          prev[i])
            if power_brake[i]:
                conditions.append(self._power_brake_condition(msg, live.gpus, braking[i]))
            if sib is not None and sib[0][i].any():
                conditions.extend(self._sibling_conditions(msg, live, sib[0][i], sib[1][i], sib[2][i]))
            conditions.extend(lost.get(i, ()))
            if gap[i]:
                conditions.append(self._gap_condition(msg, float(dt[i])))
            conditions.extend(self._xid_conditions(msg, live, xid_changed[i], x[i]))
            findings.extend(self._report(msg, live, conditions))
        return findings

    def observe_events(self, node: str, ts: float, xids: Sequence[XidEvent], gpus: Sequence[int],
                       source: int = KERNEL) -> list[Finding]:
        """XIDs that come without a sample: from the kernel log (``source`` KERNEL), or a telemetry
        record with no metrics. The XID rules judge them as they do a sample's; the same XID from
        another source within ``xid_dedup_window_s`` is one event (:mod:`.event_dedup`). Nothing of
        the node's metric state moves: its clock (``prev_ts``), samples, baselines and GPU columns.
        A node not seen before is created with ``gpus`` (its GPU map), taken over by the GPUs its
        first telemetry record lists."""
        live = self.states.live.get(node)
        if live is None:
            live = self.states.live[node] = self.states.new(tuple(sorted({*gpus, *(x.gpu for x in xids)})))
        g = len(live.gpus)
        msg = DetectionTelemetry(node=node, ts=ts, gpus=list(live.gpus), metrics=_NO_METRICS, xids=list(xids))
        conditions = self._xid_conditions(msg, live, np.zeros(g, dtype=bool), np.full((len(USED_METRICS), g), np.nan),
                                          source)
        return self._report(msg, live, conditions)

    # --- missing GPUs and siblings -------------------------------------------------------------

    def _absence(self, msg: DetectionTelemetry, live: LiveNode, gone: NDArray[np.bool_],
                 reporting: int) -> tuple[list[_Condition], list[int]]:
        """Account for the node's GPUs missing from ``msg`` (``gone``, by column): the conditions of
        those now lost, and the columns of GPUs back after an absence."""
        s = self.settings
        ts = float(msg.ts)
        missing = {live.gpus[j] for j in np.flatnonzero(gone)}
        back = [j for j, gpu in enumerate(live.gpus) if gpu in live.absent and gpu not in missing]
        for j in back:
            del live.absent[live.gpus[j]]
        out: list[_Condition] = []
        for gpu in sorted(missing):
            since = live.absent.setdefault(gpu, [ts, 0.0])
            since[1] += 1
            records, span = int(since[1]), ts - since[0]
            xid = _lost_gpu_xid(msg, live, gpu, since[0] - s.max_sample_gap_s)
            if xid is None and (records < s.gpu_missing_after_samples or span < s.gpu_missing_after_s):
                continue  # missing data so far: a partial or misaligned scrape, an exporter hiccup
            why = (f"XID {xid} (fallen off the bus)" if xid is not None
                   else f"absent from {records} records in a row over {span:.0f} s")
            ev = Evidence(detector="hard_rules", metric="gpu_count", value=float(reporting),
                          baseline=float(len(live.gpus)), gpu=gpu, ts=msg.ts, note=f"GPU stopped reporting: {why}")
            out.append(_Condition(key=f"gpu_missing:{gpu}", detector="hard_rules", kind="hard_fault",
                                  severity="critical", summary=f"GPU {gpu} stopped reporting (fell off the bus?)",
                                  evidence=ev, gpu=gpu, hint="reboot_node"))
        return out, back

    def _siblings(self, y: F64, x: F64, prev: F64, reset: NDArray[np.bool_], slab: Slab, idx: NDArray[np.intp],
                  present: NDArray[np.bool_], reporting: NDArray[np.int64]) -> tuple[
                      NDArray[np.bool_], F64, F64] | None:
        """Smooth the sibling-compared rates of each GPU (in the slab's rows) and compare each with
        the median of its node's GPUs: ``(flagged, smoothed, median)``, ``[B, R, G]``; None when no
        GPU is flagged (or no signal compared)."""
        if not self.sibling_names:
            return None
        sb = self.settings.siblings
        smooth = slab.sib[idx]
        rate = y[:, self._sib_rows, :]
        # a counter that went down (a GPU reset, a driver reload) or a reboot: that GPU starts again
        with np.errstate(invalid="ignore"):
            down = x[:, self._sib_metric_rows, :] < prev[:, self._sib_watched_rows, :]
        if down.any() or reset.any():
            for k, (lo, hi) in enumerate(self._sib_spans):
                smooth[:, k, :][down[:, lo:hi, :].any(axis=1) | reset[:, None]] = 0.0
        np.copyto(smooth, smooth + self._sib_alpha * (rate - smooth), where=np.isfinite(rate))
        slab.sib[idx] = smooth
        # rates are never negative, so neither is the median: only a GPU above min_excess can stand out
        candidate = smooth >= sb.min_excess
        if not candidate.any():
            return None
        median = nanmedian_last_axis(smooth)
        with np.errstate(invalid="ignore"):
            flagged = (candidate & (smooth - median >= sb.min_excess) & (smooth >= sb.ratio * median)
                       & present[:, None, :] & (reporting >= sb.min_gpus)[:, None, None])
        if not flagged.any():
            return None
        return flagged, smooth, np.broadcast_to(median, smooth.shape)

    def _sibling_conditions(self, msg: DetectionTelemetry, live: LiveNode, flagged: NDArray[np.bool_], smooth: F64,
                            median: F64) -> list[_Condition]:
        sb, out = self.settings.siblings, []
        for k, j in zip(*np.nonzero(flagged), strict=True):
            name, gpu = self.sibling_names[k], live.gpus[j]
            value, centre = float(smooth[k, j]), float(median[k, j])
            severity: Severity = "critical" if value - centre >= sb.critical_excess else "warning"
            ev = Evidence(detector="gpu_siblings", metric=name, value=value, baseline=centre, score=value - centre,
                          threshold=sb.min_excess, window_s=sb.halflife_samples * self.settings.sample_interval_s,
                          gpu=gpu, ts=msg.ts, note="per minute, smoothed; baseline: the median of the node's GPUs")
            summary = f"GPU {gpu} {name} {value:.1f}/min while its node's GPUs have {centre:.1f}/min (median)"
            out.append(_Condition(key=f"siblings:{name}:{gpu}:{severity}", detector="gpu_siblings",
                                  kind="degradation", severity=severity, summary=summary, evidence=ev, gpu=gpu,
                                  hint=""))
        return out

    def _gap_condition(self, msg: DetectionTelemetry, gap_s: float) -> _Condition:
        """The node sent nothing for ``gap_s``: missing data (an exporter, the network, a reboot), not a
        finding about its hardware: what the node reports now tells."""
        ev = Evidence(detector="telemetry_gap", metric="sample_gap_s", value=gap_s,
                      threshold=self.settings.max_sample_gap_s, ts=msg.ts,
                      note="no GPU telemetry from the node in this time")
        return _Condition(key=f"telemetry_gap:{float(msg.ts):.3f}", detector="telemetry_gap", kind="telemetry",
                          severity="info", summary=f"no GPU telemetry from {msg.node} for {gap_s:.0f} s (missing data)",
                          evidence=ev, gpu=None, hint="")

    # --- conditions ----------------------------------------------------------------------------

    def _conditions(
        self,
        i: int,
        msg: DetectionTelemetry,
        gpus: tuple[int, ...],
        res: StepResult,
        hard: dict[str, NDArray[np.bool_]],
        throttle: F64,
        throttled: NDArray[np.bool_],
        narrow: NDArray[np.bool_],
        x: F64,
        prev: F64,
    ) -> list[_Condition]:
        out: list[_Condition] = []
        s = self.settings
        window = s.continuity_samples * s.sample_interval_s
        if res.persistent[i].any() or res.drifting[i].any():
            for sig, g in zip(*np.nonzero(res.persistent[i] | res.drifting[i]), strict=True):
                name = self.names[sig]
                persistent = bool(res.persistent[i][sig, g])
                detector = "gpu_baseline" if persistent else "gpu_drift"
                critical = bool(res.critical[i][sig, g])
                ev = Evidence(
                    detector=detector,
                    metric=name,
                    value=_f(res.value[i][sig, g]),
                    baseline=_f(res.baseline[i][sig, g]),
                    score=_f(res.z[i][sig, g]),
                    threshold=float(self.plan.z_warning[sig, 0]),
                    window_s=window,
                    gpu=gpus[g],
                    ts=msg.ts,
                )
                verb = "persistently off" if persistent else "drifting from"
                out.append(
                    _Condition(key=f"signal:{name}:{gpus[g]}", detector=detector, kind="degradation",
                               severity="critical" if critical else "warning",
                               summary=f"GPU {gpus[g]} {name} {verb} its baseline (z={_f(res.z[i][sig, g]):.1f})",
                               evidence=ev, gpu=gpus[g], hint="")
                )
        for g in np.nonzero(throttled)[0]:
            ev = Evidence(detector="gpu_throttle", metric="clocks_event_reasons", value=float(throttle[g]),
                          threshold=s.thermal_throttle_fraction, gpu=gpus[g], ts=msg.ts,
                          note="share of samples in HW slowdown / thermal / power brake")
            out.append(_Condition(key=f"gpu_throttle:{gpus[g]}", detector="gpu_throttle", kind="degradation",
                                  severity="warning",
                                  summary=f"GPU {gpus[g]} throttled {throttle[g]:.0%} of the time", evidence=ev,
                                  gpu=gpus[g], hint=""))
        for g in np.nonzero(narrow)[0]:
            ev = Evidence(detector="pcie_width", metric="pcie_link_width", value=float(x[M["pcie_link_width"], g]),
                          baseline=float(np.nanmax(x[M["pcie_link_width"]])), gpu=gpus[g], ts=msg.ts)
            out.append(_Condition(key=f"pcie_width:{gpus[g]}", detector="pcie_width", kind="degradation",
                                  severity="warning",
                                  summary=f"GPU {gpus[g]} PCIe link width dropped to x{int(ev.value or 0)}",
                                  evidence=ev, gpu=gpus[g], hint=""))
        for key, mask in hard.items():
            for g in np.nonzero(mask[i])[0]:
                out.append(self._hard_condition(key, msg, gpus, int(g), x, prev))
        return out

    def _hard_condition(self, key: str, msg: DetectionTelemetry, gpus: tuple[int, ...], g: int, x: F64,
                        prev: F64) -> _Condition:
        gpu = gpus[g]
        metric, detector, kind, summary, hint = _HARD[key]
        value = float(x[M[metric], g])
        before = float(prev[W[metric], g]) if metric in W else float("nan")
        ev = Evidence(detector=detector, metric=metric, value=value, baseline=_f(before), gpu=gpu, ts=msg.ts)
        severity: Severity = "critical" if kind == "hard_fault" else ("info" if key in _INFO_ONLY else "warning")
        # hard faults are events: one finding per change, keyed by the value reached; a state (a
        # slowdown bit) is one condition while it lasts, whatever else the bitmask holds
        state = key in _HARD_STATES
        return _Condition(key=f"{key}:{gpu}" if state else f"{key}:{gpu}:{value:g}", detector=detector, kind=kind,
                          severity=severity, summary=summary.format(gpu=gpu, value=value), evidence=ev, gpu=gpu,
                          hint=hint)

    def _power_brake_condition(self, msg: DetectionTelemetry, gpus: tuple[int, ...],
                               braking: NDArray[np.bool_]) -> _Condition:
        """One node-level condition: the board braked most of its GPUs at once (power delivery)."""
        braked = [gpus[g] for g in np.flatnonzero(braking)]
        frac = self.settings.power_brake_min_gpu_fraction
        ev = Evidence(detector="power_brake", metric="clocks_event_reasons", value=float(len(braked)),
                      threshold=frac * len(gpus), ts=msg.ts,
                      note="HW power brake (0x80) on GPUs " + ",".join(map(str, braked)))
        return _Condition(key="power_brake", detector="power_brake", kind="hard_fault", severity="critical",
                          summary=f"HW power brake on {len(braked)} of {len(gpus)} GPUs: power delivery (PSU) fault",
                          evidence=ev, gpu=None, hint="isolate")

    def _xid_conditions(
        self, msg: DetectionTelemetry, live: LiveNode, gauge_changed: NDArray[np.bool_], x: F64, source: int = TELEMETRY
    ) -> list[_Condition]:
        events: list[tuple[float, int, int, str]] = [(e.ts, e.gpu, e.xid, e.message) for e in msg.xids]
        # dcgm-exporter's XID gauge holds the last XID: a new one is a change of value
        for g in np.nonzero(gauge_changed)[0]:
            code = int(x[M["xid_errors"], g])
            if not any(e[1] == live.gpus[g] and e[2] == code for e in events):
                events.append((float(msg.ts), live.gpus[g], code, "from the XID gauge"))
        if events:  # the same XID from another source (kernel log, NVML, dcgm) is one event, not two
            window = self.settings.xid_dedup_window_s
            events = [e for e in events if event_dedup.accept(live.xid_seen, e[1], e[2], e[0], source, window)]
        if not events and not live.xid_log:
            return []
        xs = self.settings.xid
        horizon = msg.ts - max(xs.repeat_window_s, xs.trend_window_s)
        log = [e for e in live.xid_log if e[0] >= horizon]
        log += [(ts, gpu, code) for ts, gpu, code, _ in events]
        out: list[_Condition] = []
        for ts, gpu, code, text in events:
            info = self.catalog.lookup(code)
            severity: Severity = ("critical" if info.isolates
                                  else "warning" if info.action == "investigate" else "info")
            ev = Evidence(detector="xid_rules", metric="xid", value=float(code), gpu=gpu, ts=ts,
                          note=f"{info.mnemonic} ({info.bucket or 'not in catalog'}): {text}"[:4000])
            out.append(_Condition(key=f"xid:{gpu}:{code}:{ts:.3f}", detector="xid_rules", kind="hard_fault",
                                  severity=severity, summary=f"XID {code} ({info.mnemonic}) on GPU {gpu}",
                                  evidence=ev, gpu=gpu, hint=info.action))
            if code in xs.repeat_xids and not _xid_burst(log, ts, code, xs.repeat_burst_s, xs.repeat_max_gpus):
                # occurrences on many GPUs at once (an application's every rank faulting) do not count
                n = sum(1 for t, g_, c in log if g_ == gpu and c == code and t >= ts - xs.repeat_window_s
                        and not _xid_burst(log, t, code, xs.repeat_burst_s, xs.repeat_max_gpus))
                if n >= xs.repeat_count:
                    ev2 = Evidence(detector="xid_repeat", metric="xid", value=float(n), threshold=xs.repeat_count,
                                   window_s=xs.repeat_window_s, gpu=gpu, ts=ts)
                    out.append(_Condition(key=f"xid_repeat:{gpu}:{code}", detector="xid_repeat", kind="hard_fault",
                                          severity="warning", summary=f"XID {code} repeated {n}x on GPU {gpu}",
                                          evidence=ev2, gpu=gpu, hint="investigate"))
            if code in xs.trend_xids:
                n = sum(1 for t, g_, c in log if g_ == gpu and c == code and t >= ts - xs.trend_window_s)
                if n >= xs.trend_count:
                    ev3 = Evidence(detector="xid_trend", metric="xid", value=float(n), threshold=xs.trend_count,
                                   window_s=xs.trend_window_s, gpu=gpu, ts=ts)
                    out.append(_Condition(key=f"xid_trend:{gpu}:{code}", detector="xid_trend", kind="degradation",
                                          severity="warning",
                                          summary=f"XID {code} trending on GPU {gpu} ({n} in window)", evidence=ev3,
                                          gpu=gpu, hint="investigate"))
        live.xid_log = log[-256:]
        return out

    def _report(self, msg: DetectionTelemetry, live: LiveNode, conditions: Iterable[_Condition]) -> list[Finding]:
        """Report conditions that are new, or due again; forget those absent for ``reassert_s``.

        ``live.active`` maps a condition to ``[last reported, last seen]``: a condition that dips
        for a sample or two is not reported again as new (hysteresis)."""
        out: list[Finding] = []
        hold = self.settings.reassert_s
        ts = float(msg.ts)
        active = {k: v for k, v in live.active.items() if ts - v[1] < hold}
        for cond in conditions:
            seen = active.get(cond.key)
            if seen is None or ts - seen[0] >= hold:
                out.append(_finding(msg, cond))
                active[cond.key] = [ts, ts]
            else:
                seen[1] = ts
        live.active = active
        return out


@dataclass(frozen=True, kw_only=True)
class _Condition:
    """One condition a rule saw on a node: reported as a :class:`Finding` when new or due again."""

    key: str
    detector: str
    kind: FindingKind
    severity: Severity
    summary: str
    evidence: Evidence
    gpu: int | None
    hint: str


_HARD: dict[str, tuple[str, str, FindingKind, str, str]] = {
    "dbe": ("ecc_dbe_vol_total", "hard_rules", "hard_fault", "GPU {gpu}: uncorrectable ECC (DBE) errors", "reset_gpu"),
    "row_remap_failure": ("row_remap_failure", "hard_rules", "hard_fault", "GPU {gpu}: row remapping failed",
                          "isolate"),
    "nvlink_down": ("nvlink_links_down", "hard_rules", "hard_fault", "GPU {gpu}: {value:g} NVLink link(s) down",
                    "isolate"),
    "remapped_rows": ("uncorrectable_remapped_rows", "hbm_rows", "degradation",
                      "GPU {gpu}: uncorrectable remapped rows rose to {value:g}", "investigate"),
    "hw_thermal": ("clocks_event_reasons", "hard_rules", "hard_fault",
                   "GPU {gpu}: HW thermal slowdown (over-temperature protection; cooling failed)", "isolate"),
    "remap_pending": ("row_remap_pending", "hbm_rows", "degradation",
                      "GPU {gpu}: row remap pending (takes effect at the next GPU reset)", "reset_gpu"),
}
#: hard conditions that are states (a bit held while it lasts), not counters that step
_HARD_STATES = frozenset({"hw_thermal"})
#: conditions that are evidence only: one row remap is normal HBM wear (XID 63, IGNORE in NVIDIA's
#: catalog); remaps that keep coming are ``xid_trend``'s, uncorrectable rows and failures are above
_INFO_ONLY = frozenset({"remap_pending"})


def _hard_conditions(x: F64, prev: F64, reset: NDArray[np.bool_], dbe_threshold: int) -> dict[str, NDArray[np.bool_]]:
    def cur(m: str) -> F64:
        return x[:, M[m], :]

    def before(m: str) -> F64:
        return prev[:, W[m], :]

    with np.errstate(invalid="ignore"):
        dbe_before = np.where(reset[:, None], 0.0, np.nan_to_num(before("ecc_dbe_vol_total")))
        dbe_first = np.isnan(before("ecc_dbe_vol_total")) & ~reset[:, None]
        return {
            # a first sample counts its DBEs since boot only if they already reach the threshold
            "dbe": (cur("ecc_dbe_vol_total") - np.where(dbe_first, 0.0, dbe_before)) >= dbe_threshold,
            "row_remap_failure": (cur("row_remap_failure") > 0) & ~(before("row_remap_failure") > 0),
            "nvlink_down": (cur("nvlink_links_down") > 0) & ~(before("nvlink_links_down") >= cur("nvlink_links_down")),
            "remapped_rows": cur("uncorrectable_remapped_rows") > before("uncorrectable_remapped_rows"),
            "remap_pending": (cur("row_remap_pending") > 0) & ~(before("row_remap_pending") > 0),
        }


#: XIDs that say a GPU is gone: fallen off the bus (the NVML exporter reports NVML_ERROR_GPU_IS_LOST as 79)
_LOST_GPU_XIDS = frozenset({79})


def _lost_gpu_xid(msg: DetectionTelemetry, live: LiveNode, gpu: int, since: float) -> int | None:
    """An XID saying ``gpu`` fell off the bus, in ``msg`` or logged since ``since``; None if none."""
    for e in msg.xids:
        if e.gpu == gpu and e.xid in _LOST_GPU_XIDS:
            return e.xid
    for t, g, code in live.xid_log:
        if g == gpu and code in _LOST_GPU_XIDS and t >= since:
            return code
    return None


def _spread(msgs: Sequence[DetectionTelemetry], spread: dict[int, list[int]], width: int) -> F64:
    """:func:`metrics_batch` of messages of which some (``spread``: message -> columns) hold only some
    of their node's ``width`` GPUs: theirs in those columns, NaN in the others."""
    x = np.full((len(msgs), len(USED_METRICS), width), np.nan)
    whole = [i for i in range(len(msgs)) if i not in spread]
    if whole:
        x[whole] = metrics_batch([msgs[i] for i in whole])
    for i, cols in spread.items():
        x[i][:, cols] = metrics_array(msgs[i])
    return x


_NO_METRICS = DetectionMetrics()
_NO_GPU_METRICS = GpuMetrics()


def metricless(msg: DetectionTelemetry) -> bool:
    """A record that carries no metric at all (only XIDs): no sample for the metric detectors."""
    return msg.metrics == _NO_METRICS or msg.metrics == _NO_GPU_METRICS


def _split_waves(msgs: list[DetectionTelemetry]) -> tuple[list[DetectionTelemetry], list[DetectionTelemetry]]:
    """First occurrence of each node now, later ones (same node again) in the next wave."""
    seen: set[str] = set()
    now: list[DetectionTelemetry] = []
    later: list[DetectionTelemetry] = []
    for msg in msgs:
        if msg.node in seen:
            later.append(msg)
        else:
            seen.add(msg.node)
            now.append(msg)
    return now, later


def _xid_burst(log: Sequence[tuple[float, int, int]], ts: float, code: int, within_s: float, max_gpus: int) -> bool:
    """XID ``code`` struck more than ``max_gpus`` GPUs of the node within ``within_s`` of ``ts``."""
    return len({g for t, g, c in log if c == code and abs(t - ts) <= within_s}) > max_gpus


def _f(v: float | np.floating) -> float:
    v = float(v)
    return v if np.isfinite(v) else 0.0


def _finding(msg: DetectionTelemetry, cond: _Condition) -> Finding:
    return Finding(
        id=f"{msg.node}:{cond.key}:{msg.ts:.3f}",
        ts=msg.ts,
        node=msg.node,
        detector=cond.detector,
        kind=cond.kind,
        severity=cond.severity,
        summary=cond.summary,
        evidence=[cond.evidence],
        gpu=cond.gpu,
        action_hint=cond.hint,
    )

