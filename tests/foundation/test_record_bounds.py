"""The bounds every decoder keeps: a message's size and its nesting, unknown fields included.

A message over :data:`~fleetmedic.records.MAX_RECORD_BYTES` or nested deeper than
:data:`~fleetmedic.records.MAX_NESTING` is an :class:`~fleetmedic.records.InvalidRecord` for every
record type, before it is parsed, the same whatever the depth of the call stack that decodes it;
the stages dead-letter it and go on. A fuzz (hypothesis) checks the nesting read without parsing
against a plain scanner, on valid JSON and on cut or garbled text, and that decoding any such text
as any record type returns a record or raises :class:`~fleetmedic.records.InvalidRecord`, nothing
else.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter
from typing import Any

import pytest
from aiokafka import TopicPartition
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetmedic import records as r
from fleetmedic.config import KafkaTelemetrySettings, Settings
from fleetmedic.connectors.kafka_telemetry.exporter_map import BadMessage, PointMapper
from fleetmedic.connectors.kernel.kmsg_map import BadRecord, parse_journal
from fleetmedic.connectors.prometheus.history import matrix_columns
from fleetmedic.streams.decide import DecideStage
from fleetmedic.streams.detect import DetectStage
from fleetmedic.streams.outputs import Source
from tests.streams.helpers_fakes import FakeOutputs, consumer_record

TYPES: list[type[Any]] = [*r.RECORD_TYPES, r.DetectionTelemetry, r.AuditRecord]
HEAD = (b'{"type":"gpu_telemetry","schema_version":1,"node":"n1","ts":1790000000.0,"gpus":[0],'
        b'"metrics":{"gpu_temp":[50.0]},"x":')


def _deep(levels: int, head: bytes = HEAD) -> bytes:
    return head + b"[" * levels + b"]" * levels + b"}"


def _nesting(text: bytes) -> int:
    """The deepest nesting of a JSON text's arrays and objects, read as a parser reads it: up to
    an unpaired closing bracket, or to what follows the text's one value (where a parser stops)."""
    depth = deepest = 0
    in_string = escaped = done = False
    for byte in text:
        c = chr(byte)
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
                done = depth == 0
        elif c in " \t\r\n":
            continue
        elif done:
            break
        elif c == '"':
            in_string = True
        elif c in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in "]}":
            if depth == 0:
                break
            depth -= 1
            done = depth == 0
        elif depth == 0 and not c.isalnum() and c not in ".-+":
            break
    return deepest


# --- every record type ----------------------------------------------------------------------------


@pytest.mark.parametrize("record_type", TYPES, ids=lambda t: t.__name__)
def test_an_unknown_field_nested_1000_deep_is_an_invalid_record_of_every_type(record_type: type[Any]) -> None:
    with pytest.raises(r.InvalidRecord) as err:
        r.decode(record_type, _deep(1000))
    assert err.value.path == "$"
    assert err.value.reason == f"refused: arrays and objects nest deeper than {r.MAX_NESTING} levels"


@pytest.mark.parametrize("record_type", TYPES, ids=lambda t: t.__name__)
def test_unpaired_brackets_deeper_than_the_bound_are_an_invalid_record(record_type: type[Any]) -> None:
    with pytest.raises(r.InvalidRecord, match="brackets do not pair"):
        r.decode(record_type, HEAD + b"[" * 5000)


@pytest.mark.parametrize("record_type", TYPES, ids=lambda t: t.__name__)
def test_a_message_over_the_size_bound_is_an_invalid_record(record_type: type[Any]) -> None:
    with pytest.raises(r.InvalidRecord, match="above the limit of 1048576"):
        r.decode(record_type, b" " * (r.MAX_RECORD_BYTES + 1))


def test_a_message_at_the_bound_decodes_however_deep_the_stack() -> None:
    """The bound, not the call stack, decides: 64 levels decode with only 150 frames to spare, 65
    are refused at any depth."""
    within, beyond = _deep(r.MAX_NESTING - 1), _deep(r.MAX_NESTING)  # the message itself is one level

    def at_depth(left: int) -> r.GpuTelemetry:
        if left > 0:
            return at_depth(left - 1)
        return r.decode(r.GpuTelemetry, within)

    spare = sys.getrecursionlimit() - len(_frames()) - 150
    assert at_depth(spare).node == "n1"
    with pytest.raises(r.InvalidRecord, match="deeper than 64"):
        r.decode(r.GpuTelemetry, beyond)


def _frames() -> list[Any]:
    frames, f = [], sys._getframe()
    while f is not None:
        frames.append(f)
        f = f.f_back  # type: ignore[assignment]
    return frames


def test_strings_and_escapes_do_not_count_as_nesting() -> None:
    brackets = json.dumps({"note": "[" * 500 + '\\"{' * 200, "k": "]]]" + "\\" * 7}).encode()
    assert r.json_limit_error(brackets) is None
    assert r.decode(r.JobEvent, brackets[:-1] + b',"job":"a/b","event":"start","ts":1}').job == "a/b"


# --- the stages -----------------------------------------------------------------------------------


def _gpu_record_errors(out: FakeOutputs) -> float:
    return sum(m.value for metric in out.metrics.record_errors.collect() for m in metric.samples
               if m.name.endswith("_total"))


def test_stage_1_dead_letters_a_deep_message_on_each_of_its_topics_and_goes_on() -> None:
    s = Settings()
    out = FakeOutputs(s)
    detect = DetectStage(s, out, out.metrics, 256, 0.5, 60.0, 10.0)
    try:
        for offset, name in enumerate(("telemetry.gpu", "telemetry.port", "kernel.events")):
            topic = s.topics.topic(name)
            asyncio.run(detect._process({TopicPartition(topic, 0): [consumer_record(topic, _deep(1000),
                                                                                      offset=offset)]}))
            assert detect.next_offsets[TopicPartition(topic, 0)] == offset + 1  # consumed, committed next
    finally:
        detect._refits.shutdown(wait=False, cancel_futures=True)
    dead = out.dead_letters()
    assert [d.topic for d in dead] == [s.topics.topic(n) for n in ("telemetry.gpu", "telemetry.port", "kernel.events")]
    assert all(d.error == f"$: refused: arrays and objects nest deeper than {r.MAX_NESTING} levels" for d in dead)
    assert _gpu_record_errors(out) == 0


def test_the_decision_stage_dead_letters_a_deep_message_on_each_of_its_inputs() -> None:
    from fleetmedic.streams.decide import INPUTS

    s = Settings()
    out = FakeOutputs(s)
    decide = DecideStage(s, b"k" * 40, out, out.metrics, None, set())

    async def run() -> None:
        for offset, name in enumerate(INPUTS):
            await decide.handle_record(Source(s.topics.topic(name), 0, offset, b"n1", _deep(1000), -1))

    asyncio.run(run())
    assert len(out.dead_letters()) == len(INPUTS)
    assert all("nest deeper than" in d.error for d in out.dead_letters())
    assert _gpu_record_errors(out) == 0


def test_the_connectors_refuse_a_deep_message_by_the_same_bound() -> None:
    with pytest.raises(BadMessage, match="nest deeper than 64"):
        PointMapper(KafkaTelemetrySettings()).points(_deep(1000, b'{"name":"x","x":'))
    with pytest.raises(BadRecord, match="nest deeper than 64"):
        parse_journal(_deep(1000, b'{"MESSAGE":"x","x":'))
    with pytest.raises(ValueError, match="the answer is refused: arrays and objects nest deeper than 64"):
        matrix_columns(_deep(1000, b'{"status":"success","x":'), Counter())


# --- fuzz -----------------------------------------------------------------------------------------

_TEXT = st.text(alphabet='ab[]{}"\\/:,é\n', max_size=8)
_SCALAR = st.one_of(st.none(), st.booleans(), st.integers(-10, 10), _TEXT)


def _json(max_depth: int) -> st.SearchStrategy[Any]:
    return st.recursive(_SCALAR, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                         st.dictionaries(_TEXT, inner, max_size=3)),
                        max_leaves=max_depth * 2)


@st.composite
def _texts(draw: st.DrawFn) -> bytes:
    """A JSON text nested up to ~100 levels (a chain, with siblings), sometimes cut, garbled, an
    unknown field of a record, or past the size bound."""
    depth = draw(st.integers(0, 100))
    doc: Any = draw(_json(4))
    for _ in range(depth):
        doc = [doc, draw(_SCALAR)] if draw(st.booleans()) else {draw(_TEXT): doc}
    text = json.dumps(doc, ensure_ascii=draw(st.booleans())).encode()
    match draw(st.sampled_from(["whole", "whole", "cut", "garbled", "unknown field", "oversize"])):
        case "cut":
            text = text[: draw(st.integers(0, len(text)))]
        case "garbled":
            at = draw(st.integers(0, len(text)))
            text = text[:at] + draw(st.sampled_from([b"[", b"]", b"{", b'"', b"\\", b"\xff"])) + text[at:]
        case "unknown field":
            text = HEAD + text + b"}"
        case "oversize":  # valid JSON, padded past the size bound
            text = text + b" " * (r.MAX_RECORD_BYTES + 1 - len(text) + draw(st.integers(0, 10)))
    return text


@settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(_texts())
def test_the_nesting_read_without_parsing_is_that_of_a_scanner(text: bytes) -> None:
    refused = r.json_limit_error(text)
    if len(text) > r.MAX_RECORD_BYTES:
        assert refused == f"the message is {len(text)} bytes, above the limit of {r.MAX_RECORD_BYTES}"
        return
    if refused is None:
        assert _nesting(text) <= r.MAX_NESTING  # let through: a parser nests no deeper
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        return
    assert (refused is None) == (_nesting(text) <= r.MAX_NESTING)  # valid JSON: exactly


@settings(max_examples=200, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(_texts(), st.sampled_from(TYPES))
def test_any_text_decodes_to_a_record_or_an_invalid_record(text: bytes, record_type: type[Any]) -> None:
    try:
        record = r.decode(record_type, text)
    except r.InvalidRecord as exc:
        assert exc.record_type == record_type.__name__ and exc.reason
    else:
        assert isinstance(record, record_type)
