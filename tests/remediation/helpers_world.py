"""A tiny closed loop for scenario tests: a fleet with racks and leaf switches, jobs placed on it,
a fake executor that applies every command and reports results, and helpers that feed the
:class:`DecisionEngine` hand-built findings and job events with real log lines."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from fleetmedic.config import Settings, parse_config
from fleetmedic.records import (
    AuditRecord,
    Evidence,
    Finding,
    Incident,
    JobEvent,
    RankPlacement,
    RemediationCommand,
    RemediationResult,
)
from fleetmedic.remediation.engine import DecisionEngine, Decisions
from fleetmedic.remediation.topology import Topology

T0 = 1_790_000_000.0

ECC = "RuntimeError: CUDA error: uncorrectable ECC error encountered"
XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."
OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
       "79.15 GiB of which 1.23 GiB is free. Process 12345 has 77.91 GiB memory in use.")
ILLEGAL = "RuntimeError: CUDA error: an illegal memory access was encountered"
KEYERROR = "KeyError: 'input_ids'"
SEGV = "Segmentation fault (core dumped)"
SIGTERM = ("torch.distributed.elastic.agent.server.api: [WARNING] Received Signals.SIGTERM death signal, shutting down "
           "workers")
IB = ("node-3:1184:1302 [0] NCCL WARN NET/IB : Got completion from peer 10.0.0.12<41234> with status=12 opcode=0 "
      "len=0 vendor err 129 (Recv) localGid ::ffff:10.0.0.11 remoteGidsfe80::a288:c2ff:fe31:7c84")
CHILD = "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:"


def timeout_line(rank: int) -> str:
    return (f"[rank{rank}]:[E ProcessGroupNCCL.cpp:563] [Rank {rank}] Watchdog caught collective operation timeout: "
            "WorkNCCL(SeqNum=1234, OpType=ALLREDUCE, NumelIn=1048576, NumelOut=1048576, Timeout(ms)=600000) ran for "
            "600049 milliseconds before timing out.")


def settings(yaml_text: str = "") -> Settings:
    return parse_config(yaml_text)


class World:
    """``n`` nodes named node-0.., ``per_rack`` per rack (r0..), ``per_leaf`` per leaf (leaf-0..)."""

    def __init__(self, n: int = 32, per_rack: int = 4, per_leaf: int = 8, config: str = "",
                 auto_execute: bool = True, verdicts: dict[str, str] | None = None) -> None:
        self.n = n
        self.topology = Topology.from_dict(
            {f"node-{i}": {"rack": f"r{i // per_rack}", "leaf": f"leaf-{i // per_leaf}", "pool": "h100"}
             for i in range(n)})
        # 10 % of the fleet: a budget of 3 nodes in a 32-node world (one of them for preventive holds)
        self.settings = settings(config or "safety: {max_quarantined_fraction: 0.1}")
        self.engine = DecisionEngine(self.settings, self.topology)
        self.now = T0
        self.auto_execute = auto_execute
        self.verdicts = verdicts or {}  # node -> "pass" | "fail" for diagnostics
        self.incidents: list[Incident] = []
        self.commands: list[RemediationCommand] = []
        self.audit: list[AuditRecord] = []
        self.attempts: dict[str, int] = {}
        self.placements: dict[str, list[str]] = {}
        self._fid = 0
        self._executed: set[str] = set()

    # --- time and bookkeeping ------------------------------------------------------------------

    def _take(self, out: Decisions) -> Decisions:
        self.incidents += out.incidents
        self.commands += out.commands
        self.audit += out.audit
        return out

    def advance(self, seconds: float) -> Decisions:
        """Let time pass in steps of at most 10 s, ticking (and executing) as it goes."""
        out = Decisions()
        end = self.now + seconds
        while self.now < end:
            self.now = min(end, self.now + 10.0)
            out.extend(self._take(self.engine.tick(self.now)))
            if self.auto_execute:
                out.extend(self.execute())
        return out

    # --- inputs ---------------------------------------------------------------------------------

    def place(self, job: str, nodes: Iterable[str], attempt: int | None = None, start: bool = True) -> None:
        nodes = list(nodes)
        attempt = self.attempts.get(job, -1) + 1 if attempt is None else attempt
        self.attempts[job] = attempt
        self.placements[job] = nodes
        placement = [RankPlacement(rank=r, node=n) for r, n in enumerate(nodes)]
        self._take(self.engine.on_job_event(
            JobEvent(job=job, event="placement", ts=self.now, attempt=attempt, placement=placement), self.now))
        if start:
            self._take(self.engine.on_job_event(JobEvent(job=job, event="start", ts=self.now, attempt=attempt),
                                                self.now))

    def progress(self, job: str, step: int = 10) -> Decisions:
        return self._take(self.engine.on_job_event(
            JobEvent(job=job, event="progress", ts=self.now, attempt=self.attempts[job], step=step,
                     step_time_s=1.0), self.now))

    def complete(self, job: str) -> Decisions:
        return self._take(self.engine.on_job_event(
            JobEvent(job=job, event="completion", ts=self.now, attempt=self.attempts[job]), self.now))

    def fail(self, job: str, node: str, lines: list[str], rank: int | None = None, exit_code: int = 1,
             reason: str = "Error") -> Decisions:
        nodes = self.placements[job]
        rank = nodes.index(node) if rank is None and node in nodes else rank
        return self._take(self.engine.on_job_event(
            JobEvent(job=job, event="failure", ts=self.now, attempt=self.attempts[job], rank=rank, node=node,
                     exit_code=exit_code, reason=reason, log_excerpt=lines), self.now))

    def finding(self, node: str, kind: str = "hard_fault", severity: str = "critical", hint: str = "",
                detector: str = "hard_rules", gpu: int | None = 0, port: str = "", summary: str = "",
                metric: str = "x", value: float = 1.0) -> Decisions:
        self._fid += 1
        f = Finding(id=f"f{self._fid}", ts=self.now, node=node, detector=detector, kind=kind,  # type: ignore[arg-type]
                    severity=severity, summary=summary or f"{detector} {kind} on {node}",  # type: ignore[arg-type]
                    evidence=[Evidence(detector=detector, metric=metric, value=value, ts=self.now)], gpu=gpu,
                    port=port, action_hint=hint)
        out = self._take(self.engine.on_finding(f, self.now))
        if self.auto_execute:
            out.extend(self.execute())
        return out

    # --- the hard faults as the GPU detector reports them ---------------------------------------------

    def xid(self, node: str, code: int, gpu: int = 0) -> Decisions:
        """An XID as ``xid_rules`` reports it (its catalog action as the hint)."""
        from fleetmedic.models.xid_catalog import default_catalog

        info = default_catalog().lookup(code)
        severity = "critical" if info.isolates else "warning"
        return self.finding(node, kind="hard_fault", severity=severity, hint=info.action, detector="xid_rules",
                            gpu=gpu, metric="xid", value=float(code), summary=f"XID {code} ({info.mnemonic})")

    def gpu_lost(self, node: str, gpu: int = 0) -> Decisions:
        return self.finding(node, hint="reboot_node", gpu=gpu, metric="gpu_count", value=7.0,
                            summary=f"GPU {gpu} stopped reporting (fell off the bus?)")

    def dbe(self, node: str, gpu: int = 0) -> Decisions:
        return self.finding(node, hint="reset_gpu", gpu=gpu, metric="ecc_dbe_vol_total",
                            summary=f"GPU {gpu}: uncorrectable ECC (DBE) errors")

    def row_remap_failure(self, node: str, gpu: int = 0) -> Decisions:
        return self.finding(node, hint="isolate", gpu=gpu, metric="row_remap_failure",
                            summary=f"GPU {gpu}: row remapping failed")

    def degradation(self, node: str, metric: str = "sm_clock", severity: str = "warning", gpu: int = 0) -> Decisions:
        return self.finding(node, kind="degradation", severity=severity, detector="gpu_baseline", gpu=gpu,
                            metric=metric, summary=f"GPU {gpu} {metric} persistently off its baseline")

    def observe(self, node: str, cordoned: bool, by_fleetmedic: bool, labels: dict[str, str] | None = None
                ) -> Decisions:
        return self._take(self.engine.node_observed(node, cordoned=cordoned, cordoned_by_fleetmedic=by_fleetmedic,
                                                    labels=labels or {}, now=self.now))

    # --- the fake executor ----------------------------------------------------------------------

    def execute(self) -> Decisions:
        """Apply every command not yet applied: node steps succeed (diagnostics per ``verdicts``);
        job restarts re-place the job on free healthy nodes outside ``exclude_nodes``."""
        out = Decisions()
        while True:
            todo = [c for c in self.commands if c.id not in self._executed]
            if not todo:
                return out
            for c in todo:
                self._executed.add(c.id)
                out.extend(self._apply(c))

    def _apply(self, c: RemediationCommand) -> Decisions:
        if c.track == "job":
            if c.action in ("restart_job", "requeue_job", "retry_in_place") and c.job in self.placements:
                size = len(self.placements[c.job])
                if c.action == "retry_in_place":
                    nodes = self.placements[c.job]
                else:
                    busy = {n for j, ns in self.placements.items() if j != c.job for n in ns}
                    free = [f"node-{i}" for i in range(self.n) if f"node-{i}" not in busy
                            and f"node-{i}" not in c.exclude_nodes
                            and self.engine.node_state(f"node-{i}") in ("healthy", "probation")]
                    nodes = free[:size]
                self.place(c.job, nodes)
            return Decisions()
        if c.action == "escalate":
            return Decisions()
        details = {}
        if c.action == "run_diagnostics":
            details = {"verdict": self.verdicts.get(c.node, "pass")}
        result = RemediationResult(command_id=c.id, action=c.action, outcome="applied", ts=self.now, node=c.node,
                                   details=details)
        return self._take(self.engine.on_result(result, self.now))

    # --- queries --------------------------------------------------------------------------------

    def cmds(self, action: str | None = None, node: str | None = None, job: str | None = None
             ) -> list[RemediationCommand]:
        return [c for c in self.commands if (action is None or c.action == action)
                and (node is None or c.node == node) and (job is None or c.job == job)]

    def isolated(self) -> set[str]:
        """Nodes fleetmedic ever cordoned."""
        return {c.node for c in self.cmds("cordon")}

    def last_incident(self, node: str | None = None, job: str | None = None) -> Incident:
        for inc in reversed(self.incidents):
            names = {s.name for s in inc.suspects}
            if (node is None or node in names) and (job is None or job in inc.jobs or job in names):
                return inc
        raise AssertionError(f"no incident for node={node} job={job}")

    def decisions(self, decision: str) -> list[AuditRecord]:
        return [a for a in self.audit if a.decision == decision]

    def state_bytes(self) -> bytes:
        return self.engine.to_bytes()

    def to_builtins(self) -> Any:
        return msgspec.to_builtins(self.engine.state)


def answer(w: World, cmd: RemediationCommand, **details: str) -> None:
    """The executor's answer to ``cmd``: applied, with ``details`` (a diagnostic's verdict, a repair)."""
    w._executed.add(cmd.id)
    w._take(w.engine.on_result(RemediationResult(command_id=cmd.id, action=cmd.action, outcome="applied",
                                                 ts=w.now, node=cmd.node, details=details), w.now))
