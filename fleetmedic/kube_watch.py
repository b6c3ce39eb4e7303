"""List + watch of Kubernetes resources as raw JSON, shared by the job watcher and the executor's cache.

No client models: the objects stay the dicts the API server sent (decoding them into models is the
cost that matters at thousands of pods, and a malformed object then cannot break a stream).

- :func:`list_pages`: every object at a path, one :class:`Page` of at most ``PAGE`` objects at a
  time (a caller that handles each page before asking for the next holds one page, not the whole
  list: 2,000 Nodes decode to ~40 MiB); when a page's continue token expires meanwhile (etcd
  compacted while a slow client paged: HTTP 410), the list is taken again in one piece, as
  client-go's reflector falls back to, and that page says so (``again``). The last page carries the
  list's resourceVersion, from which a watch starts. :func:`list_objects`: the same, as one list.
- :func:`watch_lines`: the watch's newline-delimited events from a resourceVersion (bookmarks on),
  until the server's ``timeoutSeconds``.
- :func:`event_of`: one line as ``(type, object)``; an ``ERROR`` event raises (:class:`Gone` for
  410: list again), an unreadable line gives None.
- :func:`keep`: an object reduced to the fields its reader uses (a :data:`Fields` tree), so that
  what waits in a queue or a cache is that, not the whole object (managedFields, pod templates,
  images, volumes).

HTTP 410 raises :class:`Gone` (the resourceVersion is too old: list again), 404 on a list
:class:`NotServed` (the API is not served: a CRD not installed), any other error status
``kubernetes.client.ApiException``. Reconnecting, backoff and what a list replaces are the callers'.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Union

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


@dataclass(frozen=True)
class Page:
    """One page of a list: its objects; ``again``: the list starts over here (forget the objects of
    the pages before); ``resource_version``: the list's, on its last page ("" on the others)."""

    items: list[dict[str, Any]]
    again: bool = False
    resource_version: str = ""


def list_pages(api: client.ApiClient, path: str, selector: str = "", *, page: int = PAGE,
               read_timeout: float = LIST_READ_TIMEOUT_S) -> Iterator[Page]:
    """The objects at ``path`` matching the label ``selector``, a page at a time (the next page is
    asked for when the caller asks for it)."""
    base = {"labelSelector": selector} if selector else {}
    query = {"limit": str(page), **base}
    again = False
    while True:
        resp = get(api, path, query, read_timeout)
        data = resp.read()
        if resp.status == 404:
            raise NotServed(path)
        if resp.status == 410 and "continue" in query:
            log.info("%s: continue token expired while paging; listing in one piece", path)
            query, again = dict(base), True
            continue
        if resp.status == 410:
            raise Gone(path)
        if resp.status >= 400:
            raise _error(resp, data)
        doc = json.loads(data)
        del data, resp  # the body: the generator's frame lives on while the caller handles the page
        items = [i for i in doc.get("items") or [] if isinstance(i, dict)]
        meta = doc.get("metadata") or {}
        del doc
        token = meta.get("continue")
        yield Page(items, again, "" if token else str(meta.get("resourceVersion") or ""))
        del items
        if not token:
            return
        query["continue"], again = token, False


def list_objects(api: client.ApiClient, path: str, selector: str = "", *, page: int = PAGE,
                 read_timeout: float = LIST_READ_TIMEOUT_S) -> tuple[list[dict[str, Any]], str]:
    """All objects at ``path`` matching the label ``selector`` and the list's resourceVersion."""
    items: list[dict[str, Any]] = []
    rv = ""
    for p in list_pages(api, path, selector, page=page, read_timeout=read_timeout):
        if p.again:
            items = []
        items += p.items
        rv = p.resource_version
    return items, rv


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


#: Which fields of an object to keep: a key's value is ``True`` (all of it), a tree (the fields of
#: the object it holds), or a one-tree list (the fields of each object of the list it holds); the
#: key ``"*"`` stands for every key. A value whose shape differs from the tree's is kept whole, so
#: a reader sees a malformed object as malformed as it came.
Fields = Mapping[str, Union[bool, "Fields", list["Fields"]]]


def keep(obj: Any, fields: Fields) -> Any:
    """``obj`` with only the ``fields`` (see :data:`Fields`); a new dict, ``obj`` untouched."""
    if not isinstance(obj, dict):
        return obj
    every = fields.get("*")
    pairs = ((k, v, fields.get(k, every)) for k, v in obj.items()) if every is not None else (
        (k, obj[k], sub) for k, sub in fields.items() if k in obj)
    out: dict[str, Any] = {}
    for key, value, sub in pairs:
        if sub is None or sub is False:
            continue
        if sub is True:
            out[key] = value
        elif isinstance(sub, list):
            out[key] = [keep(v, sub[0]) for v in value] if isinstance(value, list) else value
        else:
            out[key] = keep(value, sub)
    return out


def merged(*trees: Fields) -> Fields:
    """The fields any of ``trees`` keeps (readers that share a watch)."""
    out: dict[str, Any] = {}
    for tree in trees:
        for key, sub in tree.items():
            have = out.get(key)
            if have is None or sub is True or have is True:
                out[key] = True if have is True else sub
            elif isinstance(have, list) and isinstance(sub, list):
                out[key] = [merged(have[0], sub[0])]
            elif isinstance(have, Mapping) and isinstance(sub, Mapping):
                out[key] = merged(have, sub)
            else:
                out[key] = True  # a list in one, an object in the other: keep it whole
    return out
