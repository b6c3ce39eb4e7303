"""The shared list + watch (fleetmedic/kube_watch.py).

- A watch line: an ERROR event raises (410: Gone), an unreadable line or object gives None.
- On the real control plane (etcd compacted every 10 s): a paged list whose continue token expires
  between two pages (as a slow client's on a busy server) is taken again in one piece and still
  returns every object; a list of an API that is not served says so (NotServed).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest
from kubernetes import client

from fleetmedic.kube_watch import Gone, NotServed, event_of, get, list_objects


def test_watch_lines_become_events_errors_raise_and_garbage_is_none() -> None:
    pod = {"metadata": {"name": "p", "resourceVersion": "7"}}
    assert event_of(json.dumps({"type": "ADDED", "object": pod}).encode()) == ("ADDED", pod)
    with pytest.raises(Gone):
        event_of(b'{"type": "ERROR", "object": {"kind": "Status", "code": 410}}')
    with pytest.raises(client.ApiException) as err:
        event_of(b'{"type": "ERROR", "object": {"kind": "Status", "code": 500, "message": "etcd"}}')
    assert err.value.status == 500
    for bad in (b"{not json", b'{"type": "ADDED"}', b'{"type": "ADDED", "object": [1]}', b"[]"):
        assert event_of(bad) is None, bad


def test_a_list_whose_continue_token_expires_between_pages_is_taken_again_in_one_piece(
    kube_api: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(kube_api)
    names = {f"cm-{i}" for i in range(3)}
    for name in names:
        core.create_namespaced_config_map(namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name)))
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    expired: list[str] = []
    original = kube_api.call_api

    def slow_client(method: str, url: str, *args: Any, **kw: Any) -> Any:
        """Before the first request for a second page, wait (as a busy client would) until the
        server no longer honours its continue token: it has compacted past the first page."""
        if "continue=" in url and not expired:
            core.create_namespaced_config_map(namespace, client.V1ConfigMap(
                metadata=client.V1ObjectMeta(name=f"later-{uuid.uuid4().hex[:6]}")))  # history to compact
            deadline = time.monotonic() + 40
            while True:
                probe = original(method, url, *args, **kw)
                probe.read()
                if probe.status == 410:
                    expired.append(url)
                    break
                assert time.monotonic() < deadline, "the continue token did not expire within 40 s"
                time.sleep(1.0)
        return original(method, url, *args, **kw)

    kube_api.call_api = slow_client  # type: ignore[method-assign]
    try:
        items, rv = list_objects(kube_api, path, page=1)
    finally:
        kube_api.call_api = original  # type: ignore[method-assign]
    assert expired, "the list never asked for a second page"
    got = {i["metadata"]["name"] for i in items}
    assert names <= got and any(n.startswith("later-") for n in got) and rv  # one consistent list, after
    resp = get(kube_api, path, {"watch": "1", "resourceVersion": rv, "timeoutSeconds": "1"}, 10.0)
    resp.read()
    assert resp.status == 200  # a watch starts from the fallback list's version

    with pytest.raises(NotServed):
        list_objects(kube_api, "/apis/example.invalid/v1/widgets")
