"""The Kubernetes executor: carries out signed remediation commands on a cluster and reports results.

Layers (docs/executor.md):

- :mod:`.plan` (pure, no ``kubernetes`` import): what a command means for a node, given what the
  node looks like now: screening (signature, expiry, duplicates), the node patch, the drain plan from
  a pod list and namespace policies, the annotation state machine, the result to publish.
- :mod:`.kube`: the one narrow seam to the API server (read/patch nodes, events, evictions, Jobs,
  the job-command ledger).
- :mod:`.actions`: one command at a time, decide (``plan``) then act (``kube``); :mod:`.drain` and
  :mod:`.diagnostics` carry out the long actions, crash-safe through node annotations.
- :mod:`.leader` (a coordination.k8s.io Lease), :mod:`.service` (Kafka in, results out),
  :mod:`.metrics` (Prometheus).
- ``workloads`` (restart/re-place/requeue jobs) is called for the job-track actions.
"""
