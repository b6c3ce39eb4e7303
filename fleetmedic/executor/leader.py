"""Leader election with a coordination.k8s.io/v1 Lease (the client-go leaderelection protocol).

A replica holds the Lease while it renews ``renewTime`` within ``leaseDurationSeconds``; another
replica takes it only after it expired. Every write is a ``replace`` guarded by the Lease's
resourceVersion, so two replicas racing for an expired Lease cannot both win (one gets 409).
Only the holder acts on commands (:mod:`.service`).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from datetime import UTC, datetime

from kubernetes import client
from kubernetes.client import ApiException
from urllib3.exceptions import HTTPError

log = logging.getLogger(__name__)

#: the API server did not answer (refused, reset, timed out): a round that failed, like an error
#: status, never an exception out of the elector (the executor would exit while the API server
#: restarts, and crash-loop until it is back)
UNREACHABLE = (HTTPError, OSError)


def _micro(ts: float) -> datetime:
    """A MicroTime. The client writes ``isoformat()``, which drops the fraction when it is zero, and
    the API server then rejects the Lease (it wants ``.000000``): never send a whole second."""
    dt = datetime.fromtimestamp(ts, UTC)
    return dt.replace(microsecond=1) if dt.microsecond == 0 else dt


class LeaseElector:
    def __init__(self, api: client.ApiClient, namespace: str, name: str, identity: str, duration_s: float,
                 clock: Callable[[], float] = time.time) -> None:
        self.coord = client.CoordinationV1Api(api)
        self.namespace, self.name, self.identity = namespace, name, identity
        self.duration_s = duration_s
        self.clock = clock
        self.leading = False

    @property
    def renew_every_s(self) -> float:
        return max(0.2, self.duration_s / 3.0)

    def try_acquire_or_renew(self) -> bool:
        """One round: create, renew or take over the Lease; return whether this replica leads now."""
        now = self.clock()
        try:
            lease = self.coord.read_namespaced_lease(self.name, self.namespace)
        except ApiException as exc:
            if exc.status != 404:
                log.warning("lease %s/%s: read failed: %s", self.namespace, self.name, exc.status)
                return self._kept_or_lost(now)
            return self._create(now)
        except UNREACHABLE as exc:
            log.warning("lease %s/%s: read failed: API server unreachable (%s)", self.namespace, self.name,
                        type(exc).__name__)
            return self._kept_or_lost(now)
        spec = lease.spec or client.V1LeaseSpec()
        holder = spec.holder_identity or ""
        renewed = spec.renew_time.timestamp() if spec.renew_time else 0.0
        duration = spec.lease_duration_seconds or math.ceil(self.duration_s)
        if holder and holder != self.identity and now < renewed + duration:
            return self._lost()
        taking_over = holder != self.identity
        spec.holder_identity = self.identity
        spec.lease_duration_seconds = max(1, math.ceil(self.duration_s))
        spec.renew_time = _micro(now)
        if taking_over:
            spec.acquire_time = _micro(now)
            spec.lease_transitions = (spec.lease_transitions or 0) + 1
        lease.spec = spec
        try:
            self.coord.replace_namespaced_lease(self.name, self.namespace, lease)
        except ApiException as exc:
            log.info("lease %s/%s: %s lost the race (%s)", self.namespace, self.name, self.identity, exc.status)
            return self._lost()
        except UNREACHABLE as exc:  # the write may or may not have landed: valid until the last renewal expires
            log.warning("lease %s/%s: renewal failed: API server unreachable (%s)", self.namespace, self.name,
                        type(exc).__name__)
            return self._kept_or_lost(now)
        if not self.leading:
            log.info("lease %s/%s: %s is the leader", self.namespace, self.name, self.identity)
        self.leading = True
        self._renewed_at = now
        return True

    def _create(self, now: float) -> bool:
        body = client.V1Lease(metadata=client.V1ObjectMeta(name=self.name, namespace=self.namespace),
                              spec=client.V1LeaseSpec(holder_identity=self.identity,
                                                      lease_duration_seconds=max(1, math.ceil(self.duration_s)),
                                                      acquire_time=_micro(now), renew_time=_micro(now),
                                                      lease_transitions=0))
        try:
            self.coord.create_namespaced_lease(self.namespace, body)
        except (ApiException, *UNREACHABLE):
            return self._lost()
        self.leading = True
        self._renewed_at = now
        log.info("lease %s/%s: created, %s is the leader", self.namespace, self.name, self.identity)
        return True

    def _kept_or_lost(self, now: float) -> bool:
        """A round that reached no verdict: still the leader while its last renewal lasts."""
        return self._lost() if not self._still_valid(now) else self.leading

    def _still_valid(self, now: float) -> bool:
        return self.leading and now < getattr(self, "_renewed_at", 0.0) + self.duration_s

    def _lost(self) -> bool:
        if self.leading:
            log.warning("lease %s/%s: %s is no longer the leader", self.namespace, self.name, self.identity)
        self.leading = False
        return False

    def release(self) -> None:
        """Give the Lease up at shutdown so a standby takes over at once, not after it expires."""
        if not self.leading:
            return
        try:
            lease = self.coord.read_namespaced_lease(self.name, self.namespace)
            if lease.spec and lease.spec.holder_identity == self.identity:
                lease.spec.holder_identity = ""
                lease.spec.renew_time = None
                self.coord.replace_namespaced_lease(self.name, self.namespace, lease)
        except ApiException as exc:
            log.warning("lease %s/%s: release failed: %s", self.namespace, self.name, exc.status)
        except UNREACHABLE as exc:  # it expires on its own
            log.warning("lease %s/%s: release failed: API server unreachable (%s)", self.namespace, self.name,
                        type(exc).__name__)
        self.leading = False
