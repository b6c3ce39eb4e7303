"""Every Kafka producer of fleetmedic is idempotent with ``acks=all``, and every client
takes the ``kafka`` section's metadata refresh.

- Each ``AIOKafkaProducer(...)`` in the package is built from :func:`fleetmedic.bus.producer_options`
  or names ``acks="all"`` and ``enable_idempotence=True`` itself (found by parsing the source, so a
  new construction site is checked too).
- :func:`producer_options` gives idempotence and ``acks=all`` by default, keeps them for decisions
  whatever ``kafka.acks`` says, and builds a producer aiokafka accepts.
- Faust's own producer and consumer (the decision stage) take ``producer_acks=-1`` and the same
  ``metadata_max_age_ms``; Faust makes its producer idempotent only inside transactions, and the
  stages write every record through their own idempotent producer (fleetmedic.streams.outputs).
"""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from fleetmedic.bus import DECISIONS, client_options, producer_options
from fleetmedic.config import ConfigError, Settings, parse_config

PACKAGE = Path(__file__).resolve().parents[2] / "fleetmedic"


def _constructions() -> list[tuple[str, ast.Call]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and (getattr(node.func, "id", None) == "AIOKafkaProducer"
                                               or getattr(node.func, "attr", None) == "AIOKafkaProducer"):
                found.append((f"{path.relative_to(PACKAGE.parent)}:{node.lineno}", node))
    return found


def _idempotent(call: ast.Call) -> bool:
    spread = [k.value for k in call.keywords if k.arg is None]
    if any(isinstance(v, ast.Call) and getattr(v.func, "id", None) == "producer_options" for v in spread):
        return not {k.arg for k in call.keywords} & {"acks", "enable_idempotence"}  # nothing overrides it
    named = {k.arg: k.value for k in call.keywords if k.arg}
    acks, idem = named.get("acks"), named.get("enable_idempotence")
    return (isinstance(acks, ast.Constant) and acks.value == "all"
            and isinstance(idem, ast.Constant) and idem.value is True)


def test_every_producer_of_the_package_is_idempotent_with_acks_all() -> None:
    sites = _constructions()
    places = {site.split(":")[0] for site, _ in sites}
    # the connectors, the job watcher, the executor, ctl, both stages and the simulator's producers
    assert {"fleetmedic/connectors/runtime.py", "fleetmedic/connectors/kube/jobs.py",
            "fleetmedic/executor/service.py", "fleetmedic/cli/ctl.py", "fleetmedic/streams/outputs.py",
            "fleetmedic/streams/state.py", "fleetmedic/sim/kafka_producer.py"} <= places, places
    assert not [site for site, call in sites if not _idempotent(call)], "producers not idempotent with acks=all"


def test_the_source_check_tells_an_idempotent_producer_from_one_that_is_not() -> None:
    def call(src: str) -> ast.Call:
        node = ast.parse(src).body[0]
        assert isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
        return node.value

    assert _idempotent(call("AIOKafkaProducer(linger_ms=5, **producer_options(k))"))
    assert _idempotent(call('AIOKafkaProducer(**client_options(k), acks="all", enable_idempotence=True)'))
    assert not _idempotent(call('AIOKafkaProducer(acks="all", **client_options(k))'))
    assert not _idempotent(call("AIOKafkaProducer(acks=1, **producer_options(k))"))
    assert not _idempotent(call('AIOKafkaProducer(**client_options(k), acks="all", enable_idempotence=False)'))


def test_producer_options_are_idempotent_unless_acks_are_relaxed_outside_decisions() -> None:
    k = Settings().kafka
    assert (producer_options(k)["acks"], producer_options(k)["enable_idempotence"]) == ("all", True)
    relaxed = parse_config("kafka: {acks: '1'}\n", env={}).kafka
    assert (producer_options(relaxed)["acks"], producer_options(relaxed)["enable_idempotence"]) == (1, False)
    assert (producer_options(relaxed, DECISIONS)["acks"],
            producer_options(relaxed, DECISIONS)["enable_idempotence"]) == ("all", True)
    assert producer_options(k, client_id="x-executor")["client_id"] == "x-executor"

    async def build() -> None:  # aiokafka accepts them (it refuses idempotence without acks=all)
        AIOKafkaProducer(**producer_options(k))
        AIOKafkaProducer(**producer_options(relaxed))

    asyncio.run(build())


def test_metadata_max_age_is_configurable_and_a_client_may_ask_for_a_shorter_one() -> None:
    assert client_options(Settings().kafka)["metadata_max_age_ms"] == 30_000
    k = parse_config("kafka: {metadata_max_age_ms: 10000}\n", env={}).kafka
    assert client_options(k)["metadata_max_age_ms"] == 10_000
    assert client_options(k, metadata_max_age_ms=5000)["metadata_max_age_ms"] == 5000
    with pytest.raises(ConfigError, match="metadata_max_age_ms"):
        parse_config("kafka: {metadata_max_age_ms: 10}\n", env={})

    async def consumer() -> int:
        c = AIOKafkaConsumer(**client_options(k, metadata_max_age_ms=5000), enable_auto_commit=False)
        return int(c._client._metadata_max_age_ms)

    assert asyncio.run(consumer()) == 5000


def test_the_faust_app_takes_acks_all_and_the_metadata_refresh() -> None:
    from fleetmedic.streams.app import build_app

    app = build_app(parse_config("kafka: {metadata_max_age_ms: 12000}\n", env={}), datadir="/nonexistent")
    assert app.conf.producer_acks == -1
    assert app.conf.consumer_metadata_max_age_ms == app.conf.producer_metadata_max_age_ms == 12_000
