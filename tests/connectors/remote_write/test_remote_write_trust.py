"""The remote-write receiver's trust boundary, through a real aiohttp server and real sockets:

- what it answers 204 for is kept (one request of more nodes than the outbox holds; concurrent
  senders through a slow Kafka that retry their 503s lose nothing and publish nothing twice);
- the bodies being received are capped all requests together, and a connection that sends its
  headers or its body too slowly is closed;
- only senders that prove who they are may send (Bearer tokens, basic auth, TLS client
  certificates; each read from files that rotate without a restart), and the receiver refuses to
  listen beyond loopback without that; labels a record cannot carry are refused and counted;
- a sender that goes away mid-body is counted apart and logged once, not as an internal error.

Nothing here waits on a sleep: a test polls the condition it needs, with a generous deadline.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import ssl
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest
from prometheus_client import CollectorRegistry

from fleetmedic import records as r
from fleetmedic.config import Settings, parse_config
from fleetmedic.connectors.remote_write import assembler as rw_module
from fleetmedic.connectors.remote_write.codec import WriteRequest, encode_request
from fleetmedic.connectors.remote_write.server import HealthSink, RemoteWriteReceiver
from fleetmedic.connectors.runtime import ConnectorMetrics, Outbox, Outgoing, PumpSettings, pump
from fleetmedic.devenv.tls import Ca, issue, make_ca

HEADERS = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy",
           "X-Prometheus-Remote-Write-Version": "0.1.0"}
TS_MS = 1_760_000_000_000


def _request(nodes: list[str], ts_ms: int, **extra: str) -> bytes:
    """One GPU temperature per node (one record per node and scrape)."""
    return encode_request([({"__name__": "DCGM_FI_DEV_GPU_TEMP", "gpu": "0", "Hostname": node, **extra},
                            [(50.0, ts_ms)]) for node in nodes])


class ListSink:
    """A Kafka stand-in: keeps what it is sent; ``delay_s`` per batch makes it slow."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.records: list[r.Record] = []

    async def start(self) -> None:
        pass

    async def send_batch(self, items: list[Outgoing]) -> None:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)  # the broker's latency, not a wait of the test
        self.records.extend(i.record for i in items)

    async def stop(self) -> None:
        pass


class Served:
    def __init__(self, receiver: RemoteWriteReceiver, registry: CollectorRegistry, url: str) -> None:
        self.receiver = receiver
        self.registry = registry
        self.url = url
        self.port = int(url.rsplit(":", 1)[1])
        self.entered = 0  # requests whose headers were in (the handler was called)

    def value(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0


@contextlib.asynccontextmanager
async def serving(settings: Settings, sink: Any, batch: int = 500) -> AsyncIterator[Served]:
    registry = CollectorRegistry()
    metrics = ConnectorMetrics(registry, "remote-write")
    outbox = Outbox(settings.exporters.queue_max, metrics)
    health = HealthSink(sink)
    receiver = RemoteWriteReceiver(settings, outbox, metrics, registry, health=health, listen="127.0.0.1:0")
    stop = asyncio.Event()
    pumping = asyncio.create_task(pump(outbox, health, metrics, stop, PumpSettings(batch=batch, drain_timeout_s=5)))
    handle = receiver.handle
    served: list[Served] = []

    async def counted(request: Any) -> Any:
        served[0].entered += 1
        return await handle(request)

    receiver.handle = counted  # type: ignore[method-assign]
    running = asyncio.create_task(receiver.run(stop))
    await until(lambda: receiver.bound is not None)
    assert receiver.bound is not None
    scheme = "https" if getattr(receiver, "tls", None) else "http"
    served.append(Served(receiver, registry, f"{scheme}://127.0.0.1:{receiver.bound[1]}"))
    try:
        yield served[0]
    finally:
        stop.set()
        await running
        await pumping


async def until(condition: Callable[[], bool], timeout: float = 30.0, state: Callable[[], str] = str) -> None:
    """Polls ``condition`` until it holds (fails after ``timeout``, saying ``state()``)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"the condition did not hold in time {state()}"
        await asyncio.sleep(0.01)


def _settings(yaml: str) -> Settings:
    return parse_config("exporters: " + yaml)


# --- what is answered 204 is kept --------------------------------------------------------------------


def test_one_request_of_more_nodes_than_the_outbox_holds_is_kept_whole() -> None:
    settings = _settings("{queue_max: 100, remote_write: {assemble_s: 0.05}}")
    sink = ListSink()
    nodes = [f"n{i:03d}" for i in range(300)]

    async def main() -> None:
        async with serving(settings, sink) as s, aiohttp.ClientSession() as http:
            async with http.post(s.url + "/api/v1/write", data=_request(nodes, TS_MS), headers=HEADERS) as resp:
                assert resp.status == 204
            await until(lambda: len(sink.records) >= 300, state=lambda: f"({len(sink.records)} of 300 published)")
            assert s.value("fleetmedic_connector_dropped_total", connector="remote-write") == 0

    asyncio.run(main())
    assert sorted(rec.node for rec in sink.records) == nodes  # type: ignore[attr-defined]


def test_concurrent_senders_through_a_slow_kafka_lose_nothing_they_were_answered_204_for() -> None:
    """16 senders x 20 requests x 50 nodes, each request a new scrape: 16,000 records, each once.
    The outbox (queue_max 200) fills while the slow sink drains, so the receiver answers 503 with a
    Retry-After, and the senders retry those requests as Prometheus does."""
    settings = _settings("{queue_max: 200, remote_write: {assemble_s: 0.05}}")
    sink = ListSink(delay_s=0.002)
    answers: Counter[int] = Counter()
    retry_after: set[str | None] = set()

    async def sender(s: Served, http: aiohttp.ClientSession, k: int) -> None:
        nodes = [f"s{k:02d}-n{i:02d}" for i in range(50)]
        for j in range(20):
            body = _request(nodes, TS_MS + j * 15_000)
            while True:
                async with http.post(s.url + "/api/v1/write", data=body, headers=HEADERS) as resp:
                    answers[resp.status] += 1
                    if resp.status == 204:
                        break
                    assert resp.status == 503, await resp.text()
                    retry_after.add(resp.headers.get("Retry-After"))
                await asyncio.sleep(0.02)  # the sender's backoff (shorter than Retry-After, to be quick)

    async def main() -> None:
        async with serving(settings, sink, batch=50) as s, aiohttp.ClientSession() as http:
            await asyncio.gather(*(sender(s, http, k) for k in range(16)))
            await until(lambda: len(sink.records) >= 16_000, timeout=60,
                        state=lambda: f"({len(sink.records)} of 16,000 records published; answers {dict(answers)})")
            assert s.value("fleetmedic_connector_dropped_total", connector="remote-write") == 0
            assert s.value("fleetmedic_remote_write_rejected_total", reason="outbox_full") == answers[503]

    asyncio.run(main())
    got = Counter((rec.node, rec.ts) for rec in sink.records)  # type: ignore[attr-defined]
    assert len(got) == 16_000 and set(got.values()) == {1}, "every record of a 204 published, once"
    assert answers[204] == 320 and answers[503] > 0, answers
    assert retry_after == {"1"}


# --- bodies in flight and read timeouts ------------------------------------------------------------------


async def _open(port: int, head: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head)
    await writer.drain()
    return reader, writer


def _head(length: int) -> bytes:
    return (f"POST /api/v1/write HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
            f"Content-Encoding: snappy\r\nContent-Length: {length}\r\n\r\n").encode()


def test_bodies_being_received_are_capped_all_requests_together() -> None:
    settings = _settings("{remote_write: {max_body_bytes: 65536, max_inflight_bytes: 150000}}")

    async def main() -> None:
        async with serving(settings, ListSink()) as s:
            held = [await _open(s.port, _head(60_000) + b"x" * 1000) for _ in range(2)]
            await until(lambda: s.value("fleetmedic_remote_write_inflight_bytes") == 120_000)
            reader, writer = await _open(s.port, _head(60_000) + b"x" * 1000)  # a third would pass the cap
            answer = await asyncio.wait_for(reader.read(4096), 30)
            assert answer.startswith(b"HTTP/1.1 503") and b"max_inflight_bytes" in answer
            assert b"Retry-After: 1" in answer
            assert s.value("fleetmedic_remote_write_rejected_total", reason="inflight_full") == 1
            assert s.receiver.inflight.used == 120_000 <= s.receiver.inflight.limit
            for _, w in [*held, (reader, writer)]:
                w.close()
            await until(lambda: s.receiver.inflight.used == 0)

    asyncio.run(main())


async def _drip(writer: asyncio.StreamWriter, data: bytes) -> None:
    """A slow-loris sender: a byte every 50 ms."""
    with contextlib.suppress(ConnectionError):
        for i in range(len(data)):
            writer.write(data[i:i + 1])
            await writer.drain()
            await asyncio.sleep(0.05)


def test_connections_that_send_their_headers_a_byte_at_a_time_are_closed_after_header_timeout_s() -> None:
    settings = _settings("{remote_write: {header_timeout_s: 1.0}}")

    async def closed(port: int) -> float:
        start = time.monotonic()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        dripping = asyncio.create_task(_drip(writer, b"POST /api/v1/write HTTP/1.1\r\nX-Slow: " + b"a" * 8000))
        try:
            assert await asyncio.wait_for(reader.read(), 30) == b""  # closed, nothing answered
        finally:
            dripping.cancel()
            writer.close()
        return time.monotonic() - start

    async def main() -> None:
        async with serving(settings, ListSink()) as s:
            took = await asyncio.gather(*(closed(s.port) for _ in range(20)))
            assert all(1.0 <= t < 25 for t in took), took

    asyncio.run(main())


def test_a_body_sent_a_byte_at_a_time_is_answered_503_and_closed_after_body_timeout_s() -> None:
    settings = _settings("{remote_write: {body_timeout_s: 1.0}}")

    async def main() -> None:
        async with serving(settings, ListSink()) as s:
            reader, writer = await _open(s.port, _head(10_000))
            dripping = asyncio.create_task(_drip(writer, b"x" * 10_000))
            try:
                answer = await asyncio.wait_for(reader.read(), 30)  # the answer, then the close
            finally:
                dripping.cancel()
                writer.close()
            assert answer.startswith(b"HTTP/1.1 503") and b"body_timeout_s" in answer
            assert s.value("fleetmedic_remote_write_rejected_total", reason="body_timeout") == 1
            await until(lambda: s.receiver.inflight.used == 0)

    asyncio.run(main())


def test_the_defaults_leave_room_for_what_prometheus_sends() -> None:
    rw = Settings().exporters.remote_write
    # Prometheus gives up on a request after remote_timeout (30 s by default) and sends its headers at once
    assert rw.header_timeout_s >= 30 and rw.body_timeout_s >= 30
    assert rw.max_inflight_bytes >= 8 * rw.max_body_bytes


# --- a sender that goes away ----------------------------------------------------------------------------------


def test_a_sender_that_goes_away_mid_body_is_counted_apart_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        async with serving(_settings("{remote_write: {}}"), ListSink()) as s:
            for i in range(10):
                _, writer = await _open(s.port, _head(5000) + b"x" * 100)
                await until(lambda: s.entered == i + 1)  # the body is being read  # noqa: B023
                writer.transport.abort()
            await until(lambda: s.value("fleetmedic_remote_write_rejected_total", reason="client_disconnect") == 10)
            assert not [k for k in ("internal_ConnectionResetError", "internal_ClientConnectionResetError")
                        if s.value("fleetmedic_remote_write_rejected_total", reason=k)]
            assert s.value("fleetmedic_remote_write_requests_total", code="499") == 10
            assert s.value("fleetmedic_remote_write_requests_total", code="400") == 0
            await until(lambda: s.receiver.inflight.used == 0)

    with caplog.at_level(logging.INFO, logger="fleetmedic"):
        asyncio.run(main())
    assert not [rec for rec in caplog.records if rec.levelno >= logging.ERROR]
    assert len([rec for rec in caplog.records if "closed the connection" in rec.getMessage()]) == 1


# --- who may send -----------------------------------------------------------------------------------------------


def _write(path: Path, text: str) -> None:
    """Replaces ``path`` as a rotation does (a new file moved over it)."""
    tmp = path.with_suffix(".new")
    tmp.write_text(text)
    os.replace(tmp, path)


def test_credentials_are_required_and_their_files_rotate_without_a_restart(tmp_path: Path) -> None:
    tokens, users = tmp_path / "tokens", tmp_path / "users"
    _write(tokens, "old-token\n")
    _write(users, "prometheus:old-password\n")
    settings = _settings("{remote_write: {assemble_s: 0.05, files_check_s: 0.000001, auth: {"
                         f"bearer_tokens_file: '{tokens}', basic_auth_file: '{users}'}}}}}}")
    body = _request(["n1"], TS_MS)

    def basic(user: str, password: str) -> str:
        return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    async def main() -> None:
        async with serving(settings, ListSink()) as s, aiohttp.ClientSession() as http:
            async def post(authorization: str | None) -> int:
                headers = {**HEADERS, **({"Authorization": authorization} if authorization else {})}
                async with http.post(s.url + "/api/v1/write", data=body, headers=headers) as resp:
                    if resp.status == 401:
                        assert "Bearer" in resp.headers["WWW-Authenticate"]
                    return resp.status

            assert await post(None) == 401
            assert await post("Bearer wrong") == 401
            assert await post("Bearer old-token") == 204
            assert await post(basic("prometheus", "old-password")) == 204
            assert await post(basic("prometheus", "wrong")) == 401
            assert await post("Digest x") == 401
            _write(tokens, "new-token\n")
            _write(users, "prometheus:new-password\n")
            assert await post("Bearer old-token") == 401
            assert await post("Bearer new-token") == 204
            assert await post(basic("prometheus", "new-password")) == 204
            _write(tokens, "")  # emptied mid-write: the tokens in use stay
            assert await post("Bearer new-token") == 204
            reasons = {k: s.value("fleetmedic_remote_write_rejected_total", reason=f"unauthorized_{k}")
                       for k in ("missing", "credentials", "scheme")}
            assert reasons == {"missing": 1, "credentials": 3, "scheme": 1}

    asyncio.run(main())


def _client(ca: Ca, leaf: Any | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca.cert))
    if leaf is not None:
        ctx.load_cert_chain(leaf.cert, leaf.key)
    return ctx


def test_tls_with_client_certificates_whose_ca_rotates_without_a_restart(tmp_path: Path) -> None:
    ca, other = make_ca(tmp_path / "ca"), make_ca(tmp_path / "other", cn="another CA")
    server = issue(ca, tmp_path / "ca", "server")
    client, other_client = issue(ca, tmp_path / "ca", "client"), issue(other, tmp_path / "other", "client")
    client_ca = tmp_path / "client-ca.pem"
    _write(client_ca, ca.cert.read_text())
    settings = _settings("{remote_write: {files_check_s: 0.000001, tls: {"
                         f"cert_file: '{server.cert}', key_file: '{server.key}', client_ca_file: '{client_ca}'}}}}}}")
    body = _request(["n1"], TS_MS)

    async def main() -> None:
        async with serving(settings, ListSink()) as s:
            assert s.url.startswith("https://")

            async def post(ctx: ssl.SSLContext) -> int | str:
                try:
                    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as http, \
                            http.post(s.url + "/api/v1/write", data=body, headers=HEADERS) as resp:
                        return resp.status
                except (aiohttp.ClientError, ssl.SSLError, ConnectionError) as exc:
                    return type(exc).__name__

            assert await post(_client(ca, client)) == 204
            assert not isinstance(await post(_client(ca, None)), int), "no client certificate: no request"
            assert not isinstance(await post(_client(ca, other_client)), int)
            _write(client_ca, other.cert.read_text())  # the client CA rotates
            assert await post(_client(ca, other_client)) == 204
            assert not isinstance(await post(_client(ca, client)), int)
            assert s.receiver.tls is not None and s.receiver.tls.reloads == 1
            async with aiohttp.ClientSession() as http:  # plain HTTP is not spoken
                with pytest.raises(aiohttp.ClientError):
                    async with http.post(s.url.replace("https", "http") + "/api/v1/write", data=body,
                                         headers=HEADERS):
                        pass

    asyncio.run(main())


def test_tls_files_that_do_not_make_a_context_leave_the_last_good_one(tmp_path: Path) -> None:
    from fleetmedic.connectors.remote_write.auth import tls_files

    ca = make_ca(tmp_path)
    server = issue(ca, tmp_path, "server")
    cert = tmp_path / "cert.pem"
    _write(cert, server.cert.read_text())
    tls = _settings(f"{{remote_write: {{tls: {{cert_file: '{cert}', key_file: '{server.key}'}}}}}}")
    files = tls_files(tls.exporters.remote_write.tls, check_s=0.0)
    first = files.current
    _write(cert, "-----BEGIN CERTIFICATE-----\nhalf")
    files.refresh()
    assert files.current is first and "cert_file/key_file" in files.error
    _write(cert, server.cert.read_text())
    files.refresh()
    assert files.current is not first and files.error == ""
    with pytest.raises(ValueError, match=r"exporters\.remote_write\.tls\.key_file"):
        tls_files(msgspec.structs.replace(tls.exporters.remote_write.tls, key_file=str(tmp_path / "missing")), 1.0)


def test_the_receiver_refuses_to_listen_beyond_loopback_without_authentication(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("t\n")
    metrics = ConnectorMetrics(CollectorRegistry(), "remote-write")

    def receiver(yaml: str, listen: str) -> RemoteWriteReceiver:
        return RemoteWriteReceiver(_settings(yaml), Outbox(10, metrics), metrics, CollectorRegistry(), listen=listen)

    with pytest.raises(ValueError, match="allow_unauthenticated"):
        receiver("{remote_write: {}}", "0.0.0.0:9201")
    with pytest.raises(ValueError, match="no authentication"):
        receiver("{remote_write: {}}", ":9201")
    receiver("{remote_write: {}}", "127.0.0.1:9201")
    receiver("{remote_write: {allow_unauthenticated: true}}", "0.0.0.0:9201")
    receiver(f"{{remote_write: {{auth: {{bearer_tokens_file: '{tokens}'}}}}}}", "0.0.0.0:9201")
    with pytest.raises(ValueError, match="bearer_tokens_file"):
        receiver(f"{{remote_write: {{auth: {{bearer_tokens_file: '{tmp_path / 'none'}'}}}}}}", "127.0.0.1:0")


# --- labels a record cannot carry -----------------------------------------------------------------------------------


def _raw_request(series: list[list[tuple[str, str]]], ts_ms: int) -> bytes:
    """A WriteRequest whose series carry their labels as given (duplicates and order kept)."""
    import cramjam

    request = WriteRequest()
    for labels in series:
        ts = request.timeseries.add()
        for name, value in labels:
            ts.labels.add(name=name, value=value)
        ts.samples.add(value=50.0, timestamp=ts_ms)
    return bytes(cramjam.snappy.compress_raw(request.SerializeToString()))


@pytest.mark.parametrize("native", [True, False], ids=["c", "python"])
def test_series_whose_labels_a_record_cannot_carry_are_refused_and_counted(native: bool) -> None:
    name = ("__name__", "DCGM_FI_DEV_GPU_TEMP")
    bad = {
        "duplicate label name": [name, ("Hostname", "n-dup"), ("gpu", "0"), ("gpu", "1")],
        "duplicate __name__": [name, name, ("Hostname", "n-dup2"), ("gpu", "0")],
        "control character": [name, ("Hostname", "n\x00ul"), ("gpu", "0")],
        "control character in a name": [name, ("Hostname", "n-ctl"), ("gpu", "0"), ("x\x07", "1")],
        "node label longer": [name, ("Hostname", "n" * 254), ("gpu", "0")],
    }
    good = [name, ("Hostname", "n-good"), ("gpu", "0")]
    settings = _settings("{remote_write: {assemble_s: 0.05}}")
    saved = rw_module._native_hold_inline
    if not native:
        rw_module._native_hold_inline = None
    sink = ListSink()

    async def main() -> None:
        async with serving(settings, sink) as s, aiohttp.ClientSession() as http:
            for k in range(2):  # the second time, every label set is one the receiver has seen
                async with http.post(s.url + "/api/v1/write", data=_raw_request([*bad.values(), good],
                                                                                 TS_MS + k * 15_000),
                                     headers=HEADERS) as resp:
                    assert resp.status == 204
            await until(lambda: len(sink.records) >= 2)
            assert s.value("fleetmedic_remote_write_samples_total", outcome="skipped") == 2 * len(bad)
            assert s.value("fleetmedic_remote_write_samples_total", outcome="read") == 2
            reasons = {k[1]["reason"]: k[2] for k in _samples(s.registry, "fleetmedic_connector_skipped_total")}
            assert reasons == {"DCGM_FI_DEV_GPU_TEMP: duplicate label name": 4,
                               "DCGM_FI_DEV_GPU_TEMP: a label name or value has a control character": 4,
                               "DCGM_FI_DEV_GPU_TEMP: node label longer than N characters": 2}

    try:
        asyncio.run(main())
    finally:
        rw_module._native_hold_inline = saved
    assert {rec.node for rec in sink.records} == {"n-good"}  # type: ignore[attr-defined]


def _samples(registry: CollectorRegistry, name: str) -> list[tuple[str, dict[str, str], float]]:
    return [(s.name, s.labels, s.value) for m in registry.collect() for s in m.samples if s.name == name]



def test_the_cli_refuses_to_start_an_unauthenticated_receiver_beyond_loopback() -> None:
    import subprocess
    import sys

    from fleetmedic.cli.common import EXIT_INVALID

    out = subprocess.run([sys.executable, "-m", "fleetmedic.cli.main", "exporter", "remote-write", "--listen",
                          "0.0.0.0:0", "--metrics-port", "-1", "--output", "/dev/null"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == EXIT_INVALID and "allow_unauthenticated" in out.stderr, out.stderr[-2000:]
