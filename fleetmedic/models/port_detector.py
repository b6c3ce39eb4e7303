"""Network port detection: InfiniBand/Ethernet counters, bit-error rate and link state.

:class:`PortDetector` turns :class:`~fleetmedic.records.PortTelemetry` (a switch's ports or a host's
NICs) into ``network`` findings:

- a counter that rose by at least its threshold since the previous sample (``ib_thresholds``:
  rdma-core's defaults per check interval; the increase is scaled to the configured
  ``sample_interval_s`` when samples arrive further apart), with reset detection (a counter that
  goes down or a new ``boot_id`` starts a new series);
- an effective bit-error rate above ``effective_ber_threshold``;
- a link that went down (state change), or link-down counter increments (flaps).

Each finding names the node behind the port (``node``; the device itself for inter-switch links)
and the port as ``device/port`` so triage can group the ports of one switch. State per port is
the previous counters; it serialises to bytes. Pure: time comes from the messages.
"""

from __future__ import annotations

from operator import attrgetter

import msgspec

from fleetmedic.config import DetectionSettings
from fleetmedic.records import Evidence, Finding, PortSample, PortTelemetry, Severity


class _PortState(msgspec.Struct, kw_only=True):
    ts: float
    boot_id: str
    link_state: str
    counters: dict[str, int]
    active: dict[str, float] = {}


class PortDetector:
    def __init__(self, settings: DetectionSettings) -> None:
        self.settings = settings
        self.thresholds = dict(settings.ib_thresholds)
        unknown = sorted(set(self.thresholds) - set(PortSample.__struct_fields__))
        if unknown:
            raise ValueError(f"detection.ib_thresholds: unknown counter(s) {unknown}")
        self._ports: dict[str, _PortState] = {}
        self._names = tuple(self.thresholds)
        getter = attrgetter(*self._names) if self._names else (lambda p: ())
        self._values = getter if len(self._names) != 1 else (lambda p: (getter(p),))

    def export_state(self) -> bytes:
        return msgspec.msgpack.encode(self._ports)

    def import_state(self, data: bytes) -> None:
        self._ports = msgspec.msgpack.decode(data, type=dict[str, _PortState])

    def observe(self, msg: PortTelemetry) -> list[Finding]:
        out: list[Finding] = []
        names = self._names
        ts = float(msg.ts)
        for port in msg.ports:
            key = f"{msg.device}/{port.port}"
            prev = self._ports.get(key)
            values = self._values(port)
            counters = {c: v for c, v in zip(names, values, strict=True) if v is not None}
            state = _PortState(ts=ts, boot_id=msg.boot_id, link_state=port.link_state, counters=counters,
                               active=prev.active if prev else {})
            self._ports[key] = state
            conditions = self._conditions(msg, port, key, prev, counters)
            if conditions or state.active:
                out.extend(self._report(msg, port, key, state, conditions))
        return out

    def _conditions(
        self, msg: PortTelemetry, port: PortSample, key: str, prev: _PortState | None, counters: dict[str, int]
    ) -> list[tuple[str, str, Evidence]]:
        s = self.settings
        found: list[tuple[str, str, Evidence]] = []
        if prev is not None and prev.boot_id == msg.boot_id:
            dt = float(msg.ts) - prev.ts
            scale = max(1.0, dt / s.sample_interval_s) if dt > 0 else 1.0
            before_all = prev.counters
            for name, value in counters.items():
                before = before_all.get(name)
                if before is None or value - before < 1 or value < before:  # unchanged, first sight or reset
                    continue
                limit = self.thresholds[name] * scale
                if limit > 0 and value - before >= limit:
                    ev = Evidence(detector="ib_counters", metric=name, value=float(value - before),
                                  threshold=float(limit), window_s=dt, port=key, ts=msg.ts)
                    found.append((f"counter:{name}", f"{name} rose by {value - before} on {key}", ev))
            if prev.link_state == "up" and port.link_state == "down":
                ev = Evidence(detector="link_state", metric="link_state", port=key, ts=msg.ts, note="up -> down")
                found.append(("link_down", f"link {key} went down", ev))
        if port.effective_ber is not None and port.effective_ber > s.effective_ber_threshold:
            ev = Evidence(detector="ber", metric="effective_ber", value=port.effective_ber,
                          threshold=s.effective_ber_threshold, port=key, ts=msg.ts)
            found.append(("ber", f"effective BER {port.effective_ber:.1e} on {key}", ev))
        return found

    def _report(
        self,
        msg: PortTelemetry,
        port: PortSample,
        key: str,
        state: _PortState,
        conditions: list[tuple[str, str, Evidence]],
    ) -> list[Finding]:
        out = []
        ts = float(msg.ts)
        hold = self.settings.reassert_s
        active = {k: v for k, v in state.active.items() if ts - v < hold}  # condition -> last reported
        for cond, summary, ev in conditions:
            if cond in active:
                active[cond] = active[cond]  # still present: reported again only after reassert_s
                continue
            active[cond] = ts
            severity: Severity = "critical" if cond == "link_down" else "warning"
            out.append(
                Finding(
                    id=f"{key}:{cond}:{ts:.3f}",
                    ts=ts,
                    node=port.node or msg.device,
                    detector=ev.detector,
                    kind="network",
                    severity=severity,
                    summary=summary,
                    evidence=[ev],
                    port=key,
                )
            )
        state.active = active
        return out
