#!/usr/bin/env bash
# Builds kube-apiserver, kube-scheduler, kube-controller-manager, etcd and kwok from the Go module
# proxy into a cache outside the repository. Idempotent: exits at once when the binaries exist.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
. "$HERE/versions.env"
CACHE=${FLEETMEDIC_CACHE:-$HOME/.cache/fleetmedic}
BIN=$CACHE/k8s-$K8S_VERSION-kwok-$KWOK_VERSION/bin
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0
mkdir -p "$BIN"
# kwok v0.8.0 has no built-in stages: these files from its module are passed with --config.
STAGES="node/fast/node-initialize node/heartbeat-with-lease/node-heartbeat-with-lease pod/fast/pod-ready pod/fast/pod-complete pod/fast/pod-delete"
STAGE_DIR=$BIN/../kwok-stages
need=0
for b in kube-apiserver kube-scheduler kube-controller-manager kubectl etcd kwok; do
  [ -x "$BIN/$b" ] || need=1
done
for f in $STAGES; do [ -f "$STAGE_DIR/$(basename "$f").yaml" ] || need=1; done
if [ "$need" = 0 ]; then echo "$BIN"; exit 0; fi

W=$CACHE/build/k8s-$K8S_VERSION
mkdir -p "$W"; cd "$W"
# a fresh wrapper module every run, so a half-finished earlier run cannot skew the module graph
rm -f go.mod go.sum; go mod init local/fleetmedic-k8sbin >/dev/null 2>&1
GOMOD=$(go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" | python3 -c 'import json,sys;print(json.load(sys.stdin)["GoMod"])')
for m in $(sed -n 's|^[[:space:]]*\(k8s.io/[^ ]*\) => ./staging/src/.*|\1|p' "$GOMOD"); do
  go mod edit -replace="$m=$m@v0.${K8S_VERSION#1.}"
done
MINOR=$(cut -d. -f2 <<<"$K8S_VERSION")
LD="-s -w -X k8s.io/component-base/version.gitVersion=v$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$MINOR"
for c in kube-apiserver kube-scheduler kube-controller-manager kubectl; do
  if [ ! -x "$BIN/$c" ]; then
    go get "k8s.io/kubernetes/cmd/$c@v$K8S_VERSION"
    echo "building $c" >&2
    go build -trimpath -ldflags "$LD" -o "$BIN/$c" "k8s.io/kubernetes/cmd/$c"
  fi
done
if [ ! -x "$BIN/etcd" ]; then
  # The etcd version the apiserver's client pins (v3.6.8 for 1.36.3). A bare
  # `go get go.etcd.io/etcd/server/v3` would mean @upgrade, i.e. whatever is newest on the day.
  # etcd is built in its own module so its requirements never leak into the kube binaries' graph.
  APIMOD=$(go mod download -json "k8s.io/apiserver@v0.${K8S_VERSION#1.}" | python3 -c 'import json,sys;print(json.load(sys.stdin)["GoMod"])')
  ETCD=$(sed -n 's|^[[:space:]]*go.etcd.io/etcd/client/v3 \(v[^ ]*\).*|\1|p' "$APIMOD" | head -1)
  [ -n "$ETCD" ] || { echo "cannot find the etcd client version in $APIMOD" >&2; exit 1; }
  EW=$CACHE/build/etcd-$ETCD
  mkdir -p "$EW"
  ( cd "$EW"
    [ -f go.mod ] || go mod init local/fleetmedic-etcd >/dev/null 2>&1
    go get "go.etcd.io/etcd/server/v3@$ETCD"
    echo "building etcd $ETCD" >&2
    go build -trimpath -ldflags "-s -w" -o "$BIN/etcd" go.etcd.io/etcd/server/v3 )
fi
if [ ! -x "$BIN/kwok" ]; then
  echo "building kwok" >&2
  GOBIN="$BIN" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@v$KWOK_VERSION"
fi
KW=$(go mod download -json "sigs.k8s.io/kwok@v$KWOK_VERSION" | python3 -c 'import json,sys;print(json.load(sys.stdin)["Dir"])')
mkdir -p "$STAGE_DIR"
for f in $STAGES; do
  install -m 0644 "$KW/kustomize/stage/$f.yaml" "$STAGE_DIR/$(basename "$f").yaml"
done
echo "$BIN"
