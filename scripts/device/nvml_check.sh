#!/usr/bin/env bash
# Exercise fleetmedic's NVML exporter on a machine with an NVIDIA GPU (issue #9's device check).
#   1. a venv (system site packages visible) with nvidia-ml-py, msgspec, PyYAML, prometheus-client
#      — from the index, or offline from $FLEETMEDIC_WHEELS (a directory filled beforehand with
#      `pip download -d DIR nvidia-ml-py msgspec PyYAML prometheus-client`);
#   2. a one-shot probe: every field NVML gives per GPU, what is not supported, any problem;
#   3. the real exporter for $DURATION seconds (default 20, a record every 2 s) writing JSON lines
#      to $OUT/nvml.jsonl instead of Kafka, then a summary of what it read per GPU.
# Usage: scripts/device/nvml_check.sh [OUTDIR]     (OUTDIR defaults to $OUT, else ./nvml-check)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUTDIR=${1:-${OUT:-./nvml-check}}
DURATION=${DURATION:-20}
VENV=${VENV:-/tmp/fleetmedic-nvml-venv}
mkdir -p "$OUTDIR"
echo "== GPUs"; nvidia-smi -L || echo "(nvidia-smi not available)"
PY=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then "$PY" -m venv --system-site-packages "$VENV"; fi
PKGS=("nvidia-ml-py>=12.535,<14" "msgspec>=0.19,<0.24" "PyYAML>=6.0,<7" "prometheus-client>=0.20,<1")
if [ -n "${FLEETMEDIC_WHEELS:-}" ]; then
  "$VENV/bin/python" -m pip install -q --no-index --find-links "$FLEETMEDIC_WHEELS" "${PKGS[@]}"
else
  "$VENV/bin/python" -m pip install -q "${PKGS[@]}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
echo "== probe (one read of every GPU through the exporter's NVML seam)"
"$VENV/bin/python" scripts/device/nvml_summary.py probe | tee "$OUTDIR/probe.txt"
echo "== exporter for ${DURATION}s -> $OUTDIR/nvml.jsonl"
rm -f "$OUTDIR/nvml.jsonl"
rc=0
FLEETMEDIC__EXPORTERS__NVML__INTERVAL_S=${INTERVAL_S:-2} \
  "$VENV/bin/python" -m fleetmedic.cli.exporter nvml --output "$OUTDIR/nvml.jsonl" --duration "$DURATION" \
  --metrics-port -1 2>&1 | tee "$OUTDIR/exporter.log" || rc=$?
echo "== exporter exit code: $rc"
echo "== summary"
"$VENV/bin/python" scripts/device/nvml_summary.py summary "$OUTDIR/nvml.jsonl" | tee "$OUTDIR/summary.txt"
exit "$rc"
