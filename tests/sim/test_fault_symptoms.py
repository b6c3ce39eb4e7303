"""Every fault kind produces the symptoms it claims (its truth record's ``symptoms``), on its own
component; negative controls and software faults produce none of the signals that would justify
isolating a node; the truth record describes the fault that was injected."""

from __future__ import annotations

import numpy as np
import pytest

from fleetmedic.sim import xids
from fleetmedic.sim.batch import GPU_FIELD_INDEX
from fleetmedic.sim.faults import KINDS
from fleetmedic.sim.telemetry import HW_POWER_BRAKE, HW_SLOWDOWN, HW_THERMAL
from tests.sim.helpers_symptoms import NODE, ONSET_S, SUB, Run, check, pinned, run, small_config

SOFTWARE = [k for k, v in KINDS.items() if v.fault_class in ("negative_control", "transient_software", "job_bug")]
_runs: dict[str, Run] = {}


def _run(spec: str) -> Run:
    if spec not in _runs:
        _runs[spec] = run(small_config(spec, duration_s=3300.0))
    return _runs[spec]


def _spec(kind: str) -> str:
    if kind == "hbm_degradation":  # reach the uncorrectable error within the run
        return f"{kind}@{int(ONSET_S)}s+30m/{NODE}/{SUB}"
    return pinned(kind)


@pytest.mark.parametrize("kind", list(KINDS))
def test_fault_kind_produces_the_symptoms_it_claims(kind: str) -> None:
    r = _run(_spec(kind))
    truth = r.sim.truth()
    assert len(truth) == 1, f"{kind} was not injected"
    t = truth[0]
    assert t.symptoms, f"{kind} claims no symptoms"
    missing = {s: why for s in t.symptoms if (why := check(r, t, s)) is not None}
    assert not missing, f"{kind}: {missing}"


@pytest.mark.parametrize("kind", list(KINDS))
def test_truth_record_matches_the_injected_fault(kind: str) -> None:
    r = _run(_spec(kind))
    (t,) = r.sim.truth()
    info = KINDS[kind]
    fleet = r.sim.fleet
    assert t.kind == kind and t.fault_class == info.fault_class and t.expected_response == info.expected
    assert t.component == info.component
    if info.target in ("gpu", "nic", "node"):
        assert t.node == fleet.node_names[NODE]
        assert t.onset == pytest.approx(r.sim.start + ONSET_S, abs=0.01)
    if info.target == "gpu":
        assert t.gpu == SUB
        assert {b.kind for b in t.blame} == {"gpu", "node"}
    if info.component == "switch":
        assert [b.kind for b in t.blame] == ["switch"]
        assert t.node == "" and len(t.nodes) == 4 and set(t.isolate_nodes) == set(t.nodes)
    if info.component == "job":
        assert [b.kind for b in t.blame] == ["job"] and t.job in t.affected_jobs
    if info.fault_class in ("transient_software", "job_bug", "negative_control"):
        assert t.isolate_nodes == []
    if info.component in ("nic", "link"):
        assert t.switch.startswith("leaf-") and t.port
    assert t.end >= t.onset


def _isolating_signals(r: Run) -> list[str]:
    """Signals a detector could rightly isolate a node for."""
    out = []
    for node, _gpu, code, _ts in r.xids:
        if xids.isolating(code):
            out.append(f"XID {code} on node {node}")
    for n in range(r.sim.fleet.n):
        _t, reasons = r.gpu_series(n, "clocks_event_reasons")
        bad = np.nan_to_num(reasons, nan=0).astype(np.int64) & (HW_SLOWDOWN | HW_THERMAL | HW_POWER_BRAKE)
        if bad.any():
            out.append(f"HW throttle on node {n}")
        _, dbe = r.gpu_series(n, "ecc_dbe_vol_total")
        if np.nansum(dbe) > 0:
            out.append(f"DBE on node {n}")
        _, temp = r.gpu_series(n, "gpu_temp")
        if _absent_rows_in_a_row(temp) >= 3:  # what detection needs (gpu_missing_after_samples)
            out.append(f"GPU missing on node {n}")
        _, width = r.gpu_series(n, "pcie_link_width")
        if (width < 16).any():
            out.append(f"PCIe width low on node {n}")
    for rec in r.ports:
        for p in rec.ports:
            if p.effective_ber is not None and p.effective_ber > 1e-12:
                out.append(f"BER on {rec.device}:{p.port}")
    return sorted(set(out))


def _absent_rows_in_a_row(temp: np.ndarray) -> int:
    """The longest run of rows in which a GPU is missing while others of its node report."""
    miss = np.isnan(temp) & ~np.isnan(temp).all(axis=1, keepdims=True)
    longest = 0
    for g in range(temp.shape[1]):
        run_ = 0
        for m in miss[:, g].tolist():
            run_ = run_ + 1 if m else 0
            longest = max(longest, run_)
    return longest


@pytest.mark.parametrize("kind", SOFTWARE)
def test_software_faults_and_negative_controls_show_no_isolating_signal(kind: str) -> None:
    r = _run(_spec(kind))
    assert r.sim.truth(), f"{kind} was not injected"
    assert _isolating_signals(r) == []


def test_a_fault_free_run_shows_no_isolating_signal() -> None:
    assert _isolating_signals(_run("none")) == []


def test_straggler_slows_its_gpu_and_the_whole_job_not_its_neighbours() -> None:
    r = _run(pinned("straggler"))
    (t,) = r.sim.truth()
    ts, clk = r.gpu_series(NODE, "sm_clock")
    _, util = r.gpu_series(NODE, "gpu_util")
    busy = (ts > t.onset + 60) & (util[:, SUB] > 50)
    assert np.nanmedian(clk[busy, SUB]) < 0.96 * np.nanmedian(np.delete(clk[busy], SUB, axis=1))
    job = t.affected_jobs[0]
    prog = [e for e in r.events if e.event == "progress" and e.job == job and e.rank is None]
    before = np.median([e.step_time_s for e in prog if e.ts < t.onset])
    after = np.median([e.step_time_s for e in prog if e.ts > t.onset + 120])
    s = float(t.params["slowdown"])
    assert after > before * (1 + 0.4 * s)


def test_leaf_failure_hits_every_node_behind_it_and_only_them() -> None:
    r = _run(pinned("leaf_switch").split("/")[0])
    (t,) = r.sim.truth()
    fleet = r.sim.fleet
    behind = set(t.nodes)
    down_hosts = {rec.device for rec in r.ports
                  if t.onset + 30 < rec.ts < t.end and any(p.link_state == "down" for p in rec.ports)
                  and rec.device_kind == "host"}
    assert down_hosts == behind
    assert behind == {fleet.node_names[i] for i in fleet.leaf_nodes(fleet.leaf_index[t.switch])}


def test_hbm_degradation_climbs_before_it_fails() -> None:
    r = _run(_spec("hbm_degradation"))
    (t,) = r.sim.truth()
    ts, sbe = r.gpu_series(NODE, "ecc_sbe_vol_total")
    s = sbe[:, SUB]
    fail_at = t.onset + float(t.params["fail_after_s"])
    early = s[(ts > t.onset) & (ts < t.onset + 600)]
    late = s[(ts > fail_at - 600) & (ts < fail_at)]
    rate_early = (early[-1] - early[0]) / 600
    rate_late = (late[-1] - late[0]) / 600
    assert rate_late > 5 * rate_early
    codes = [c for n, _g, c, x in r.xids if n == NODE and x > t.onset]
    assert codes.index(63) < codes.index(48)


def test_xid_gauge_holds_the_last_xid_until_an_exporter_restart_or_reboot() -> None:
    r = _run(pinned("xid48"))
    ts, gauge = r.gpu_series(NODE, "xid_errors")
    (t,) = r.sim.truth()
    after = gauge[ts > t.onset + 30, SUB]
    assert set(np.unique(after[~np.isnan(after)])) <= {63.0, 48.0, 0.0}
    assert (after == 63).any()  # 48 then 63 within a second: the gauge shows the last one
    assert GPU_FIELD_INDEX["xid_errors"] >= 0


def test_pcie_width_recovers_when_the_degradation_ends() -> None:
    """The link is back at full width once the fault's truth window closes: a detector still seeing
    x8 afterwards would be scored against a fault that is over."""
    r = _run(f"pcie_degradation@{int(ONSET_S)}s+10m/{NODE}/{SUB}")
    (t,) = r.sim.truth()
    ts, width = r.gpu_series(NODE, "pcie_link_width")
    during = (ts > t.onset + 30) & (ts < t.end - 30)
    after = ts > t.end + 30
    assert during.any() and after.any()
    assert (width[during, SUB] < 16).all()
    assert (width[after, SUB] == 16).all()
