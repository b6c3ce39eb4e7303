"""Port counters (rdma-core thresholds, BER, link state, resets), peer comparison across a job's
nodes (Minder-style continuity), stragglers from per-rank step times, the IsolationForest model,
and the EWMA baseline's arithmetic, merge and persistence."""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import numpy as np
import pytest

from fleetmedic import records as r
from fleetmedic.config import Settings, parse_config
from fleetmedic.devenv.synth import gpu_message
from fleetmedic.models.baseline import EwmaBaseline, alpha_for_halflife
from fleetmedic.models.multivariate import MultivariateModel, NodeWindowFeatures
from fleetmedic.models.peers import PeerComparison, node_summary
from fleetmedic.models.port_detector import PortDetector
from fleetmedic.models.stages import FleetDetection
from fleetmedic.models.straggler import StragglerDetector

S = Settings().detection


def port_msg(ts: float, sym: int, *, state: str = "up", ber: float = 1e-15, boot: str = "b") -> r.PortTelemetry:
    return r.PortTelemetry(device="leaf-01", device_kind="switch", ts=ts, boot_id=boot, ports=[
        r.PortSample(port="swp3", node="gpu-node-3", link_state=state, symbol_error_counter=sym, effective_ber=ber,
                     port_xmit_wait=0, link_downed_counter=0)])


class TestPorts:
    def test_counter_increase_at_the_rdma_core_threshold_is_a_network_finding(self) -> None:
        det = PortDetector(S)
        assert det.observe(port_msg(0, 100)) == []
        assert det.observe(port_msg(10, 109)) == []  # +9 < 10
        found = det.observe(port_msg(20, 119))  # +10
        assert [(f.kind, f.node, f.port, f.evidence[0].metric) for f in found] == [
            ("network", "gpu-node-3", "leaf-01/swp3", "symbol_error_counter")]

    def test_counter_reset_is_not_an_increase(self) -> None:
        det = PortDetector(S)
        det.observe(port_msg(0, 5000))
        assert det.observe(port_msg(10, 3, boot="b2")) == []
        assert det.observe(port_msg(20, 1)) == []

    def test_ber_and_link_down_are_reported_once_while_they_last(self) -> None:
        det = PortDetector(S)
        det.observe(port_msg(0, 0))
        assert [f.detector for f in det.observe(port_msg(10, 0, ber=1e-9))] == ["ber"]
        assert det.observe(port_msg(20, 0, ber=1e-9)) == []
        down = det.observe(port_msg(30, 0, state="down"))
        assert [(f.detector, f.severity) for f in down] == [("link_state", "critical")]

    def test_a_nic_trained_below_its_speed_or_width_is_a_network_finding_once(self) -> None:
        def nics(ts: float, speed0: float, width0: int = 4) -> r.PortTelemetry:
            return r.PortTelemetry(device="gpu-node-3", device_kind="host", ts=ts, boot_id="b", ports=[
                r.PortSample(port=f"mlx5_{k}", node="gpu-node-3", link_state="up",
                             speed_gbps=speed0 if k == 0 else 400.0, width=width0 if k == 0 else 4) for k in range(4)])

        det = PortDetector(S)
        assert det.observe(nics(0, 400.0)) == [] and det.observe(nics(10, 400.0)) == []
        slow = det.observe(nics(20, 200.0, 2))
        assert [(f.detector, f.port, f.evidence[0].metric, f.evidence[0].baseline) for f in slow] == [
            ("link_speed", "gpu-node-3/mlx5_0", "speed_gbps", 400.0)]
        assert det.observe(nics(30, 200.0, 2)) == []  # reported once while it lasts
        # a NIC that comes up degraded is judged against the node's other NICs
        fresh = PortDetector(S)
        assert [f.detector for f in fresh.observe(nics(0, 200.0))] == ["link_speed"]
        narrow = PortDetector(S)
        narrow.observe(nics(0, 400.0))
        assert [f.evidence[0].metric for f in narrow.observe(nics(10, 400.0, 2))] == ["width"]

    def test_an_inter_switch_port_names_the_other_end_of_its_cable(self) -> None:
        det = PortDetector(S)
        msg = r.PortTelemetry(device="spine-0", device_kind="switch", ts=0, boot_id="b", ports=[
            r.PortSample(port="swp2", peer="leaf-1:swp33", link_state="up")])
        det.observe(msg)
        down = det.observe(msgspec.structs.replace(msg, ts=10, ports=[
            msgspec.structs.replace(msg.ports[0], link_state="down")]))
        assert [(f.node, [(e.detector, e.port) for e in f.evidence]) for f in down] == [
            ("spine-0", [("link_state", "spine-0/swp2"), ("link_peer", "leaf-1/swp33")])]

    def test_a_link_that_stays_down_is_reported_again_after_reassert_s(self) -> None:
        # a node returned to service with its link still down must be found again, not forgotten
        det = PortDetector(S)
        det.observe(port_msg(0, 0))
        first = det.observe(port_msg(10, 0, state="down"))
        assert [(f.detector, f.summary) for f in first] == [("link_state", "link leaf-01/swp3 went down")]
        assert det.observe(port_msg(20, 0, state="down")) == []  # once per reassert_s
        again = det.observe(port_msg(10 + S.reassert_s, 0, state="down"))
        assert [(f.severity, f.summary, f.evidence[0].value) for f in again] == [
            ("critical", "link leaf-01/swp3 is still down", S.reassert_s)]
        assert det.observe(port_msg(20 + S.reassert_s, 0)) == []  # up again: nothing
        assert det.observe(port_msg(30 + 2 * S.reassert_s, 0, state="down", boot="b2")) == []  # a reboot's down

    def test_a_port_never_seen_up_is_not_reported_down(self) -> None:
        det = PortDetector(S)
        assert det.observe(port_msg(0, 0, state="down")) == []
        assert det.observe(port_msg(10 + S.reassert_s, 0, state="down")) == []

    def test_state_round_trips(self) -> None:
        det = PortDetector(S)
        det.observe(port_msg(0, 100))
        other = PortDetector(S)
        other.load_state(det.state_bytes())
        assert [f.detector for f in other.observe(port_msg(10, 200))] == ["ib_counters"]


class TestPeers:
    def test_a_jobs_node_waiting_on_io_is_not_compared_with_empty_idle_nodes(self) -> None:
        # n0 runs a job that is writing a checkpoint (GPUs near 0 % but warmer than empty nodes);
        # n5 has no job and runs hot: only n5 is unlike its idle SKU peers
        fleet = FleetDetection(S)
        fleet.on_job(r.JobEvent(job="ml/a", event="placement", ts=1000, attempt=0,
                                placement=[r.RankPlacement(rank=0, node="n0")]))
        rng = np.random.default_rng(2)
        found: list[r.Finding] = []
        for k in range(40):
            for i in range(8):
                msg = gpu_message(f"n{i}", 1000 + 10 * k, rng, load=0.0,
                                  hot={g: 8.0 for g in range(8)} if i in (0, 5) else None)
                fleet.on_gpu(msgspec.structs.replace(msg, sku="H100", metrics=msgspec.structs.replace(
                    msg.metrics, gpu_util=[2.0] * 8)))
            found += fleet.tick(1000 + 10 * k)
        assert {f.node for f in found if f.detector == "sku_peers"} == {"n5"}
        # idle nodes all draw idle power: compared as they are, not against a line fitted to power noise
        assert not [f for f in found if "expected at" in f.evidence[0].note]
        # across a SKU fleet a node cooler than its peers is not suspect (it does less work), a hotter one is
        cold = FleetDetection(S)
        for k in range(40):
            for i in range(8):
                msg = gpu_message(f"n{i}", 1000 + 10 * k, rng, load=0.0,
                                  hot={g: -8.0 if i == 2 else (8.0 if i == 6 else 0.0) for g in range(8)})
                cold.on_gpu(msgspec.structs.replace(msg, sku="H100", metrics=msgspec.structs.replace(
                    msg.metrics, gpu_util=[2.0] * 8)))
            found += cold.tick(1000 + 10 * k)
        assert {f.node for f in found if f.detector == "sku_peers"} == {"n5", "n6"}
        restored = FleetDetection(S)
        restored.load_state(fleet.state_bytes())
        assert restored._placed == {"n0": 1}

    def test_across_a_sku_a_node_hot_for_its_power_is_flagged_not_one_running_a_heavier_job(self) -> None:
        """Busy nodes run different jobs: temperature follows the power each draws. n10 and n11 run a
        heavier job (more power, hotter, as physics says); n3 has a failing fan (hotter at the same
        power). Only n3 is unlike its SKU peers; judged on raw temperatures a heavy one was too."""
        def run(settings: str) -> set[str]:
            fleet = FleetDetection(parse_config(settings).detection)
            rng = np.random.default_rng(5)
            found: list[r.Finding] = []
            for k in range(40):
                for i in range(12):
                    load = 1.3 if i >= 10 else 0.85 + 0.015 * i
                    msg = gpu_message(f"n{i}", 1000 + 10 * k, rng, load=load,
                                      hot={g: 8.0 for g in range(8)} if i == 3 else None)
                    fleet.on_gpu(msgspec.structs.replace(msg, sku="H100", metrics=msgspec.structs.replace(
                        msg.metrics, gpu_util=[99.0] * 8)))
                found += fleet.tick(1000 + 10 * k)
            hot = [f for f in found if f.detector == "sku_peers"]
            if settings == "":
                assert all("expected at its power_usage" in f.evidence[0].note for f in hot)
                assert all(f.evidence[0].value > 70 for f in hot if f.node == "n3")  # the raw temperature
            return {f.node for f in hot}

        assert run("") == {"n3"}
        assert run("detection: {peers: {sku_adjust_by: ''}}") & {"n10", "n11"}

    def nodes(self, n: int, hot_node: int | None, k: int, rng: np.random.Generator) -> list[r.GpuTelemetry]:
        return [gpu_message(f"n{i}", 1000 + 10 * k, rng, hot={g: 6.0 for g in range(8)} if i == hot_node else None)
                for i in range(n)]

    def test_a_whole_node_running_hot_against_its_job_peers_is_flagged_after_continuity(self) -> None:
        cmp = PeerComparison(S.peers)
        rng = np.random.default_rng(0)
        found = []
        for k in range(30):
            now = 1000.0 + 10 * k
            for m in self.nodes(8, 5, k, rng):
                cmp.observe(m.node, m.ts, node_summary(m))
            found += cmp.evaluate("research/llm", [f"n{i}" for i in range(8)], now)
        assert {f.node for f in found} == {"n5"}
        assert found[0].ts - 1000.0 >= S.peers.continuity_window_s
        assert found[0].evidence[0].metric in ("gpu_temp", "memory_temp")

    def test_against_its_job_peers_a_hotter_node_is_suspect_on_temperature_a_cooler_one_is_not(self) -> None:
        """Two nodes of an 8-node job, 10 degrees cooler and 10 degrees hotter than the others at the same
        load: the fleet stage's job-peer comparison flags the hot one only (a cooler node is doing no less
        work here; one that does less shows it in power and clocks)."""
        fleet = FleetDetection(S)
        nodes = [f"n{i}" for i in range(8)]
        fleet.on_job(r.JobEvent(job="ml/j", event="placement", ts=0,
                                placement=[r.RankPlacement(rank=i, node=n) for i, n in enumerate(nodes)]))
        rng = np.random.default_rng(3)
        found: list[r.Finding] = []
        for k in range(40):
            for i, n in enumerate(nodes):
                shift = {2: -10.0, 5: 10.0}.get(i)
                msg = gpu_message(n, 1000 + 10 * k, rng, hot={g: shift for g in range(8)} if shift else None)
                fleet.on_gpu(msg)
            found += fleet.tick(1000 + 10 * k + 1)
        peers = [f for f in found if f.detector == "job_peers"]
        assert {f.node for f in peers} == {"n5"}
        assert {f.evidence[0].metric for f in peers} <= {"gpu_temp", "memory_temp"}

    def test_healthy_peers_and_small_groups_are_not_flagged(self) -> None:
        cmp = PeerComparison(S.peers)
        rng = np.random.default_rng(1)
        found = []
        for k in range(40):
            for m in self.nodes(8, None, k, rng):
                cmp.observe(m.node, m.ts, node_summary(m))
            found += cmp.evaluate("job", [f"n{i}" for i in range(8)], 1000.0 + 10 * k)
            found += cmp.evaluate("tiny", ["n0", "n1", "n2"], 1000.0 + 10 * k)
        assert found == []


class TestStraggler:
    def test_a_rank_consistently_slower_than_the_median_is_found_on_its_node(self) -> None:
        det = StragglerDetector(S.straggler)
        det.observe(r.JobEvent(job="ml/a", event="placement", ts=0, placement=[
            r.RankPlacement(rank=i, node=f"n{i}") for i in range(8)]))
        found = []
        for step in range(12):
            for rank in range(8):
                t = 1.0 * (1.25 if rank == 6 and step >= 3 else 1.0)
                found += det.observe(r.JobEvent(job="ml/a", event="progress", ts=step + rank / 10, step=step,
                                                rank=rank, step_time_s=t))
        assert [(f.node, f.detector) for f in found] == [("n6", "straggler")]

    def test_a_job_wide_slowdown_is_a_job_finding_not_a_node_one(self) -> None:
        det = StragglerDetector(S.straggler)
        det.observe(r.JobEvent(job="ml/b", event="placement", ts=0, placement=[r.RankPlacement(rank=0, node="n0")]))
        rng = np.random.default_rng(0)
        found = []
        for step in range(80):
            t = 2.0 + rng.normal(0, 0.02) + (0.6 if step >= 50 else 0.0)
            found += det.observe(r.JobEvent(job="ml/b", event="progress", ts=step * 2.0, step=step, step_time_s=t))
        assert [f.kind for f in found] == ["job"]

    def test_job_step_time_findings_and_state_hold_plain_floats(self) -> None:
        # the finding goes onto Kafka and the state into a compacted topic: a numpy scalar encodes in neither
        det = StragglerDetector(S.straggler)
        det.observe(r.JobEvent(job="ml/c", event="placement", ts=0, placement=[r.RankPlacement(rank=0, node="n0")]))
        rng = np.random.default_rng(1)
        found = []
        for step in range(80):  # noisy enough that the step-time spread, not its floor, sets the scale
            t = 2.0 + rng.normal(0, 0.1) + (1.5 if step >= 50 else 0.0)
            found += det.observe(r.JobEvent(job="ml/c", event="progress", ts=step * 2.0, step=step, step_time_s=t))
        assert [f.detector for f in found] == ["job_step_time"]
        assert type(found[0].evidence[0].score) is float
        msgspec.json.encode(found[0])
        msgspec.json.encode(det.state_bytes())


def _windows(model_cfg: object, nodes: int, minutes: int, rng: np.random.Generator, **bad: object) -> list:  # type: ignore[type-arg]
    feats = NodeWindowFeatures(window_s=60.0)
    out = []
    for k in range(minutes * 6):
        for n in range(nodes):
            vec = feats.add(gpu_message(f"n{n}", 10.0 * k, rng, **bad))  # type: ignore[arg-type]
            if vec is not None:
                out.append(vec)
    return out


class TestMultivariate:
    def fitted(self, algorithm: str) -> MultivariateModel:
        cfg = msgspec.structs.replace(S.multivariate, algorithm=algorithm)
        model = MultivariateModel(cfg)
        for vec in _windows(cfg, 16, 60, np.random.default_rng(0)):
            model.learn(vec)
        assert model.maybe_refit(now=3600.0)
        return model

    def test_an_unusual_node_window_is_flagged_and_the_model_persists_with_a_version(self) -> None:
        model = self.fitted("robust_covariance")
        assert model.version == 1
        bad = _windows(None, 1, 2, np.random.default_rng(5), hot={g: 4.0 for g in range(8)}, slow={2: 0.1})[0]
        finding = model.judge("bad", bad, now=3700.0)
        assert finding is not None and finding.detector == "robust_covariance"
        restored = MultivariateModel(model.settings)
        restored.load_state(model.state_bytes())
        assert restored.version == 1
        assert np.allclose(restored.score(bad[None, :]), model.score(bad[None, :]))

    def test_robust_covariance_separates_injected_anomalies_better_than_isolation_forest(self) -> None:
        rng = np.random.default_rng(9)
        healthy = _windows(None, 8, 10, rng)
        anomalies = []
        for hot, slow in [(2.0, 0.0), (4.0, 0.0), (0.0, 0.05), (3.0, 0.03), (8.0, 0.2), (20.0, 0.5)]:
            anomalies += _windows(None, 4, 2, rng, hot={3: hot}, slow={1: slow})
        auc = {}
        for algorithm in ("robust_covariance", "isolation_forest"):
            model = self.fitted(algorithm)
            s_ok, s_bad = model.score(np.array(healthy)), model.score(np.array(anomalies))
            auc[algorithm] = float(np.mean(s_bad[:, None] > s_ok[None, :]))
        assert auc["robust_covariance"] >= 0.95, auc
        assert auc["robust_covariance"] > auc["isolation_forest"], auc


class TestBaseline:
    def test_ewma_converges_to_the_stream_mean_and_variance(self) -> None:
        rng = np.random.default_rng(0)
        b = EwmaBaseline.empty((3,))
        for _ in range(4000):
            b.learn(rng.normal([1.0, 5.0, -2.0], [0.5, 1.0, 2.0]), alpha_for_halflife(500))
        assert np.allclose(b.mean, [1.0, 5.0, -2.0], atol=0.2)
        assert np.allclose(np.sqrt(b.var), [0.5, 1.0, 2.0], rtol=0.15)

    def test_merge_of_two_halves_matches_the_moments_of_the_whole(self) -> None:
        rng = np.random.default_rng(1)
        a, b = EwmaBaseline.empty((1,)), EwmaBaseline.empty((1,))
        for x in rng.normal(0, 1, 3000):
            a.learn(np.array([x]), 0.001)
        for x in rng.normal(4, 1, 3000):
            b.learn(np.array([x]), 0.001)
        m = a.merge(b)
        assert m.mean[0] == pytest.approx(2.0, abs=0.25)
        assert np.sqrt(m.var[0]) == pytest.approx(np.sqrt(1 + 4), rel=0.15)  # mixture variance

    def test_bytes_round_trip_and_protection(self) -> None:
        b = EwmaBaseline.empty((2,))
        b.learn(np.array([1.0, 2.0]), 0.1)
        b.learn(np.array([100.0, np.nan]), 0.1, protect=np.array([True, False]))
        assert b.mean.tolist() == [1.0, 2.0] and b.count.tolist() == [1.0, 1.0]
        c = EwmaBaseline.empty((1,))
        c.load_state(b.state_bytes())
        assert np.allclose(c.mean, b.mean) and np.allclose(c.count, b.count)


class TestSkuOffsets:
    """A node in a warm rack slot is a few degrees above its SKU's median every day: judged against
    its own usual place among its peers it is not a fault; a failing fan still is."""

    @staticmethod
    def idle_fleet(settings: str, heat: Callable[[int, int], float], hours: int, seed: int) -> dict[str, list[float]]:
        """Twelve idle nodes n0..n11 for ``hours``, one record a minute; ``heat(i, k)``: the degrees
        node i runs above the rest k seconds in. Returns node -> the hours of its sku_peers findings."""
        fleet = FleetDetection(parse_config(settings).detection)
        rng = np.random.default_rng(seed)
        found: dict[str, list[float]] = {}
        for k in range(0, hours * 3600, 60):
            t = 1000.0 + k
            for i in range(12):
                msg = gpu_message(f"n{i}", t, rng, load=0.0, hot={g: heat(i, k) for g in range(8)})
                fleet.on_gpu(msgspec.structs.replace(msg, sku="H100", metrics=msgspec.structs.replace(
                    msg.metrics, gpu_util=[0.0] * 8)))
            for f in fleet.tick(t):
                if f.detector == "sku_peers":
                    found.setdefault(f.node, []).append(k / 3600)
        return found

    @classmethod
    def run(cls, settings: str) -> dict[str, list[float]]:
        spread = [-2.0, -1.5, -1.0, -0.5, 4.0, 0.5, 1.0, 1.5, 2.0, -1.8, 1.8, 0.0]

        def heat(i: int, k: int) -> float:
            # hours 0-6: the fleet's temperatures spread widely (n4's +4 degC is within it);
            # from hour 6 they are uniform, so n4 stands out; at hour 7 n7's fan fails
            extra = spread[i] if (k < 6 * 3600 or i == 4) else 0.0
            return extra + (9.0 if i == 7 and k >= 7 * 3600 else 0.0)

        return cls.idle_fleet(settings, heat, hours=8, seed=11)

    def test_a_warm_slot_is_learned_and_a_failing_fan_still_stands_out(self) -> None:
        # a spread floor low enough for n4's +4 degC to count, so that only the learned place can excuse it
        without = self.run("detection: {peers: {offset_halflife_s: 0, sku_min_temp_spread_c: 0.5}}")
        assert any(h >= 6 for h in without.get("n4", [])), without  # against the median: a false finding
        learned = self.run("detection: {peers: {offset_halflife_s: 1800, sku_min_temp_spread_c: 0.5}}")
        assert not any(h >= 6 for h in learned.get("n4", [])), learned
        assert any(7 <= h < 7.2 for h in learned.get("n7", [])), learned  # the fan, within minutes

    def test_busy_nodes_are_judged_against_the_median_not_a_learned_place(self) -> None:
        """A busy node's place among its peers follows its job: learning it would make a node that
        hosted a cool job for hours stand out on its next, ordinary one."""
        fleet = FleetDetection(parse_config("detection: {peers: {offset_halflife_s: 600}}").detection)
        rng = np.random.default_rng(3)
        for k in range(0, 3 * 3600, 60):
            for i in range(10):
                msg = gpu_message(f"n{i}", 1000.0 + k, rng, load=0.9)
                fleet.on_gpu(msgspec.structs.replace(msg, sku="H100", metrics=msgspec.structs.replace(
                    msg.metrics, gpu_util=[99.0] * 8)))
            fleet.tick(1000.0 + k)
        assert fleet.sku_peers._offsets == {}
        assert set(fleet._skus) == {"H100 busy"}  # the busy band was judged, with no place learned

    def test_offsets_survive_the_state_round_trip(self) -> None:
        a = PeerComparison(S.peers, detector="sku_peers", learn_offsets=True)
        for k in range(30):
            for i in range(6):
                a.observe(f"n{i}", 100.0 + k, {"gpu_temp": 40.0 + i * 0.3})
            a.evaluate("sku H100 idle", [f"n{i}" for i in range(6)], 100.0 + k)
        b = PeerComparison(S.peers, detector="sku_peers", learn_offsets=True)
        b.load_state(a.state_bytes())
        assert b._offsets == a._offsets and b._offsets
        old = msgspec.msgpack.encode([a._latest, a._since, a._reported])  # a state written before offsets
        c = PeerComparison(S.peers, detector="sku_peers", learn_offsets=True)
        c.load_state(old)
        assert c._offsets == {} and c._latest == a._latest

    def test_a_node_warm_since_its_first_comparison_on_a_tight_fleet_is_not_a_fault(self) -> None:
        """Twelve idle nodes whose temperatures agree within a degree, one of them 5 degC warmer from
        the first sample: it never gets a usual place (it stands out from the start), so only the
        smallest spread it is measured against (``sku_min_temp_spread_c``) keeps it from being
        flagged; a fan failing on another node (+9 degC) is still found."""
        def run(settings: str) -> dict[str, list[float]]:
            return self.idle_fleet(settings, lambda i, k: 5.0 if i == 4 else (9.0 if i == 7 and k >= 2 * 3600 else 0.0),
                                   hours=3, seed=3)

        shipped = run("")
        assert "n4" not in shipped, shipped
        assert any(2 <= h < 2.2 for h in shipped.get("n7", [])), shipped  # the fan, within minutes
        assert "n4" in run("detection: {peers: {sku_min_temp_spread_c: 0.5}}")  # the spread as measured
