"""The connectors' pure modules (parsing and mapping) import none of the adapters' libraries, so
they can be used and tested without Kafka, Prometheus's client, aiohttp or NVML."""

from __future__ import annotations

import subprocess
import sys

PURE = ["prometheus_text", "prometheus_api", "kafka_telemetry_map", "log_failures", "perfquery", "nvml_record",
        "nvml_seam", "errors", "remote_write", "remote_write_auth", "node_conditions", "kmsg_map", "kube_jobs_map",
        "kube_nodes_map"]
ADAPTERS = ["prometheus_client", "aiokafka", "aiohttp", "faust", "kubernetes", "pynvml"]


def test_pure_connector_modules_import_no_adapter_library() -> None:
    code = (
        "import sys\n"
        + "".join(f"import fleetmedic.connectors.{m}\n" for m in PURE)
        + f"print(sorted(m for m in {ADAPTERS!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"
