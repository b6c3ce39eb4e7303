"""The Faust worker (``fleetmedic worker``) on the real broker, run as a subprocess.

- end to end: GPU telemetry of four nodes of one job, an XID 79 on one of them: stage 1 finds it,
  the decision stage opens a hardware incident and issues signed commands (restart the job,
  cordon the node), audited; at SIGTERM the engine state is written to the state topic and reads
  back (what a restarted worker restores).
- dead letters: malformed telemetry (not JSON, a field of the wrong type) lands on the dead-letter
  topic with the field path, the original bytes and its offset; the good messages after it on the
  same partition are still processed.
- several clusters on shared topics: the worker of one cluster acts on its own cluster's records
  only, skips (and counts) the other's, and labels what it produces and its metrics.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import msgspec
import numpy as np

from fleetmedic import records as r
from fleetmedic.bus import partitions_of
from fleetmedic.devenv.kafka import produce
from fleetmedic.devenv.synth import gpu_message
from fleetmedic.remediation.engine import DecisionEngine
from fleetmedic.signing import load_key, verify
from fleetmedic.streams.app import ensure_topics
from fleetmedic.streams.state import decode_snapshot, load_snapshot
from tests.streams.helpers_harness import KEY, Collected, collect_sync, new_run, wait_for_log, worker
from tests.streams.helpers_worker import JOB, NODES, SICK, scrape

T0 = 1_700_000_000.0


def _telemetry(samples: int, xid_at: int, rng: np.random.Generator) -> list[r.GpuTelemetry]:
    out = []
    for k in range(samples):
        t = T0 + 10 * (k + 1)
        for n in NODES:
            xids = [r.XidEvent(gpu=3, xid=79, ts=t)] if n == SICK and k == xid_at else None
            out.append(gpu_message(n, t, rng, xids=xids))
    return out


def test_worker_turns_an_xid79_into_a_hardware_incident_and_signed_commands(kafka_bootstrap: str,
                                                                              tmp_path: Path) -> None:
    run = new_run(kafka_bootstrap, tmp_path)
    created = asyncio.run(ensure_topics(run.settings))
    assert run.topic("telemetry.gpu") in created and run.topic("incidents") in created
    assert asyncio.run(ensure_topics(run.settings)) == []  # idempotent

    placement = r.JobEvent(job=JOB, event="placement", ts=T0, world_size=4,
                           placement=[r.RankPlacement(rank=i, node=n, gpus=list(range(8)))
                                      for i, n in enumerate(NODES)])
    start = r.JobEvent(job=JOB, event="start", ts=T0)
    jobs = run.topic("jobs.events")
    # the job events are on the broker before the worker starts, telemetry (hence findings) after
    asyncio.run(produce(kafka_bootstrap, [(jobs, JOB.encode(), r.encode(e)) for e in (placement, start)]))
    gpu = run.topic("telemetry.gpu")
    telemetry = [(gpu, m.node.encode(), r.encode(m)) for m in _telemetry(6, 3, np.random.default_rng(7))]

    incidents, commands = run.topic("incidents"), run.topic("remediation.commands")
    audit = run.topic("remediation.audit")

    def done(c: Collected) -> bool:
        cmds = _commands(c, commands)
        actions = {(x.action, x.node or x.job) for x in cmds}
        audited = {cid for a in (r.decode(r.AuditRecord, v) for v in c.values(audit)) for cid in a.command_ids}
        # wait for the audit of every command seen, too: it is produced after the commands
        return {("cordon", SICK), ("restart_job", JOB)} <= actions and {x.id for x in cmds} <= audited

    started = time.monotonic()
    with worker(run):
        asyncio.run(produce(kafka_bootstrap, telemetry))
        got = collect_sync(kafka_bootstrap, [incidents, commands, audit], done, timeout=40)
        assert done(got), f"no commands after {time.monotonic() - started:.0f}s: {got.by_topic.keys()}"

    hardware = [i for i in (r.decode(r.Incident, v) for v in got.values(incidents)) if i.incident_class == "hardware"]
    assert hardware and {s.name for s in hardware[0].suspects} >= {SICK, f"{SICK}/gpu3"}
    assert hardware[0].evidence[0].detector == "xid_rules" and hardware[0].jobs == [JOB]
    key = load_key(KEY)
    cmds = _commands(got, commands)
    for cmd in cmds:
        verify(cmd, key, now=cmd.issued_at, max_future_skew_s=run.settings.streams.max_future_skew_s)
        assert cmd.incident_id == hardware[0].id
    keys = {k for k, _, _, _ in got.by_topic[commands]}
    assert {SICK.encode(), JOB.encode()} <= keys  # keyed by target
    tampered = msgspec.structs.replace(cmds[0], node="gpu-node-0")
    try:
        verify(tampered, key, now=tampered.issued_at, max_future_skew_s=run.settings.streams.max_future_skew_s)
    except ValueError:
        pass
    else:
        raise AssertionError("a tampered command verified")
    audited = {cid for a in (r.decode(r.AuditRecord, v) for v in got.values(audit)) for cid in a.command_ids}
    assert {c.id for c in cmds} <= audited

    # the worker wrote its state when it stopped; a restarted worker starts from it
    snapshot = asyncio.run(load_snapshot(run.settings))
    assert snapshot is not None
    snap = decode_snapshot(snapshot)
    engine = DecisionEngine.from_bytes(snap.engine, run.settings)
    assert snap.offsets[run.topic("jobs.events")] and snap.commands_from == len(cmds)
    assert engine.node_state(SICK) != engine.node_state("gpu-node-0")
    assert engine.state.clock >= T0 + 40
    with worker(run) as again:  # and a second worker starts from it
        wait_for_log(run, again, "[^Worker]: Ready", count=2)  # SIGTERM before faust's handlers would kill it
    assert f"decision engine: restored ({len(snapshot)} bytes" in run.log.read_text()
    assert f"{len(cmds)} command ids already on the topic" not in run.log.read_text()  # none since the snapshot


def _commands(c: Collected, topic: str) -> list[r.RemediationCommand]:
    return [r.decode(r.RemediationCommand, v) for v in c.values(topic)]


def test_malformed_telemetry_goes_to_the_dead_letter_topic_and_the_worker_goes_on(kafka_bootstrap: str,
                                                                                   tmp_path: Path) -> None:
    run = new_run(kafka_bootstrap, tmp_path)
    asyncio.run(ensure_topics(run.settings))
    assert partitions_of(run.settings, "telemetry.gpu") == 2 and partitions_of(run.settings, "incidents") == 1
    gpu, dead, findings = run.topic("telemetry.gpu"), run.topic("deadletter"), run.topic("findings")
    node = "gpu-node-7"
    good = gpu_message(node, T0 + 10, np.random.default_rng(1), xids=[r.XidEvent(gpu=1, xid=79, ts=T0 + 10)])
    wrong_type = msgspec.json.decode(r.encode(good))
    wrong_type["ts"] = "yesterday"
    not_json = b'{"type": "gpu_telemetry", "node": '
    bad_type = msgspec.json.encode(wrong_type)
    # all on one key, so on one partition in this order: bad, bad, good
    messages = [(gpu, node.encode(), v) for v in (not_json, bad_type, r.encode(good))]

    def done(c: Collected) -> bool:
        return len(c.values(dead)) >= 2 and any(r.decode(r.Finding, v).node == node for v in c.values(findings))

    with worker(run):
        asyncio.run(produce(kafka_bootstrap, messages))
        got = collect_sync(kafka_bootstrap, [dead, findings], done, timeout=40)
        assert done(got), f"got {[(t, len(v)) for t, v in got.by_topic.items()]}"
        scraped = scrape(run.log.read_text())
        # the probes: both loops of --role all beat, the stages are ready
        assert scrape(run.log.read_text(), "/healthz") == "ok\n"
        assert scrape(run.log.read_text(), "/readyz") == "ready\n"

    assert f'fleetmedic_dead_letters_total{{stage="detect",topic="{gpu}"}} 2.0' in scraped
    assert f'fleetmedic_messages_in_total{{stage="detect",topic="{gpu}"}} 3.0' in scraped
    assert 'fleetmedic_findings_total{detector="xid_rules",severity="critical"} 1.0' in scraped
    assert 'fleetmedic_processing_seconds_count{stage="detect"}' in scraped

    letters = [r.decode(r.DeadLetter, v) for v in got.values(dead)]
    assert [d.original for d in letters] == [not_json, bad_type]
    assert letters[0].error.startswith("$: ") and "JSON" in letters[0].error
    assert letters[1].error.startswith("$.ts: ") and "float" in letters[1].error
    assert all(d.topic == gpu and d.stage == "detect" and d.key == node for d in letters)
    assert letters[0].offset is not None and letters[0].partition == letters[1].partition
    assert letters[1].offset == letters[0].offset + 1
    assert {k for k, _, _, _ in got.by_topic[dead]} == {gpu.encode()}  # keyed by source topic
    found = [f for f in (r.decode(r.Finding, v) for v in got.values(findings)) if f.node == node]
    assert found[0].detector == "xid_rules"


def test_a_worker_of_one_cluster_decides_on_its_own_clusters_records_from_shared_topics(kafka_bootstrap: str,
                                                                                      tmp_path: Path) -> None:
    """Two clusters' telemetry and job events on the same topics: the worker of gpu-east-1 acts on
    the XID 79 of its own node only (the other cluster's XID 79 on another node is skipped,
    counted), labels what it produces, and its /metrics carry cluster="gpu-east-1"."""
    run = new_run(kafka_bootstrap, tmp_path, extra="cluster: {name: gpu-east-1}\n")
    asyncio.run(ensure_topics(run.settings))
    east, west = "gpu-east-1", "gpu-west-2"
    gpu, jobs = run.topic("telemetry.gpu"), run.topic("jobs.events")
    placement = r.JobEvent(job=JOB, event="placement", ts=T0, world_size=4,
                           placement=[r.RankPlacement(rank=i, node=n, gpus=list(range(8)))
                                      for i, n in enumerate(NODES)])
    start = r.JobEvent(job=JOB, event="start", ts=T0)
    other_job = r.JobEvent(job="west/train", event="placement", ts=T0, world_size=1,
                           placement=[r.RankPlacement(rank=0, node="gpu-node-0", gpus=list(range(8)))], cluster=west)
    asyncio.run(produce(kafka_bootstrap, [(jobs, e.job.encode(), r.encode(e)) for e in (
        msgspec.structs.replace(placement, cluster=east), msgspec.structs.replace(start, cluster=east), other_job)]))
    rng = np.random.default_rng(7)
    ours = [msgspec.structs.replace(m, cluster=east) for m in _telemetry(6, 3, rng)]  # XID 79 on SICK
    theirs = [msgspec.structs.replace(gpu_message("gpu-node-0", T0 + 10 * (k + 1), rng,
                                                  xids=[r.XidEvent(gpu=1, xid=79, ts=T0 + 10 * (k + 1))]
                                                  if k == 3 else None), cluster=west) for k in range(6)]
    # the other cluster has a gpu-node-0 too: its samples, first, touch nothing of ours
    telemetry = [(gpu, m.node.encode(), r.encode(m)) for m in (*theirs, *ours)]
    findings, commands, audit = run.topic("findings"), run.topic("remediation.commands"), run.topic("remediation.audit")

    def done(c: Collected) -> bool:
        cmds = _commands(c, commands)
        audited = {cid for a in (r.decode(r.AuditRecord, v) for v in c.values(audit)) for cid in a.command_ids}
        return {("cordon", SICK), ("restart_job", JOB)} <= {(x.action, x.node or x.job) for x in cmds} and (
            {x.id for x in cmds} <= audited)

    with worker(run):
        asyncio.run(produce(kafka_bootstrap, telemetry))
        got = collect_sync(kafka_bootstrap, [findings, commands, audit], done, timeout=40)
        assert done(got), f"got {[(t, len(v)) for t, v in got.by_topic.items()]}"
        scraped = scrape(run.log.read_text())

    cmds = _commands(got, commands)
    assert {c.cluster for c in cmds} == {east} and "gpu-node-0" not in {c.node for c in cmds}
    for cmd in cmds:
        verify(cmd, load_key(KEY), now=cmd.issued_at, max_future_skew_s=run.settings.streams.max_future_skew_s)
    found = [r.decode(r.Finding, v) for v in got.values(findings)]
    assert found and {f.cluster for f in found} == {east} and "gpu-node-0" not in {f.node for f in found}
    assert {a.cluster for a in (r.decode(r.AuditRecord, v) for v in got.values(audit))} == {east}
    assert (f'fleetmedic_records_skipped_total{{cluster="{east}",reason="other_cluster",stage="detect",'
            f'topic="{gpu}"}} 6.0') in scraped
    assert (f'fleetmedic_records_skipped_total{{cluster="{east}",reason="other_cluster",stage="decide",'
            f'topic="{jobs}"}} 1.0') in scraped
    samples = [line for line in scraped.splitlines() if line.startswith("fleetmedic_")]
    assert samples and all(f'cluster="{east}"' in line for line in samples)


def test_the_workers_bind_time_check_refuses_the_node_it_just_decided_to_cordon(kafka_bootstrap: str,
                                                                                tmp_path: Path) -> None:
    """``admission.enabled``: the worker serves the webhook over HTTPS from its own state. After the
    XID 79 its cordon of the sick node is issued and, with no executor to apply it, on its way: a
    bind there is refused, a bind to a healthy node of the job allowed."""
    import json
    import ssl
    import urllib.request

    from fleetmedic.devenv import proc, tls

    ca = tls.make_ca(tmp_path / "ca")
    leaf = tls.issue(ca, tmp_path / "leaf", "webhook")
    (port,) = proc.free_ports(1)
    run = new_run(kafka_bootstrap, tmp_path, extra=(
        f"admission: {{enabled: true, listen: '127.0.0.1:{port}', cert_file: '{leaf.cert}',"
        f" key_file: '{leaf.key}'}}\n"))
    asyncio.run(ensure_topics(run.settings))
    placement = r.JobEvent(job=JOB, event="placement", ts=T0, world_size=4,
                           placement=[r.RankPlacement(rank=i, node=n, gpus=list(range(8)))
                                      for i, n in enumerate(NODES)])
    jobs, gpu, commands = run.topic("jobs.events"), run.topic("telemetry.gpu"), run.topic("remediation.commands")
    asyncio.run(produce(kafka_bootstrap, [(jobs, JOB.encode(), r.encode(e))
                                          for e in (placement, r.JobEvent(job=JOB, event="start", ts=T0))]))
    telemetry = [(gpu, m.node.encode(), r.encode(m)) for m in _telemetry(6, 3, np.random.default_rng(7))]
    context = ssl.create_default_context(cafile=str(ca.cert))

    def bind(node: str) -> dict[str, object]:
        review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": f"u-{node}", "operation": "CREATE", "resource": {"group": "", "version": "v1", "resource": "pods"},
            "subResource": "binding", "name": "p", "namespace": "team",
            "object": {"kind": "Binding", "target": {"kind": "Node", "name": node}}}}
        req = urllib.request.Request(f"https://127.0.0.1:{port}/admission/binding", data=json.dumps(review).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10, context=context) as resp:
            answer: dict[str, object] = json.loads(resp.read())["response"]
            return answer

    with worker(run) as w:
        wait_for_log(run, w, "admission: bind-time check on https://127.0.0.1")
        assert bind(SICK)["allowed"] is True  # nothing decided yet
        asyncio.run(produce(kafka_bootstrap, telemetry))
        got = collect_sync(kafka_bootstrap, [commands], lambda c: any(
            x.action == "cordon" and x.node == SICK for x in _commands(c, commands)), timeout=40)
        assert any(x.action == "cordon" for x in _commands(got, commands))
        refused = bind(SICK)
        assert refused["allowed"] is False and SICK in str(refused["status"]), refused
        assert bind("gpu-node-0")["allowed"] is True
        assert 'fleetmedic_admission_reviews_total{outcome="denied"} 1.0' in scrape(run.log.read_text())
