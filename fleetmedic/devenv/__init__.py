"""fleetmedic.devenv: the real services fleetmedic's tests and local runs talk to.

- ``build``: fetches the Kafka jars (Maven Central) and builds the Kubernetes binaries (Go module
  proxy) into the cache, ``$FLEETMEDIC_CACHE`` (default ``~/.cache/fleetmedic``).
- ``kafka``: a single-node KRaft broker on loopback.
- ``kube``: etcd, kube-apiserver, kube-scheduler, kube-controller-manager and kwok on loopback.
- ``fleet``: fake GPU nodes (kwok), CRDs, and an eviction helper.
- ``waiting``: ``wait(what, check)``, the one way tests and benches wait on a condition.
- ``fake_api``: an in-memory API server for ``fleetmedic.kube_watch``'s lists and watches, and
  Nodes and Pods as a kwok cluster serves them (fast tests and benches of the job watcher).
- ``synth``: small hand-made GPU telemetry messages.
- ``workloads``, ``jobset``, ``placement``: GPU Jobs on a dev fleet, quarantining a node, pod and
  binding watches, the real JobSet controller out of cluster, placement scenarios per leaf.
- ``chain``: the whole chain (``fleetmedic worker`` and ``fleetmedic executor`` subprocesses on one
  config) with its job, telemetry and pod watch.
- ``cli``: ``fleetmedic dev build|up|down|status`` (also ``python -m fleetmedic.devenv``).

Everything here is imperative shell; nothing in the pure core imports it.
"""
