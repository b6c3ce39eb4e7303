"""fleetmedic: keeps GPU training fleets on Kubernetes running.

Floors, from the top (docs/architecture.md; ``.importlinter`` enforces them):

- tools: ``fleetmedic.cli`` (the command line), ``fleetmedic.sim`` (the simulator, the embedded
  engine, the demo), ``fleetmedic.evaluation`` (truth, scoring, backtest);
- adapters: ``fleetmedic.streams`` (the pipeline on Kafka), ``fleetmedic.connectors`` (exporters
  and ingest), ``fleetmedic.executor`` (the Kubernetes executor);
- the pure core: ``fleetmedic.remediation`` (the decision engine), ``fleetmedic.models``
  (baselines and detectors);
- the contract: ``fleetmedic.config``, ``fleetmedic.signing``, ``fleetmedic.bus``,
  ``fleetmedic.records``, ``fleetmedic.k8s_keys``.

``fleetmedic.devenv`` (real Kafka and Kubernetes services for tests and local runs) stands apart.
"""

__version__ = "0.1.0"
