"""Lease leader election on the real API server, with injected clocks instead of sleeps: one holder
at a time; a standby takes over only after the Lease expired; the old holder then knows it lost;
a released Lease is taken at once; transitions are counted."""

from __future__ import annotations

from kubernetes import client

from fleetmedic.executor.leader import LeaseElector


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_one_holder_takeover_only_after_expiry_and_release_hands_over_at_once(
    kube_api: client.ApiClient, namespace: str
) -> None:
    ca, cb = Clock(1_000_000.0), Clock(1_000_000.0)
    a = LeaseElector(kube_api, namespace, "exec", "a", 10.0, clock=ca)
    b = LeaseElector(kube_api, namespace, "exec", "b", 10.0, clock=cb)
    assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()
    ca.t = cb.t = 1_000_008.0  # a renews within its 10 s
    assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()
    cb.t = 1_000_017.0  # 9 s after a's renewal: still a's
    assert not b.try_acquire_or_renew()
    cb.t = 1_000_019.0  # expired: b takes over
    assert b.try_acquire_or_renew() and b.leading
    ca.t = 1_000_019.5
    assert not a.try_acquire_or_renew() and not a.leading  # a learns it lost
    lease = client.CoordinationV1Api(kube_api).read_namespaced_lease("exec", namespace)
    assert lease.spec.holder_identity == "b" and lease.spec.lease_transitions == 1
    b.release()
    assert a.try_acquire_or_renew()  # no waiting for the expiry after a release
    lease = client.CoordinationV1Api(kube_api).read_namespaced_lease("exec", namespace)
    assert lease.spec.holder_identity == "a" and lease.spec.lease_transitions == 2
