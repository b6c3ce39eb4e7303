"""One conformance suite, run against every detector: seeded determinism, state saved and loaded
mid-stream through the state protocol (:mod:`fleetmedic.models.state`), tolerance of missing fields
and counter resets, rejection of NaN/inf before a detector sees it, and a minimum AUC separating
injected faults from clean streams. Then the protocol itself, for every model that keeps state: it
is implemented, and the bytes written load back into the same state (replacing what was there).
Last the detector shape (:mod:`fleetmedic.models.detector`): every detector the stages call takes
``detect(records, now)``, and a micro-batch gives what its records give one at a time."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np
import pytest

from fleetmedic import records as r
from fleetmedic.config import Settings
from fleetmedic.devenv.synth import gpu_message
from fleetmedic.models.baseline import EwmaBaseline
from fleetmedic.models.detector import Detector, FleetDetector, NodeDetector
from fleetmedic.models.gpu_detector import GpuDetector
from fleetmedic.models.kernel_events import KernelEventDetector
from fleetmedic.models.multivariate import FEATURES, MultivariateModel, NodeWindowFeatures
from fleetmedic.models.peers import PeerComparison, node_summary
from fleetmedic.models.port_detector import PortDetector
from fleetmedic.models.stages import FleetDetection, NodeDetection
from fleetmedic.models.state import NodeState, State
from fleetmedic.models.straggler import StragglerDetector

S = Settings().detection


@dataclass
class Case:
    """How to drive one detector: a seeded stream (with or without a fault); ``node``: the node whose
    state it saves and loads (:class:`NodeState`), or None for its whole state (:class:`State`)."""

    name: str
    make: Callable[[], Any]
    stream: Callable[[int, bool], list[Any]]
    feed: Callable[[Any, Any], list[r.Finding]]
    node: str | None = None

    def save(self, det: Any) -> bytes:
        if self.node is None:
            data: bytes = det.state_bytes()
            return data
        node_data: bytes | None = det.node_bytes(self.node)
        assert node_data is not None
        return node_data

    def restore(self, data: bytes) -> Any:
        """A detector built as :attr:`make` does, its state loaded from ``data``."""
        det = self.make()
        if self.node is None:
            det.load_state(data)
        else:
            det.load_node(self.node, data)
        return det


def gpu_stream(seed: int, fault: bool) -> list[r.GpuTelemetry]:
    rng = np.random.default_rng(seed)
    g = int(rng.integers(8))
    out = []
    for k in range(160):
        sbe = [k // 20] * 8
        if fault and k > 100:
            sbe[g] += 6 * (k - 100)
        # missing values, a reboot halfway (counters reset), idle periods
        boot = "b1" if k < 60 else "b2"
        holes = {"memory_temp": [None] * 8} if k % 13 == 0 else {}
        out.append(gpu_message("n0", 1000 + 10 * k, rng, load=0.1 if (k // 25) % 3 == 0 else 1.0, boot_id=boot,
                               counters={"ecc_sbe_vol_total": sbe if k >= 60 else [500] * 8}, gauges=holes))
    return out


def port_stream(seed: int, fault: bool, device: str = "leaf-1") -> list[r.PortTelemetry]:
    """A switch's port (the node behind it: n1), or a host's NIC (``device`` n1)."""
    rng = np.random.default_rng(seed)
    out, sym = [], 0
    for k in range(60):
        sym += int(rng.integers(0, 3)) + (15 if fault and k > 40 else 0)
        boot = "a" if k < 20 else "b"
        if k == 20:
            sym = 0
        out.append(r.PortTelemetry(device=device, device_kind="switch" if device == "leaf-1" else "host",
                                   ts=10.0 * k, boot_id=boot, ports=[
            r.PortSample(port="p1", node="n1", link_state="up", symbol_error_counter=sym, port_rcv_errors=None)]))
    return out


def straggler_stream(seed: int, fault: bool) -> list[r.JobEvent]:
    rng = np.random.default_rng(seed)
    out = [r.JobEvent(job="ml/j", event="placement", ts=0,
                      placement=[r.RankPlacement(rank=i, node=f"n{i}") for i in range(8)])]
    slow = int(rng.integers(8))
    for step in range(40):
        for rank in range(8):
            t = 1.0 + rng.normal(0, 0.01) + (0.3 if fault and rank == slow and step > 15 else 0.0)
            out.append(r.JobEvent(job="ml/j", event="progress", ts=step + rank / 100, step=step, rank=rank,
                                  step_time_s=t))
    return out


def peer_stream(seed: int, fault: bool) -> list[list[r.GpuTelemetry]]:
    rng = np.random.default_rng(seed)
    bad = int(rng.integers(8))
    # times as floats, as records off the wire have them (an int time would come back a float)
    return [[gpu_message(f"n{i}", 1000.0 + 10 * k, rng, hot={g: 5.0 for g in range(8)} if fault and i == bad else None)
             for i in range(8)] for k in range(30)]


def kernel_stream(seed: int, fault: bool) -> list[r.KernelEvent]:
    """A node's kernel log: corrected errors and slower links (info: no finding) and, with a fault,
    a storm of one device's uncorrected AER errors (reported once: the storm crosses the save)."""
    rng = np.random.default_rng(seed)
    bad = f"0000:{int(rng.integers(16, 250)):02x}:00.0"
    out = []
    for k in range(80):
        pci = f"0000:{int(rng.integers(16, 250)):02x}:00.0"
        out.append(r.KernelEvent(node="n0", ts=1000.0 + 10 * k, signal="pcie", incident_class="hardware",
                                 severity="info", message=f"pcieport {pci}: AER: Corrected error received", pci=pci))
        if fault and k > 30 and k % 3 == 0:
            out.append(r.KernelEvent(node="n0", ts=1000.0 + 10 * k + 1, signal="pcie", incident_class="hardware",
                                     severity="critical", pci=bad,
                                     message=f"pcieport {bad}: AER: Uncorrected (Fatal) error received"))
    return out


def feed_peers(det: PeerComparison, tick: list[r.GpuTelemetry]) -> list[r.Finding]:
    for m in tick:
        det.observe(m.node, m.ts, node_summary(m))
    return det.evaluate("ml/j", [m.node for m in tick], tick[0].ts)


def gpu_factory() -> GpuDetector:
    return GpuDetector(S)


def port_factory() -> PortDetector:
    return PortDetector(S)


def kernel_factory() -> KernelEventDetector:
    return KernelEventDetector(S, GpuDetector(S))  # the GPU detector takes the XID lines (none in the stream)


def straggler_factory() -> StragglerDetector:
    return StragglerDetector(S.straggler)


def peer_factory() -> PeerComparison:
    return PeerComparison(S.peers)


CASES = [
    Case("gpu", gpu_factory, gpu_stream, lambda d, m: d.detect([m], m.ts), node="n0"),
    Case("port", port_factory, port_stream, lambda d, m: d.detect([m], m.ts)),
    Case("host_ports", port_factory, lambda seed, fault: port_stream(seed, fault, "n1"),
         lambda d, m: d.detect([m], m.ts), node="n1"),
    Case("straggler", straggler_factory, straggler_stream, lambda d, m: d.detect([m], m.ts)),
    Case("kernel", kernel_factory, kernel_stream, lambda d, ev: d.detect([ev], ev.ts), node="n0"),
    Case("peers", peer_factory, peer_stream, feed_peers),
]


def run(case: Case, items: list[Any], det: Any | None = None) -> list[str]:
    det = det if det is not None else case.make()
    found = [f for item in items for f in case.feed(det, item)]
    for f in found:
        _strict_json(f)  # a finding goes onto Kafka: a numpy scalar anywhere in it would not encode
    return [f.id for f in found]


_strict_json = msgspec.json.Encoder().encode


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
class TestConformance:
    def test_is_deterministic_for_a_seed(self, case: Case) -> None:
        assert run(case, case.stream(3, True)) == run(case, case.stream(3, True))

    def test_state_round_trips_through_bytes_mid_stream(self, case: Case) -> None:
        items = case.stream(4, True)
        whole = run(case, items)
        det = case.make()
        half = len(items) // 2
        first = run(case, items[:half], det)
        restored = case.restore(case.save(det))
        assert first + run(case, items[half:], restored) == whole

    def test_clean_streams_with_missing_values_and_resets_give_no_findings(self, case: Case) -> None:
        for seed in range(5):
            assert run(case, case.stream(seed, False)) == []

    def test_separates_injected_faults_from_clean_streams(self, case: Case) -> None:
        seeds = range(10, 22)
        flagged_bad = [bool(run(case, case.stream(s, True))) for s in seeds]
        flagged_ok = [bool(run(case, case.stream(s, False))) for s in seeds]
        tpr, fpr = np.mean(flagged_bad), np.mean(flagged_ok)
        auc = 0.5 * (1 + tpr - fpr)  # AUC of a binary detector
        assert auc >= 0.9, (tpr, fpr)


def test_nan_and_infinity_never_reach_a_detector() -> None:
    msg = gpu_message("n0", 1.0, np.random.default_rng(0))
    doc = r.to_builtins(msg)
    for bad in (math.nan, math.inf):
        doc["metrics"]["gpu_temp"][0] = bad
        with pytest.raises(r.InvalidRecord):
            r.convert(r.GpuTelemetry, doc)


# --- the state protocol, for every model that keeps state ---------------------------------------------


def _fleet_stage(seed: int) -> FleetDetection:
    fleet = FleetDetection(S)
    nodes = [f"n{i}" for i in range(6)]
    fleet.on_job(r.JobEvent(job="ml/j", event="placement", ts=0,
                            placement=[r.RankPlacement(rank=i, node=n) for i, n in enumerate(nodes)]))
    rng = np.random.default_rng(seed)
    for k in range(20):
        for n in nodes:
            msg = gpu_message(n, 1000.0 + 10 * k, rng)
            fleet.on_gpu(msgspec.structs.replace(msg, sku="H100"))
        for rank in range(len(nodes)):
            fleet.on_job(r.JobEvent(job="ml/j", event="progress", ts=1000 + 10 * k + rank / 100, step=k, rank=rank,
                                    step_time_s=1.0 + rng.normal(0, 0.01)))
        fleet.on_port(port_stream(seed, False)[k])
        fleet.tick(1000.0 + 10 * k + 1)
    return fleet


def _model(seed: int) -> MultivariateModel:
    rng = np.random.default_rng(seed)
    model = MultivariateModel(S.multivariate)
    for k in range(300):
        model.learn(np.abs(rng.normal(1.0, 0.3, len(FEATURES))), f"n{k % 6}", 60.0 * k)
    assert model.maybe_refit(now=20_000.0)
    model.learn(np.full(len(FEATURES), 1.5), "n1", 20_060.0)  # learned since the fit
    return model


def _baseline(seed: int) -> EwmaBaseline:
    b = EwmaBaseline.empty((4, 3))
    for x in np.random.default_rng(seed).normal(5, 1, (50, 4, 3)):
        b.learn(x, 0.1)
    return b


def _fed(case: Case, seed: int) -> Any:
    det = case.make()
    run(case, case.stream(seed, True), det)
    return det


#: every model whose whole state is saved: a fresh one (as the settings build it) and one with state
WHOLE: dict[str, tuple[Callable[[], State], Callable[[int], State]]] = {
    "fleet": (lambda: FleetDetection(S), _fleet_stage),
    "multivariate": (lambda: MultivariateModel(S.multivariate), _model),
    "baseline": (lambda: EwmaBaseline.empty((1,)), _baseline),
    **{c.name: (c.make, lambda seed, c=c: _fed(c, seed)) for c in CASES if c.node is None},  # type: ignore[misc]
}


def _windows(seed: int) -> NodeWindowFeatures:
    w = NodeWindowFeatures(window_s=60.0)
    rng = np.random.default_rng(seed)
    w.add_batch([gpu_message(n, 1000 + 10 * k, rng) for k in range(4) for n in ("n0", "n1")])
    return w


#: every model whose state is saved a node at a time: a fresh one, one with state, and the node
BY_NODE: dict[str, tuple[Callable[[], NodeState], Callable[[int], NodeState], str]] = {
    "windows": (lambda: NodeWindowFeatures(window_s=60.0), _windows, "n0"),
    **{c.name: (c.make, lambda seed, c=c: _fed(c, seed), c.node) for c in CASES if c.node},  # type: ignore[misc]
}


@pytest.mark.parametrize("name", WHOLE)
def test_whole_state_loads_back_into_the_same_state_replacing_what_was_there(name: str) -> None:
    fresh, with_state = WHOLE[name]
    saved = with_state(1)
    assert isinstance(saved, State)
    data = saved.state_bytes()
    for into in (fresh(), with_state(2)):  # a new object, and one that already has another state
        into.load_state(data)
        assert into.state_bytes() == data


@pytest.mark.parametrize("name", BY_NODE)
def test_node_state_loads_back_into_the_same_state_of_that_node(name: str) -> None:
    fresh, with_state, node = BY_NODE[name]
    saved = with_state(1)
    assert isinstance(saved, NodeState)
    data = saved.node_bytes(node)
    assert data is not None and saved.node_bytes("never-seen") in (None, msgspec.msgpack.encode({}))
    for into in (fresh(), with_state(2)):
        into.load_node(node, data)
        assert into.node_bytes(node) == data


# --- the detector shape, for every detector of records ---------------------------------------------


def test_every_detector_of_the_stages_takes_the_one_shape() -> None:
    node, fleet = NodeDetection(S), FleetDetection(S)
    for det in (node.gpu, node.kernel, node.ports):
        assert isinstance(det, NodeDetector), type(det).__name__
    for det in (fleet.stragglers, fleet.switch_ports):
        assert isinstance(det, FleetDetector), type(det).__name__
    assert node.kernel.gpu is node.gpu, "a kernel-log XID joins the same XID from the node's telemetry"
    # the peers are judged per group on the fleet stage's tick, not per record
    assert not isinstance(fleet.peers, Detector)


@pytest.mark.parametrize("case", [c for c in CASES if c.name != "peers"], ids=lambda c: c.name)
def test_a_batch_gives_what_its_records_give_one_at_a_time_whatever_now(case: Case) -> None:
    """:meth:`Detector.detect` on a micro-batch gives the findings and the state of its records one
    at a time; a detector timed by its records' stamps does not read the ``now`` it is given."""
    records = case.stream(5, True)
    one_by_one, batched, late = case.make(), case.make(), case.make()
    singles = [f for rec in records for f in one_by_one.detect([rec], float(rec.ts))]
    assert singles, "the fault is found"
    assert batched.detect(records, float(records[-1].ts)) == singles
    assert late.detect(records, 1e12) == singles
    assert case.save(batched) == case.save(one_by_one) == case.save(late)
