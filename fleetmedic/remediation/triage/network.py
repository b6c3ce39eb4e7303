"""Network findings, gathered per leaf switch for ``network_settle_s`` and then decided together:
**one** switch incident when at least ``leaf_min_nodes`` and ``leaf_min_fraction`` of the nodes
behind the leaf are affected (or the switch itself reports, or a switch incident is open for the
leaf: its findings join it), else one link incident per node. A node
whose every link went down at once is down itself (a hardware incident), never evidence against its
leaf; congestion alone on one node is its own traffic, not a broken link."""

from __future__ import annotations

from fleetmedic.config import TriageSettings
from fleetmedic.records import Evidence, Finding, Suspect
from fleetmedic.remediation.kinds import Isolation
from fleetmedic.remediation.topology import Topology
from fleetmedic.remediation.triage.book import IncidentBook
from fleetmedic.remediation.triage.jobs import JobBoard
from fleetmedic.remediation.triage.records import (
    Assessment,
    PendingGroup,
    TriageState,
    confirmed,
    evidence_of,
    file_group,
    is_congestion,
    link_name,
    max_severity,
    times_seen,
)


class NetworkTriage:
    def __init__(self, settings: TriageSettings, state: TriageState, book: IncidentBook, jobs: JobBoard,
                 topology: Topology) -> None:
        self.settings = settings
        self.state = state
        self.book = book
        self.jobs = jobs
        self.topology = topology

    def gather(self, f: Finding, now: float) -> None:
        """File a network finding with its leaf (``leaf:<leaf>``), or its node when no leaf is known."""
        if self._is_device(f.node):
            # a spine's port facing a leaf is about that leaf's uplink: file it with the leaf
            peer = next((e.port.partition("/")[0] for e in f.evidence if e.detector == "link_peer"), "")
            on_leaf = self.topology.is_switch(f.node) or not self.topology.is_switch(peer)
            key = f"leaf:{f.node if on_leaf else peer}"
        else:
            leaf = self.topology.leaf_for_port(f.node, f.port)
            key = f"leaf:{leaf}" if leaf else f"node:{f.node}"
        group = self.state.network.get(key)
        if group is None:
            group = file_group(self.state.network, PendingGroup(key=key, first_ts=now,
                                                                deadline=now + self.settings.network_settle_s))
        group.findings.append(f)

    def decide(self, group: PendingGroup, now: float) -> list[Assessment]:
        """A settled group: nodes that went dark, then one switch incident or one link incident per node."""
        s = self.settings
        window = [f for f in group.findings if f.severity != "info"]
        if not window:
            return []
        leaf = group.key[5:] if group.key.startswith("leaf:") else ""
        behind = self.topology.behind_leaf(leaf)
        on_switch = [f for f in window if self._is_device(f.node)]
        hosts = self._hosts_in_trouble(group, window, leaf, behind)
        first = min(f.ts for f in window)
        # a node whose every link went down at once is down itself (power, kernel): its own incident,
        # never evidence against a leaf
        dark = {h for h in hosts if self._went_dark(h, first - s.network_settle_s)}
        hosts -= dark
        dark_now = [self._node_down(h, [f for f in window if f.node == h], now) for h in sorted(dark)
                    if any(f.node == h for f in window)]
        # a leaf with an open switch incident: its ports' further findings (a dead leaf's links reported
        # still down, node by node, minutes apart) are that incident's, never a node's
        if leaf and (on_switch or self.book.is_open("network", f"switch:{leaf}") or (
                len(hosts) >= s.leaf_min_nodes and len(hosts) >= s.leaf_min_fraction * len(behind))):
            return [self._switch_incident(leaf, behind, window, on_switch, hosts, now), *dark_now]
        return dark_now + self._link_incidents(window, dark, now)

    def _hosts_in_trouble(self, group: PendingGroup, window: list[Finding], leaf: str,
                          behind: frozenset[str]) -> set[str]:
        """The nodes in the group, and those behind the same leaf that reported trouble on it recently
        (before this group)."""
        hosts = {f.node for f in window if not self._is_device(f.node)}
        lo = group.first_ts - self.settings.network_window_s
        for n in behind - hosts:
            if any(f.kind == "network" and f.severity != "info" and lo <= f.ts
                   and self.topology.leaf_for_port(n, f.port) == leaf for f in self.state.findings.get(n, ())):
                hosts.add(n)
        return hosts

    def _switch_incident(self, leaf: str, behind: frozenset[str], window: list[Finding], on_switch: list[Finding],
                         hosts: set[str], now: float) -> Assessment:
        ports = sorted({link_name(f) for f in window if f.port})[:10]
        suspects = [Suspect(kind="switch", name=leaf), *[Suspect(kind="link", name=p) for p in ports]]
        why = (f"network errors on {len(hosts)} of {len(behind)} nodes behind leaf {leaf}"
               + (f" and on the switch itself ({len(on_switch)} findings)" if on_switch else "")
               + ": one switch/link incident, not node incidents")
        jobs = sorted({j for n in hosts for j in self.jobs.jobs_on(n)})
        evidence = [Evidence(detector="triage", note=why, ts=now), *evidence_of(window)]
        conf = 0.9 if on_switch else min(0.9, 0.6 + 0.3 * len(hosts) / max(1, len(behind)))
        first = min(f.ts for f in window)
        inc, new = self.book.open("network", f"switch:{leaf}", suspects, conf, evidence,
                                  max_severity(f.severity for f in window), why, jobs, [f.id for f in window],
                                  first, now)
        return Assessment(inc, new, frozenset({"leaf_correlated", "kind:network"}), why, first,
                          affected_jobs=tuple(jobs), exclude_nodes=tuple(sorted(hosts)))

    def _link_incidents(self, window: list[Finding], dark: set[str], now: float) -> list[Assessment]:
        """One link incident per node with errors not shared by its leaf (congestion alone is none)."""
        out: list[Assessment] = []
        congestion = self.settings.congestion_metrics
        for host in sorted({f.node for f in window if not self._is_device(f.node)} - dark):
            mine = [f for f in window if f.node == host]
            if all(is_congestion(f, congestion) for f in mine):
                continue  # traffic waiting for credits on one node: its own load, not a broken link
            ports = sorted({link_name(f) for f in mine if f.port})
            suspects = [Suspect(kind="node", name=host), *[Suspect(kind="link", name=p) for p in ports[:4]]]
            why = f"network errors on {host} ({', '.join(ports) or 'its NIC'}), not shared by its leaf's other nodes"
            on_host = self.jobs.jobs_on(host)
            inc, new = self.book.open("network", f"link:{host}", suspects, 0.75, evidence_of(mine),
                                      max_severity(f.severity for f in mine), why, list(on_host), [f.id for f in mine],
                                      min(f.ts for f in mine), now)
            seen = times_seen(self.state, self.settings, host,
                              lambda g: g.kind == "network" and not is_congestion(g, congestion), now)
            metric = next((e.metric for f in mine for e in f.evidence if e.metric), "link")
            out.append(Assessment(inc, new, frozenset({"link", "kind:network"}), why, inc.first_seen,
                                  affected_jobs=on_host, exclude_nodes=(host,),
                                  confirmed=confirmed(self.settings, inc.severity, seen),
                                  isolation={host: Isolation("uncertain", f"network:{metric}")}))
        return out

    def _went_dark(self, host: str, since: float) -> bool:
        """Links on every leaf ``host`` hangs off (two or more) went down since ``since``."""
        leaves = self.topology.leaves_of(host)
        down = {self.topology.leaf_for_port(host, f.port) for f in self.state.findings.get(host, ())
                if f.ts >= since and f.detector == "link_state" and f.severity == "critical"}
        return len(leaves) >= 2 and leaves <= down

    def _node_down(self, host: str, mine: list[Finding], now: float) -> Assessment:
        ports = sorted({link_name(f) for f in mine if f.port})
        why = f"every link of {host} went down at once ({', '.join(ports)}): the node itself is down"
        on_host = self.jobs.jobs_on(host)
        inc, new = self.book.open("hardware", f"node:{host}", [Suspect(kind="node", name=host)], 0.85,
                                  evidence_of(mine), "critical", why, list(on_host), [f.id for f in mine],
                                  min(f.ts for f in mine), now)
        return Assessment(inc, new, frozenset({"node_down", "kind:network"}), why, inc.first_seen,
                          affected_jobs=on_host, exclude_nodes=(host,),
                          isolation={host: Isolation("definitive", "node_down", device_gone=True)})

    def _is_device(self, name: str) -> bool:
        """A switch (or other fabric device) rather than a node of the fleet."""
        return self.topology.is_switch(name) or (len(self.topology) > 0 and name not in self.topology)
