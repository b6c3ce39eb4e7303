"""The multivariate model's persisted state: bytes, export and restore time, state-topic cost.

    .venv/bin/python bench/bench_model_state.py [--nodes 1000] [--cap 20000] [--rounds 3]

Stage 1 saves the model as its training rows (``ModelPart``: 44 bytes a row, no pickle) with,
for robust_covariance, the fitted arrays (loaded as they are); an isolation forest is refitted.
This measures, for each algorithm, a model at the cap (``--cap`` rows of its last fit) plus one
refit interval of rows learned since (``--nodes`` x 3600 s / 300 s windows):

- the part's bytes, the time to export it and to restore it (decode, and the forest's refit);
- the baseline, measured in the same run: the fitted scikit-learn object pickled (what the
  package used to write: an injection path), its bytes and its load time; the ratios;
- the state-topic cost: stage 1 rewrites the part at each checkpoint where it changed
  (``streams.detect_snapshot_every_s``, 60 s), against the telemetry of those 60 s
  (1,940 bytes per 8-GPU message, docs/streams.md) at 10 s and 1 s sampling.
"""

from __future__ import annotations

import argparse
import pickle  # the baseline only: the package itself never pickles
import time
from functools import partial

import msgspec
import numpy as np
from numpy.typing import NDArray

from fleetmedic.config import Settings
from fleetmedic.models.multivariate import FEATURES, MultivariateModel

TELEMETRY_BYTES = 1940  # one 8-GPU GpuTelemetry message, every dcgm field (docs/streams.md, bench part 5)


def build(algorithm: str, nodes: int, cap: int) -> MultivariateModel:
    settings = msgspec.structs.replace(Settings().detection.multivariate, algorithm=algorithm, max_training_windows=cap)
    model = MultivariateModel(settings)
    rng = np.random.default_rng(0)
    mean = np.array([2.0, 3.0, 20.0, 30.0, 0.01, 0.2, 0.1, 0.1])
    spread = np.array([0.5, 0.7, 5.0, 8.0, 0.01, 0.3, 0.2, 0.2])
    for k in range(cap):
        model.learn(np.abs(rng.normal(mean, spread)), f"gpu-node-{k % nodes:05d}", 300.0 * (k // nodes))
    assert model.maybe_refit(now=1e7)
    for k in range(nodes * 12):  # one refit interval (3600 s) of 300 s windows, not fitted yet
        model.learn(np.abs(rng.normal(mean, spread)), f"gpu-node-{k % nodes:05d}", 1e7 + 300.0 * (k // nodes))
    return model


def best(fn, rounds: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--cap", type=int, default=Settings().detection.multivariate.max_training_windows)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    probe = np.abs(np.random.default_rng(1).normal(3.0, 2.0, size=(200, len(FEATURES))))
    print(f"{a.nodes} nodes, cap {a.cap} rows; {a.nodes * 12} rows learned since the fit; best of {a.rounds}")
    for algorithm in ("robust_covariance", "isolation_forest"):
        measure(algorithm, a.nodes, a.cap, a.rounds, probe)


def measure(algorithm: str, nodes: int, cap: int, rounds: int, probe: NDArray[np.float64]) -> None:
    model = build(algorithm, nodes, cap)
    part = model.state_bytes()
    export_s = best(model.state_bytes, rounds)

    def restored() -> MultivariateModel:
        into = MultivariateModel(model.settings)
        into.load_state(part)
        return into

    restore_s = best(restored, rounds)
    exact = np.array_equal(restored().score(probe), model.score(probe))
    pickled = pickle.dumps({"forest": model._forest, "ref": model._ref, "spread": model._spread,
                            "location": model._location, "precision": model._precision})
    unpickle_s = best(partial(pickle.loads, pickled), rounds)
    print(f"\n{algorithm}:")
    print(f"  part: {len(part):,} bytes ({len(part) / max(1, model.trained_on + nodes * 12):.1f} per row); "
          f"export {export_s * 1000:.1f} ms; restore {restore_s * 1000:.0f} ms; "
          f"scores equal after restore: {exact}")
    print(f"  baseline, pickled fitted model: {len(pickled):,} bytes, load {unpickle_s * 1000:.2f} ms "
          f"(fitted model only: the rows learned since are lost)")
    print(f"  ratio part/pickle: bytes {len(part) / len(pickled):.2f}x, restore time {restore_s / unpickle_s:.0f}x")
    for interval in (10.0, 1.0):
        telemetry = nodes * (60.0 / interval) * TELEMETRY_BYTES
        print(f"  state topic per 60 s checkpoint vs telemetry at {interval:g} s sampling: "
              f"{len(part):,} / {telemetry:,.0f} bytes = {len(part) / telemetry:.3f}x")

if __name__ == "__main__":
    main()
