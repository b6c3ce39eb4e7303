"""Hooks and the job track: a configured reset_gpu hook runs its Job (from the template, on the node)
and reports its outcome; the job-track commands go through the ledger (recorded before the workload
is touched, so a repeat is a duplicate) to the workload restart, and a dry run changes nothing and
records nothing. On the real API server, and the ledger's rules also on the in-memory cluster."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from kubernetes import client

from fleetmedic.devenv import fleet as fl
from fleetmedic.devenv.chain import gpu_job, running_ranks
from fleetmedic.devenv.waiting import wait
from fleetmedic.executor.fake_cluster import FakeCluster
from fleetmedic.executor.kube import LEDGER_NAME
from fleetmedic.executor.node import plan as p
from fleetmedic.k8s_keys import ANNOTATION_INFLIGHT, ANNOTATION_KWOK_COMPLETE, LABEL_ROLE
from tests.executor.helpers_executor import (
    RecordingRestarter,
    command,
    executor,
    fake_executor,
    node_events,
    settings,
)

HOOK = """apiVersion: batch/v1
kind: Job
metadata: {name: '${name}'}
spec:
  backoffLimit: 0
  template:
    metadata:
      annotations: {""" + ANNOTATION_KWOK_COMPLETE + """: 'true', fleetmedic.io/gpu: '${gpu}'}
    spec:
      nodeName: ${node}
      restartPolicy: Never
      tolerations: [{operator: Exists}]
      containers: [{name: reset, image: example.invalid/nvidia-smi:1, command: [nvidia-smi, -r, -i, '${gpu}']}]
"""


def test_a_configured_reset_gpu_hook_runs_its_job_on_the_node_and_reports_it(
    kube_api: client.ApiClient, namespace: str, make_fleet: Callable[..., fl.Fleet], tmp_path: Path
) -> None:
    core = client.CoreV1Api(kube_api)
    name = make_fleet(1).nodes[0]
    template = tmp_path / "reset.yaml"
    template.write_text(HOOK)
    ex = executor(kube_api, settings(namespace, extra=f"  action_hooks: {{reset_gpu: '{template}'}}\n"))
    r = ex.handle(command("reset_gpu", name, params={"gpu": "3"}))
    assert r.outcome == "applied" and r.details["hook"] == "reset_gpu", r
    job_ns, job_name = r.details["job"].split("/")
    pod = core.list_namespaced_pod(job_ns, label_selector=f"job-name={job_name}").items[0]
    assert pod.spec.node_name == name and pod.spec.containers[0].command == ["nvidia-smi", "-r", "-i", "3"]
    assert pod.metadata.labels[LABEL_ROLE] == "reset_gpu"
    assert "FleetmedicResetGpuDone" in node_events(core, name)
    assert ANNOTATION_INFLIGHT not in core.read_node(name).metadata.annotations
    missing = executor(kube_api, settings(namespace, extra="  action_hooks: {reboot_node: /nonexistent.yaml}\n"))
    out = missing.handle(command("reboot_node", name))
    assert out.outcome == "failed" and "action_hooks.reboot_node" in out.reason


def test_job_track_commands_are_recorded_in_the_ledger_once_and_dry_runs_record_nothing(
    kube_api: client.ApiClient, namespace: str, make_fleet: Callable[..., fl.Fleet]
) -> None:
    core = client.CoreV1Api(kube_api)
    fleet = make_fleet(5)
    client.BatchV1Api(kube_api).create_namespaced_job(namespace, gpu_job("train", fleet))
    ranks = wait("4 ranks", lambda: (x := running_ranks(core, namespace, "train")) and len(x) == 4 and x)
    ref = f"{namespace}/train"
    ex = executor(kube_api, settings(namespace))
    dry = ex.handle(command("restart_job", job=ref, exclude_nodes=[ranks[0].node], dry_run=True))
    assert dry.outcome == "skipped" and dry.dry_run
    assert not p.applied_ids(core.read_namespaced_config_map(LEDGER_NAME, namespace).metadata.annotations or {})
    for action in ("cordon", "taint"):  # the node track, in parallel in the real flow
        assert ex.handle(command(action, ranks[0].node)).outcome == "applied"
    cmd = command("restart_job", job=ref, exclude_nodes=[ranks[0].node])
    first = ex.handle(cmd)
    assert first.outcome == "applied", first
    ledger = core.read_namespaced_config_map(LEDGER_NAME, namespace).metadata.annotations
    assert set(p.applied_ids(ledger)) == {cmd.id}
    again = executor(kube_api, settings(namespace), identity="other").handle(cmd)
    assert again.outcome == "skipped" and "duplicate" in again.reason
    moved = wait("4 new ranks off the excluded node", lambda: (x := running_ranks(core, namespace, "train"))
                 and len(x) == 4 and not ({y.uid for y in x} & {y.uid for y in ranks}) and x)
    assert ranks[0].node not in {x.node for x in moved}
    unknown = ex.handle(command("retry_in_place", job=f"{namespace}/no-such-job"))
    assert unknown.outcome == "failed"


def test_the_ledger_records_a_job_command_before_its_restart_and_only_once() -> None:
    cluster, restarter = FakeCluster(), RecordingRestarter()
    ex = fake_executor(cluster, settings("fm"), restarter=restarter)
    dry = ex.handle(command("restart_job", job="ml/train", exclude_nodes=["n1"], dry_run=True))
    assert dry.outcome == "skipped" and dry.dry_run and restarter.calls[-1]["dry_run"] is True
    assert not p.applied_ids(cluster.read_ledger("fm")[0])
    seen_at_restart: list[set[str]] = []
    restart = restarter.restart

    def checking(job: str, **kw: object) -> object:
        seen_at_restart.append(set(p.applied_ids(cluster.read_ledger("fm")[0])))
        return restart(job, **kw)  # type: ignore[arg-type]

    restarter.restart = checking  # type: ignore[method-assign,assignment]
    cmd = command("restart_job", job="ml/train", exclude_nodes=["n1"])
    first = ex.handle(cmd)
    assert first.outcome == "applied" and seen_at_restart == [{cmd.id}]  # recorded before the restart
    assert restarter.calls[-1] | {"params": {}} == {"job": "ml/train", "action": "restart_job", "exclude_nodes": ["n1"],
                                                    "params": {}, "dry_run": False, "actor": "test-executor"}
    assert restarter.calls[-1]["params"]["command_id"] == cmd.id
    again = fake_executor(cluster, settings("fm"), identity="other", restarter=restarter).handle(cmd)
    assert again.outcome == "skipped" and "duplicate" in again.reason and len(seen_at_restart) == 1
    escalated = ex.handle(command("escalate", job="ml/train", params={"escalation": "page"}))
    assert escalated.outcome == "skipped" and "'page'" in escalated.reason and len(seen_at_restart) == 1
    assert ex.handle(command("drain", job="ml/train")).reason == "drain needs a node"
