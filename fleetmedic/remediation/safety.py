"""Blast-radius control: isolation budgets, rate limits, per-rack/per-switch caps, cooldowns and a
circuit breaker on correlated suspicion. Small pure objects; every method that needs time takes ``now``.

The budgets bound the damage of *wrong* decisions (false positives, telemetry storms, a shared
cause); they never abandon a node whose device is already gone. So each isolation has a kind
(:mod:`.kinds`): **definitive** (hard evidence that the device or node is unusable: counted,
audited and reported, never refused by a budget), **preventive** (degradation) and **uncertain**
(the rest). :class:`SafetyGate` answers :meth:`SafetyGate.check_isolation`: may fleetmedic take one
more node out of service now? It refuses (with a reason an operator can read) when

- the :class:`CircuitBreaker` is open and stops this evidence (:meth:`CircuitBreaker.stops`: with
  ``scope: evidence`` the signatures and failure domains it tripped on, evidence without a signature
  and nodes it stopped before; everything once the fleet share trips or with ``scope: all``); only a
  definitive isolation of a node whose device is gone passes it (``breaker.pass_lost_devices``),
  unless the breaker tripped on that very signature outside the node's failure domain (a storm of
  one kind of evidence is likelier a telemetry fault than that many dead GPUs);
- and, for preventive and uncertain isolation only (the *budgeted* holds, until their fault is
  confirmed by failed diagnostics or a repair: a confirmed hold leaves the budget, still held and
  counted):
  - fleetmedic already holds ``max_quarantined_count`` budgeted nodes, or ``max_quarantined_fraction``
    of the fleet (at least one node unless the count limit is 0); beyond that, up to one node below
    the breaker's fleet-share level while the node's signature and failure domains stay below the
    breaker's levels among the holds (:meth:`SafetyGate.max_held_distinct`): distinct faults the
    breaker accepts as uncorrelated are isolated on small fleets too;
  - ``max_new_isolations`` budgeted isolations happened in the last ``isolation_window_s``;
  - the node's rack already has ``max_per_rack`` budgeted holds, or one of its leaf switches
    ``max_per_switch``;
  - preventive holds already fill ``preventive_share`` of the budget (at least one node);
  - the node was returned to service less than ``node_cooldown_s`` ago and the evidence is neither
    definitive nor critical.

:meth:`SafetyGate.check_disruptive` allows each disruptive step (reset, reboot) once per node per
``node_cooldown_s``.

The breaker counts distinct nodes that became isolation candidates within ``window_s`` three ways
and opens when any count reaches its level (each ``max(min_nodes, ceil(fraction x size))``):

- **fleet share** (``trip_min_nodes``, ``trip_suspect_fraction`` of the fleet): NVSentinel's
  sliding-window breaker on the share of nodes cordoned, Medik8s NodeHealthCheck's ``minHealthy``;
- **one signature** (``signature_min_nodes``, ``signature_fraction`` of the fleet): the same XID,
  metric or log signal on many nodes at once is one cause (an exporter, a driver, a rollout);
- **one failure domain** (``domain_min_nodes``, ``domain_fraction`` of the domain's nodes): many
  nodes of one rack or behind one leaf switch at once share a cause there.

Distinct faults on different nodes and domains trip none of them at small shares. It stays open
until a command resumes it or, with ``resume: auto``, until ``auto_resume_after_s`` passed and every
count fell below its level. Budgets count the nodes fleetmedic holds from the moment it decides to
isolate them (not when the executor confirms), so no event order can overshoot them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

import msgspec

from fleetmedic.config import BreakerSettings, SafetySettings
from fleetmedic.records import BudgetSnapshot
from fleetmedic.remediation.kinds import KIND_RANK, IsolationKind, kind_of


class Verdict(msgspec.Struct, frozen=True, kw_only=True):
    allowed: bool
    # "" when allowed within the budget; "outside_breaker" when allowed within it while the breaker
    # is open on other evidence; "definitive" when allowed outside it; "lost_device" when a lost
    # device passed the open breaker; otherwise why not: breaker_open, max_held, rate, rack, switch,
    # preventive_share, cooldown
    reason: str
    explanation: str = ""


ALLOWED = Verdict(allowed=True, reason="")


class Domains(Protocol):
    """Failure domains of a node (``rack:<r>``, ``leaf:<l>``) and how many nodes each holds."""

    def domains_of(self, node: str) -> Iterable[str]: ...

    def domain_size(self, domain: str) -> int: ...


class NoDomains:
    def domains_of(self, node: str) -> Iterable[str]:
        return ()

    def domain_size(self, domain: str) -> int:
        return 0


NO_DOMAINS = NoDomains()


def domain_keys(node: str, rack_of: Callable[[str], str], leaves_of: Callable[[str], Iterable[str]]) -> set[str]:
    """A node's failure domains as the breaker names them."""
    rack = rack_of(node)
    return ({f"rack:{rack}"} if rack else set()) | {f"leaf:{leaf}" for leaf in leaves_of(node) if leaf}


def level(min_nodes: int, fraction: float, size: int) -> int:
    """A trip level: ``max(min_nodes, ceil(fraction x size))``."""
    return max(min_nodes, math.ceil(fraction * size - 1e-9))


class BreakerState(msgspec.Struct, kw_only=True):
    open: bool = False
    opened_at: float = 0.0
    opened_reason: str = ""
    trips: int = 0
    suspicions: dict[str, float] = {}  # node -> last time it became a candidate (pruned to the window)
    signatures: dict[str, dict[str, float]] = {}  # signature -> node -> last time (pruned to the window)
    domains: dict[str, dict[str, float]] = {}  # failure domain -> node -> last time (pruned to the window)
    tripped_signatures: list[str] = []  # signatures whose count reached its level while open
    tripped_domains: list[str] = []  # failure domains whose count reached its level while open
    tripped_fleet: bool = False  # the fleet share reached its level while open: every isolation stops


class CircuitBreaker:
    """Correlated suspicion => stop isolating. Resume by rule (``resume: auto``) or by command."""

    def __init__(self, settings: BreakerSettings, state: BreakerState | None = None) -> None:
        self.settings = settings
        self.state = state if state is not None else BreakerState()
        self._earliest: float | None = None  # the oldest time noted, unknown (None) until a prune

    # --- levels -----------------------------------------------------------------------------------

    def trip_level(self, fleet_size: int) -> int:
        s = self.settings
        return level(s.trip_min_nodes, s.trip_suspect_fraction, fleet_size)

    def signature_level(self, fleet_size: int) -> int:
        s = self.settings
        return level(s.signature_min_nodes, s.signature_fraction, fleet_size)

    def domain_level(self, domain_size: int) -> int:
        s = self.settings
        return level(s.domain_min_nodes, s.domain_fraction, domain_size)

    def suspicion_count(self, now: float) -> int:
        self._prune(now)
        return len(self.state.suspicions)

    # --- suspicion ----------------------------------------------------------------------------------

    def note_suspicion(self, node: str, now: float, fleet_size: int, signature: str = "",
                       domains: Domains = NO_DOMAINS) -> bool:
        """Record that ``node`` became an isolation candidate on evidence ``signature``; True if this
        opened the breaker. While open, it keeps noting which signatures and domains are stormy."""
        st = self.state
        self._prune(now)
        st.suspicions[node] = now
        if signature:
            st.signatures.setdefault(signature, {})[node] = now
        for d in domains.domains_of(node):
            st.domains.setdefault(d, {})[node] = now
        reasons = self._reached(fleet_size, signature, node, domains)
        if not reasons:
            return False
        for kind, key, why in reasons:
            if kind == "fleet":
                if st.open and not st.tripped_fleet:
                    st.opened_reason += f"; then {why}"
                st.tripped_fleet = True
                continue
            listed = st.tripped_signatures if kind == "signature" else st.tripped_domains
            if key not in listed:
                listed.append(key)
        if st.open:
            return False
        st.open, st.opened_at = True, now
        st.trips += 1
        st.opened_reason = "; ".join(why for _, _, why in reasons)
        return True

    def stops(self, signature: str, node_domains: Iterable[str]) -> bool:
        """Does the open breaker stop isolating a node with this evidence in these failure domains?
        With ``scope: all``, or once the fleet share tripped, everything; with ``scope: evidence``, the
        signatures and failure domains that reached their levels, and evidence without a signature
        (it cannot be told apart from the storm)."""
        st = self.state
        if not st.open:
            return False
        if self.settings.scope == "all" or st.tripped_fleet or not signature or signature in st.tripped_signatures:
            return True
        return bool(set(node_domains) & set(st.tripped_domains))

    def scope_text(self) -> str:
        """What the open breaker stops, in words, for the audit and the escalation."""
        st = self.state
        if self.settings.scope == "all" or st.tripped_fleet:
            return "all isolation"
        parts = [*(f"evidence {sig}" for sig in st.tripped_signatures),
                 *(d.replace(":", " ", 1) for d in st.tripped_domains)]
        return "isolation on " + ", ".join(parts)

    def blames(self, signature: str, node_domains: Iterable[str]) -> bool:
        """The breaker tripped on ``signature`` and not on a failure domain of this node: a lost
        device with that evidence waits for an operator even with ``pass_lost_devices``."""
        st = self.state
        return bool(signature) and signature in st.tripped_signatures and not (set(node_domains)
                                                                               & set(st.tripped_domains))

    def poll(self, now: float, fleet_size: int, domains: Domains = NO_DOMAINS) -> bool:
        """Apply the resume rule; True if the breaker closed now."""
        s, st = self.settings, self.state
        if not st.open or s.resume != "auto" or now - st.opened_at < s.auto_resume_after_s:
            return False
        if not self.calm(now, fleet_size, domains):
            return False
        self.close()
        return True

    def calm(self, now: float, fleet_size: int, domains: Domains = NO_DOMAINS) -> bool:
        """Every count is below its level within the window: what ``resume: auto`` waits for, and what
        a person checks before resuming."""
        st = self.state
        self._prune(now)
        if len(st.suspicions) >= self.trip_level(fleet_size):
            return False
        if any(len(nodes) >= self.signature_level(fleet_size) for nodes in st.signatures.values()):
            return False
        return not any(len(nodes) >= self.domain_level(size) for d, nodes in st.domains.items()
                       if (size := domains.domain_size(d)) > 0)

    def close(self) -> None:
        st = self.state
        st.open = False
        st.opened_reason = ""
        st.suspicions, st.signatures, st.domains = {}, {}, {}
        self._earliest = None
        st.tripped_signatures, st.tripped_domains = [], []
        st.tripped_fleet = False

    def _reached(self, fleet_size: int, signature: str, node: str, domains: Domains
                 ) -> list[tuple[str, str, str]]:
        """The rules whose count reached its level: (rule, key, explanation)."""
        st, w = self.state, self.settings.window_s
        out: list[tuple[str, str, str]] = []
        n, lvl = len(st.suspicions), self.trip_level(fleet_size)
        if n >= lvl:
            out.append(("fleet", "", f"{n} nodes became suspect within {w:g}s (trip level {lvl} of {fleet_size} "
                                     "nodes)"))
        if signature:
            k, lvl = len(st.signatures.get(signature, {})), self.signature_level(fleet_size)
            if k >= lvl:
                out.append(("signature", signature, f"{k} nodes became suspect on the same evidence ({signature}) "
                                                    f"within {w:g}s (trip level {lvl} of {fleet_size} nodes)"))
        for d in sorted(set(domains.domains_of(node))):
            size = domains.domain_size(d)
            if size <= 0:
                continue
            members = len(st.domains.get(d, {}))
            lvl = self.domain_level(size)
            if members >= lvl:
                out.append(("domain", d, f"{members} of the {size} nodes of {d.replace(':', ' ', 1)} became suspect "
                                         f"within {w:g}s (trip level {lvl})"))
        return out

    def _prune(self, now: float) -> None:
        horizon = now - self.settings.window_s
        if self._earliest is not None and self._earliest > horizon:
            return  # nothing can have aged out yet
        st = self.state
        st.suspicions = {n: ts for n, ts in st.suspicions.items() if ts > horizon}
        st.signatures = _pruned(st.signatures, horizon)
        st.domains = _pruned(st.domains, horizon)
        stamps = [*st.suspicions.values(), *(ts for t in (st.signatures, st.domains) for v in t.values()
                                             for ts in v.values())]
        self._earliest = min(stamps) if stamps else None


def _pruned(table: dict[str, dict[str, float]], horizon: float) -> dict[str, dict[str, float]]:
    return {key: kept for key, nodes in table.items() if (kept := {n: ts for n, ts in nodes.items() if ts > horizon})}


class SafetyState(msgspec.Struct, kw_only=True):
    held: dict[str, float] = {}  # node -> since when fleetmedic holds it out of service (every kind)
    preventive: list[str] = []  # held nodes isolated on preventive evidence
    definitive: list[str] = []  # held nodes isolated on definitive evidence (outside the budget)
    confirmed: list[str] = []  # held nodes whose fault was confirmed since (outside the budget)
    signatures: dict[str, str] = {}  # held node -> the signature of the evidence it was isolated on
    isolations: list[tuple[str, float]] = []  # new budgeted isolations, pruned to the window
    definitive_isolations: int = 0  # definitive isolations ever (they use no budget; reported)
    released: dict[str, float] = {}  # node -> when fleetmedic last returned it to service
    disruptive: dict[str, float] = {}  # "node|action" -> last reset/reboot
    breaker: BreakerState = msgspec.field(default_factory=BreakerState)


Locator = Callable[[str], str]
Leaves = Callable[[str], Iterable[str]]


@dataclass(frozen=True)
class Allowance:
    """What the defaults (or any settings) allow at one fleet size (the table in docs/safety.md)."""

    fleet: int
    max_held: int  # unconfirmed preventive + uncertain nodes held at once
    preventive: int  # of which preventive at most
    max_held_distinct: int  # held at once when each hold's evidence stays below every breaker level
    preventive_distinct: int  # of which preventive at most
    new_per_window: int  # new budgeted isolations per isolation_window_s (a released or confirmed hold frees its place)
    trip_fleet: int  # breaker: suspect nodes in window_s
    trip_signature: int  # breaker: nodes with one signature in window_s
    trip_rack: int  # breaker: suspect nodes of one rack (of rack_size nodes)
    trip_leaf: int  # breaker: suspect nodes behind one leaf (of leaf_size nodes)


TABLE_SIZES: tuple[int, ...] = (16, 64, 512, 4096)


def allowance_table(settings: SafetySettings, sizes: Iterable[int] = TABLE_SIZES, rack_size: int = 4,
                    leaf_size: int = 32) -> str:
    """The markdown table of what ``settings`` allow at each fleet size (docs/safety.md holds the
    one for the shipped defaults; a test keeps it equal to this)."""
    gate = SafetyGate(settings)
    w, b = settings.isolation_window_s, settings.breaker.window_s
    lines = [
        "| fleet | unconfirmed held at once: preventive + uncertain (of which preventive) | the same, evidence "
        f"distinct below every breaker level | new per {w:g} s | breaker, suspect nodes in {b:g} s | breaker, one "
        f"signature | breaker, one rack of {rack_size} | breaker, one leaf of {leaf_size} | confirmed, definitive |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for n in sizes:
        a = gate.allowance(n, rack_size, leaf_size)
        lines.append(f"| {n:,} | {a.max_held} ({a.preventive}) | {a.max_held_distinct} ({a.preventive_distinct}) | "
                     f"{a.new_per_window} | {a.trip_fleet} ({a.trip_fleet / n:.0%}) | {a.trip_signature} | "
                     f"{a.trip_rack} | {a.trip_leaf} | every one |")
    return "\n".join(lines) + "\n"


class SafetyGate:
    """Budgets over the nodes fleetmedic holds. ``rack_of`` locates a node (``""``: unknown);
    ``leaves_of`` gives the leaf switches it is cabled to (several on rail-optimised fabrics)."""

    def __init__(self, settings: SafetySettings, state: SafetyState | None = None) -> None:
        self.settings = settings
        self.state = state if state is not None else SafetyState()
        self.breaker = CircuitBreaker(settings.breaker, self.state.breaker)
        self._oldest_release = float("-inf")  # no release or disruption remembered is older (unknown: restored)
        #: moves on with every change of the holds (held, their kinds and signatures, the isolations
        #: in the window): a refusal of :meth:`check_isolation` stands while it and the breaker stay
        self.changes = 0

    # --- limits -------------------------------------------------------------------------------

    def max_held(self, fleet_size: int) -> int:
        """Most unconfirmed preventive + uncertain nodes held at once, whatever their evidence
        (definitive and confirmed holds are outside it)."""
        s = self.settings
        by_fraction = math.floor(s.max_quarantined_fraction * fleet_size + 1e-9)
        if s.max_quarantined_fraction > 0:
            by_fraction = max(1, by_fraction)
        return min(s.max_quarantined_count, by_fraction)

    def max_held_distinct(self, fleet_size: int) -> int:
        """Most unconfirmed holds at once when each one's evidence is distinct: as many as the breaker
        accepts as uncorrelated suspicion (one below its fleet-share level), at least :meth:`max_held`
        and at most ``max_quarantined_count``. Beyond :meth:`max_held` a node is held only while its
        signature and each of its failure domains stay below the breaker's levels among the holds."""
        limit = self.max_held(fleet_size)
        if limit <= 0:
            return 0
        return min(self.settings.max_quarantined_count, max(limit, self.breaker.trip_level(fleet_size) - 1))

    def preventive_limit(self, fleet_size: int, limit: int | None = None) -> int:
        """Most preventive holds at once: ``preventive_share`` of the held limit (:meth:`max_held`
        unless ``limit`` is given), at least one."""
        s = self.settings
        limit = self.max_held(fleet_size) if limit is None else limit
        if s.preventive_share <= 0 or limit <= 0:
            return 0
        return max(1, math.floor(s.preventive_share * limit + 1e-9))

    def allowance(self, fleet_size: int, rack_size: int = 4, leaf_size: int = 32) -> Allowance:
        b = self.breaker
        distinct = self.max_held_distinct(fleet_size)
        return Allowance(fleet=fleet_size, max_held=self.max_held(fleet_size),
                         preventive=self.preventive_limit(fleet_size), max_held_distinct=distinct,
                         preventive_distinct=self.preventive_limit(fleet_size, distinct),
                         new_per_window=self.settings.max_new_isolations,
                         trip_fleet=b.trip_level(fleet_size), trip_signature=b.signature_level(fleet_size),
                         trip_rack=b.domain_level(min(rack_size, fleet_size)),
                         trip_leaf=b.domain_level(min(leaf_size, fleet_size)))

    def new_in_window(self, now: float) -> int:
        self._prune(now)
        return len(self.state.isolations)

    def holds(self, node: str) -> bool:
        return node in self.state.held

    def kind_held(self, node: str) -> IsolationKind | None:
        if node not in self.state.held:
            return None
        if node in self.state.definitive:
            return "definitive"
        return "preventive" if node in self.state.preventive else "uncertain"

    def budgeted(self) -> list[str]:
        """Held nodes that use the budget (preventive and uncertain, not confirmed)."""
        outside = set(self.state.definitive) | set(self.state.confirmed)
        return [n for n in self.state.held if n not in outside]

    def definitive_held(self) -> int:
        return sum(1 for n in self.state.definitive if n in self.state.held)

    def confirmed_held(self) -> int:
        """Preventive or uncertain holds confirmed since (failed diagnostics, a repair): outside the budget."""
        return sum(1 for n in self.state.confirmed if n in self.state.held)

    def confirm(self, node: str) -> bool:
        """The fault behind ``node``'s hold is confirmed (diagnostics failed, a person repaired it): the
        hold leaves the budget and stays held, counted as confirmed. True if it was in the budget."""
        st = self.state
        if node not in st.held or node in st.definitive or node in st.confirmed:
            return False
        st.confirmed.append(node)
        self.changes += 1
        return True

    def check_isolation(
        self,
        node: str,
        now: float,
        fleet_size: int,
        rack_of: Locator,
        leaves_of: Leaves,
        critical: bool = False,
        *,
        kind: IsolationKind | None = None,
        device_gone: bool = False,
        signature: str = "",
        domains: Domains = NO_DOMAINS,
        stopped: bool = False,
    ) -> Verdict:
        """May ``node`` be taken out of service now? (Holding it already is always allowed.) ``kind``
        defaults to uncertain for critical evidence and preventive otherwise; ``domains`` sizes the
        failure domains for the breaker's levels among the holds (:meth:`max_held_distinct`);
        ``stopped``: the open breaker stopped this node before, so it stops it on any evidence (one
        fault shows several signatures: a DBE counter and XID 48) but a lost device it does not blame."""
        s = self.settings
        kind = kind or kind_of("", critical)
        if node in self.state.held:
            return ALLOWED
        node_domains = domain_keys(node, rack_of, leaves_of) if self.breaker.state.open else set()
        if self.breaker.stops(signature, node_domains) or (stopped and self.breaker.state.open):
            if kind == "definitive" and device_gone and s.breaker.pass_lost_devices and not self.breaker.blames(
                    signature, node_domains):
                return Verdict(allowed=True, reason="lost_device",
                               explanation=f"its device is gone ({signature or 'definitive evidence'}): isolated "
                               f"although the circuit breaker is open ({self.breaker.state.opened_reason})")
            why = f"circuit breaker open: {self.breaker.state.opened_reason}"
            if kind == "definitive" and device_gone and s.breaker.pass_lost_devices:
                why += f"; it tripped on this very evidence ({signature}) across failure domains"
            return Verdict(allowed=False, reason="breaker_open", explanation=why)
        if kind == "definitive":
            return Verdict(allowed=True, reason="definitive",
                           explanation=f"definitive evidence ({signature or 'hard fault'}): the capacity is already "
                           "gone, isolated outside the budget" + self._outside_breaker(signature))
        budgeted = self.budgeted()
        held = len(budgeted)
        limit = self.max_held(fleet_size)
        if held + 1 > limit:
            distinct = self.max_held_distinct(fleet_size)
            shared = self._shared_evidence(node, signature, budgeted, fleet_size, domains)
            if held + 1 > distinct or shared:
                beyond = (f"; beyond it up to {distinct} with distinct evidence, but {shared}" if shared and
                          held + 1 <= distinct else f"; {distinct} with distinct evidence" if distinct > limit else "")
                return Verdict(allowed=False, reason="max_held",
                               explanation=f"fleetmedic already holds {held} of {fleet_size} nodes on unconfirmed "
                               f"preventive or uncertain evidence (limit {limit}: max_quarantined_count "
                               f"{s.max_quarantined_count}, max_quarantined_fraction "
                               f"{s.max_quarantined_fraction:g}{beyond})")
            limit = distinct
        recent = self.new_in_window(now)
        if recent + 1 > s.max_new_isolations:
            return Verdict(allowed=False, reason="rate",
                           explanation=f"{recent} new isolations in the last {s.isolation_window_s:g}s "
                           f"(max_new_isolations {s.max_new_isolations})")
        rack = rack_of(node)
        if rack:
            in_rack = sum(1 for n in budgeted if rack_of(n) == rack)
            if in_rack + 1 > s.max_per_rack:
                return Verdict(allowed=False, reason="rack",
                               explanation=f"rack {rack} already has {in_rack} isolated nodes (max_per_rack "
                               f"{s.max_per_rack})")
        for leaf in sorted(set(leaves_of(node)) - {""}):
            behind = sum(1 for n in budgeted if leaf in set(leaves_of(n)))
            if behind + 1 > s.max_per_switch:
                return Verdict(allowed=False, reason="switch",
                               explanation=f"leaf switch {leaf} already has {behind} isolated nodes behind it "
                               f"(max_per_switch {s.max_per_switch})")
        if kind == "preventive":
            share = self.preventive_limit(fleet_size, limit)
            preventive = sum(1 for n in self.state.preventive if n in budgeted)
            if preventive + 1 > share:
                return Verdict(allowed=False, reason="preventive_share",
                               explanation=f"{preventive} preventive isolations already use the share of the budget "
                               f"for degradation (preventive_share {s.preventive_share:g} of {limit})")
        released = self.state.released.get(node)
        if not critical and released is not None and now - released < s.node_cooldown_s:
            return Verdict(allowed=False, reason="cooldown",
                           explanation=f"returned to service {now - released:.0f}s ago (node_cooldown_s "
                           f"{s.node_cooldown_s:g}); only critical evidence isolates it again this soon")
        if self.breaker.state.open:
            return Verdict(allowed=True, reason="outside_breaker", explanation=self._outside_breaker(signature)[2:])
        return ALLOWED

    def _outside_breaker(self, signature: str) -> str:
        """What an isolation the open breaker lets through says about it ("" while it is closed)."""
        if not self.breaker.state.open:
            return ""
        return (f"; the circuit breaker is open ({self.breaker.state.opened_reason}) and stops "
                f"{self.breaker.scope_text()}: this evidence ({signature}) and the node's racks and leaves are "
                "outside it")

    def _shared_evidence(self, node: str, signature: str, budgeted: list[str], fleet_size: int,
                         domains: Domains) -> str:
        """Why holding ``node`` too would put its evidence at a breaker level among the holds ("" when
        it would not): its signature, or one of its failure domains, shared by as many holds as the
        breaker counts as one cause."""
        b, sigs = self.breaker, self.state.signatures
        if not signature:
            return "its evidence has no signature to tell it apart"
        same = sum(1 for n in budgeted if sigs.get(n) == signature)
        if same + 1 >= b.signature_level(fleet_size):
            return f"{same} of them on the same evidence ({signature})"
        mine = set(domains.domains_of(node))
        members_of = dict.fromkeys(mine, 0)  # domain -> the holds in it (one pass over the holds)
        if mine:
            for n in budgeted:
                of = domains.domains_of(n)
                for d in of if isinstance(of, (set, frozenset)) else set(of):
                    if d in members_of:
                        members_of[d] += 1
        for d in sorted(mine):
            size = domains.domain_size(d)
            if size <= 0:
                continue
            members = members_of[d]
            if members + 1 >= b.domain_level(size):
                return f"{members} of them in {d.replace(':', ' ', 1)}"
        return ""

    def check_disruptive(self, node: str, action: str, now: float) -> Verdict:
        """May ``action`` (reset_gpu, reboot_node) run on ``node`` now (each once per ``node_cooldown_s``)?"""
        last = self.state.disruptive.get(f"{node}|{action}")
        if last is not None and now - last < self.settings.node_cooldown_s:
            return Verdict(allowed=False, reason="cooldown",
                           explanation=f"last {action} {now - last:.0f}s ago (node_cooldown_s "
                           f"{self.settings.node_cooldown_s:g})")
        return ALLOWED

    # --- bookkeeping ----------------------------------------------------------------------------

    def record_isolation(self, node: str, now: float, critical: bool = True, *,
                         kind: IsolationKind | None = None, signature: str = "") -> None:
        """``node`` is held from now (a hold's kind only ever gets stronger), on evidence ``signature``."""
        st = self.state
        kind = kind or kind_of("", critical)
        self.changes += 1
        if node in st.held:
            if KIND_RANK[kind] > KIND_RANK[self.kind_held(node) or "preventive"]:
                if node in st.preventive:
                    st.preventive.remove(node)  # the evidence became stronger
                if kind == "definitive":
                    st.definitive.append(node)
            return
        st.held[node] = now
        if signature:
            st.signatures[node] = signature
        if kind == "definitive":
            st.definitive.append(node)
            st.definitive_isolations += 1
            return
        self._prune(now)
        st.isolations.append((node, now))
        if kind == "preventive":
            st.preventive.append(node)

    def record_disruptive(self, node: str, action: str, now: float) -> None:
        self.state.disruptive[f"{node}|{action}"] = now
        self._oldest_release = min(self._oldest_release, now)

    def release(self, node: str, now: float) -> None:
        self.changes += 1
        if self.state.held.pop(node, None) is not None:
            self.state.released[node] = now
            self._oldest_release = min(self._oldest_release, now)
        self._unlist(node)

    def forget(self, node: str) -> bool:
        """The node left the cluster: it holds nothing any more (no cooldown: it may come back new).
        True if it was held."""
        self.changes += 1
        held = self.state.held.pop(node, None) is not None
        self._unlist(node)
        self.state.released.pop(node, None)
        return held

    def forget_released_before(self, horizon: float) -> None:
        if horizon <= self._oldest_release:
            return  # none is that old
        self.state.released = {n: ts for n, ts in self.state.released.items() if ts >= horizon}
        self.state.disruptive = {n: ts for n, ts in self.state.disruptive.items() if ts >= horizon}
        self._oldest_release = min([*self.state.released.values(), *self.state.disruptive.values()],
                                   default=float("inf"))

    def snapshot(self, now: float, fleet_size: int) -> BudgetSnapshot:
        """The budget (``held``: the preventive and uncertain holds it counts)."""
        return BudgetSnapshot(
            held=len(self.budgeted()),
            max_held=self.max_held(fleet_size),
            new_in_window=self.new_in_window(now),
            max_new_in_window=self.settings.max_new_isolations,
            fleet_size=fleet_size,
            breaker_open=self.breaker.state.open,
        )

    def _unlist(self, node: str) -> None:
        for listed in (self.state.preventive, self.state.definitive, self.state.confirmed):
            if node in listed:
                listed.remove(node)
        self.state.signatures.pop(node, None)

    def _prune(self, now: float) -> None:
        horizon = now - self.settings.isolation_window_s
        if any(ts <= horizon for _, ts in self.state.isolations):
            self.state.isolations = [(n, ts) for n, ts in self.state.isolations if ts > horizon]
            self.changes += 1
