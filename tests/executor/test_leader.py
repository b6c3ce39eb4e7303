"""Lease leader election on the real API server, with injected clocks instead of sleeps: one holder
at a time; a standby takes over only after the Lease expired; the old holder then knows it lost;
a released Lease is taken at once; transitions are counted."""

from __future__ import annotations

from kubernetes import client

from fleetmedic.devenv.proc import free_ports
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


def _unreachable(port: int) -> client.ApiClient:
    """A client of an API server that is not there (a restart, a network cut): connections refused."""
    config = client.Configuration(host=f"https://127.0.0.1:{port}")
    config.verify_ssl = False
    config.retries = 0
    return client.ApiClient(config)


def test_an_api_server_out_of_reach_is_a_failed_round_not_an_exception(
    kube_api: client.ApiClient, namespace: str
) -> None:
    """An API server restart refuses connections for seconds: the elector keeps leading while its
    last renewal lasts, then steps down, and campaigns again once the server answers; releasing
    the Lease meanwhile gives up quietly (it expires on its own). Nothing raises, so the executor
    keeps running through the restart instead of exiting and crash-looping until it is back."""
    dead = _unreachable(free_ports(1)[0])
    clock = Clock(1_000_000.0)
    a = LeaseElector(kube_api, namespace, "exec", "a", 10.0, clock=clock)
    assert a.try_acquire_or_renew()
    live = a.coord
    a.coord = client.CoordinationV1Api(dead)
    clock.t = 1_000_005.0
    assert a.try_acquire_or_renew() and a.leading  # the last renewal (5 s ago) still holds
    clock.t = 1_000_011.0
    assert not a.try_acquire_or_renew() and not a.leading  # expired: no longer the leader
    a.release()  # not leading: nothing to do
    a.coord = live
    assert a.try_acquire_or_renew()  # the server is back: leading again
    a.coord = client.CoordinationV1Api(dead)
    a.release()  # leading, the server away: no exception
    assert not a.leading

    fresh = LeaseElector(dead, namespace, "exec2", "b", 10.0, clock=clock)
    assert not fresh.try_acquire_or_renew() and not fresh.leading  # never led: the first round fails
