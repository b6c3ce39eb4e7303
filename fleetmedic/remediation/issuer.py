"""The engine's pen: writes what one call decided into its :class:`~.engine_state.Decisions`, as
numbered audit records (each with the budget where it matters) and remediation commands with
deterministic ids (:func:`fleetmedic.actions.command_id`). An id is issued at most once; what
was issued is remembered (:class:`~.engine_state.CommandInfo`) until its result comes back."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection

from fleetmedic.actions import command_id
from fleetmedic.config import Settings
from fleetmedic.records import AuditDecision, AuditRecord, Incident, NodeState, RemediationCommand, Track
from fleetmedic.remediation.engine_state import CommandInfo, Decisions, EngineState
from fleetmedic.remediation.lifecycle import Issue, NodeRecord
from fleetmedic.remediation.safety import SafetyGate

BUDGETED = frozenset({"blocked", "command", "breaker_tripped", "breaker_resumed", "cleared"})  # audit with budget


class Issuer:
    def __init__(self, settings: Settings, state: EngineState, gate: SafetyGate, fleet_size: Callable[[], int]) -> None:
        self.settings = settings
        self.state = state
        self.gate = gate
        self.fleet_size = fleet_size
        #: (issued at, id) of the commands remembered, in issue order, but for ``_kept``: node -> those
        #: issued before the horizon and kept because the node still waits for their results
        self._issued: deque[tuple[float, str]] | None = None
        self._kept: dict[str, set[str]] = {}
        self._kept_n = 0

    def audit(self, out: Decisions, now: float, decision: AuditDecision, explanation: str, *,
              incident: Incident | None = None, incident_id: str = "", node: str = "", job: str = "",
              rule: str = "", track: Track | None = None, command_ids: list[str] | None = None,
              state_from: NodeState | None = None, state_to: NodeState | None = None,
              actor: str = "fleetmedic") -> None:
        self.state.seq += 1
        budget = self.gate.snapshot(now, self.fleet_size()) if decision in BUDGETED else None
        out.audit.append(AuditRecord(
            id=f"audit-{self.state.seq:012d}", ts=now, decision=decision, explanation=explanation[:4096],
            node=node, job=job, incident_id=incident.id if incident else incident_id,
            incident_class=incident.incident_class if incident else None, command_ids=command_ids or [],
            rule=rule, track=track, state_from=state_from, state_to=state_to, actor=actor, budget=budget,
            dry_run=self.settings.safety.dry_run, cluster=self.settings.cluster.name,
        ))

    def command(self, out: Decisions, now: float, cid: str, action: str, incident_id: str, job: str, reason: str,
                params: dict[str, str], exclude: list[str] | None = None, node: str = "",
                track: Track = "job") -> None:
        """Build and emit one command (both tracks); an id already issued is never emitted twice."""
        if cid in self.state.commands:
            return
        cmd = RemediationCommand(
            id=cid, action=action, incident_id=incident_id, reason=reason[:4096], issued_at=now,  # type: ignore[arg-type]
            expires_at=now + self.settings.signing.command_ttl_s, node=node, job=job, track=track,
            dry_run=self.settings.safety.dry_run, exclude_nodes=exclude or [], params=params,
            cluster=self.settings.cluster.name,  # signed with the rest: the executor of another cluster refuses it
        )
        self.state.commands[cid] = CommandInfo(action=action, track=track, incident_id=incident_id, issued_at=now,
                                               node=node, job=job)
        if self._issued is not None:
            self._issued.append((now, cid))
        out.commands.append(cmd)

    def node_commands(self, now: float, out: Decisions) -> Issue:
        """The ``issue`` callback the lifecycle gets: a node's plan step becomes a node-track command."""
        def issue(rec: NodeRecord, action: str, params: dict[str, str], attempt: str, reason: str) -> str:
            cid = command_id(rec.incident_id or "node", action, rec.name, attempt)
            self.command(out, now, cid, action, rec.incident_id, "", reason, params, node=rec.name, track="node")
            return cid
        return issue

    def explain_commands(self, out: Decisions, now: float) -> None:
        """Every command is explained: audit any command no audit record of this call names yet."""
        named = {cid for a in out.audit for cid in a.command_ids}
        for c in out.commands:
            if c.id not in named:
                self.audit(out, now, "command", f"{c.action} {c.node or c.job}: {c.reason}", node=c.node, job=c.job,
                           incident_id=c.incident_id, track=c.track, command_ids=[c.id])

    def forget_commands(self, before: float, waits_for: Callable[[str, str], bool],
                        changed: Collection[str] | None = None) -> None:
        """Forget commands issued before ``before`` whose results can no longer matter: no node waits
        for them (``waits_for(command id, node)``; ``changed``: the nodes whose records changed since
        the last call, None: any may have). The commands are kept in the order they were issued (engine
        time never runs backwards), so only those issued before ``before``, and those a node of
        ``changed`` waited for before, are looked at."""
        commands, kept = self.state.commands, self._kept
        if self._issued is None or len(self._issued) + self._kept_n < len(commands):  # restored
            self._issued = deque(sorted((v.issued_at, k) for k, v in commands.items()))
            kept.clear()
            self._kept_n = 0
            changed = None
        for node in list(kept) if changed is None else [n for n in changed if n in kept]:
            ids = kept[node]
            for cid in [c for c in ids if not waits_for(c, node)]:
                ids.discard(cid)
                self._kept_n -= 1
                commands.pop(cid, None)
            if not ids:
                del kept[node]
        issued = self._issued
        while issued and issued[0][0] < before:
            cid = issued.popleft()[1]
            info = commands.get(cid)
            if info is not None:
                if waits_for(cid, info.node):
                    kept.setdefault(info.node, set()).add(cid)
                    self._kept_n += 1
                else:
                    del commands[cid]
