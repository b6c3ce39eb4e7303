"""One conformance suite, run against every detector: seeded determinism, state round-trip
through bytes mid-stream, tolerance of missing fields and counter resets, rejection of NaN/inf
before a detector sees it, and a minimum AUC separating injected faults from clean streams."""

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
from fleetmedic.models.contract import EwmaScalar
from fleetmedic.models.gpu_detector import GpuDetector
from fleetmedic.models.peers import PeerComparison, node_summary
from fleetmedic.models.port_detector import PortDetector
from fleetmedic.models.straggler import StragglerDetector
from tests.models.synth import gpu_message

S = Settings().detection


@dataclass
class Case:
    """How to drive one detector: a seeded stream (with or without a fault) and its state hooks."""

    name: str
    make: Callable[[], Any]
    stream: Callable[[int, bool], list[Any]]
    feed: Callable[[Any, Any], list[r.Finding]]
    export: Callable[[Any], bytes]
    restore: Callable[[bytes], Any]


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


def port_stream(seed: int, fault: bool) -> list[r.PortTelemetry]:
    rng = np.random.default_rng(seed)
    out, sym = [], 0
    for k in range(60):
        sym += int(rng.integers(0, 3)) + (15 if fault and k > 40 else 0)
        boot = "a" if k < 20 else "b"
        if k == 20:
            sym = 0
        out.append(r.PortTelemetry(device="leaf-1", device_kind="switch", ts=10.0 * k, boot_id=boot, ports=[
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
    return [[gpu_message(f"n{i}", 1000 + 10 * k, rng, hot={g: 5.0 for g in range(8)} if fault and i == bad else None)
             for i in range(8)] for k in range(30)]


def feed_peers(det: PeerComparison, tick: list[r.GpuTelemetry]) -> list[r.Finding]:
    for m in tick:
        det.observe(m.node, m.ts, node_summary(m))
    return det.evaluate("ml/j", [m.node for m in tick], tick[0].ts)


def _restore(factory: Callable[[], Any], load: Callable[[Any, bytes], None]) -> Callable[[bytes], Any]:
    def restore(data: bytes) -> Any:
        det = factory()
        load(det, data)
        return det

    return restore


def gpu_factory() -> GpuDetector:
    return GpuDetector(S)


def port_factory() -> PortDetector:
    return PortDetector(S)


def straggler_factory() -> StragglerDetector:
    return StragglerDetector(S.straggler)


def peer_factory() -> PeerComparison:
    return PeerComparison(S.peers)


CASES = [
    Case("gpu", gpu_factory, gpu_stream, lambda d, m: d.observe(m), lambda d: d.export_state("n0") or b"",
         _restore(gpu_factory, lambda d, b: d.import_state("n0", b))),
    Case("port", port_factory, port_stream, lambda d, m: d.observe(m), lambda d: d.export_state(),
         _restore(port_factory, lambda d, b: d.import_state(b))),
    Case("straggler", straggler_factory, straggler_stream, lambda d, m: d.observe(m), lambda d: d.export_state(),
         _restore(straggler_factory, lambda d, b: d.import_state(b))),
    Case("peers", peer_factory, peer_stream, feed_peers, lambda d: d.export_state(),
         _restore(peer_factory, lambda d, b: d.import_state(b))),
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
        restored = case.restore(case.export(det))
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


class TestScalarContract:
    def test_learn_score_merge_and_bytes(self) -> None:
        rng = np.random.default_rng(0)
        a, b = EwmaScalar(warmup=10), EwmaScalar(warmup=10)
        assert math.isnan(a.score_one(1.0))  # warming up
        for x in rng.normal(10, 1, 500):
            a.learn_one(float(x))
            b.learn_one(float(x) + 0.1)
        a.learn_one(math.nan)
        a.learn_one(math.inf)
        assert a.score_one(10.0) < 1.5 and a.score_one(25.0) > 8
        assert math.isnan(a.score_one(math.inf))
        c = EwmaScalar.from_bytes(a.to_bytes(), warmup=10)
        assert c.score_one(25.0) == pytest.approx(a.score_one(25.0), rel=1e-5)
        m = a.merge(b)
        assert 9.5 < float(m.state.mean[0]) < 10.7

    def test_anomalies_are_not_learned(self) -> None:
        det = EwmaScalar(warmup=10)
        for x in np.random.default_rng(1).normal(0, 1, 200):
            det.learn_one(float(x))
        before = float(det.state.mean[0])
        for _ in range(50):
            det.learn_one(100.0)
        assert float(det.state.mean[0]) == pytest.approx(before)
