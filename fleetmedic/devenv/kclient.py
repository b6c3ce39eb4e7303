"""Small helpers over the ``kubernetes`` client (v37+: pydantic models, typed methods)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kubernetes import client, config


def api_client(kubeconfig: Path | str) -> client.ApiClient:
    """An ApiClient for the cluster in ``kubeconfig`` (does not touch the global default)."""
    api: client.ApiClient = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
    return api


@contextmanager
def connect(kubeconfig: Path | str) -> Iterator[client.ApiClient]:
    """``api_client`` that is closed (its thread pool and connections) on exit."""
    api = api_client(kubeconfig)
    try:
        yield api
    finally:
        api.close()  # type: ignore[no-untyped-call]


def get_raw(api: client.ApiClient, path: str, timeout: float = 10.0) -> tuple[int, bytes]:
    """GET ``path`` with the client's credentials; (status, body) without model decoding."""
    method, url, headers, body, post = api.param_serialize("GET", path, auth_settings=["BearerToken"])
    resp = api.call_api(method, url, headers, body, post, _request_timeout=timeout)
    resp.read()  # type: ignore[no-untyped-call]
    return resp.status, resp.data or b""


def get_json(api: client.ApiClient, path: str, timeout: float = 10.0) -> dict[str, Any]:
    status, data = get_raw(api, path, timeout)
    if status >= 400:
        raise client.ApiException(status=status, reason=data[:200].decode(errors="replace"))
    doc: dict[str, Any] = json.loads(data)
    return doc
