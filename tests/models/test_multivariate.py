"""The multivariate model's persistence without pickle: training rows as plain arrays, refitted on
restore, exactly (same rows + seed = same model, same scores), split by node and merged again,
bounded by ``multivariate.max_training_windows``; and stage 1's multivariate memory (open
windows, outlier streaks, the model) carried across a restore with the same findings after it."""

from __future__ import annotations

import ast
from pathlib import Path

import msgspec
import numpy as np
import pytest
from numpy.typing import NDArray

import fleetmedic
from fleetmedic.config import MultivariateSettings, Settings
from fleetmedic.devenv.synth import gpu_message
from fleetmedic.models.multivariate import FEATURES, MultivariateModel
from fleetmedic.models.multivariate_state import ModelPart
from fleetmedic.models.stages import NodeDetection

NODES = [f"n{i}" for i in range(12)]


def _settings(algorithm: str = "robust_covariance", **kw: object) -> MultivariateSettings:
    return msgspec.structs.replace(Settings().detection.multivariate, algorithm=algorithm, **kw)


def _learned(settings: MultivariateSettings, windows: int = 400, seed: int = 0) -> MultivariateModel:
    rng = np.random.default_rng(seed)
    model = MultivariateModel(settings)
    for k in range(windows):
        vec = np.abs(rng.normal([2.0, 3.0, 20.0, 30.0, 0.01, 0.2, 0.1, 0.1], [0.5, 0.7, 5.0, 8.0, 0.01, 0.3, 0.2, 0.2]))
        model.learn(vec, NODES[k % len(NODES)], 300.0 * (k // len(NODES)))
    return model


def _probe(seed: int = 7) -> NDArray[np.float64]:
    rng = np.random.default_rng(seed)
    return np.abs(rng.normal([2.5, 3.0, 25.0, 35.0, 0.05, 1.0, 0.5, 0.5], [2.0, 2.0, 20.0, 30.0, 0.05, 2.0, 1.0, 1.0],
                             size=(50, len(FEATURES))))


@pytest.mark.parametrize("algorithm", ["robust_covariance", "isolation_forest"])
def test_a_restored_model_scores_exactly_as_the_one_saved_and_goes_on_alike(algorithm: str) -> None:
    model = _learned(_settings(algorithm))
    assert model.maybe_refit(now=10_000.0) and model.version == 1
    for k in range(30):  # learned after the fit: pending, not yet in the model
        model.learn(np.full(len(FEATURES), 1.0 + k / 10), NODES[k % 3], 20_000.0 + k)

    restored = MultivariateModel(model.settings)
    restored.load_state(model.state_bytes())
    assert (restored.version, restored.fitted_at, restored.trained_on) == (1, 10_000.0, model.trained_on)
    assert np.array_equal(restored.score(_probe()), model.score(_probe()))  # equal, not close
    assert restored.state_bytes() == model.state_bytes()
    # and the next refit (on the fit's rows and those learned since) is the same model too
    assert model.maybe_refit(now=20_000.0) and restored.maybe_refit(now=20_000.0)
    assert np.array_equal(restored.score(_probe()), model.score(_probe())) and restored.version == 2


def test_a_refit_run_elsewhere_equals_one_in_place_and_keeps_what_was_learned_meanwhile() -> None:
    # the worker runs the fit in a thread and goes on judging and learning with the current fit
    inline, planned = _learned(_settings()), _learned(_settings())
    assert inline.maybe_refit(now=10_000.0)
    job = planned.plan_refit(now=10_000.0)
    assert job is not None and planned.plan_refit(now=10_001.0) is None  # one at a time
    assert not planned.fitted  # still judging with the previous fit (none yet) until installed
    fit = job.run()
    planned.learn(np.full(len(FEATURES), 2.0), "n1", 10_500.0)  # learned while the fit ran
    planned.forget({"n2"})  # n2 moved to another worker meanwhile
    planned.install(job, fit)
    assert planned.version == inline.version == 1 and planned.fitted_at == inline.fitted_at
    assert np.array_equal(planned.score(_probe()), inline.score(_probe()))  # the same fit
    assert [(ts, n) for ts, n, _ in planned._pending] == [(10_500.0, "n1")]
    assert "n2" not in {n for _, n, _ in planned._trained} and len(planned._trained) < len(inline._trained)


def test_parts_split_by_node_and_merged_again_fit_the_same_model() -> None:
    model = _learned(_settings())
    model.maybe_refit(now=10_000.0)
    model.learn(np.full(len(FEATURES), 2.0), "n1", 12_000.0)
    even = model.state_bytes(lambda node: int(node[1:]) % 2 == 0)
    odd = model.state_bytes(lambda node: int(node[1:]) % 2 == 1)
    merged = MultivariateModel(model.settings)
    assert merged.load_parts([odd, even]) == 400 + 1  # the fit's rows and the one learned since
    assert np.array_equal(merged.score(_probe()), model.score(_probe()))
    assert merged.state_bytes() == model.state_bytes()  # rows in canonical order, wherever they came from
    # one part alone (a worker that takes over half the partitions): the fit it was written with,
    # and only those nodes' rows for the next fit
    half = MultivariateModel(model.settings)
    half.load_parts([even])
    assert np.array_equal(half.score(_probe()), model.score(_probe())) and half.version == model.version
    assert len(half.healthy) == sum(1 for k in range(400) if k % len(NODES) % 2 == 0) == 200


def test_an_isolation_forest_is_refitted_from_its_rows_and_a_changed_algorithm_refits_too() -> None:
    forest = _learned(_settings("isolation_forest"))
    forest.maybe_refit(now=10_000.0)
    mcd = MultivariateModel(_settings())  # the operator switched the algorithm: refit on the rows
    mcd.load_parts([forest.state_bytes()])
    assert mcd.fitted and mcd.trained_on == 400 and np.isfinite(mcd.score(_probe())).all()
    reference = _learned(_settings())
    reference.maybe_refit(now=10_000.0)
    assert np.array_equal(mcd.score(_probe()), reference.score(_probe()))


def test_the_rows_kept_are_bounded_by_max_training_windows_and_the_state_by_44_bytes_a_row() -> None:
    model = _learned(_settings(max_training_windows=100, min_training_windows=64), windows=1000)
    assert len(model.healthy) == 100
    assert [ts for ts, _, _ in model.healthy] == sorted(ts for ts, _, _ in model.healthy)  # the newest
    assert model.maybe_refit(now=1e6) and model.trained_on == 100
    for k in range(1000):
        model.learn(np.ones(len(FEATURES)), NODES[0], 2e6 + k)
    size = len(model.state_bytes())
    assert size < 200 * 44 + 1000, size  # at most twice the cap: the fit's rows and the newest since


def test_bytes_that_are_not_a_model_part_are_refused_with_the_reason() -> None:
    model = MultivariateModel(_settings())
    with pytest.raises(ValueError, match="model part"):
        model.load_parts([b"\x93not a part"])
    part = msgspec.msgpack.decode(_learned(_settings(), windows=10).state_bytes(), type=ModelPart)
    other = msgspec.structs.replace(part, features=["gpu_temp_spread"])
    with pytest.raises(ValueError, match="features"):
        model.load_parts([msgspec.msgpack.encode(other)])
    short = msgspec.structs.replace(part, trained_x=part.pending_x, pending_x=b"\x00" * 4)
    with pytest.raises(ValueError, match="inconsistent"):
        model.load_parts([msgspec.msgpack.encode(short)])
    assert model.version == 0 and np.isnan(model.score(_probe())).all()  # nothing half-loaded


def test_no_module_of_the_package_uses_pickle() -> None:
    """Loading pickles from a topic is an injection path: no pickle (nor its relatives) anywhere."""
    banned = {"pickle", "cPickle", "dill", "cloudpickle", "joblib", "shelve", "marshal"}
    offenders = []
    for path in Path(fleetmedic.__file__).parent.rglob("*.py"):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module.split(".")[0]]
            elif (isinstance(node, ast.keyword) and node.arg == "allow_pickle"
                  and not (isinstance(node.value, ast.Constant) and node.value.value is False)):
                offenders.append(f"{path}:{node.value.lineno}: allow_pickle")
            offenders += [f"{path}:{getattr(node, 'lineno', 0)}: {n}" for n in names if n in banned]
    assert not offenders, offenders


def test_stage1_restored_mid_stream_finds_and_learns_exactly_as_one_never_restored() -> None:
    """Node states (GPU, open windows, streaks) and the model's parts, split as two partitions,
    restored into a fresh NodeDetection: from there on the same findings and the same model."""
    detection = msgspec.structs.replace(Settings().detection, multivariate=_settings(
        window_s=30.0, min_training_windows=12, refit_interval_s=120.0))
    rng = np.random.default_rng(3)

    def batch(k: int) -> list:  # type: ignore[type-arg]
        odd = {g: 2.0 + 0.2 * k for g in range(4)} if k > 60 else None  # n5 drifts into an unusual combination
        return [gpu_message(n, 10.0 * k + 0.5, rng, hot=odd if n == "n5" else None) for n in NODES]

    batches = [batch(k) for k in range(1, 121)]
    live = NodeDetection(detection)
    found_live = [f.id for b in batches for f in live.on_gpu(b)]

    first = NodeDetection(detection)
    found = [f.id for b in batches[:50] for f in first.on_gpu(b)]
    assert first.model.version >= 1  # fitted before the "checkpoint"
    partition = {n: i % 2 for i, n in enumerate(NODES)}
    parts = [first.model.state_bytes(lambda node, p=p: partition[node] == p) for p in (0, 1)]  # type: ignore[misc]
    nodes = {n: (first.gpu.node_bytes(n), first.multivariate_bytes(n)) for n in NODES}

    second = NodeDetection(detection)
    for n, (gpu, mv) in nodes.items():
        if gpu is not None:
            second.gpu.load_node(n, gpu)
        second.load_multivariate(n, mv)
    second.model.load_parts(parts)
    found += [f.id for b in batches[50:] for f in second.on_gpu(b)]

    assert found == found_live
    assert any(":robust_covariance:" in f for f in found_live), "the drifting node was not flagged"
    assert second.model.state_bytes() == live.model.state_bytes() and second.model.version == live.model.version


def test_stage1_refitting_in_a_thread_plans_on_the_same_rows_and_ends_with_the_same_model() -> None:
    """Refits submitted to a thread pool (as the detect worker runs them) are planned at the same
    windows as in place; judging goes on with the current fit meanwhile; waiting for the last one
    gives the model of a stage that refitted in place."""
    from concurrent.futures import ThreadPoolExecutor

    detection = msgspec.structs.replace(Settings().detection, multivariate=_settings(
        window_s=30.0, min_training_windows=12, refit_interval_s=60.0))
    rng = np.random.default_rng(5)
    batches = [[gpu_message(n, 10.0 * k + 0.5, rng) for n in NODES] for k in range(1, 121)]
    inline = NodeDetection(detection)
    for b in batches:
        inline.on_gpu(b)
    with ThreadPoolExecutor(max_workers=1) as pool:
        threaded = NodeDetection(detection)
        threaded.refit_runner = pool.submit
        for b in batches:
            threaded.on_gpu(b)
        running = threaded.refit_running()
        threaded.install_refit()  # as a checkpoint does
    assert inline.model.version >= 5 and threaded.model.version == inline.model.version
    assert threaded.refit_running() is None and (running is None or running.done())
    assert threaded.model.state_bytes() == inline.model.state_bytes()
    assert np.array_equal(threaded.model.score(_probe()), inline.model.score(_probe()))
