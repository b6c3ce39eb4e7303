"""``cluster.name``: the config's check of it, the ``cluster`` field every record carries (additive:
``schema_version`` stays, an older record without it decodes as unlabeled), the cluster inside a
command's signature and who may act on a command, and the ``cluster`` label on every metric served."""

from __future__ import annotations

import json
import urllib.request

import msgspec
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from fleetmedic import records as r
from fleetmedic.config import ConfigError, config_warnings, parse_config
from fleetmedic.serving import Health, serve
from fleetmedic.signing import KeySet, SignatureError, cluster_refusal, sign, sign_bytes, verify, verify_bytes

KEY = b"k" * 40
SKEW = 300.0


# --- config -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["", "a", "gpu-east-1", "0", "a" * 63])
def test_a_cluster_name_is_empty_or_a_dns_label(name: str) -> None:
    assert parse_config(f"cluster: {{name: '{name}'}}", env={}).cluster.name == name


@pytest.mark.parametrize("name", ["GPU-East", "gpu_east", "-east", "east-", "gpu.east", "a" * 64, "gpu east"])
def test_any_other_cluster_name_is_refused_naming_the_field_and_what_it_must_be(name: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(f"cluster: {{name: '{name}'}}", env={})
    assert "cluster.name: must be empty or a DNS-1123 label" in str(err.value)


def test_the_cluster_defaults_to_unnamed_and_comes_from_the_environment_too() -> None:
    s = parse_config("", env={})
    assert s.cluster.name == "" and s.cluster.accept_unlabeled_commands is False
    assert parse_config("", env={"FLEETMEDIC__CLUSTER__NAME": "gpu-west-2"}).cluster.name == "gpu-west-2"


def test_accepting_unlabeled_commands_under_a_name_is_a_warning() -> None:
    assert config_warnings(parse_config("cluster: {accept_unlabeled_commands: true}", env={})) == []
    (warning,) = config_warnings(parse_config("cluster: {name: gpu-east-1, accept_unlabeled_commands: true}",
                                              env={}))
    assert warning.startswith("cluster.accept_unlabeled_commands: true") and "'gpu-east-1'" in warning


# --- records ------------------------------------------------------------------------------------


def _command(**kw: object) -> r.RemediationCommand:
    fields: dict[str, object] = dict(id="inc-1/cordon/n1/1", action="cordon", incident_id="inc-1", reason="xid 79",
                                     issued_at=1000.0, expires_at=1300.0, node="n1")
    return r.RemediationCommand(**{**fields, **kw})  # type: ignore[arg-type]


def test_every_record_type_carries_the_cluster_and_round_trips_it() -> None:
    for record_type in (*r.RECORD_TYPES, r.AuditRecord):
        assert "cluster" in record_type.__struct_fields__, record_type.__name__
    finding = r.Finding(id="f", ts=1.0, node="n1", detector="xid_rules", kind="hard_fault", severity="critical",
                        summary="xid 79", evidence=[], cluster="gpu-east-1")
    wire = r.encode(finding)
    assert json.loads(wire)["cluster"] == "gpu-east-1" and json.loads(wire)["schema_version"] == 1
    assert r.decode(r.Finding, wire) == finding


def test_a_record_without_the_field_decodes_as_unlabeled_and_a_bad_name_is_refused_naming_the_field() -> None:
    doc = json.loads(r.encode(_command()))
    del doc["cluster"]  # a producer from before the field
    assert r.decode(r.RemediationCommand, json.dumps(doc)).cluster == ""
    with pytest.raises(r.InvalidRecord) as err:
        r.decode(r.RemediationCommand, json.dumps({**doc, "cluster": "Not A Label"}))
    assert err.value.path == "$.cluster"


def test_labelled_stamps_a_record_and_foreign_tells_another_clusters_record() -> None:
    unlabeled = _command()
    east = r.labelled(unlabeled, "gpu-east-1")
    assert east.cluster == "gpu-east-1" and r.labelled(east, "gpu-east-1") is east
    assert r.foreign(east, "gpu-west-2") and r.foreign(east, "")
    assert not r.foreign(east, "gpu-east-1") and not r.foreign(unlabeled, "gpu-west-2")


# --- signatures ---------------------------------------------------------------------------------


def test_the_cluster_is_inside_the_signature_in_the_body_and_in_the_header() -> None:
    signed = sign(_command(cluster="gpu-east-1"), KEY)
    verify(signed, KEY, 1100.0, max_future_skew_s=SKEW)
    with pytest.raises(SignatureError, match="does not match"):
        verify(msgspec.structs.replace(signed, cluster="gpu-west-2"), KEY, 1100.0, max_future_skew_s=SKEW)
    with pytest.raises(SignatureError, match="does not match"):
        verify(msgspec.structs.replace(signed, cluster=""), KEY, 1100.0, max_future_skew_s=SKEW)
    keys = KeySet({"command": KEY}, "command", what="command key")
    value = r.encode(signed)
    headers = sign_bytes(value, "command", KEY)
    verify_bytes(value, headers, keys)
    moved = value.replace(b'"cluster":"gpu-east-1"', b'"cluster":"gpu-west-2"')
    assert moved != value
    with pytest.raises(SignatureError):
        verify_bytes(moved, headers, keys)


@pytest.mark.parametrize(("command", "here", "accept_unlabeled", "refused"), [
    ("gpu-east-1", "gpu-east-1", False, None),
    ("", "", False, None),
    ("gpu-west-2", "gpu-east-1", False, "addressed to cluster 'gpu-west-2', and this one is 'gpu-east-1'"),
    ("gpu-west-2", "gpu-east-1", True, "addressed to cluster 'gpu-west-2'"),
    ("gpu-east-1", "", False, "addressed to cluster 'gpu-east-1', and this one has no cluster.name"),
    ("", "gpu-east-1", False, "names no cluster"),
    ("", "gpu-east-1", True, None),
])
def test_a_command_is_acted_on_only_in_the_cluster_it_is_addressed_to(command: str, here: str,
                                                                      accept_unlabeled: bool,
                                                                      refused: str | None) -> None:
    why = cluster_refusal(_command(cluster=command), here, accept_unlabeled=accept_unlabeled)
    assert (why is None) if refused is None else (why is not None and refused in why)


# --- metrics ------------------------------------------------------------------------------------


def _metrics_page(registry: CollectorRegistry, cluster: str, query: str = "") -> str:
    server = serve(registry, 0, "127.0.0.1", Health(stall_after_s=60), cluster)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics{query}"
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.read().decode()
    finally:
        server.shutdown()


def _samples(page: str) -> list[str]:
    return [line for line in page.splitlines() if line.startswith("fleetmedic_")]


def test_every_metric_served_carries_the_cluster_label_when_the_cluster_has_a_name() -> None:
    registry = CollectorRegistry()
    Counter("fleetmedic_test_events", "events", ["kind"], registry=registry).labels("a").inc()
    Gauge("fleetmedic_test_level", "a level", registry=registry).set(3)
    Histogram("fleetmedic_test_seconds", "time", buckets=(1.0,), registry=registry).observe(0.5)
    named = _samples(_metrics_page(registry, "gpu-east-1"))
    assert len(named) >= 7 and all('cluster="gpu-east-1"' in line for line in named), named
    assert 'fleetmedic_test_events_total{cluster="gpu-east-1",kind="a"} 1.0' in named
    restricted = _samples(_metrics_page(registry, "gpu-east-1", "?name[]=fleetmedic_test_level"))
    assert restricted == ['fleetmedic_test_level{cluster="gpu-east-1"} 3.0']
    unnamed = _samples(_metrics_page(registry, ""))
    assert len(unnamed) == len(named) and not any("cluster=" in line for line in unnamed)
    # the metric objects stay as registered: code and tests read them by their own labels
    assert registry.get_sample_value("fleetmedic_test_events_total", {"kind": "a"}) == 1.0
