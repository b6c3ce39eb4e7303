"""The connectors' pure modules (parsing and mapping) import none of the adapters' libraries, so
they can be used and tested without Kafka, Prometheus's client, aiohttp or NVML."""

from __future__ import annotations

import subprocess
import sys

PURE = ["prometheus.text", "prometheus.api", "kafka_telemetry.exporter_map", "logs.failures", "infiniband.perfquery",
        "nvml.record", "nvml.seam", "errors", "remote_write.assembler", "remote_write.codec", "remote_write.auth",
        "kube.node_conditions", "kernel.kmsg_map", "kernel.log_lines", "kube.jobs_map", "kube.nodes_map"]
ADAPTERS = ["prometheus_client", "aiokafka", "aiohttp", "faust", "kubernetes", "pynvml"]


def test_pure_connector_modules_import_no_adapter_library() -> None:
    code = (
        "import sys\n"
        + "".join(f"import fleetmedic.connectors.{m}\n" for m in PURE)
        + f"print(sorted(m for m in {ADAPTERS!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"
