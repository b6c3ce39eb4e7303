"""The simulator is deterministic per seed: the same seed, config and commands give byte-identical
records and truth; another seed gives another run; the fault plan does not depend on the telemetry
noise settings; and the core never reads the wall clock."""

from __future__ import annotations

import hashlib
import time

import pytest

from fleetmedic.evaluation.truth import TruthRecord
from fleetmedic.records import RemediationCommand, encode
from fleetmedic.sim.engine import SimConfig, Simulator
from fleetmedic.sim.fleet import FleetSpec
from fleetmedic.sim.telemetry import NoiseSpec


def _digest(config: SimConfig, commands: list[RemediationCommand] | None = None) -> tuple[str, list[TruthRecord]]:
    sim = Simulator(config)
    h = hashlib.sha256()
    pending = sorted(commands or [], key=lambda c: c.issued_at)
    for out in sim.run():
        while pending and pending[0].issued_at <= sim.now:
            sim.submit(pending.pop(0))
        assert out.gpu is not None
        h.update(out.gpu.encode_jsonl())
        if out.ports is not None:
            h.update(out.ports.encode_jsonl())
        for e in out.job_events + out.results:  # type: ignore[operator]
            h.update(encode(e))
    for t in sim.truth():
        h.update(repr(t).encode())
    h.update(repr(sim.accounting()).encode())
    return h.hexdigest(), sim.truth()


CFG = SimConfig(fleet=FleetSpec(nodes=12, nodes_per_su=4), duration_s=1800, seed=5, faults="mix:8")


def test_same_seed_gives_byte_identical_output() -> None:
    assert _digest(CFG)[0] == _digest(CFG)[0]


def test_same_seed_and_same_commands_give_identical_closed_loop_runs() -> None:
    t0 = CFG.start
    cmds = [
        RemediationCommand(id="c1", action="cordon", incident_id="i", reason="test", issued_at=t0 + 600,
                           expires_at=t0 + 900, node="gpu-node-0002"),
        RemediationCommand(id="c2", action="drain", incident_id="i", reason="test", issued_at=t0 + 620,
                           expires_at=t0 + 900, node="gpu-node-0002"),
    ]
    assert _digest(CFG, cmds)[0] == _digest(CFG, cmds)[0]
    assert _digest(CFG, cmds)[0] != _digest(CFG)[0]


def test_another_seed_gives_another_run() -> None:
    a, ta = _digest(CFG)
    b, tb = _digest(SimConfig(**{**CFG.__dict__, "seed": 6}))
    assert a != b
    assert [(t.kind, t.node, t.onset) for t in ta] != [(t.kind, t.node, t.onset) for t in tb]


def test_fault_plan_is_independent_of_noise_settings() -> None:
    quiet = SimConfig(**{**CFG.__dict__, "noise": NoiseSpec.named("none")})
    heavy = SimConfig(**{**CFG.__dict__, "noise": NoiseSpec.named("heavy")})
    plan = [[(f.kind, f.node, f.gpu, f.nic, f.leaf, f.onset, f.end) for f in Simulator(c).faults.faults]
            for c in (CFG, quiet, heavy)]
    assert plan[0] == plan[1] == plan[2]


def test_core_never_reads_the_wall_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom() -> float:
        raise AssertionError("the simulator read the wall clock")

    monkeypatch.setattr(time, "time", boom)
    monkeypatch.setattr(time, "time_ns", boom)
    monkeypatch.setattr(time, "monotonic", boom)
    sim = Simulator(SimConfig(fleet=FleetSpec(nodes=4), duration_s=600, seed=1, faults="xid79@2m"))
    assert sum(1 for _ in sim.run()) == 60
    assert sim.now == pytest.approx(CFG.start + 600)
