"""The bind-time check: the answer to the API server's ``ValidatingWebhook`` call for a pod's
binding (``pods/binding``, what the scheduler creates) or a pod created with ``spec.nodeName``
(bound by its creator). A bind to a node in ``refused`` (the nodes whose cordon fleetmedic issued
and has not yet seen applied: :meth:`~fleetmedic.remediation.engine.DecisionEngine.cordons_in_flight`)
is denied, naming the node and why; the scheduler then places the pod elsewhere. Everything else
is allowed, so is a review that cannot be read (the webhook fails open: a broken check must never
stop a cluster from scheduling), and in dry run a bind that would be denied is allowed with a
warning. Pure: the review's bytes in, the answer out."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

Outcome = Literal["allowed", "denied", "would_deny", "unreadable", "other"]

_API = "admission.k8s.io/v1"


@dataclass(frozen=True)
class Review:
    """The answer (an ``AdmissionReview``, as JSON bytes), what was decided and the node asked for."""

    body: bytes
    outcome: Outcome
    node: str = ""
    reason: str = ""


def review(body: bytes, refused: Mapping[str, str], dry_run: bool = False) -> Review:
    """Answer one ``AdmissionReview`` request (``body``); see the module docstring."""
    try:
        doc = msgspec.json.decode(body)
    except msgspec.DecodeError as exc:
        return Review(_answer("", True), "unreadable", reason=f"not JSON: {exc}")
    request = doc.get("request") if isinstance(doc, dict) else None
    if not isinstance(request, dict) or not isinstance(request.get("uid"), str):
        return Review(_answer("", True), "unreadable", reason="no request.uid")
    uid = request["uid"]
    node = _target(request)
    if node is None:
        return Review(_answer(uid, True), "other")
    why = refused.get(node)
    if why is None:
        return Review(_answer(uid, True), "allowed", node)
    pod = f"{request.get('namespace') or ''}/{request.get('name') or ''}".strip("/")
    message = (f"fleetmedic: node {node} is being taken out of service ({why}); its cordon is on its way: "
               f"{pod or 'the pod'} goes elsewhere")
    if dry_run:
        return Review(_answer(uid, True, warning=f"{message} (dry run: allowed)"), "would_deny", node, why)
    return Review(_answer(uid, False, message), "denied", node, why)


def _target(request: dict[str, Any]) -> str | None:
    """The node a bind or a bound pod's creation names (None: not a bind)."""
    if request.get("operation") != "CREATE":
        return None
    resource = request.get("resource")
    if not isinstance(resource, dict) or resource.get("resource") != "pods":
        return None
    obj = request.get("object")
    if not isinstance(obj, dict):
        return None
    sub = request.get("subResource") or ""
    if sub == "binding":
        target = obj.get("target")
        name = target.get("name") if isinstance(target, dict) else None
    elif not sub:
        spec = obj.get("spec")
        name = spec.get("nodeName") if isinstance(spec, dict) else None
    else:
        return None
    return name if isinstance(name, str) and name else None


def _answer(uid: str, allowed: bool, message: str = "", warning: str = "") -> bytes:
    response: dict[str, Any] = {"uid": uid, "allowed": allowed}
    if not allowed:
        response["status"] = {"code": 403, "reason": "Forbidden", "message": message}
    if warning:
        response["warnings"] = [warning[:1000]]
    return msgspec.json.encode({"apiVersion": _API, "kind": "AdmissionReview", "response": response})
