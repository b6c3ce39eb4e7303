"""Transient software and job faults: they target a running job (an NCCL timeout, a worker crash, an OOM, a bug)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fleetmedic.sim import logs
from fleetmedic.sim.faults.base import ELASTIC_HINT, Fault, FaultHost
from fleetmedic.sim.logs import FailureReport
from fleetmedic.sim.telemetry import GpuTick

if TYPE_CHECKING:
    from fleetmedic.sim.fleet import Fleet
    from fleetmedic.sim.workload import Job


class JobFault(Fault):
    """Base of faults that target a running job (picked at onset); ``nodes`` are the job's nodes."""

    job_nodes: list[int]

    def nodes(self, fleet: Fleet) -> list[int]:
        return list(getattr(self, "job_nodes", []))

    def pick_job(self, host: FaultHost, t: float) -> Job | None:
        jobs = host.workload.running_jobs()
        if self.job_ref:
            jobs = [j for j in jobs if j.ref == self.job_ref]
        if not jobs:
            return None
        jobs.sort(key=lambda j: j.idx)
        job = jobs[int(self.rng.integers(0, len(jobs)))]
        self.job_ref = job.ref
        self.job_idx = job.idx
        self.job_nodes = list(job.nodes)
        if job.ref not in self.affected:
            self.affected.append(job.ref)
        return job

    def on_start(self, host: FaultHost, t: float) -> None:
        job = self.pick_job(host, t)
        if job is None:
            self.dropped = True
            self.active = False
            return
        self.job_started(host, job, t)

    def job_started(self, host: FaultHost, job: Job, t: float) -> None:
        pass

    def on_tick(self, host: FaultHost, t0: float, t1: float) -> None:
        pass


class NcclTimeout(JobFault):
    """One collective hangs (a transient fabric or software hiccup): the NCCL watchdog aborts every
    rank after the timeout; a retry succeeds."""

    def job_started(self, host: FaultHost, job: Job, t: float) -> None:
        host.hang(job, t, self.watchdog_report(host, job, t + host.workload.spec.nccl_timeout_s), self)
        self.end = t + host.workload.spec.nccl_timeout_s


class WorkerCrash(JobFault):
    """One worker dies (a data-loader worker killed, a segfault in a Python extension); a retry succeeds."""

    def job_started(self, host: FaultHost, job: Job, t: float) -> None:
        fleet = host.fleet
        pos = int(self.rng.integers(0, len(job.nodes)))
        lg = int(self.rng.integers(0, fleet.g))
        node = job.nodes[pos]
        sig, code = ("Killed", 1) if self.rng.random() < 0.6 else ("Segmentation fault", 139)
        self.params["signal"] = sig
        pid = self.pid()
        at = t + float(self.rng.uniform(1, 5))
        lines = [*logs.dataloader_killed(pid + 211, sig),
                 *logs.torchrun_root_cause(at + host.skew(node), fleet.node_names[node], pos * fleet.g + lg, lg, 1,
                                           pid, ELASTIC_HINT)]
        host.kill(job, at, FailureReport(code, "Error", pos * fleet.g + lg, node, lines), self)
        self.end = at


class Oom(JobFault):
    """A transient CUDA OOM on one rank (fragmentation at an unlucky batch): its GPU's memory climbs
    to the limit over a few minutes, then the rank dies with ``torch.OutOfMemoryError``; a retry
    succeeds."""

    def job_started(self, host: FaultHost, job: Job, t: float) -> None:
        fleet = host.fleet
        pos = int(self.rng.integers(0, len(job.nodes)))
        self.node = job.nodes[pos]
        self.gpu = int(self.rng.integers(0, fleet.g))
        self.rank = pos * fleet.g + self.gpu
        self.crash_at = t + float(self.rng.uniform(120, 300))
        self.end = self.crash_at

    def on_tick(self, host: FaultHost, t0: float, t1: float) -> None:
        if t0 < self.crash_at <= t1:
            job = host.workload.jobs[self.job_idx]
            if not job.active() or self.node not in job.nodes:
                return
            total = host.fleet.sku_of(self.node).fb_total_mib / 1024.0
            pid = self.pid()
            lines = [*logs.cuda_oom(self.gpu, float(self.rng.uniform(1.0, 8.0)), total - 0.45,
                                    float(self.rng.uniform(0.2, 1.0)), pid),
                     *logs.torchrun_root_cause(self.crash_at + host.skew(self.node), host.fleet.node_names[self.node],
                                               self.rank, self.gpu, 1, pid, ELASTIC_HINT)]
            host.kill(job, self.crash_at, FailureReport(1, "Error", self.rank, self.node, lines), self)

    def gpu_pre(self, tick: GpuTick) -> None:
        if self.node >= 0 and tick.t <= self.crash_at + tick.dt:
            total = float(tick.model.fb_total[self.node, self.gpu])
            frac = min(1.0, max(0.0, 1.0 - (self.crash_at - tick.t) / 300.0))
            cur = float(tick.fb_used[self.node, self.gpu])
            tick.fb_used[self.node, self.gpu] = cur + (total - 600.0 - cur) * frac

    def nodes(self, fleet: Fleet) -> list[int]:
        return [self.node] if self.node >= 0 else []


class JobBug(JobFault):
    """A bug in the job: the same exception on every rank, on every attempt, a few steps in, until the
    owner fixes it (the fault's end). Variant ``cuda``: an illegal memory access, with XID 13 (or 31)
    on every GPU of the job — on healthy nodes. No node may be isolated for it."""

    def job_started(self, host: FaultHost, job: Job, t: float) -> None:
        self.params["variant"] = "cuda" if self.rng.random() < 0.4 else "python"
        self.bug = int(self.rng.integers(0, len(logs.JOB_BUGS)))
        self._xid = 13 if self.rng.random() < 0.6 else 31

    def on_tick(self, host: FaultHost, t0: float, t1: float) -> None:
        job = host.workload.jobs[self.job_idx]
        if job.state != "running":
            return
        if job.ref not in self.affected:
            self.affected.append(job.ref)
        for n in job.nodes:
            if n not in self.job_nodes:
                self.job_nodes.append(n)
        key = (job.idx, job.attempt)
        if key in self._struck:
            return
        hit = max(self.onset, job.resumed_at) + 3 * job.last_step_time
        if hit > t1:
            return
        self._struck.add(key)
        hit = max(hit, t0)
        if self.params["variant"] == "cuda":
            for n in job.nodes:
                for g in range(host.fleet.g):
                    self.xid(host, hit - 0.2, self._xid, gpu=g, node=n)
        host.kill(job, hit, self._report(host, job, hit), self)

    def _report(self, host: FaultHost, job: Job, t: float) -> FailureReport:
        fleet = host.fleet
        pos = int(self.rng.integers(0, len(job.nodes)))
        node = job.nodes[pos]
        lg = int(self.rng.integers(0, fleet.g))
        pid = self.pid()
        body = (logs.cuda_error("an illegal memory access was encountered") if self.params["variant"] == "cuda"
                else logs.job_bug(self.bug))
        lines = [*body, *logs.torchrun_root_cause(t + host.skew(node), fleet.node_names[node], pos * fleet.g + lg,
                                                  lg, 1, pid, ELASTIC_HINT)]
        return FailureReport(1, "Error", pos * fleet.g + lg, node, lines)

