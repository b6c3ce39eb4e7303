"""fleetmedic: keeps GPU training fleets on Kubernetes running.

Layout (see README "Architecture"):
- ``fleetmedic.records``, ``fleetmedic.config``, ``fleetmedic.signing``, ``fleetmedic.bus``:
  the wire contract and settings; pure.
- ``fleetmedic.models``: detectors and baselines; pure.
- ``fleetmedic.remediation``: triage and policy decisions (pure) and executors (adapters).
- ``fleetmedic.streams``: the Faust pipeline and the embedded engine.
- ``fleetmedic.connectors``: exporters and ingest adapters.
- ``fleetmedic.devenv``: real Kafka and Kubernetes services for tests and local runs.
"""

__version__ = "0.1.0"
