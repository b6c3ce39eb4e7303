"""The probes every long-running process serves beside its metrics: liveness follows
the event loops' heartbeats, readiness what the process says, over a real HTTP server."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request

from prometheus_client import CollectorRegistry, Counter

from fleetmedic.serving import Health, serve


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _get(base: str, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(base + path, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_liveness_follows_every_loop_and_readiness_what_the_process_says() -> None:
    clock = Clock()
    health = Health(stall_after_s=60, clock=clock)
    registry = CollectorRegistry()
    Counter("fleetmedic_probe_test", "a counter", registry=registry).inc()
    server = serve(registry, 0, "127.0.0.1", health)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert _get(base, "/healthz") == (200, "starting\n")  # before the first beat: the startup probe waits
        assert _get(base, "/readyz") == (503, "starting\n")
        health.beat("decide")
        health.beat("detect")
        health.ready()
        assert _get(base, "/healthz") == (200, "ok\n") and _get(base, "/readyz") == (200, "ready\n")
        clock.now += 61
        health.beat("decide")  # stage 1's loop stopped turning: the process must be restarted
        code, text = _get(base, "/healthz")
        assert code == 503 and "'detect' has not run for 61s" in text
        assert _get(base, "/readyz")[0] == 503
        health.beat("detect")
        health.not_ready("catching up")
        assert _get(base, "/healthz") == (200, "ok\n") and _get(base, "/readyz") == (503, "catching up\n")
        code, page = _get(base, "/metrics")
        assert code == 200 and "fleetmedic_probe_test_total 1.0" in page
    finally:
        server.shutdown()


def test_a_loop_beats_while_it_runs() -> None:
    health = Health(stall_after_s=60)

    async def run() -> None:
        task = asyncio.create_task(health.beat_every("main", every_s=0.01))
        await asyncio.sleep(0.05)
        task.cancel()

    asyncio.run(run())
    assert health.liveness() == (200, "ok")


def test_every_process_serves_the_probes_not_a_bare_metrics_server() -> None:
    """A process started with prometheus_client's own server would answer the probes' paths with
    metrics (200) and hide a stalled loop: every server goes through fleetmedic.serving."""
    import pathlib

    import fleetmedic

    root = pathlib.Path(fleetmedic.__file__).parent
    bare = [str(p.relative_to(root)) for p in root.rglob("*.py") if "start_http_server" in p.read_text()]
    assert bare == []
    serving = sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                     if "serve(registry" in p.read_text() and p.name != "serving.py")
    assert serving == ["cli/executor.py", "cli/exporter.py", "cli/watch_jobs.py", "streams/runner.py"]
