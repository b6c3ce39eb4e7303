"""The Kubernetes executor: carries out signed remediation commands on a cluster and reports results.

Rooms (docs/executor.md). Pure modules (``*plan*``, :mod:`.cluster`) import no ``kubernetes`` and
do no I/O (import-linter's pure-core contract); the ``*apply*`` modules carry their plans out. Each
action takes the route :mod:`fleetmedic.actions` puts it on: quick node, long node, job.

- :mod:`.service`: the process. Leads through :mod:`.leader` (a coordination.k8s.io Lease), consumes
  ``remediation.commands``, publishes results, commits offsets; :mod:`.metrics` (Prometheus).
- :mod:`.queueing`: one queue and worker per target (a node, a job), the ordering between the
  tracks of one incident, the committable offset.
- :mod:`.dispatch`: :class:`~.dispatch.CommandExecutor`, one command at a time: screening
  (signature, expiry), then the one routing of a command to the node or the job track
  (:func:`fleetmedic.actions.targets_node`).
- :mod:`.cluster` (pure): the seam to a cluster, the :class:`~.cluster.Cluster` protocol (nodes,
  conditions, Events, pods and evictions, Jobs, the job-command ledger; :class:`~.cluster.WorkloadCluster`
  adds the workloads, their pods and the node list as JSON), its errors, the one Event builder.
  :mod:`.kube`: :class:`~.kube.KubeCluster`, the Cluster on an API server (with :mod:`.leader`, the
  only executor module that imports ``kubernetes``); :mod:`.fake_cluster`: the Cluster in memory,
  for fast tests.
- :mod:`.node`, the node track:

  - :mod:`.node.plan` (pure): what a command means for a node: screening (signature, expiry,
    duplicates), the node patch of each quick action, the annotation state, the result to publish;
  - :mod:`.node.long_plan` (pure): which pods a drain evicts, the diagnostics and hook Jobs, what a
    finished Job means;
  - :mod:`.node.conditions` (pure): the per-class node conditions;
  - :mod:`.node.apply`: :class:`~.node.apply.NodeTrack`, a node command: decide (the plans) then
    act (the Cluster);
  - :mod:`.node.long_apply`: drain (Eviction API), diagnostics and hook Jobs, crash-safe through
    node annotations;
  - :mod:`.node.write`: the one write of a node plan (patch, conditions, Event).

- :mod:`.workload`, the job track (restart, re-place, requeue a Job, PyTorchJob or JobSet):

  - :mod:`.workload.plan` (pure): the restart plan from the workload's manifest (node exclusion,
    in-place preference, the annotations that record it);
  - :mod:`.workload.placement_plan` (pure): topology domains, preferred affinity, isolation, the
    capacity verdict;
  - :mod:`.workload.track`: :class:`~.workload.track.JobTrack`, a job command: the ledger, then
    the restart;
  - :mod:`.workload.api`: the shared low-level calls (versioned JSON patch, waiting, Events);
  - :mod:`.workload.apply`: ``restart_workload``, the restart through the API server;
    :mod:`.workload.jobset`: node exclusion through a JobSet's suspended child Jobs;
    :mod:`.workload.kueue`: the restart of a Kueue-managed workload through its ``Workload``;
  - :mod:`.workload.placement_apply`: ``PlacementRestarter``, the topology-aware restart the
    executor calls; :mod:`.workload.placement_metrics` (Prometheus).

Every label, annotation, taint and component name written on Kubernetes objects is in
:mod:`fleetmedic.k8s_keys`.
"""
