"""Network port detection: InfiniBand/Ethernet counters, bit-error rate and link state.

:class:`PortDetector` turns :class:`~fleetmedic.records.PortTelemetry` (a switch's ports or a host's
NICs) into ``network`` findings:

- a counter that rose by at least its threshold since the previous sample (``ib_thresholds``:
  rdma-core's defaults per check interval; the increase is scaled to the configured
  ``sample_interval_s`` when samples arrive further apart), with reset detection (a counter that
  goes down or a new ``boot_id`` starts a new series);
- an effective bit-error rate above ``effective_ber_threshold``;
- a link that went down (state change), reported again every ``reassert_s`` while it stays down
  (a node returned to service with its link still down is found again), or link-down counter
  increments (flaps);
- a link that is up but trained below its expected speed or width (``link_speed_min_ratio`` of the
  best speed the port has reported, or of its device's other ports now; narrower than its best
  width): a NIC that came up at 200 Gb/s on a 400 Gb/s fabric halves that rail's bandwidth.

Each finding names the node behind the port (``node``; the device itself for inter-switch links)
and the port as ``device/port`` so triage can group the ports of one switch. A finding on an
inter-switch port (no node behind it) also names the cable's other end, when the sample gives it,
as an evidence entry (``detector="link_peer"``, ``port="<device>/<port>"``): triage files it with
that switch. State per port is the previous counters and the best speed and width seen; it saves
and loads whole (:class:`~fleetmedic.models.state.State`: the decision stage's switch ports) or one
host's NICs at a time (:class:`~fleetmedic.models.state.NodeState`: stage 1's per-node state). Pure:
time comes from the messages.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter

import msgspec

from fleetmedic.config import DetectionSettings
from fleetmedic.models.state import require_finite
from fleetmedic.records import Evidence, Finding, PortSample, PortTelemetry, Severity


class _PortState(msgspec.Struct, kw_only=True):
    ts: float
    boot_id: str
    link_state: str
    counters: dict[str, int]
    active: dict[str, float] = {}
    best_speed: float = 0.0
    best_width: int = 0
    down_since: float | None = None  # when a link seen up went down (None: up, or never seen up)


class PortDetector:
    def __init__(self, settings: DetectionSettings) -> None:
        self.settings = settings
        self.thresholds = dict(settings.ib_thresholds)
        unknown = sorted(set(self.thresholds) - set(PortSample.__struct_fields__))
        if unknown:
            raise ValueError(f"detection.ib_thresholds: unknown counter(s) {unknown}")
        self._ports: dict[str, _PortState] = {}
        self._devices: dict[str, dict[str, None]] = {}  # device -> its port keys, in the order of ``_ports``
        self._names = tuple(self.thresholds)
        getter = attrgetter(*self._names) if self._names else (lambda p: ())
        self._values = getter if len(self._names) != 1 else (lambda p: (getter(p),))

    def state_bytes(self) -> bytes:
        """The whole state (msgpack): every port's previous sample and best speed and width."""
        return msgspec.msgpack.encode(self._ports)

    def load_state(self, data: bytes) -> None:
        """Replace the state with what :meth:`state_bytes` wrote (:class:`ValueError` for a value that
        is not finite)."""
        ports = msgspec.msgpack.decode(data, type=dict[str, _PortState])
        _check_finite(ports)
        self._ports = ports
        self._devices = {}
        for key in self._ports:
            self._devices.setdefault(_device(key), {})[key] = None

    def node_bytes(self, node: str) -> bytes:
        """The state of one device's ports (a host's NICs: the device is the node), for per-node state."""
        ports = self._ports
        return msgspec.msgpack.encode({k: ports[k] for k in self._devices.get(node, ())})

    def load_node(self, node: str, data: bytes) -> None:
        """Add the ports :meth:`node_bytes` wrote (other ports are kept)."""
        loaded = msgspec.msgpack.decode(data, type=dict[str, _PortState])
        _check_finite(loaded)
        self._ports.update(loaded)
        for key in loaded:
            self._devices.setdefault(_device(key), {})[key] = None

    def forget(self, device: str) -> None:
        """Drop the state of one device's ports (a host evicted, or moved to another worker)."""
        for key in self._devices.pop(device, ()):
            self._ports.pop(key, None)

    def devices(self) -> int:
        """How many devices have ports in the state."""
        return len(self._devices)

    def detect(self, records: Sequence[PortTelemetry], now: float) -> list[Finding]:
        """Findings for port samples, in order (:class:`~fleetmedic.models.detector.Detector`): the
        samples' own stamps time them, ``now`` is not read."""
        if len(records) == 1:
            return self.observe(records[0])
        return [f for msg in records for f in self.observe(msg)]

    def observe(self, msg: PortTelemetry) -> list[Finding]:
        out: list[Finding] = []
        names = self._names
        ts = float(msg.ts)
        # what the device's other ports of the same kind (host-facing or inter-switch) run at now
        up = [p for p in msg.ports if p.link_state == "up" and p.speed_gbps]
        device_speed = {True: _median([p.speed_gbps for p in up if p.node]),
                        False: _median([p.speed_gbps for p in up if not p.node])}
        for port in msg.ports:
            key = f"{msg.device}/{port.port}"
            prev = self._ports.get(key)
            if prev is None:
                self._devices.setdefault(msg.device, {})[key] = None
            values = self._values(port)
            counters = {c: v for c, v in zip(names, values, strict=True) if v is not None}
            down_since = None
            if port.link_state == "down" and prev is not None and prev.boot_id == msg.boot_id:
                down_since = prev.down_since if prev.link_state == "down" else (ts if prev.link_state == "up" else None)
            state = _PortState(ts=ts, boot_id=msg.boot_id, link_state=port.link_state, counters=counters,
                               active=prev.active if prev else {}, best_speed=prev.best_speed if prev else 0.0,
                               best_width=prev.best_width if prev else 0, down_since=down_since)
            self._ports[key] = state
            conditions = self._conditions(msg, port, key, prev, counters, down_since)
            if port.link_state == "up":
                conditions += self._trained(port, key, state, ts, device_speed[bool(port.node)])
            if conditions or state.active:
                out.extend(self._report(msg, port, key, state, conditions))
        return out

    def _conditions(
        self, msg: PortTelemetry, port: PortSample, key: str, prev: _PortState | None, counters: dict[str, int],
        down_since: float | None = None,
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
        if down_since is not None:  # went down now, or stays down (reported again after reassert_s)
            down_s = float(msg.ts) - down_since
            ev = Evidence(detector="link_state", metric="link_state", port=key, ts=msg.ts, value=down_s,
                          note="up -> down" if down_s == 0 else f"down for {down_s:.0f} s")
            found.append(("link_down", f"link {key} went down" if down_s == 0 else f"link {key} is still down", ev))
        if port.effective_ber is not None and port.effective_ber > s.effective_ber_threshold:
            ev = Evidence(detector="ber", metric="effective_ber", value=port.effective_ber,
                          threshold=s.effective_ber_threshold, port=key, ts=msg.ts)
            found.append(("ber", f"effective BER {port.effective_ber:.1e} on {key}", ev))
        return found

    def _trained(self, port: PortSample, key: str, state: _PortState, ts: float,
                 device_speed: float) -> list[tuple[str, str, Evidence]]:
        """An up link below its expected speed or width; otherwise learn its best."""
        ratio = self.settings.link_speed_min_ratio
        speed, width = port.speed_gbps, port.width
        expected = max(state.best_speed, device_speed)
        if speed and expected and speed < ratio * expected:
            ev = Evidence(detector="link_speed", metric="speed_gbps", value=speed, baseline=expected,
                          threshold=ratio * expected, port=key, ts=ts)
            return [("speed_low", f"link {key} is up at {speed:g} Gb/s, expected {expected:g}", ev)]
        if width and state.best_width and width < state.best_width:
            ev = Evidence(detector="link_speed", metric="width", value=float(width), baseline=float(state.best_width),
                          port=key, ts=ts)
            return [("width_low", f"link {key} is up at width {width}x, expected {state.best_width}x", ev)]
        state.best_speed = max(state.best_speed, speed or 0.0)
        state.best_width = max(state.best_width, width or 0)
        return []

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
            evidence = [ev]
            if not port.node and port.peer:  # an inter-switch link: name the other end of the cable
                peer_device, _, peer_port = port.peer.rpartition(":")
                evidence.append(Evidence(detector="link_peer", port=f"{peer_device}/{peer_port}", ts=msg.ts,
                                         note=f"other end of {key}"))
            out.append(
                Finding(
                    id=f"{key}:{cond}:{ts:.3f}",
                    ts=ts,
                    node=port.node or msg.device,
                    detector=ev.detector,
                    kind="network",
                    severity=severity,
                    summary=summary,
                    evidence=evidence,
                    port=key,
                )
            )
        state.active = active
        return out


def _device(key: str) -> str:
    """The device of a port key ``<device>/<port>`` (device names have no "/"; port names may)."""
    return key.partition("/")[0]


def _median(values: list[float | None]) -> float:
    xs = sorted(v for v in values if v)
    return xs[len(xs) // 2] if xs else 0.0


def _check_finite(ports: dict[str, _PortState]) -> None:
    for key, st in ports.items():
        require_finite(f"ports[{key}]", [st.ts, st.best_speed, *st.active.values()])
