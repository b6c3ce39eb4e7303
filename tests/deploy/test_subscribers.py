"""The example subscribers in examples/subscribers/ (Go and Node, standard library only) against
commands the real worker produced through the real broker.

The worker (``fleetmedic worker`` as a subprocess, tests/streams/helpers_harness.py) turns an XID 79 into
signed commands on ``remediation.commands``. A Python helper reads them back from the broker with
aiokafka, headers included, and writes each as the line ``kcat -C -J`` prints (the bridge the
examples document: kcat is not installed here). Each subscriber must accept every one of them
(signature header over the exact value bytes, the published JSON Schema, the expiry), print what
it would do, and refuse a record with one changed byte, a changed signature, a missing header, a
key id it does not hold (a retired key), and a correctly signed body that breaks the schema.

The worker signs with the command key under the id its config names (``signing.key_id``:
``2026-12`` here, a key that replaced ``2026-11``), so the same records also carry a key rotation
through the real executor (:class:`~fleetmedic.executor.service.ExecutorService` on the real broker
and API server, its keys loaded from the config as ``fleetmedic executor`` loads them): holding the
old and the new key it takes what the worker signed and commands the old key signed that are still
in flight; with the old key removed from its config it refuses what that key signed, with the
reason in a dead letter.

Go and Node are needed: missing, these tests fail under ``FLEETMEDIC_REQUIRE_SERVICES=1`` (CI) and
are skipped otherwise.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiokafka import AIOKafkaConsumer

from fleetmedic import records as r
from fleetmedic.config import parse_config
from fleetmedic.devenv.kafka import produce
from fleetmedic.devenv.synth import gpu_message
from fleetmedic.devenv.waiting import wait
from fleetmedic.signing import (
    KEY_ID_HEADER,
    SIGNATURE_HEADER,
    KeySet,
    command_keys,
    load_key,
    sign,
    sign_bytes,
    verify_bytes,
)
from fleetmedic.streams.app import ensure_topics
from tests.conftest import require_tool
from tests.streams.helpers_harness import KEY, Run, collect_sync, new_run, worker
from tests.streams.helpers_worker import JOB, NODES, SICK

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "subscribers"
SCHEMA = ROOT / "deploy" / "schemas" / "RemediationCommand.schema.json"
KEY_ID = "2026-12"  # the worker's signing.key_id: it signs with KEY under this id
OLD_KEY_ID, OLD_KEY = "2026-11", "the-command-key-before-2026-12-0123456789abcdef"  # the key it replaced


def _require(tool: str) -> str:
    return require_tool(tool, why="the example subscribers are built and run with it")


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


def _telemetry(t0: float, samples: int, xid_at: int, rng: np.random.Generator) -> list[r.GpuTelemetry]:
    """As tests/streams/test_worker.py's, from ``t0``: an XID 79 on GPU 3 of the sick node."""
    out = []
    for k in range(samples):
        t = t0 + 10 * (k + 1)
        for n in NODES:
            xids = [r.XidEvent(gpu=3, xid=79, ts=t)] if n == SICK and k == xid_at else None
            out.append(gpu_message(n, t, rng, xids=xids))
    return out


@pytest.fixture(scope="module")
def worker_run(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Run, list[Any]]:
    """The run and the records the real worker put on ``remediation.commands`` (aiokafka
    ConsumerRecords). Event time starts 90 s before now, and commands live 30 minutes, so that the
    executor may still act on them at the end of the module."""
    run = new_run(kafka_bootstrap, tmp_path_factory.mktemp("subscribers"),
                  extra=f"signing: {{key_id: '{KEY_ID}', command_ttl_s: 1800}}\n")
    asyncio.run(ensure_topics(run.settings))
    t0 = time.time() - 90
    ranks = [r.RankPlacement(rank=i, node=n, gpus=list(range(8))) for i, n in enumerate(NODES)]
    placement = r.JobEvent(job=JOB, event="placement", ts=t0, world_size=4, placement=ranks)
    jobs, gpu = run.topic("jobs.events"), run.topic("telemetry.gpu")
    asyncio.run(produce(kafka_bootstrap, [(jobs, JOB.encode(), r.encode(e))
                                          for e in (placement, r.JobEvent(job=JOB, event="start", ts=t0))]))
    telemetry = [(gpu, m.node.encode(), r.encode(m)) for m in _telemetry(t0, 6, 3, np.random.default_rng(7))]

    def done(recs: list[Any]) -> bool:
        cmds = {(c.action, c.node or c.job) for c in (r.decode(r.RemediationCommand, x.value) for x in recs)}
        return {("cordon", SICK), ("restart_job", JOB)} <= cmds

    with worker(run):
        asyncio.run(produce(kafka_bootstrap, telemetry))
        recs = asyncio.run(_read_all(kafka_bootstrap, run.topic("remediation.commands"), done, timeout=60))
    assert done(recs), f"the worker issued no cordon and restart_job: {[x.value for x in recs]}"
    return run, recs


@pytest.fixture(scope="module")
def produced(worker_run: tuple[Run, list[Any]]) -> list[Any]:
    return worker_run[1]


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("keys")
    (d / "command.key").write_text(KEY + "\n")  # a trailing newline, as in a mounted Secret: stripped
    (d / "other.key").write_text("another-key-that-signed-nothing-here-0123456789\n")
    (d / "old.key").write_text(OLD_KEY + "\n")
    return {"command": d / "command.key", "other": d / "other.key", "old": d / "old.key"}


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


@pytest.fixture(params=[pytest.param(name, marks=[pytest.mark.node] if name == "node" else [])
                        for name in sorted(SUBSCRIBERS)])
def subscriber(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
               keys: dict[str, Path]) -> Callable[..., subprocess.CompletedProcess[str]]:
    cmd = SUBSCRIBERS[request.param](tmp_path_factory)
    dash = "-" if request.param == "go" else "--"  # Go's flag package takes -name; parseArgs --name

    def run(lines: list[str], now: float, key_ids: tuple[str, ...] = ("command",)) -> subprocess.CompletedProcess[str]:
        argv = [*cmd, f"{dash}schema", str(SCHEMA), f"{dash}now", repr(now)]
        for kid in key_ids:
            name = {"command": KEY_ID, "old": OLD_KEY_ID}.get(kid, kid)
            argv += [f"{dash}key", f"{name}={keys[kid]}"]
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


def _signed_with_the_old_key(rec: Any) -> str:
    """``rec``'s value as the decision stage signed it before the switch: the old key, its id."""
    signed = sign_bytes(rec.value, OLD_KEY_ID, load_key(OLD_KEY))
    return _edited(rec, headers=[x for name, value in signed for x in (name, value.decode())])


def test_each_subscriber_follows_a_key_rotation(
        produced: list[Any], subscriber: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    """During the overlap the subscriber holds the old and the new key and accepts what either
    signed; once the old key is removed from it, what that key signed is refused, and what the new
    one signed still accepted; without the new key, what it signed is refused."""
    new, now = [kcat_line(x) for x in produced], _now(produced)
    old = [_signed_with_the_old_key(x) for x in produced[:2]]
    overlap = subscriber([*old, *new], now=now, key_ids=("other", "old", "command"))
    assert overlap.returncode == 0 and overlap.stdout.count("OK ") == len(old) + len(new), overlap.stdout
    after = subscriber([*old, *new], now=now, key_ids=("command",))
    assert after.returncode == 1, after.stdout
    assert [line.split(" ", 1)[0] for line in after.stdout.splitlines()] == ["REJECTED"] * len(old) + ["OK"] * len(new)
    assert after.stdout.count(f'key id "{OLD_KEY_ID}" is not accepted') == len(old), after.stdout
    run = subscriber(new, now=now, key_ids=("other",))
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


Signed = tuple[str, bytes, bytes, list[tuple[str, bytes]]]  # command id, record key, value, headers


class _Executor:
    """The executor service (as ``fleetmedic executor`` runs it) on its own thread and event loop."""

    def __init__(self, api: Any, s: Any, keys: KeySet, identity: str) -> None:
        from fleetmedic.executor.kube import KubeCluster
        from fleetmedic.executor.service import ExecutorService

        self.service = ExecutorService(s, keys, KubeCluster(api, instance=identity), identity)
        self.loop = asyncio.new_event_loop()
        self.stop = asyncio.Event()
        self.thread = threading.Thread(target=lambda: self.loop.run_until_complete(self.service.run(self.stop)),
                                       daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(timeout=30)
        assert not self.thread.is_alive(), f"{self.service.identity} did not stop"



def test_the_executor_follows_a_command_key_rotation_on_the_real_broker(
        worker_run: tuple[Run, list[Any]], keys: dict[str, Path], kube_api: Any, namespace: str,
        kafka_bootstrap: str) -> None:
    """Step 1/2 of the rotation: the executor holds the old key (``signing.command_keys``) and the new
    one (the active key, what the worker signs with): it takes every command the worker signed and
    the old key's commands still in flight. Step 3: the old key leaves the executor's config; a
    command the old key signed is refused (dead-lettered, naming the id), one the new key signed
    is taken. No process restarts together with another."""
    run, produced = worker_run
    # the worker's config with one signing section (a key given twice is a config error)
    worker = "".join(line for line in run.config.read_text().splitlines(keepends=True)
                     if not line.startswith("signing:"))
    base = worker + (
        "executor:\n"
        f"  diagnostics_namespace: {namespace}\n"
        f"  lease_namespace: {namespace}\n"
        "  lease_duration_s: 3.0\n"
        "signing:\n"
        f"  key_id: '{KEY_ID}'\n"
        "  command_ttl_s: 1800\n"
        f"  key_file: {keys['command']}\n")
    overlap = parse_config(base + f"  command_keys: [{{id: '{OLD_KEY_ID}', key_file: {keys['old']}}}]\n", env={})
    after = parse_config(base, env={})
    commands, results, dead = (run.topic(t) for t in ("remediation.commands", "remediation.results", "deadletter"))

    def decide(node: str, kid: str = OLD_KEY_ID, text: str = OLD_KEY) -> Signed:
        """A command as the decision stage signs it with the key ``kid`` (by default: the old one,
        before the switch): the in-body signature and the headers."""
        now, key = time.time(), load_key(text)
        cmd = sign(r.RemediationCommand(id=f"rotation/{node}", action="cordon", incident_id="inc-rotation",
                                        reason=f"signed with {kid}", issued_at=now, expires_at=now + 600, node=node,
                                        dry_run=True), key)
        value = r.encode(cmd)
        return cmd.id, node.encode(), value, sign_bytes(value, kid, key)

    async def send(records: list[Signed]) -> None:
        from aiokafka import AIOKafkaProducer

        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
        await producer.start()
        try:
            for _, key, value, headers in records:
                await producer.send_and_wait(commands, key=key, value=value, headers=headers)
        finally:
            await producer.stop()

    in_flight = [decide(f"rotation-node-{i}") for i in range(2)]
    asyncio.run(send(in_flight))
    ring = command_keys(overlap.signing, {})
    assert set(ring.keys) == {KEY_ID, OLD_KEY_ID}
    started = time.monotonic()
    ex = _Executor(kube_api, overlap, ring, "rotation-overlap")
    try:
        wait("a result for every command", lambda: ex.service.results_published >= len(produced) + len(in_flight),
              timeout=60)
    finally:
        ex.close()

    retired = decide("rotation-node-late")  # the old key, after it left the executor's config
    by_new = decide("rotation-node-new", KEY_ID, KEY)
    asyncio.run(send([retired, by_new]))
    ring = command_keys(after.signing, {})
    assert set(ring.keys) == {KEY_ID}
    ex = _Executor(kube_api, after, ring, "rotation-after")
    try:
        wait("the record the new key signed", lambda: ex.service.results_published >= 1, timeout=60)
        letters = wait("the refused record's dead letter", lambda: [
            x for x in (r.decode(r.DeadLetter, v) for v in collect_sync(
                kafka_bootstrap, [dead], lambda c: bool(c.by_topic), timeout=5).values(dead)) if x.stage == "executor"],
            timeout=30)
    finally:
        ex.close()
    print(f"rotation through the executor: {time.monotonic() - started:.1f}s")

    got = collect_sync(kafka_bootstrap, [results], lambda c: False, timeout=3)
    by_id = {x.command_id: x for x in (r.decode(r.RemediationResult, v) for v in got.values(results))}
    worker_ids = {r.decode(r.RemediationCommand, x.value).id for x in produced}
    assert worker_ids | {c[0] for c in in_flight} <= set(by_id), sorted(by_id)
    for cid in worker_ids | {c[0] for c in in_flight}:  # past the signature and the expiry, whatever came next
        assert not by_id[cid].reason.startswith(("signature rejected", "expired")), by_id[cid]
    for cid, node, _, _ in [*in_flight, by_new]:  # verified, then looked for on the cluster (no such node here)
        assert by_id[cid].reason == f"unknown node {node.decode()}", by_id[cid]
    assert retired[0] not in by_id  # refused before anything: no result
    assert len(letters) == 1 and letters[0].original == retired[2], letters
    assert (f"signature rejected: fleetmedic-key-id '{OLD_KEY_ID}': not an accepted command key ({KEY_ID}): "
            "retired, or never configured") in letters[0].error, letters[0].error
