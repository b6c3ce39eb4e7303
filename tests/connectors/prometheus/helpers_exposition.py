"""dcgm-exporter text whose values change with every scrape, for the Prometheus connector tests and
the runtime and hostile-input tests that scrape it."""

from __future__ import annotations

DCGM_HEAD = """# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).
# TYPE DCGM_FI_DEV_GPU_TEMP gauge
"""
LABELS = ('gpu="{g}",UUID="GPU-5c2e3f1a-0000-4000-8000-00000000000{g}",pci_bus_id="00000000:{bus}:00.0",'
          'device="nvidia{g}",modelName="NVIDIA H100 80GB HBM3",Hostname="{node}",DCGM_FI_DRIVER_VERSION="550.54.15"')


def dcgm_text(n: int, node: str = "gpu-node-7", bad_line: bool = True) -> str:
    """dcgm-exporter output after ``n`` scrapes: GPU 1 warms up and gains an ECC error per scrape.
    ``bad_line`` adds a line with a broken value (Prometheus itself rejects such a scrape whole)."""
    lines = [DCGM_HEAD.rstrip("\n")]
    for g in range(2):
        lab = LABELS.format(g=g, bus=18 + g, node=node)
        lines.append(f"DCGM_FI_DEV_GPU_TEMP{{{lab}}} {40 + (n if g == 1 else 0)}")
        lines.append(f"DCGM_FI_DEV_POWER_USAGE{{{lab}}} 312.{g}15")
        lines.append(f"DCGM_FI_DEV_SM_CLOCK{{{lab}}} 1980")
        lines.append(f"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{{{lab}}} {n if g == 1 else 0}")
        lines.append(f"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{{{lab}}} {0x20 if g == 1 and n >= 1 else 0}")
        lines.append(f"DCGM_FI_DEV_XID_ERRORS{{{lab},err_code=\"0\",err_msg=\"\"}} 0")
    if bad_line:
        lines.append('DCGM_FI_DEV_FB_USED{gpu="0",UUID="x",Hostname="gpu-node-7"} not-a-number')
    lines.append("go_goroutines 12")
    return "\n".join(lines) + "\n"
