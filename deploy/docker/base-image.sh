#!/usr/bin/env bash
# A Debian bookworm base image (Python 3.11) made here, for machines that cannot pull from a
# registry of images: debootstrap from the Debian mirror apt already uses, then `docker import`.
# Skipped when the image is already there, so only the first build pays for it.
#
#   deploy/docker/base-image.sh [TAG]     # needs DOCKER_HOST (deploy/docker/dockerd.sh start)
set -euo pipefail

TAG="${1:-aaren-base:bookworm}"
DOCKER="${DOCKER:-/usr/bin/docker}"
SUITE=bookworm
# python3-venv: the Dockerfile makes a venv; ca-certificates: pip and the server's TLS.
PACKAGES=python3,python3-venv,ca-certificates

if "$DOCKER" image inspect "$TAG" >/dev/null 2>&1; then
  echo "base image $TAG: present"
  exit 0
fi
if ! command -v debootstrap >/dev/null 2>&1; then
  echo "base-image.sh: no debootstrap: apt-get install -y debootstrap" >&2
  exit 1
fi

# The mirror of the first Debian (not security) source apt has, in deb822 or one-line form.
mirror="${DEBIAN_MIRROR:-}"
if [ -z "$mirror" ]; then
  mirror="$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '/^URIs:/ {for (i = 2; i <= NF; i++) print $i}' |
    grep -E '/debian/?$' | head -n 1 || true)"
fi
if [ -z "$mirror" ]; then
  mirror="$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
    awk '$1 == "deb" {for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) {print $i; break}}' |
    grep -E '/debian/?$' | head -n 1 || true)"
fi
if [ -z "$mirror" ]; then
  echo "base-image.sh: no Debian mirror in apt's sources; set DEBIAN_MIRROR" >&2
  exit 1
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/aaren-base.XXXXXX")"
trap 'rm -rf "$work"' EXIT
echo "base image $TAG: debootstrap $SUITE from $mirror"
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$work/rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 || {
  tail -n 30 "$work/debootstrap.log" >&2
  exit 1
}
# Images built on it install more with apt (the test's Redis); package caches only add size.
cat >"$work/rootfs/etc/apt/sources.list" <<SOURCES
deb $mirror $SUITE main
deb $mirror $SUITE-updates main
SOURCES
rm -rf "$work/rootfs/var/cache/apt/archives/"*.deb "$work/rootfs/var/lib/apt/lists/"*
tar -C "$work/rootfs" --numeric-owner -c . |
  "$DOCKER" import --change 'CMD ["/bin/bash"]' --change 'ENV LANG=C.UTF-8' - "$TAG" >/dev/null
echo "base image $TAG: imported"
