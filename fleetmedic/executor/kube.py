"""The executor's seam to the Kubernetes API server (the official ``kubernetes`` client).

:class:`KubeCluster` is the :class:`~fleetmedic.executor.cluster.Cluster` on a real API server:
everything the node track does to a cluster, and the job track's command ledger, goes through it.
It translates between the client's models and the plain values of :mod:`.node.plan` and
:mod:`.node.long_plan`, and API errors into :class:`~.cluster.Conflict` or :class:`~.cluster.ApiError`.
:func:`api_message` is the one reading of an API server's error, :func:`create_event` the one
write of an Event (bodies from :func:`~.cluster.event_body`). The job track (:mod:`.workload`)
works on workloads through ``KubeCluster.api``, the same client.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar, cast

from kubernetes import client
from kubernetes.client import ApiException

from fleetmedic.executor.cluster import EVENT_NAMESPACE, ApiError, Conflict, Eviction, Resource, event_body
from fleetmedic.executor.node.conditions import Condition
from fleetmedic.executor.node.long_plan import JobOutcome, PodView, job_outcome
from fleetmedic.executor.node.plan import MIRROR_ANNOTATION, NodeView, Note, Taint
from fleetmedic.k8s_keys import CONDITION_QUARANTINE, LABEL_ROLE, SOURCE_COMPONENT

log = logging.getLogger(__name__)
M = TypeVar("M")
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
LEDGER_NAME = "fleetmedic-executor-ledger"


def api_message(exc: ApiException) -> str:
    """The API server's message in an error (its Status ``message``, else the HTTP reason)."""
    try:
        return str(json.loads(exc.body or "{}").get("message", exc.reason))
    except (ValueError, AttributeError):
        return str(exc.reason)


def create_event(api: client.ApiClient, body: Mapping[str, Any]) -> None:
    """Record an Event (a body from :func:`~.cluster.event_body`); best effort: a lost Event is
    logged, never raised."""
    namespace = str(body["metadata"]["namespace"])
    about = body["involvedObject"]
    try:
        client.CoreV1Api(api).create_namespaced_event(namespace, _model(client.CoreV1Event, dict(body)))
    except ApiException as exc:
        log.warning("event on %s %s/%s not recorded: %s %s", about.get("kind"), about.get("namespace", ""),
                    about.get("name"), exc.status, api_message(exc))


class KubeCluster:
    """The :class:`~fleetmedic.executor.cluster.Cluster` on an API server, writing as ``component``."""

    def __init__(self, api: client.ApiClient, component: str = SOURCE_COMPONENT, instance: str = "") -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.batch = client.BatchV1Api(api)
        self.policy = client.PolicyV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.component = component
        self.instance = instance or component

    # --- nodes -------------------------------------------------------------------------------------

    def read_node(self, name: str) -> NodeView | None:
        try:
            node = self.core.read_node(name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise _error(f"read node {name}", exc) from None
        meta, spec, status = node.metadata, node.spec, node.status
        gpus = (status.allocatable or {}).get("nvidia.com/gpu", "0") if status else "0"
        return NodeView(
            name=name,
            uid=str(meta.uid or "") if meta else "",
            unschedulable=bool(spec.unschedulable) if spec else False,
            taints=tuple(Taint(t.key, t.value or "", t.effect) for t in (spec.taints or [])) if spec else (),
            labels=dict(meta.labels or {}) if meta else {},
            annotations=dict(meta.annotations or {}) if meta else {},
            resource_version=str(meta.resource_version or "") if meta else "",
            conditions={str(c.type): str(c.status) for c in (status.conditions or [])} if status else {},
            gpus=int(gpus) if str(gpus).isdigit() else 0,
        )

    def patch_node(self, name: str, patch: dict[str, Any]) -> None:
        try:
            self.core.patch_node(name, patch, _content_type=MERGE)
        except ApiException as exc:
            if exc.status == 409:
                raise Conflict(f"node {name} changed while being patched") from None
            raise _error(f"patch node {name}", exc) from None

    def set_condition(self, name: str, cond: Condition, ctype: str = CONDITION_QUARANTINE) -> None:
        now = _now()
        body = {"status": {"conditions": [{"type": ctype, "status": cond.status, "reason": cond.reason,
                                           "message": cond.message, "lastTransitionTime": now,
                                           "lastHeartbeatTime": now}]}}
        try:  # strategic merge: conditions merge by type, the kubelet's (kwok's) stay
            self.core.patch_node_status(name, body, _content_type=STRATEGIC)
        except ApiException as exc:
            raise _error(f"set condition on node {name}", exc) from None

    def event(self, node: str, note: Note, action: str) -> None:
        """A core/v1 Event about the Node (best effort: a lost Event must not fail the action)."""
        # kubelet's convention for Node events, which `kubectl describe node` relies on: uid = name
        create_event(self.api, event_body({"kind": "Node", "name": node, "uid": node, "apiVersion": "v1"},
                                          note.reason, note.message, namespace=EVENT_NAMESPACE, warning=note.warning,
                                          component=self.component, reporting_component=self.component,
                                          instance=self.instance, action=action))

    # --- pods and evictions ------------------------------------------------------------------------

    def pods_on(self, node: str) -> list[PodView]:
        try:
            pods = self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items
        except ApiException as exc:
            raise _error(f"list pods on {node}", exc) from None
        out = []
        for p in pods:
            meta = _meta(p)
            owners = meta.owner_references or []
            controller = next((o for o in owners if o.controller), owners[0] if owners else None)
            out.append(PodView(
                namespace=str(meta.namespace), name=str(meta.name), phase=str(p.status.phase if p.status else ""),
                owner_kind=controller.kind if controller else "",
                mirror=MIRROR_ANNOTATION in (meta.annotations or {}),
                deleting=meta.deletion_timestamp is not None,
                role=(meta.labels or {}).get(LABEL_ROLE, "")))
        return out

    def evict(self, pod: PodView) -> Eviction:
        body = client.V1Eviction(metadata=client.V1ObjectMeta(name=pod.name, namespace=pod.namespace))
        try:
            self.core.create_namespaced_pod_eviction(pod.name, pod.namespace, body)
            return Eviction(True, 201)
        except ApiException as exc:
            if exc.status == 404:
                return Eviction(True, 404, "already gone")
            if exc.status == 429:
                return Eviction(False, 429, api_message(exc), self._pdbs_selecting(pod))
            raise _error(f"evict {pod.ref}", exc) from None

    def _pdbs_selecting(self, pod: PodView) -> tuple[str, ...]:
        try:
            labels = _meta(self.core.read_namespaced_pod(pod.name, pod.namespace)).labels or {}
            pdbs = self.policy.list_namespaced_pod_disruption_budget(pod.namespace).items
        except ApiException:
            return ()
        names = []
        for pdb in pdbs:
            sel = pdb.spec.selector if pdb.spec else None
            match = (sel.match_labels or {}) if sel else {}
            if sel and not sel.match_expressions and all(labels.get(k) == v for k, v in match.items()):
                names.append(f"{pod.namespace}/{_meta(pdb).name}")
        return tuple(names)

    # --- Jobs (diagnostics, hooks) -----------------------------------------------------------------

    def create_job(self, doc: dict[str, Any]) -> None:
        ns = doc["metadata"]["namespace"]
        try:
            self.batch.create_namespaced_job(ns, _model(client.V1Job, doc))
        except ApiException as exc:
            if exc.status != 409:  # already created (a resumed command): watch that one
                raise _error(f"create Job {ns}/{doc['metadata']['name']}", exc) from None

    def job_outcome(self, namespace: str, name: str) -> JobOutcome | None:
        """The Job's outcome (``passed`` None while it runs), or ``None`` if there is no such Job."""
        try:
            job = self.batch.read_namespaced_job(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise _error(f"read Job {namespace}/{name}", exc) from None
        conds = [(c.type, c.status, c.message or "") for c in (job.status.conditions or [])] if job.status else []
        outcome = job_outcome(conds)
        if outcome.passed is False:
            return JobOutcome(False, self._termination_message(namespace, name) or outcome.message)
        return outcome

    def _termination_message(self, namespace: str, job: str) -> str:
        try:
            pods = self.core.list_namespaced_pod(namespace, label_selector=f"job-name={job}").items
        except ApiException:
            return ""
        for p in pods:
            for cs in (p.status.container_statuses or []) if p.status else []:
                term = cs.state.terminated if cs.state else None
                if term and term.exit_code:
                    return str(term.message or f"exit code {term.exit_code}")
        return ""

    # --- the job-command ledger --------------------------------------------------------------------

    def read_ledger(self, namespace: str) -> tuple[dict[str, str], str]:
        """Annotations and resourceVersion of the ledger ConfigMap (created empty when missing)."""
        try:
            cm = self.core.read_namespaced_config_map(LEDGER_NAME, namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise _error(f"read ledger {namespace}/{LEDGER_NAME}", exc) from None
            body = client.V1ConfigMap(metadata=client.V1ObjectMeta(
                name=LEDGER_NAME, namespace=namespace, labels={"app.kubernetes.io/managed-by": "fleetmedic"}))
            try:
                cm = self.core.create_namespaced_config_map(namespace, body)
            except ApiException as exc2:
                if exc2.status == 409:
                    return self.read_ledger(namespace)
                raise _error(f"create ledger {namespace}/{LEDGER_NAME}", exc2) from None
        return dict(_meta(cm).annotations or {}), str(_meta(cm).resource_version or "")

    def patch_ledger(self, namespace: str, annotations: dict[str, str | None], resource_version: str) -> None:
        patch = {"metadata": {"annotations": annotations, "resourceVersion": resource_version}}
        try:
            self.core.patch_namespaced_config_map(LEDGER_NAME, namespace, patch, _content_type=MERGE)
        except ApiException as exc:
            if exc.status == 409:
                raise Conflict("the ledger changed while being patched") from None
            raise _error("patch ledger", exc) from None

    # --- workloads, their pods, and the nodes placement reads (JSON) ----------------------------------

    def get_object(self, res: Resource, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return _read_json(self.custom.get_namespaced_custom_object(
                res.group, res.version, namespace, res.plural, name, _preload_content=False))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise _error(f"read {res.plural} {namespace}/{name}", exc) from None

    def list_objects(self, res: Resource, namespace: str, label_selector: str = "") -> list[dict[str, Any]]:
        try:
            listed = _read_json(self.custom.list_namespaced_custom_object(
                res.group, res.version, namespace, res.plural, label_selector=label_selector, _preload_content=False))
        except ApiException as exc:
            raise _error(f"list {res.plural} in {namespace}", exc) from None
        return list(listed.get("items") or [])

    def patch_object(self, res: Resource, namespace: str, name: str,
                     patch: list[dict[str, Any]] | dict[str, Any]) -> dict[str, Any]:
        try:
            return _read_json(self.custom.patch_namespaced_custom_object(
                res.group, res.version, namespace, res.plural, name, patch, _preload_content=False,
                _content_type=JSON_PATCH if isinstance(patch, list) else MERGE))
        except ApiException as exc:
            raise _error(f"patch {res.plural} {namespace}/{name}", exc) from None

    def delete_job(self, namespace: str, name: str) -> bool:
        try:
            self.batch.delete_namespaced_job(name, namespace, body=client.V1DeleteOptions(
                propagation_policy="Foreground"))
            return True
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise _error(f"delete Job {namespace}/{name}", exc) from None

    def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        try:
            listed = _read_json(self.core.list_namespaced_pod(namespace, label_selector=label_selector,
                                                              _preload_content=False))
        except ApiException as exc:
            raise _error(f"list pods in {namespace} ({label_selector})", exc) from None
        return list(listed.get("items") or [])

    def live_pods(self) -> list[dict[str, Any]]:
        try:
            listed = _read_json(self.core.list_pod_for_all_namespaces(
                field_selector="status.phase!=Succeeded,status.phase!=Failed", _preload_content=False))
        except ApiException as exc:
            raise _error("list live pods", exc) from None
        return list(listed.get("items") or [])

    def list_nodes(self) -> list[dict[str, Any]]:
        try:
            return list(_read_json(self.core.list_node(_preload_content=False)).get("items") or [])
        except ApiException as exc:
            raise _error("list nodes", exc) from None

    def get_node(self, name: str) -> dict[str, Any] | None:
        try:
            return _read_json(self.core.read_node(name, _preload_content=False))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise _error(f"read node {name}", exc) from None

    def served_version(self, group: str, plural: str) -> str:
        try:
            groups = client.ApisApi(self.api).get_api_versions().groups or []
            found = next((g for g in groups if g.name == group), None)
            if found is None:
                return ""
            preferred = found.preferred_version.version if found.preferred_version else ""
            for version in [preferred, *(v.version for v in found.versions or [])]:
                if version and any(r.get("name") == plural for r in self._get(f"/apis/{group}/{version}").get(
                        "resources") or []):
                    return str(version)
        except ApiException as exc:
            raise _error(f"discover {group}", exc) from None
        return ""

    def _get(self, path: str) -> dict[str, Any]:
        method, url, headers, body, post = self.api.param_serialize("GET", path, auth_settings=["BearerToken"])
        resp = self.api.call_api(method, url, headers, body, post, _request_timeout=10.0)
        resp.read()  # type: ignore[no-untyped-call]
        if resp.status >= 400:
            raise ApiException(status=resp.status, reason=(resp.data or b"")[:200].decode(errors="replace"))
        return cast(dict[str, Any], json.loads(resp.data or b"{}"))

    def record_event(self, body: dict[str, Any]) -> None:
        create_event(self.api, body)


def _read_json(resp: Any) -> dict[str, Any]:
    """The JSON body of a response asked for with ``_preload_content=False`` (no client models)."""
    return cast(dict[str, Any], json.loads(resp.data or b"{}"))


def _error(what: str, exc: ApiException) -> ApiError:
    detail = api_message(exc)
    return ApiError(f"{what}: {exc.status} {detail}", exc.status, detail)


def _meta(obj: Any) -> client.V1ObjectMeta:
    meta = obj.metadata
    if meta is None:
        raise ApiError(f"{type(obj).__name__} without metadata")
    return cast(client.V1ObjectMeta, meta)


def _model(cls: type[M], doc: dict[str, Any]) -> M:
    obj = cls.from_dict(doc)  # type: ignore[attr-defined]
    if obj is None:
        raise ApiError(f"empty {cls.__name__}")
    return cast(M, obj)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
