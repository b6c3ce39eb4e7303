#!/usr/bin/env bash
# Builds the real workload controllers the executor's tests run out of cluster, from the Go module
# proxy, into a cache outside the repository: the JobSet controller (sigs.k8s.io/jobset) and the
# Kubeflow training-operator, at the versions of the CRDs committed under tests/data/crds, and Kueue.
# Idempotent: exits at once when the binaries exist.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
. "$HERE/versions.env"
CACHE=${FLEETMEDIC_CACHE:-$HOME/.cache/fleetmedic}
OUT=$CACHE/controllers
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0
mkdir -p "$OUT"
build() {  # build <module> <version> <package in the module> <output name>
  local mod=$1 ver=$2 pkg=$3 name=$4
  local bin=$OUT/$name-$ver
  [ -x "$bin" ] && return 0
  local src=$CACHE/build/$name-$ver
  if [ ! -f "$src/go.mod" ]; then
    local dir
    dir=$(go mod download -json "$mod@$ver" | python3 -c 'import json,sys;print(json.load(sys.stdin)["Dir"])')
    rm -rf "$src"; mkdir -p "$(dirname "$src")"; cp -r "$dir" "$src"; chmod -R u+w "$src"
  fi
  echo "building $name $ver" >&2
  (cd "$src" && go build -trimpath -ldflags "-s -w" -o "$bin.partial" "$pkg" && mv "$bin.partial" "$bin")
}
build sigs.k8s.io/jobset "v$JOBSET_VERSION" . jobset-manager
build github.com/kubeflow/training-operator "v$TRAINING_OPERATOR_VERSION" ./cmd/training-operator.v1 training-operator
build sigs.k8s.io/kueue "v$KUEUE_VERSION" ./cmd/kueue kueue-manager  # its CRDs are read from the same source tree
echo "$OUT"
