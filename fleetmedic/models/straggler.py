"""Stragglers from per-rank step times, and job-level slowdowns from the job's step time.

In a lock-step job the step time is set by the slowest rank. Frameworks can report each rank's own
compute time per step (before it waits in the collective); a rank that is consistently slower
than the job's median rank points at its node. :class:`StragglerDetector` flags a rank whose time
is at least ``straggler.slowdown_ratio`` times the median of the job's ranks for
``straggler.min_steps`` consecutive reported steps.

It also watches the job's step time (``progress`` events without ``rank``) with a one-sided
CUSUM (Greyhound-style change-point detection) and reports a job-wide slowdown as a ``job``
finding, which triage weighs against the job's phases (checkpoints and data-loader stalls slow
every rank and must not isolate a node). Pure; time comes from the events.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec
import numpy as np

from fleetmedic.config import StragglerSettings
from fleetmedic.models.state import require_finite
from fleetmedic.records import Evidence, Finding, JobEvent


class _JobSteps(msgspec.Struct, kw_only=True):
    step: int = -1
    times: dict[int, float] = {}  # rank -> step time of the current step
    nodes: dict[int, str] = {}
    streak: dict[int, int] = {}
    reported: set[int] = set()
    # job-level step time
    count: int = 0
    mean: float = 0.0
    var: float = 0.0
    cusum: float = 0.0
    slow_reported: bool = False


@dataclass
class StragglerDetector:
    settings: StragglerSettings
    _jobs: dict[str, _JobSteps] = field(default_factory=dict)

    def state_bytes(self) -> bytes:
        """The whole state (msgpack): every job's ranks and step-time baselines."""
        return msgspec.msgpack.encode(self._jobs)

    def load_state(self, data: bytes) -> None:
        """Replace the state with what :meth:`state_bytes` wrote."""
        jobs = msgspec.msgpack.decode(data, type=dict[str, _JobSteps])
        require_finite("straggler step times", [v for j in jobs.values() for v in (j.mean, j.var, j.cusum,
                                                                                   *j.times.values())])
        self._jobs = jobs

    def detect(self, records: Sequence[JobEvent], now: float) -> list[Finding]:
        """Findings for job events, in order (:class:`~fleetmedic.models.detector.Detector`): the
        events' own stamps time them, ``now`` is not read."""
        if len(records) == 1:
            return self.observe(records[0])
        return [f for event in records for f in self.observe(event)]

    def observe(self, event: JobEvent) -> list[Finding]:
        if event.event in ("completion", "restart", "failure"):
            self._jobs.pop(event.job, None)
            return []
        if event.event == "placement":
            state = self._jobs.setdefault(event.job, _JobSteps())
            state.nodes.update({p.rank: p.node for p in event.placement})
            return []
        if event.event != "progress" or event.step is None or event.step_time_s is None:
            return []
        state = self._jobs.setdefault(event.job, _JobSteps())
        if event.rank is None:
            return self._job_level(event, state)
        out: list[Finding] = []
        if event.step != state.step:
            out = self._close_step(event, state)
            state.step, state.times = event.step, {}
        state.times[event.rank] = event.step_time_s
        if event.node:
            state.nodes[event.rank] = event.node
        return out

    def _close_step(self, event: JobEvent, state: _JobSteps) -> list[Finding]:
        if len(state.times) < 3:
            return []
        median = float(np.median(list(state.times.values())))
        out: list[Finding] = []
        for rank, t in state.times.items():
            slow = median > 0 and t >= self.settings.slowdown_ratio * median
            state.streak[rank] = state.streak.get(rank, 0) + 1 if slow else 0
            if slow and state.streak[rank] >= self.settings.min_steps and rank not in state.reported:
                state.reported.add(rank)
                node = state.nodes.get(rank, "")
                if not node:
                    continue
                ev = Evidence(detector="straggler", metric="step_time_s", value=t, baseline=median,
                              score=t / median, threshold=self.settings.slowdown_ratio, ts=event.ts,
                              note=f"rank {rank} slower than the median rank for {state.streak[rank]} steps")
                out.append(Finding(id=f"{node}:straggler:{event.job}:{rank}:{event.ts:.3f}", ts=event.ts, node=node,
                                   detector="straggler", kind="degradation", severity="warning",
                                   summary=f"rank {rank} of {event.job} on {node} is {t / median:.2f}x the median step",
                                   evidence=[ev], job=event.job))
        return out

    def _job_level(self, event: JobEvent, state: _JobSteps) -> list[Finding]:
        t = float(event.step_time_s or 0.0)
        if state.count >= self.settings.job_warmup_steps:
            # plain floats: the cusum is state (serialised) and evidence (encoded); a numpy scalar is neither
            std = max(math.sqrt(max(state.var, 0.0)), 0.01 * max(state.mean, 1e-9))
            z = (t - state.mean) / std
            state.cusum = max(0.0, state.cusum + min(z, 6.0) - 0.5)
            slow = t >= self.settings.slowdown_ratio * state.mean
            if state.cusum > self.settings.job_cusum_h and slow and not state.slow_reported:
                state.slow_reported = True
                node = next(iter(state.nodes.values()), "")
                ev = Evidence(detector="job_step_time", metric="step_time_s", value=t, baseline=state.mean,
                              score=state.cusum, threshold=self.settings.job_cusum_h, ts=event.ts,
                              note="job-wide step-time change point")
                return [Finding(id=f"{event.job}:job_step_time:{event.ts:.3f}", ts=event.ts, node=node or "unknown",
                                detector="job_step_time", kind="job", severity="info",
                                summary=f"{event.job} step time rose to {t:.2f}s from {state.mean:.2f}s",
                                evidence=[ev], job=event.job)]
            if z > 4.0:
                return []  # do not learn the slowdown itself
        state.count += 1
        a = 1.0 / min(state.count, 50)
        d = t - state.mean
        state.mean += a * d
        state.var = (1 - a) * (state.var + a * d * d)
        return []
