"""The example subscribers in examples/subscribers/ (Go and Node, standard library only) against
commands the real worker produced through the real broker.

The worker (``fleetmedic worker`` as a subprocess, tests/streams/harness.py) turns an XID 79 into
signed commands on ``remediation.commands``. A Python helper reads them back from the broker with
aiokafka, headers included, and writes each as the line ``kcat -C -J`` prints (the bridge the
examples document: kcat is not installed here). Each subscriber must accept every one of them
(signature header over the exact value bytes, the published JSON Schema, the expiry), print what
it would do, and refuse a record with one changed byte, a changed signature, a missing header, a
key id it does not hold (a retired key), and a correctly signed body that breaks the schema.

Go and Node are needed: missing, these tests fail under ``FLEETMEDIC_REQUIRE_SERVICES=1`` (CI) and
are skipped otherwise.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiokafka import AIOKafkaConsumer

from fleetmedic import records as r
from fleetmedic.devenv import settings
from fleetmedic.signing import KEY_ID_HEADER, SIGNATURE_HEADER, KeySet, load_key, sign_bytes, verify_bytes
from fleetmedic.streams.app import ensure_topics
from tests.streams.harness import KEY, new_run, produce, worker
from tests.streams.test_worker import JOB, NODES, SICK, T0, _telemetry

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "subscribers"
SCHEMA = ROOT / "deploy" / "schemas" / "RemediationCommand.schema.json"
KEY_ID = "command"  # fleetmedic.signing.DEFAULT_COMMAND_KEY_ID: the worker's command key


def _require(tool: str) -> str:
    found = shutil.which(tool)
    if not found:
        why = f"{tool} is missing (the example subscribers are built and run with it)"
        if settings.services_required():
            pytest.fail(why, pytrace=False)
        pytest.skip(why)
    return found


def kcat_line(rec: Any) -> str:
    """One record as ``kcat -C -J`` prints it: the headers a flat name, value, ... array (only when
    the record has headers), the key and the value bytes as JSON strings."""
    env: dict[str, Any] = {"topic": rec.topic, "partition": rec.partition, "offset": rec.offset,
                           "tstype": "create", "ts": rec.timestamp, "broker": -1}
    if rec.headers:
        env["headers"] = [x for name, value in rec.headers for x in (name, value.decode("utf-8"))]
    env["key"] = rec.key.decode("utf-8") if rec.key is not None else None
    env["payload"] = rec.value.decode("utf-8") if rec.value is not None else None
    return json.dumps(env, ensure_ascii=False, separators=(",", ":"))


async def _read_all(bootstrap: str, topic: str, done: Callable[[list[Any]], bool], timeout: float) -> list[Any]:
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                enable_auto_commit=False, metadata_max_age_ms=2000)
    await consumer.start()
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    try:
        while not done(got) and time.monotonic() < deadline:
            for recs in (await consumer.getmany(timeout_ms=500)).values():
                got += recs
        return got
    finally:
        await consumer.stop()


@pytest.fixture(scope="module")
def produced(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> list[Any]:
    """The records the real worker put on ``remediation.commands`` (aiokafka ConsumerRecords)."""
    run = new_run(kafka_bootstrap, tmp_path_factory.mktemp("subscribers"))
    asyncio.run(ensure_topics(run.settings))
    ranks = [r.RankPlacement(rank=i, node=n, gpus=list(range(8))) for i, n in enumerate(NODES)]
    placement = r.JobEvent(job=JOB, event="placement", ts=T0, world_size=4, placement=ranks)
    jobs, gpu = run.topic("jobs.events"), run.topic("telemetry.gpu")
    asyncio.run(produce(kafka_bootstrap, [(jobs, JOB.encode(), r.encode(e))
                                          for e in (placement, r.JobEvent(job=JOB, event="start", ts=T0))]))
    telemetry = [(gpu, m.node.encode(), r.encode(m)) for m in _telemetry(6, 3, np.random.default_rng(7))]

    def done(recs: list[Any]) -> bool:
        cmds = {(c.action, c.node or c.job) for c in (r.decode(r.RemediationCommand, x.value) for x in recs)}
        return {("cordon", SICK), ("restart_job", JOB)} <= cmds

    with worker(run):
        asyncio.run(produce(kafka_bootstrap, telemetry))
        recs = asyncio.run(_read_all(kafka_bootstrap, run.topic("remediation.commands"), done, timeout=60))
    assert done(recs), f"the worker issued no cordon and restart_job: {[x.value for x in recs]}"
    return recs


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("keys")
    (d / "command.key").write_text(KEY + "\n")  # a trailing newline, as in a mounted Secret: stripped
    (d / "other.key").write_text("another-key-that-signed-nothing-here-0123456789\n")
    return {"command": d / "command.key", "other": d / "other.key"}


def _go(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    go = _require("go")
    out = tmp_path_factory.getbasetemp() / "subscriber-go"
    if not out.exists():
        build = subprocess.run([go, "build", "-o", str(out), "."], cwd=EXAMPLES / "go", capture_output=True,
                               text=True, timeout=300)
        assert build.returncode == 0, build.stdout + build.stderr
        vet = subprocess.run([go, "vet", "."], cwd=EXAMPLES / "go", capture_output=True, text=True, timeout=300)
        assert vet.returncode == 0, vet.stdout + vet.stderr
    return [str(out)]


def _node(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return [_require("node"), str(EXAMPLES / "node" / "subscriber.mjs")]


SUBSCRIBERS = {"go": _go, "node": _node}


@pytest.fixture(params=sorted(SUBSCRIBERS))
def subscriber(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
               keys: dict[str, Path]) -> Callable[..., subprocess.CompletedProcess[str]]:
    cmd = SUBSCRIBERS[request.param](tmp_path_factory)
    dash = "-" if request.param == "go" else "--"  # Go's flag package takes -name; parseArgs --name

    def run(lines: list[str], now: float, key_ids: tuple[str, ...] = ("command",)) -> subprocess.CompletedProcess[str]:
        argv = [*cmd, f"{dash}schema", str(SCHEMA), f"{dash}now", repr(now)]
        for kid in key_ids:
            argv += [f"{dash}key", f"{KEY_ID if kid == 'command' else kid}={keys[kid]}"]
        return subprocess.run(argv, input="".join(line + "\n" for line in lines), capture_output=True, text=True,
                              timeout=60)

    return run


def _now(recs: list[Any]) -> float:
    """A time at which none of the worker's commands has expired (they carry the event time)."""
    return max(r.decode(r.RemediationCommand, x.value).issued_at for x in recs)


def test_the_worker_signs_the_bytes_it_produces(produced: list[Any]) -> None:
    ring = KeySet({KEY_ID: load_key(KEY)}, what="command key")
    for rec in produced:
        assert dict(rec.headers)[KEY_ID_HEADER] == KEY_ID.encode()
        assert verify_bytes(rec.value, rec.headers, ring) == KEY_ID


def test_each_subscriber_accepts_every_command_and_prints_what_it_would_do(
        produced: list[Any], subscriber: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    run = subscriber([kcat_line(x) for x in produced], now=_now(produced))
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert len(lines) == len(produced) and all(line.startswith("OK ") for line in lines), run.stdout
    for rec, line in zip(produced, lines, strict=True):
        cmd = r.decode(r.RemediationCommand, rec.value)
        assert f"would {cmd.action} " in line and cmd.id in line, line
    assert any(f"would cordon node {SICK}" in line for line in lines), run.stdout
    assert any(f"would restart_job job {JOB}" in line for line in lines), run.stdout


def _changed_byte(rec: Any) -> str:
    """The record with one byte of its value changed, inside a string, so that it still decodes and
    still fits the schema: only the signature can tell."""
    value = bytearray(rec.value)
    at = value.index(b'"reason":"') + len(b'"reason":"')
    value[at] = ord("X") if value[at] != ord("X") else ord("Y")
    doc = json.loads(kcat_line(rec))
    doc["payload"] = value.decode("utf-8")
    return json.dumps(doc, ensure_ascii=False)


def _edited(rec: Any, **changes: Any) -> str:
    doc = json.loads(kcat_line(rec))
    doc.update(changes)
    return json.dumps(doc, ensure_ascii=False)


def test_each_subscriber_refuses_a_record_with_one_changed_byte_and_other_forgeries(
        produced: list[Any], subscriber: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    rec, now = produced[0], _now(produced)
    headers = dict(rec.headers)
    sig = headers[SIGNATURE_HEADER].decode()
    flipped = sig[:-1] + ("0" if sig[-1] != "0" else "1")
    # a body that breaks the schema, signed with the right key: the schema check must catch it
    bad_body = json.loads(rec.value)
    bad_body["action"] = "explode"
    bad_value = json.dumps(bad_body, separators=(",", ":")).encode()
    resigned = [x for name, value in sign_bytes(bad_value, KEY_ID, load_key(KEY)) for x in (name, value.decode())]
    cases = {
        "one changed byte": (_changed_byte(rec), "signature"),
        "a changed signature": (_edited(rec, headers=[SIGNATURE_HEADER, flipped, KEY_ID_HEADER, KEY_ID]), "signature"),
        "no headers": (_edited(rec, headers=[]), "signature"),
        "a key id it does not hold": (_edited(rec, headers=[SIGNATURE_HEADER, sig, KEY_ID_HEADER, "retired"]),
                                      "signature"),
        "a body that breaks the schema": (_edited(rec, headers=resigned, payload=bad_value.decode()), "schema"),
    }
    for what, (line, reason) in cases.items():
        run = subscriber([line], now=now)
        assert run.returncode == 1, f"{what}: {run.stdout}{run.stderr}"
        assert run.stdout.startswith(f"REJECTED {rec.partition}/{rec.offset}: {reason}"), f"{what}: {run.stdout}"
    # and expired: the same good record, read too late
    cmd = r.decode(r.RemediationCommand, rec.value)
    run = subscriber([kcat_line(rec)], now=cmd.expires_at + 1)
    assert run.returncode == 1 and "expired" in run.stdout, run.stdout
    # in a stream, the good records are still accepted around a bad one
    run = subscriber([kcat_line(produced[0]), _changed_byte(produced[1]), *map(kcat_line, produced[1:])], now=now)
    assert run.returncode == 1
    assert [line.split(" ", 1)[0] for line in run.stdout.splitlines()] == ["OK", "REJECTED"] + ["OK"] * (
        len(produced) - 1), run.stdout


def test_each_subscriber_follows_a_key_rotation(
        produced: list[Any], subscriber: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    """During the overlap the subscriber holds the old and the new key and accepts both; once the
    old key is removed from it, what that key signed is refused."""
    lines, now = [kcat_line(x) for x in produced], _now(produced)
    assert subscriber(lines, now=now, key_ids=("other", "command")).returncode == 0
    run = subscriber(lines, now=now, key_ids=("other",))
    assert run.returncode == 1 and run.stdout.count("is not accepted") == len(produced), run.stdout


def test_the_kcat_and_openssl_line_in_operations_verifies_and_refuses(
        produced: list[Any], keys: dict[str, Path], tmp_path: Path) -> None:
    """The shell loop of docs/operations.md ("Subscribing from another system"), lifted as written,
    with a stand-in ``kcat`` that prints the envelope lines of the real records (and one changed byte)."""
    for tool in ("bash", "jq", "openssl"):
        _require(tool)
    page = (ROOT / "docs" / "operations.md").read_text()
    m = re.search(r"```bash\n(kcat -C -b \$KAFKA -t fleetmedic\.remediation\.commands -J -u \| while .+?\ndone)\n```",
                  page, re.S)
    assert m, "the kcat + openssl loop is gone from docs/operations.md"
    script = m.group(1).replace("/etc/fleetmedic/signing/signing-key", str(keys["command"]))
    lines = tmp_path / "records.jsonl"
    lines.write_text("".join(x + "\n" for x in [*map(kcat_line, produced), _changed_byte(produced[0])]))
    fake = tmp_path / "bin" / "kcat"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\ncat {lines}\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}", "KAFKA": "localhost:9092"}
    run = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    out = run.stdout.splitlines()
    assert [line.split(":")[0].split(" ")[0] for line in out] == ["verified"] * len(produced) + ["REJECTED"], run.stdout
    assert out[-1] == f"REJECTED offset {produced[0].offset}"
