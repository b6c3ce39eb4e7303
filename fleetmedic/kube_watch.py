"""List + watch of Kubernetes resources as raw JSON, shared by the job watcher and the executor's cache.

No client models: the objects stay the dicts the API server sent (decoding them into models is the
cost that matters at thousands of pods, and a malformed object then cannot break a stream).

- :func:`list_objects`: every object at a path, in pages of ``PAGE``; when a page's continue token
  expires meanwhile (etcd compacted while a slow client paged: HTTP 410), the list is taken again in
  one piece, as client-go's reflector falls back to. Returns the items and the list's
  resourceVersion, from which a watch starts.
- :func:`watch_lines`: the watch's newline-delimited events from a resourceVersion (bookmarks on),
  until the server's ``timeoutSeconds``.
- :func:`event_of`: one line as ``(type, object)``; an ``ERROR`` event raises (:class:`Gone` for
  410: list again), an unreadable line gives None.

HTTP 410 raises :class:`Gone` (the resourceVersion is too old: list again), 404 on a list
:class:`NotServed` (the API is not served: a CRD not installed), any other error status
``kubernetes.client.ApiException``. Reconnecting, backoff and what a list replaces are the callers'.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

from kubernetes import client

log = logging.getLogger(__name__)
ApiClient = client.ApiClient  # the client every list and watch here goes through
PAGE = 500
LIST_READ_TIMEOUT_S = 60.0
CONNECT_TIMEOUT_S = 10.0


class Gone(Exception):
    """The resourceVersion is too old (HTTP 410): list again."""


class NotServed(Exception):
    """The API server does not serve this resource (its CRD is not installed)."""


def get(api: client.ApiClient, path: str, query: dict[str, str], read_timeout: float) -> Any:
    """GET ``path`` (the raw urllib3-backed response, not read yet)."""
    method, url, headers, body, post = api.param_serialize(
        "GET", path, query_params=list(query.items()), auth_settings=["BearerToken"])
    return api.call_api(method, url, headers, body, post, _request_timeout=(CONNECT_TIMEOUT_S, read_timeout))


def _error(resp: Any, data: bytes | None = None) -> client.ApiException:
    body = resp.read() if data is None else data
    return client.ApiException(status=resp.status, reason=body[:200].decode(errors="replace"))


def list_objects(api: client.ApiClient, path: str, selector: str = "", *, page: int = PAGE,
                 read_timeout: float = LIST_READ_TIMEOUT_S) -> tuple[list[dict[str, Any]], str]:
    """All objects at ``path`` matching the label ``selector`` and the list's resourceVersion."""
    items: list[dict[str, Any]] = []
    base = {"labelSelector": selector} if selector else {}
    query = {"limit": str(page), **base}
    while True:
        resp = get(api, path, query, read_timeout)
        data = resp.read()
        if resp.status == 404:
            raise NotServed(path)
        if resp.status == 410 and "continue" in query:
            log.info("%s: continue token expired while paging; listing in one piece", path)
            items, query = [], dict(base)
            continue
        if resp.status == 410:
            raise Gone(path)
        if resp.status >= 400:
            raise _error(resp, data)
        doc = json.loads(data)
        items += [i for i in doc.get("items") or [] if isinstance(i, dict)]
        meta = doc.get("metadata") or {}
        if not meta.get("continue"):
            return items, str(meta.get("resourceVersion") or "")
        query["continue"] = meta["continue"]


def watch_lines(api: client.ApiClient, path: str, selector: str, rv: str, timeout_s: int) -> Iterator[bytes]:
    """The watch's event lines from ``rv`` until the server ends it (``timeout_s``) or the caller stops
    iterating (the connection is released either way)."""
    query = {"watch": "1", "resourceVersion": rv, "allowWatchBookmarks": "true", "timeoutSeconds": str(timeout_s),
             **({"labelSelector": selector} if selector else {})}
    resp = get(api, path, query, timeout_s + 30.0)
    if resp.status == 410:
        resp.read()
        raise Gone(path)
    if resp.status >= 400:
        raise _error(resp)
    buffer = b""
    try:
        for chunk in resp.response.stream(amt=None, decode_content=False):
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            yield from (line for line in lines if line.strip())
    finally:
        resp.response.release_conn()


def event_of(line: bytes, path: str = "") -> tuple[str, dict[str, Any]] | None:
    """One watch line as (event type, object); None if it is not a readable event. An ``ERROR``
    event raises :class:`Gone` (code 410) or ``ApiException``."""
    try:
        ev = json.loads(line)
        etype, obj = str(ev["type"]), ev["object"]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(obj, dict):
        return None
    if etype == "ERROR":
        if obj.get("code") == 410:
            raise Gone(path)
        raise client.ApiException(status=obj.get("code", 500), reason=str(obj)[:200])
    return etype, obj


def resource_version(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata")
    return str(meta.get("resourceVersion") or "") if isinstance(meta, dict) else ""
