"""The Kubernetes executor: carries out signed remediation commands on a cluster and reports results.

Rooms (docs/executor.md). Pure modules (``*plan*``) import no ``kubernetes`` and do no I/O
(import-linter's pure-core contract); the ``*apply*`` modules carry their plans out. Each action
takes the route :mod:`fleetmedic.actions` puts it on: quick node, long node, job.

- :mod:`.service`: the process. Leads through :mod:`.leader` (a coordination.k8s.io Lease), consumes
  ``remediation.commands``, runs one command per target at a time, publishes results, commits
  offsets; :mod:`.metrics` (Prometheus).
- :mod:`.kube`: the seam to the API server (:class:`~.kube.Cluster`: nodes, conditions, Events,
  pods and evictions, Jobs, the job-command ledger).
- :mod:`.node`, the node track:

  - :mod:`.node.plan` (pure): what a command means for a node: screening (signature, expiry,
    duplicates), the node patch of each quick action, the annotation state, the result to publish;
  - :mod:`.node.long_plan` (pure): which pods a drain evicts, the diagnostics and hook Jobs, what a
    finished Job means;
  - :mod:`.node.apply`: :class:`~.node.apply.CommandExecutor`, one command at a time: decide
    (the plans) then act (:mod:`.kube`); job-track commands go to :mod:`.workload.placement_apply`;
  - :mod:`.node.long_apply`: drain (Eviction API), diagnostics and hook Jobs, crash-safe through
    node annotations.

- :mod:`.workload`, the job track (restart, re-place, requeue a Job, PyTorchJob or JobSet):

  - :mod:`.workload.plan` (pure): the restart plan from the workload's manifest (node exclusion,
    in-place preference, the annotations that record it);
  - :mod:`.workload.placement_plan` (pure): topology domains, preferred affinity, isolation, the
    capacity verdict;
  - :mod:`.workload.api`: the shared low-level calls (versioned JSON patch, waiting, Events);
  - :mod:`.workload.apply`: ``restart_workload``, the restart through the API server;
    :mod:`.workload.jobset`: node exclusion through a JobSet's suspended child Jobs;
    :mod:`.workload.kueue`: the restart of a Kueue-managed workload through its ``Workload``;
  - :mod:`.workload.placement_apply`: ``PlacementRestarter``, the topology-aware restart the
    executor calls; :mod:`.workload.placement_metrics` (Prometheus).

Every label, annotation, taint and component name written on Kubernetes objects is in
:mod:`fleetmedic.k8s_keys`.
"""
