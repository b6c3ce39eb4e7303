#!/usr/bin/env bash
# Builds the fleetmedic image from the Dockerfile with buildah: no Docker engine, no daemon.
#
#   scripts/build_image.sh [--tag NAME] [--root DIR] [--prune] [--offline-base]
#
# Default: `buildah bud` of the Dockerfile as it is (FROM python:3.11-slim, pulled from a registry).
#
# --offline-base: for a machine that reaches Debian's packages but no image registry. The base is
#   made from Debian packages instead: mmdebstrap --variant=minbase of this machine's Debian
#   release from the Debian mirrors its apt sources name (the release, -updates and -security),
#   plus python3 (3.11 on bookworm), pip and python-is-python3. It is imported
#   with `buildah from scratch` and the same Dockerfile is built on it (--build-arg BASE=...), so
#   the image has the same layout: /usr/local/bin/fleetmedic as the entrypoint, user 10001, the
#   default configuration in /etc/fleetmedic/fleetmedic.yaml, port 9108.
#   The root file system is kept as a tarball in $FLEETMEDIC_CACHE/image/ (default
#   ~/.cache/fleetmedic/image/), and the imported base image in the container storage, so a second
#   run starts from the cached layers.
#
# --tag NAME   the image's name (default localhost/fleetmedic:<version in pyproject.toml>)
# --root DIR   container storage directory (buildah --root; default: buildah's own)
# --prune      afterwards, remove the untagged images this build left behind in the storage (the
#              previous image and its intermediate layers) except the layers this build took from
#              its cache: with vfs every layer is a full copy of the file system, so a storage that
#              keeps every build grows by gigabytes a build
#
# The Dockerfile's RUN steps (apt-get, pip) see this machine's CA bundle, bind-mounted over the
# image's, so a build behind a TLS-inspecting proxy trusts what this machine trusts; the image keeps
# Debian's own bundle. FLEETMEDIC_BUILD_CA_BUNDLE names another file; empty turns this off.
# Environment: STORAGE_DRIVER (default vfs: works inside containers and on any file system),
#   BUILDAH_ISOLATION (default chroot: needs no runc/crun and no user namespaces when run as root),
#   FLEETMEDIC_DEBIAN_SUITE and FLEETMEDIC_DEBIAN_MIRROR (override the release and the mirror taken
#   from /etc/os-release and `apt-get indextargets`; FLEETMEDIC_DEBIAN_SECURITY_MIRROR likewise).
# Needs: buildah; with --offline-base also mmdebstrap (root, or user namespaces for its unshare
#   mode). Debian: apt-get install buildah mmdebstrap.
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "build_image: $*" >&2; exit 1; }

offline=0
prune=0
tag=""
root=""
while [ $# -gt 0 ]; do
  case "$1" in
    --offline-base) offline=1 ;;
    --tag) [ $# -ge 2 ] || die "--tag needs a value"; tag="$2"; shift ;;
    --root) [ $# -ge 2 ] || die "--root needs a value"; root="$2"; shift ;;
    --prune) prune=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument: $1 (see --help)" ;;
  esac
  shift
done

command -v buildah >/dev/null 2>&1 || die "buildah not found (Debian: apt-get install buildah)"
export STORAGE_DRIVER="${STORAGE_DRIVER:-vfs}"
export BUILDAH_ISOLATION="${BUILDAH_ISOLATION:-chroot}"
bh=(buildah)
if [ -n "$root" ]; then
  mkdir -p "$root"
  bh+=(--root "$root" --runroot "$root/run")
fi

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml | head -n 1)
[ -n "$version" ] || die "no version in pyproject.toml"
tag="${tag:-localhost/fleetmedic:$version}"

bud=(bud --layers -f Dockerfile -t "$tag")
ca="${FLEETMEDIC_BUILD_CA_BUNDLE-/etc/ssl/certs/ca-certificates.crt}"
if [ -n "$ca" ]; then
  [ -s "$ca" ] || die "FLEETMEDIC_BUILD_CA_BUNDLE: $ca is not a non-empty file"
  bud+=(--volume "$(readlink -f "$ca"):/etc/ssl/certs/ca-certificates.crt:ro")
fi

# bud, then (--prune) the untagged images that were there before it and that it did not use as its cache
build() {
  if [ "$prune" = 0 ]; then exec "${bh[@]}" "${bud[@]}" "$@"; fi
  local before log keep id
  before=$("${bh[@]}" images --all --no-trunc --quiet | sort -u)
  log=$(mktemp)
  "${bh[@]}" "${bud[@]}" "$@" 2>&1 | tee "$log"
  keep=$(sed -n 's/^--> Using cache \([0-9a-f]*\).*/\1/p' "$log" | sort -u)
  rm -f "$log"
  # dangling: untagged and no image built on it; removing one can leave its parent dangling
  local removed=1
  while [ "$removed" = 1 ]; do
    removed=0
    for id in $("${bh[@]}" images --all --no-trunc --quiet --filter dangling=true | sort -u); do
      if grep -qx "$id" <<<"$before" && ! grep -q "${id#sha256:}" <<<"$keep" \
          && "${bh[@]}" rmi "$id" >/dev/null 2>&1; then
        removed=1
      fi
    done
  done
  echo "== pruned; the storage holds $(du -sh "${root:-/var/lib/containers/storage}" 2>/dev/null | cut -f1)"
}

if [ "$offline" = 0 ]; then
  build .
  exit 0
fi

# ---- the offline base -------------------------------------------------------------------------
command -v mmdebstrap >/dev/null 2>&1 || die "mmdebstrap not found (Debian: apt-get install mmdebstrap)"
arch=$(dpkg --print-architecture 2>/dev/null) || die "dpkg not found: --offline-base builds from Debian packages"
suite="${FLEETMEDIC_DEBIAN_SUITE:-$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")}"
[ -n "$suite" ] || die "no Debian release: set FLEETMEDIC_DEBIAN_SUITE (e.g. bookworm)"
# the mirrors this machine's apt already uses for that release (URIs from its sources, not guessed)
repo_of() { apt-get indextargets --format '$(RELEASE) $(REPO_URI)' 2>/dev/null | awk -v r="$1" '$1 == r {print $2; exit}'; }
if [ -z "${FLEETMEDIC_DEBIAN_MIRROR:-}" ] && [ -z "$(repo_of "$suite")" ] && [ "$(id -u)" = 0 ]; then
  apt-get update -q >/dev/null  # apt lists only once fetched name their sources' URIs
fi
mirror="${FLEETMEDIC_DEBIAN_MIRROR:-$(repo_of "$suite")}"
[ -n "$mirror" ] || die "no apt source for '$suite' in this machine's apt sources (run apt-get update?): set FLEETMEDIC_DEBIAN_MIRROR"
security="${FLEETMEDIC_DEBIAN_SECURITY_MIRROR:-$(repo_of "$suite-security")}"
updates="$(repo_of "$suite-updates")"
sources=("deb $mirror $suite main")
[ -z "$updates" ] || sources+=("deb $updates $suite-updates main")
[ -z "$security" ] || sources+=("deb $security $suite-security main")

cache="${FLEETMEDIC_CACHE:-$HOME/.cache/fleetmedic}/image"
mkdir -p "$cache"
# a new tarball and base image whenever the release, the sources or the recipe below change
key=$( { printf '%s\n' "$suite" "$arch" "${sources[@]}"; sed -n '/^# ---- base recipe/,/^# ---- end base recipe/p' "$0"; } \
  | sha256sum | cut -c1-12)
tarball="$cache/base-$suite-$arch-$key.tar"
base="localhost/fleetmedic-base:$suite-$key"

# ---- base recipe
# python3 is 3.11 on bookworm, the version the Dockerfile's python:3.11-slim has. Like Debian's slim
# images: no manuals, documentation (copyright notices kept) or translations. The image is Python's
# alone, as python:3.11-slim is, so pip installs into /usr/local as root: Debian's PEP 668 marker is
# diverted (an upgrade of python3.11 does not bring it back).
packages="python3,python3-pip,python-is-python3,ca-certificates"
build_base() {
  mmdebstrap --variant=minbase --format=tar --arch="$arch" --include="$packages" \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --customize-hook='chroot "$1" sh -ec "f=\$(python3 -c \"import sysconfig; print(sysconfig.get_path(\\\"stdlib\\\"))\")/EXTERNALLY-MANAGED; dpkg-divert --local --rename --divert \$f.diverted --add \$f"' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
    "$suite" "$1" "${sources[@]}"
}
# ---- end base recipe

if [ ! -s "$tarball" ]; then
  echo "== mmdebstrap --variant=minbase $suite ($arch) from ${sources[*]} into $tarball"
  log="$cache/mmdebstrap.log"
  if ! build_base "$tarball.partial" >"$log" 2>&1; then
    rm -f "$tarball.partial"
    tail -n 30 "$log" >&2
    die "mmdebstrap failed (last 30 lines of $log above)"
  fi
  mv "$tarball.partial" "$tarball"
else
  echo "== base root file system cached: $tarball"
fi

if "${bh[@]}" inspect --type image "$base" >/dev/null 2>&1; then
  echo "== base image cached: $base"
else
  echo "== importing $tarball as $base (buildah from scratch)"
  ctr=$("${bh[@]}" from scratch)
  trap '"${bh[@]}" rm "$ctr" >/dev/null 2>&1 || true' EXIT
  "${bh[@]}" add "$ctr" "$tarball" /
  "${bh[@]}" config \
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --env LANG=C.UTF-8 \
    --cmd python3 --label "org.opencontainers.image.description=Debian $suite minbase with python3 ($key)" "$ctr"
  "${bh[@]}" run "$ctr" -- sh -ec 'python --version; python -m pip --version
      f="$(python3 -c "import sysconfig; print(sysconfig.get_path(\"stdlib\"))")/EXTERNALLY-MANAGED"
      if [ -e "$f" ]; then echo "$f is there: pip would refuse to install" >&2; exit 1; fi'
  "${bh[@]}" commit --rm "$ctr" "$base" >/dev/null
  trap - EXIT
fi

echo "== buildah bud --build-arg BASE=$base -t $tag"
if [ "$prune" = 1 ]; then  # base images of an older recipe or release, and their tarballs
  for old in $("${bh[@]}" images --format '{{.Name}}:{{.Tag}}' | grep '^localhost/fleetmedic-base:'); do
    [ "$old" = "$base" ] || "${bh[@]}" rmi "$old" >/dev/null 2>&1 || true
  done
  find "$cache" -maxdepth 1 -name 'base-*.tar' ! -path "$tarball" -delete
fi
build --pull=never --build-arg "BASE=$base" --build-arg "BUILD_PACKAGES=gcc libc6-dev python3-dev" .
