"""Fuzz (hypothesis): schema-valid records of every input type through the stages' pure handling.

Records of every type the pipeline reads (``GpuTelemetry``, ``PortTelemetry``, ``KernelEvent``,
``Finding``, ``JobEvent``, ``RemediationResult``, ``NodeObservation``, ``OperatorCommand``; the topics of
:data:`fleetmedic.bus.TOPICS` the stages consume) are made from the records' own schema
(:func:`msgspec.inspect.type_info`: every bound, length, pattern and literal), round-tripped through
the wire encoding (so each one is what a producer could put on the topic), and fed in sequences,
with ticks between them, to stage 1 and the decision stage in process:

- ``test_the_embedded_stages_take_any_valid_record``: :class:`~fleetmedic.sim.embedded.EmbeddedPipeline`
  (``NodeDetection``, ``FleetDetection``, ``DecisionEngine``, as the demo and backtest drive them);
  any exception fails the test;
- ``test_the_kafka_stages_take_any_valid_record_without_a_dead_letter_for_an_exception``: the same
  sequences through :class:`~fleetmedic.streams.detect.DetectStage` and
  :class:`~fleetmedic.streams.decide.DecideStage` with in-process outputs: the per-record guard
  must never have caught anything (``fleetmedic_record_errors_total`` stays 0).

Names come mostly from small pools (nodes, jobs, label keys), so that records meet on the same node
and job; times mostly lie around a moving ``now`` (some far off either way). Results answer the
commands issued so far. CI runs ``FLEETMEDIC_FUZZ_EXAMPLES`` examples (default 100 and 80);
``FLEETMEDIC_FUZZ_EXAMPLES=2000 pytest tests/streams/test_fuzz_stages.py`` is the longer run
(docs/streams.md has its figures).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiokafka import TopicPartition
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st
from msgspec import inspect as mi

from fleetmedic import records as r
from fleetmedic.bus import BY_NAME
from fleetmedic.config import Settings
from fleetmedic.k8s_keys import LABEL_LEAF, LABEL_OPT_OUT, LABEL_POOL, LABEL_RACK, LABEL_RAIL_PREFIX
from fleetmedic.signing import KeySet
from fleetmedic.sim.embedded import EmbeddedPipeline
from fleetmedic.streams.decide import INPUTS as DECIDE_INPUTS
from fleetmedic.streams.decide import DecideStage
from fleetmedic.streams.detect import DetectStage
from fleetmedic.streams.outputs import Source
from tests.streams.helpers_fakes import FakeOutputs, consumer_record

EXAMPLES = int(os.environ.get("FLEETMEDIC_FUZZ_EXAMPLES", "0"))
SHRINK = os.environ.get("FLEETMEDIC_FUZZ_SHRINK", "") not in ("", "0")
BASE = 1_790_000_000.0  # the runs' start (simulated time; in the past of the machine's clock)
NODES = [f"gpu-node-{i}" for i in range(6)]
JOBS = ["team/train-a", "team/train-b", "ml/bert"]
OP_KEY = b"o" * 40
OP_ENV = "FLEETMEDIC_OPERATOR_KEY"
KEYS = KeySet({"op": OP_KEY})
INPUTS = {"telemetry.gpu": r.GpuTelemetry, "telemetry.port": r.PortTelemetry, "findings": r.Finding,
          "jobs.events": r.JobEvent, "remediation.results": r.RemediationResult,
          "cluster.nodes": r.NodeObservation, "remediation.operator": r.OperatorCommand,
          "kernel.events": r.KernelEvent}
XIDS = [13, 31, 43, 45, 48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 119, 120, 154]
LABEL_KEYS = [LABEL_RACK, LABEL_LEAF, LABEL_POOL, LABEL_OPT_OUT, f"{LABEL_RAIL_PREFIX}mlx5_0",
              f"{LABEL_RAIL_PREFIX}mlx5_1", "kubernetes.io/hostname"]


def test_the_fuzzed_types_are_every_input_of_the_stages() -> None:
    """Stage 1 reads the telemetry topics, the decision stage its INPUTS; each with its topic's record."""
    assert set(INPUTS) == {"telemetry.gpu", "telemetry.port", "kernel.events", *DECIDE_INPUTS}
    assert all(BY_NAME[name].value is record for name, record in INPUTS.items())


# --- values from the schema ---------------------------------------------------------------------------

_finite = {"allow_nan": False, "allow_infinity": False}


def _times() -> st.SearchStrategy[float]:
    """Around the run's time (mostly), its edges and far off either way."""
    return st.one_of(st.floats(BASE - 3600, BASE + 7200, **_finite), st.floats(BASE - 3600, BASE + 7200, **_finite),
                     st.floats(BASE - 3600, BASE + 7200, **_finite), st.sampled_from([0.0, 1.0, 4.0e9, BASE + 1e6]),
                     st.floats(0.0, 4.0e9, **_finite))


def _text(info: mi.StrType, name: str) -> st.SearchStrategy[str]:
    lo, hi = info.min_length or 0, info.max_length
    if info.pattern:  # JobRef
        pattern = st.from_regex(info.pattern, fullmatch=True).filter(lambda s: len(s) <= (hi or 10**9))
        return st.one_of(st.sampled_from(JOBS), pattern) if "/" in info.pattern else pattern
    pools: dict[str, list[str]] = {"node": NODES, "device": [*NODES, "leaf-1", "spine-0"], "job": JOBS,
                                   "port": ["mlx5_0/1", "mlx5_1/1", "p1", "p2"], "peer": ["leaf-1:p1", ""],
                                   "detector": ["xid_rules", "thermal", "job_peers", "sku_peers", "straggler",
                                                "port_errors", "ecc", "row_remap", "multivariate", "log"],
                                   "action_hint": ["", "isolate", "RESET_GPU", "RESTART_BM", "RMA", "IGNORE"],
                                   "incident_id": ["", "hardware:node:x", "i-1"],
                                   "sku": ["", "H100-SXM5-80GB", "A100-SXM4-40GB"], "boot_id": ["boot-1", "boot-2"],
                                   "actor": ["alice", "bob"], "command_id": ["c-1", "nothing/at/all/1"]}
    free = st.text(min_size=lo, max_size=min(hi or 40, 40))
    if name in pools:
        pool = [p for p in pools[name] if lo <= len(p) <= (hi or 10**9)]
        return st.one_of(st.sampled_from(pool), st.sampled_from(pool), free) if pool else free
    return free


def _value(t: Any, name: str = "") -> st.SearchStrategy[Any]:
    """Any value of msgspec type ``t`` (``name``: the field, for pools and times)."""
    if isinstance(t, mi.Metadata):
        return _value(t.type, name)
    if isinstance(t, mi.FloatType):
        if t.ge == 0.0 and t.le == 4.0e9:
            return _times()
        lo = t.ge if t.ge is not None else -1e12
        hi = t.le if t.le is not None else 1e12
        return st.one_of(st.floats(lo, hi, **_finite), st.sampled_from([lo, hi, (lo + hi) / 2]))
    if isinstance(t, mi.IntType):
        lo = t.ge if t.ge is not None else -(2**31)
        hi = t.le if t.le is not None else 2**63 - 1
        if name in ("gpu",):
            hi = min(hi, 9)
        return st.one_of(st.integers(lo, min(hi, lo + 20)), st.integers(lo, hi))
    if isinstance(t, mi.BoolType):
        return st.booleans()
    if isinstance(t, mi.StrType):
        return _text(t, name)
    if isinstance(t, mi.BytesType):
        return st.binary(max_size=16)
    if isinstance(t, mi.NoneType):
        return st.none()
    if isinstance(t, mi.LiteralType):
        return st.sampled_from(t.values)
    if isinstance(t, mi.UnionType):
        return st.one_of(*(_value(x, name) for x in t.types))
    if isinstance(t, mi.ListType):
        return st.lists(_value(t.item_type, name), min_size=t.min_length or 0, max_size=min(t.max_length or 4, 4))
    if isinstance(t, mi.DictType):
        keys = (st.sampled_from(LABEL_KEYS) | _value(t.key_type)) if name == "labels" else _value(t.key_type)
        return st.dictionaries(keys, _value(t.value_type), max_size=4)
    if isinstance(t, mi.StructType):
        return _struct(t)
    raise NotImplementedError(f"no strategy for {t!r}")


def _struct(info: mi.StructType) -> st.SearchStrategy[Any]:
    required = {f.name: _value(f.type, f.name) for f in info.fields if f.required}
    optional = {f.name: _value(f.type, f.name) for f in info.fields if not f.required and f.name != "schema_version"}
    return st.fixed_dictionaries(required, optional=optional).map(lambda kw: _build(info.cls, kw))


def _build(cls: type[Any], kw: dict[str, Any]) -> Any:
    try:
        return cls(**kw)
    except (ValueError, TypeError):  # a rule across fields (__post_init__): not schema-valid
        return None


@st.composite
def _gpu_telemetry(draw: st.DrawFn) -> r.GpuTelemetry | None:
    """A node's GPUs: every reported metric with one value (or null) per GPU, as the schema requires."""
    gpus = draw(st.one_of(st.just(list(range(8))), st.lists(st.integers(0, 255), min_size=1, max_size=9,
                                                            unique=True)))
    info = mi.type_info(r.GpuMetrics)
    assert isinstance(info, mi.StructType)
    columns: dict[str, Any] = {}
    for f in info.fields:
        item = f.type.types[0].item_type  # list[X | None] | None
        if draw(st.integers(0, 9)) == 0:
            continue  # no GPU reported it
        values = draw(st.lists(st.one_of(_value(item, f.name), st.none()) if draw(st.booleans()) else
                               _value(item, f.name), min_size=len(gpus), max_size=len(gpus)))
        columns[f.name] = [None if v is None else v for v in values]
    xids = draw(st.lists(st.builds(r.XidEvent, gpu=st.sampled_from(gpus) | st.integers(0, 255),
                                   xid=st.sampled_from(XIDS) | st.integers(0, 100_000), ts=_times()), max_size=3))
    return _build(r.GpuTelemetry, dict(node=draw(_text(mi.StrType(1, 253, None), "node")), ts=draw(_times()),
                                       gpus=gpus, metrics=r.GpuMetrics(**columns), xids=xids,
                                       sku=draw(_text(mi.StrType(None, None, None), "sku")),
                                       boot_id=draw(_text(mi.StrType(None, None, None), "boot_id"))))


@st.composite
def _operator_command(draw: st.DrawFn) -> r.OperatorCommand | None:
    """Mostly one the schema's rules across fields let through (a node for node actions, expiry after issue)."""
    issued = draw(_times())
    action = draw(st.sampled_from(["resume_breaker", "clear_node", "node_repaired"]))
    return _build(r.OperatorCommand, dict(
        id=draw(st.sampled_from(["op-1", "op-2"]) | st.text(min_size=1, max_size=12)), action=action,
        actor=draw(st.sampled_from(["alice", "bob"])), reason=draw(st.text(min_size=1, max_size=20)),
        issued_at=issued, expires_at=min(4.0e9, issued + draw(st.sampled_from([0.0, 600.0, 86_400.0, 1e7]))),
        node=draw(st.sampled_from(NODES) if action != "resume_breaker" else st.sampled_from(["", *NODES]))))


def _record(name: str) -> st.SearchStrategy[Any]:
    if name == "telemetry.gpu":
        return _gpu_telemetry()
    if name == "remediation.operator":
        return st.one_of(_operator_command(), _operator_command(), _struct(_info(r.OperatorCommand)))
    return _struct(_info(INPUTS[name]))


def _info(record_type: type[Any]) -> mi.StructType:
    info = mi.type_info(record_type)
    assert isinstance(info, mi.StructType)
    return info


def _valid(record: Any) -> Any:
    """The record as a consumer decodes it (so it is schema-valid), or None."""
    if record is None:
        return None
    try:
        return r.decode(type(record), r.encode(record))
    except r.InvalidRecord:
        return None


@dataclass
class Step:
    topic: str  # a logical input topic, "tick" or "result_of_issued"
    record: Any = None
    dt: float = 0.0  # the run's time moves on by this before the step
    pick: int = 0  # result_of_issued: which command
    outcome: str = "applied"
    sign: bool = False  # an operator command: signed with the operator key


def _steps() -> st.SearchStrategy[Step]:
    dts = st.sampled_from([0.0, 0.5, 10.0, 30.0, 60.0, 301.0, 900.0])
    records = [st.builds(Step, topic=st.just(name), record=_record(name).map(_valid), dt=dts,
                         sign=st.booleans()) for name in INPUTS]
    return st.one_of(*records, st.builds(Step, topic=st.just("tick"), dt=dts),
                     st.builds(Step, topic=st.just("result_of_issued"), dt=dts, pick=st.integers(0, 50),
                               outcome=st.sampled_from(["applied", "skipped", "failed"])))


def _runs(examples: int) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """CI: a fixed set of examples, no shrinking (an example takes up to a second here: shrinking a
    failure took over five minutes). ``FLEETMEDIC_FUZZ_EXAMPLES=N``: N random examples;
    ``FLEETMEDIC_FUZZ_SHRINK=1``: shrink a failure to a small example."""
    phases = [Phase.explicit, Phase.reuse, Phase.generate] + ([Phase.shrink] if SHRINK else [])
    return settings(max_examples=EXAMPLES or examples, deadline=None, derandomize=not EXAMPLES, phases=phases,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                           HealthCheck.data_too_large])


def _signed(cmd: r.OperatorCommand, sign: bool) -> r.OperatorCommand:
    return KEYS.sign(cmd) if sign else cmd


def _result(cmd: r.RemediationCommand, outcome: str, ts: float) -> r.RemediationResult:
    return r.RemediationResult(command_id=cmd.id, action=cmd.action, outcome=outcome, ts=ts,  # type: ignore[arg-type]
                               node=cmd.node, job=cmd.job, dry_run=cmd.dry_run)


def _settings() -> Settings:
    return Settings()


# --- the embedded stages -------------------------------------------------------------------------------


@_runs(100)
@given(st.lists(_steps(), min_size=8, max_size=30))
def test_the_embedded_stages_take_any_valid_record(steps: list[Step]) -> None:
    pipeline = EmbeddedPipeline(_settings(), key=b"k" * 40)
    now = BASE
    for step in steps:
        now += step.dt
        rec = step.record
        if step.topic == "tick":
            pipeline.tick(now)
        elif step.topic == "result_of_issued":
            if pipeline.out.commands:
                cmd = pipeline.out.commands[step.pick % len(pipeline.out.commands)]
                pipeline.result(_result(cmd, step.outcome, now), now)
        elif rec is None:
            continue  # not schema-valid after all
        elif step.topic == "telemetry.gpu":
            pipeline.gpu([rec], now)
        elif step.topic == "telemetry.port":
            pipeline.port(rec, now)
        elif step.topic == "kernel.events":
            for finding in pipeline.node_stage.on_kernel(rec):  # stage 1's part, its findings to the engine
                pipeline.finding(finding, now)
        elif step.topic == "findings":
            pipeline.finding(rec, now)
        elif step.topic == "jobs.events":
            pipeline.job(rec, now)
        elif step.topic == "remediation.results":
            pipeline.result(rec, now)
        elif step.topic == "cluster.nodes":
            pipeline.observation(rec, now)
        elif step.topic == "remediation.operator":
            pipeline.operator(_signed(rec, step.sign), KEYS, now)
    pipeline.tick(now + 3600)  # timeouts, settle windows, probation: everything due fires
    assert pipeline.engine.state.clock <= now + 3600
    out = pipeline.out
    event(f"findings {min(len(out.findings), 3)}, incidents {min(len(out.incidents), 3)}, "
          f"commands {min(len(out.commands), 3)}, dead letters {min(len(out.dead_letters), 1)}")


# --- the Kafka stages, in process ------------------------------------------------------------------------


@_runs(80)
@given(st.lists(_steps(), min_size=8, max_size=30))
def test_the_kafka_stages_take_any_valid_record_without_a_dead_letter_for_an_exception(steps: list[Step]) -> None:
    s = _settings()
    before = os.environ.get(OP_ENV)
    os.environ[OP_ENV] = OP_KEY.decode()  # the decision stage's operator key (signing.operator_key_env)
    try:
        asyncio.run(_through_the_kafka_stages(s, steps))
    finally:
        if before is None:
            os.environ.pop(OP_ENV, None)
        else:
            os.environ[OP_ENV] = before


async def _through_the_kafka_stages(s: Settings, steps: list[Step]) -> None:
    out = FakeOutputs(s)
    detect = DetectStage(s, out, out.metrics, 256, 0.5, 60.0, 10.0)
    decide = DecideStage(s, b"k" * 40, out, out.metrics, None, set())
    now, offset = BASE, 0
    bound = s.streams.max_future_skew_s
    commands = s.topics.topic("remediation.commands")
    try:
        for step in steps:
            now += step.dt
            offset += 1
            rec = step.record
            if step.topic == "tick":
                await decide._apply_tick(decide.clock.observe(now))
                continue
            if step.topic == "result_of_issued":
                issued = [r.decode(r.RemediationCommand, v) for t, _, v in out.sent if t == commands]
                if not issued:
                    continue
                step = Step("remediation.results", _result(issued[step.pick % len(issued)], step.outcome, now))
                rec = step.record
            if rec is None:
                continue
            if step.topic == "remediation.operator":
                rec = _signed(rec, step.sign)
            topic = s.topics.topic(step.topic)
            # the broker's timestamp is the run's now: the time bound judges records against it
            raw = consumer_record(topic, r.encode(rec), offset=offset, timestamp_ms=int(now * 1000))
            if step.topic in ("telemetry.gpu", "telemetry.port", "kernel.events"):
                await detect._process({TopicPartition(topic, 0): [raw]})
                # what stage 1 forwards reaches the decision stage
                for t, key, value in list(out.sent):
                    if t == detect.summaries:
                        await decide.handle_record(Source(t, 0, offset, key, value, int(now * 1000)))
                out.sent = [x for x in out.sent if x[0] != detect.summaries]
            else:
                await decide.handle_record(Source.of_record(raw))
            assert decide.clock.now() <= now + bound  # no record moved the clock beyond the bound
            findings = s.topics.topic("findings")
            for t, key, value in [x for x in out.sent if x[0] == findings]:  # findings come back, as on the broker
                await decide.handle_record(Source(t, 0, offset, key, value, int(now * 1000)))
            out.sent = [x for x in out.sent if x[0] != findings]
        await decide._apply_tick(decide.clock.observe(now + 3600))
    finally:
        detect._refits.shutdown(wait=False, cancel_futures=True)
    caught = [(m.labels, m.value) for metric in out.metrics.record_errors.collect() for m in metric.samples
              if m.name.endswith("_total") and m.value]
    failed = [d for d in out.dead_letters() if d.exception]
    assert not caught and not failed, f"the per-record guard caught: {caught}; {[(d.error, d.frame) for d in failed]}"
    commands_out = [r.decode(r.RemediationCommand, v) for t, _, v in out.sent if t == commands]
    assert all(c.issued_at <= now + 3600 + bound for c in commands_out)
    event(f"steps {min(len(steps), 10) // 5 * 5}+, commands {min(len(commands_out), 3)}, "
          f"dead letters {min(len(out.dead_letters()), 1)}")


def test_the_fuzz_makes_valid_records_of_every_input_type() -> None:
    """The strategies are not vacuous: most records of each input type are schema-valid."""
    for name, record_type in INPUTS.items():
        made = _draws(_record(name).map(_valid), 30)
        valid = [x for x in made if x is not None]
        assert all(isinstance(x, record_type) for x in valid)
        assert len(valid) >= len(made) // 2, f"{name}: {len(valid)} of {len(made)} valid"


def _draws(strategy: st.SearchStrategy[Any], n: int) -> list[Any]:
    made: list[Any] = []

    @settings(max_examples=n, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(strategy)
    def one(x: Any) -> None:
        made.append(x)

    one()
    return made
