"""Helpers for the Faust worker tests: a unique config per test, the worker as a subprocess
(``python -m fleetmedic.cli.main worker``), producing records and collecting the output topics."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from aiokafka import AIOKafkaConsumer

from fleetmedic.config import Settings, parse_config
from fleetmedic.devenv.proc import tail

KEY = "k" * 40  # the command key
OPERATOR_KEY = "o" * 40  # fleetmedic ctl's: the decide stage verifies operator commands with it, never KEY


@dataclass
class Run:
    settings: Settings
    config: Path
    log: Path
    tmp: Path

    def topic(self, name: str) -> str:
        return self.settings.topics.topic(name)


def new_run(bootstrap: str, tmp: Path, extra: str = "", partitions: int = 2) -> Run:
    """Unique topic prefix and consumer group; 2 partitions per topic (the README's singles stay 1)."""
    u = uuid.uuid4().hex[:8]
    text = (f"kafka: {{bootstrap_servers: '{bootstrap}', consumer_group: fm-t{u}}}\n"
            f"topics: {{prefix: t{u}., default_partitions: {partitions}}}\n"
            "metrics: {port: 0}\n" + extra)
    tmp.mkdir(parents=True, exist_ok=True)
    config = tmp / "fleetmedic.yaml"
    config.write_text(text)
    return Run(parse_config(text, env={}), config, tmp / "worker.log", tmp)


def start_worker(run: Run, role: str = "all", log: Path | None = None) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETMEDIC__")}
    env["FLEETMEDIC_SIGNING_KEY"] = KEY
    env["FLEETMEDIC_OPERATOR_KEY"] = OPERATOR_KEY
    with (log or run.log).open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "fleetmedic.cli.main", "worker", "--config", str(run.config), "--role", role,
             "--datadir", str(run.tmp / f"faust-{role}-{uuid.uuid4().hex[:6]}"), "--loglevel", "info"],
            env=env, cwd=run.tmp, stdout=out, stderr=subprocess.STDOUT,
        )


def stop_worker(proc: subprocess.Popen[bytes], log: Path) -> None:
    """SIGTERM; it must exit 0 within 30 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"worker ignored SIGTERM; log:\n{tail(log, 60)}") from None
    assert rc == 0, f"worker exited {rc}; log:\n{tail(log, 60)}"


@contextlib.contextmanager
def worker(run: Run, role: str = "all", log: Path | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """The worker as a subprocess; SIGTERM at the end, and it must exit 0 within 30 s."""
    proc = start_worker(run, role, log)
    try:
        yield proc
    finally:
        if proc.returncode is None or proc.returncode >= 0:  # not killed by the test itself
            stop_worker(proc, log or run.log)


def wait_for_log(run: Run, proc: subprocess.Popen[bytes], text: str, count: int = 1, timeout: float = 30,
                 log: Path | None = None) -> None:
    """Wait until the worker log holds ``text`` ``count`` times (the log is shared by restarts)."""
    path = log or run.log
    deadline = time.monotonic() + timeout
    while path.read_text(errors="replace").count(text) < count:
        assert proc.poll() is None, f"worker exited {proc.returncode}; log:\n{tail(path, 60)}"
        assert time.monotonic() < deadline, f"no {text!r} in the worker log after {timeout}s:\n{tail(path, 60)}"
        time.sleep(0.2)


@dataclass
class Collected:
    by_topic: dict[str, list[tuple[bytes | None, bytes, int, int]]] = field(default_factory=dict)

    def values(self, topic: str) -> list[bytes]:
        return [v for _, v, _, _ in self.by_topic.get(topic, [])]


async def collect(bootstrap: str, topics: list[str], done: Callable[[Collected], bool], timeout: float) -> Collected:
    """Read ``topics`` from the beginning until ``done(collected)`` or ``timeout`` seconds."""
    consumer = AIOKafkaConsumer(*topics, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                enable_auto_commit=False, metadata_max_age_ms=2000)
    await consumer.start()
    got = Collected()
    deadline = time.monotonic() + timeout
    try:
        while not done(got) and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=500)
            for tp, recs in batches.items():
                for rec in recs:
                    got.by_topic.setdefault(tp.topic, []).append((rec.key, rec.value, tp.partition, rec.offset))
        return got
    finally:
        await consumer.stop()


def collect_sync(bootstrap: str, topics: list[str], done: Callable[[Collected], bool], timeout: float) -> Collected:
    return asyncio.run(collect(bootstrap, topics, done, timeout))
