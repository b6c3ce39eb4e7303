"""Blast-radius control: isolation budgets, rate limits, per-rack/per-switch caps, cooldowns and a
circuit breaker. Small pure objects; every method that needs time takes ``now``.

:class:`SafetyGate` answers one question, :meth:`SafetyGate.check_isolation`: may fleetmedic take
one more node out of service now? It refuses (with a reason an operator can read) when

- the :class:`CircuitBreaker` is open (mass suspicion: a telemetry storm or a shared cause);
- fleetmedic already holds ``max_quarantined_count`` nodes, or ``max_quarantined_fraction`` of the
  fleet (at least one node may always be held unless the count limit is 0);
- ``max_new_isolations`` new isolations happened in the last ``isolation_window_s``;
- the node's rack already has ``max_per_rack`` held nodes, or its leaf switch ``max_per_switch``;
- the node was returned to service less than ``node_cooldown_s`` ago and the evidence is not
  critical (critical evidence is never held back by a cooldown: that node is dangerous);
- the evidence is not critical and preventive holds already fill ``preventive_share`` of the budget
  (at least one when the budget is two or more; the rest is kept for hardware faults).

:meth:`SafetyGate.check_disruptive` allows each disruptive step (reset, reboot) once per node per
``node_cooldown_s``.

The breaker (NVSentinel's sliding-window breaker, with the clock injected) counts distinct nodes
that became isolation candidates in the last ``window_s``; when they reach
``max(trip_min_nodes, trip_suspect_fraction * fleet)`` it opens, and stays open until a command
resumes it or, with ``resume: auto``, until ``auto_resume_after_s`` passed and the suspicion rate
fell below the trip level. Budgets count the nodes *fleetmedic* holds, from the moment it decides to
isolate them (not when the executor confirms), so no event order can overshoot them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import msgspec

from fleetmedic.config import BreakerSettings, SafetySettings
from fleetmedic.records import BudgetSnapshot


class Verdict(msgspec.Struct, frozen=True, kw_only=True):
    allowed: bool
    reason: str  # "" when allowed; a short code otherwise (breaker_open, max_held, rate, rack, switch, cooldown)
    explanation: str = ""


ALLOWED = Verdict(allowed=True, reason="")


class BreakerState(msgspec.Struct, kw_only=True):
    open: bool = False
    opened_at: float = 0.0
    opened_reason: str = ""
    trips: int = 0
    suspicions: dict[str, float] = {}  # node -> last time it became a candidate (pruned to the window)


class CircuitBreaker:
    """Mass suspicion => stop isolating. Resume by rule (``resume: auto``) or by command."""

    def __init__(self, settings: BreakerSettings, state: BreakerState | None = None) -> None:
        self.settings = settings
        self.state = state if state is not None else BreakerState()

    def trip_level(self, fleet_size: int) -> int:
        s = self.settings
        return max(s.trip_min_nodes, math.ceil(s.trip_suspect_fraction * fleet_size))

    def suspicion_count(self, now: float) -> int:
        self._prune(now)
        return len(self.state.suspicions)

    def note_suspicion(self, node: str, now: float, fleet_size: int) -> bool:
        """Record that ``node`` became an isolation candidate; True if this opened the breaker."""
        self._prune(now)
        self.state.suspicions[node] = now
        if not self.state.open and len(self.state.suspicions) >= self.trip_level(fleet_size):
            self.state.open = True
            self.state.opened_at = now
            self.state.trips += 1
            self.state.opened_reason = (
                f"{len(self.state.suspicions)} nodes became suspect within {self.settings.window_s:g}s "
                f"(trip level {self.trip_level(fleet_size)} of {fleet_size} nodes)"
            )
            return True
        return False

    def poll(self, now: float, fleet_size: int) -> bool:
        """Apply the resume rule; True if the breaker closed now."""
        s, st = self.settings, self.state
        if not st.open or s.resume != "auto" or now - st.opened_at < s.auto_resume_after_s:
            return False
        if self.suspicion_count(now) >= self.trip_level(fleet_size):
            return False
        self.close()
        return True

    def close(self) -> None:
        self.state.open = False
        self.state.opened_reason = ""
        self.state.suspicions = {}

    def _prune(self, now: float) -> None:
        horizon = now - self.settings.window_s
        if any(ts <= horizon for ts in self.state.suspicions.values()):
            self.state.suspicions = {n: ts for n, ts in self.state.suspicions.items() if ts > horizon}


class SafetyState(msgspec.Struct, kw_only=True):
    held: dict[str, float] = {}  # node -> since when fleetmedic holds it out of service
    preventive: list[str] = []  # held nodes isolated on non-critical evidence
    isolations: list[tuple[str, float]] = []  # new isolations, pruned to the window
    released: dict[str, float] = {}  # node -> when fleetmedic last returned it to service
    disruptive: dict[str, float] = {}  # "node|action" -> last reset/reboot
    breaker: BreakerState = msgspec.field(default_factory=BreakerState)


Locator = Callable[[str], str]
Leaves = Callable[[str], Iterable[str]]


class SafetyGate:
    """Budgets over the nodes fleetmedic holds. ``rack_of`` locates a node (``""``: unknown);
    ``leaves_of`` gives the leaf switches it is cabled to (several on rail-optimised fabrics)."""

    def __init__(self, settings: SafetySettings, state: SafetyState | None = None) -> None:
        self.settings = settings
        self.state = state if state is not None else SafetyState()
        self.breaker = CircuitBreaker(settings.breaker, self.state.breaker)

    # --- limits -------------------------------------------------------------------------------

    def max_held(self, fleet_size: int) -> int:
        s = self.settings
        by_fraction = math.floor(s.max_quarantined_fraction * fleet_size)
        if s.max_quarantined_fraction > 0:
            by_fraction = max(1, by_fraction)
        return min(s.max_quarantined_count, by_fraction)

    def new_in_window(self, now: float) -> int:
        self._prune(now)
        return len(self.state.isolations)

    def holds(self, node: str) -> bool:
        return node in self.state.held

    def check_isolation(
        self,
        node: str,
        now: float,
        fleet_size: int,
        rack_of: Locator,
        leaves_of: Leaves,
        critical: bool = False,
    ) -> Verdict:
        """May ``node`` be taken out of service now? (Holding it already is always allowed.)"""
        s = self.settings
        if node in self.state.held:
            return ALLOWED
        if self.breaker.state.open:
            return Verdict(allowed=False, reason="breaker_open",
                           explanation=f"circuit breaker open: {self.breaker.state.opened_reason}")
        held = len(self.state.held)
        limit = self.max_held(fleet_size)
        if held + 1 > limit:
            return Verdict(allowed=False, reason="max_held",
                           explanation=f"fleetmedic already holds {held} of {fleet_size} nodes (limit {limit}: "
                           f"max_quarantined_count {s.max_quarantined_count}, "
                           f"max_quarantined_fraction {s.max_quarantined_fraction:g})")
        recent = self.new_in_window(now)
        if recent + 1 > s.max_new_isolations:
            return Verdict(allowed=False, reason="rate",
                           explanation=f"{recent} new isolations in the last {s.isolation_window_s:g}s "
                           f"(max_new_isolations {s.max_new_isolations})")
        rack = rack_of(node)
        if rack:
            in_rack = sum(1 for n in self.state.held if rack_of(n) == rack)
            if in_rack + 1 > s.max_per_rack:
                return Verdict(allowed=False, reason="rack",
                               explanation=f"rack {rack} already has {in_rack} isolated nodes (max_per_rack "
                               f"{s.max_per_rack})")
        for leaf in sorted(set(leaves_of(node)) - {""}):
            behind = sum(1 for n in self.state.held if leaf in set(leaves_of(n)))
            if behind + 1 > s.max_per_switch:
                return Verdict(allowed=False, reason="switch",
                               explanation=f"leaf switch {leaf} already has {behind} isolated nodes behind it "
                               f"(max_per_switch {s.max_per_switch})")
        if not critical:
            share = math.floor(s.preventive_share * limit)
            if s.preventive_share > 0 and limit >= 2:
                share = max(1, share)
            preventive = sum(1 for n in self.state.preventive if n in self.state.held)
            if preventive + 1 > share:
                return Verdict(allowed=False, reason="preventive_share",
                               explanation=f"{preventive} preventive isolations already use the share of the budget "
                               f"for non-critical evidence (preventive_share {s.preventive_share:g} of {limit})")
        released = self.state.released.get(node)
        if not critical and released is not None and now - released < s.node_cooldown_s:
            return Verdict(allowed=False, reason="cooldown",
                           explanation=f"returned to service {now - released:.0f}s ago (node_cooldown_s "
                           f"{s.node_cooldown_s:g}); only critical evidence isolates it again this soon")
        return ALLOWED

    def check_disruptive(self, node: str, action: str, now: float) -> Verdict:
        """May ``action`` (reset_gpu, reboot_node) run on ``node`` now (each once per ``node_cooldown_s``)?"""
        last = self.state.disruptive.get(f"{node}|{action}")
        if last is not None and now - last < self.settings.node_cooldown_s:
            return Verdict(allowed=False, reason="cooldown",
                           explanation=f"last {action} {now - last:.0f}s ago (node_cooldown_s "
                           f"{self.settings.node_cooldown_s:g})")
        return ALLOWED

    # --- bookkeeping ----------------------------------------------------------------------------

    def record_isolation(self, node: str, now: float, critical: bool = True) -> None:
        if node in self.state.held:
            if critical and node in self.state.preventive:
                self.state.preventive.remove(node)  # the evidence became critical
            return
        self._prune(now)
        self.state.held[node] = now
        self.state.isolations.append((node, now))
        if not critical:
            self.state.preventive.append(node)

    def record_disruptive(self, node: str, action: str, now: float) -> None:
        self.state.disruptive[f"{node}|{action}"] = now

    def release(self, node: str, now: float) -> None:
        if self.state.held.pop(node, None) is not None:
            self.state.released[node] = now
        if node in self.state.preventive:
            self.state.preventive.remove(node)

    def forget_released_before(self, horizon: float) -> None:
        self.state.released = {n: ts for n, ts in self.state.released.items() if ts >= horizon}
        self.state.disruptive = {n: ts for n, ts in self.state.disruptive.items() if ts >= horizon}

    def snapshot(self, now: float, fleet_size: int) -> BudgetSnapshot:
        return BudgetSnapshot(
            held=len(self.state.held),
            max_held=self.max_held(fleet_size),
            new_in_window=self.new_in_window(now),
            max_new_in_window=self.settings.max_new_isolations,
            fleet_size=fleet_size,
            breaker_open=self.breaker.state.open,
        )

    def _prune(self, now: float) -> None:
        horizon = now - self.settings.isolation_window_s
        if any(ts <= horizon for _, ts in self.state.isolations):
            self.state.isolations = [(n, ts) for n, ts in self.state.isolations if ts > horizon]
