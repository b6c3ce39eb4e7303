"""The bind-time check's answers (:mod:`fleetmedic.remediation.admission`) and the nodes it refuses
(:meth:`DecisionEngine.cordons_in_flight`): from the decision to take a node out of service until
its cordon is applied, and not after. The real API server calling it: tests/streams/test_admission_kube.py."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from fleetmedic.records import RemediationResult
from fleetmedic.remediation.admission import review
from tests.remediation.helpers_world import World


def binding(node: str, uid: str = "u-1", sub: str = "binding") -> bytes:
    obj: dict[str, Any] = ({"kind": "Binding", "metadata": {"name": "p"}, "target": {"kind": "Node", "name": node}}
                           if sub else {"kind": "Pod", "metadata": {"name": "p"}, "spec": {"nodeName": node}})
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": uid, "operation": "CREATE", "resource": {"group": "", "version": "v1", "resource": "pods"},
        "subResource": sub, "name": "p", "namespace": "ml", "object": obj}}).encode()


def response(body: bytes) -> dict[str, Any]:
    doc = json.loads(body)
    assert doc["apiVersion"] == "admission.k8s.io/v1" and doc["kind"] == "AdmissionReview"
    out: dict[str, Any] = doc["response"]
    return out


def test_a_bind_to_a_node_whose_cordon_is_on_its_way_is_denied_with_why_and_others_are_allowed() -> None:
    refused = {"node-3": "quarantined (definitive evidence, xid:79)"}
    r = review(binding("node-3"), refused)
    resp = response(r.body)
    assert r.outcome == "denied" and resp["uid"] == "u-1" and resp["allowed"] is False
    assert resp["status"]["code"] == 403 and "node-3" in resp["status"]["message"]
    assert "xid:79" in resp["status"]["message"] and "ml/p" in resp["status"]["message"]
    assert response(review(binding("node-4"), refused).body)["allowed"] is True
    # a pod created already bound (spec.nodeName) is a bind too
    assert review(binding("node-3", sub=""), refused).outcome == "denied"


def test_dry_run_allows_what_it_would_deny_with_a_warning() -> None:
    r = review(binding("node-3"), {"node-3": "diagnosing"}, dry_run=True)
    resp = response(r.body)
    assert r.outcome == "would_deny" and resp["allowed"] is True and "dry run" in resp["warnings"][0]


def test_what_is_not_a_bind_or_cannot_be_read_is_allowed() -> None:
    refused = {"node-3": "x"}
    other = json.loads(binding("node-3"))
    other["request"]["operation"] = "UPDATE"
    assert review(json.dumps(other).encode(), refused).outcome == "other"
    status = json.loads(binding("node-3"))
    status["request"]["subResource"] = "status"
    assert review(json.dumps(status).encode(), refused).outcome == "other"
    assert review(b"{not json", refused).outcome == "unreadable"
    assert review(b'{"request": {}}', refused).outcome == "unreadable"


@given(st.one_of(st.binary(max_size=300), st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=8)),
    lambda kids: st.one_of(st.lists(kids, max_size=4), st.dictionaries(st.sampled_from(
        ["request", "uid", "operation", "resource", "subResource", "object", "target", "name", "spec", "nodeName"]),
        kids, max_size=5)), max_leaves=20).map(lambda d: json.dumps(d).encode())))
def test_any_body_gets_an_answer_that_never_denies_unless_it_names_a_refused_node(body: bytes) -> None:
    r = review(body, {"n": "x"})
    resp = response(r.body)
    assert resp["allowed"] is (r.outcome != "denied")
    assert r.outcome != "denied" or r.node == "n"


def test_the_engine_refuses_binds_from_the_decision_until_the_cordon_is_applied() -> None:
    w = World(auto_execute=False)
    assert w.engine.cordons_in_flight() == {}
    w.gpu_lost("node-3")
    refused = w.engine.cordons_in_flight()
    assert list(refused) == ["node-3"] and "definitive" in refused["node-3"]
    cordon = w.cmds("cordon", node="node-3")[-1]
    w.engine.on_result(RemediationResult(command_id=cordon.id, action="cordon", outcome="applied", ts=w.now,
                                         node="node-3", executor="test"), w.now)
    assert w.engine.cordons_in_flight() == {}  # the scheduler's own check takes over
    # preventive evidence is confirmed and settles before its isolation: until the cordon is
    # decided no bind is refused
    w2 = World(auto_execute=False)
    for _ in range(20):
        w2.degradation("node-5", severity="critical")
        if w2.cmds("cordon", node="node-5"):
            break
        assert "node-5" not in w2.engine.cordons_in_flight()
        w2.advance(30)
    assert w2.cmds("cordon", node="node-5") and "preventive" in w2.engine.cordons_in_flight()["node-5"]
