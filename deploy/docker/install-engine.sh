#!/usr/bin/env bash
# Debian's Docker tools that `make image` and the container test use, installed when missing
# (root on Debian): the engine (docker.io, its client is /usr/bin/docker), debootstrap for the
# base image, and docker-compose (1.29, Debian's only compose) for the test's compose stack.
set -euo pipefail
missing=()
[ -x /usr/sbin/dockerd ] && [ -x /usr/bin/docker ] || missing+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
command -v docker-compose >/dev/null 2>&1 || missing+=(docker-compose)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "install-engine.sh: missing ${missing[*]}; install them (Debian: apt-get install -y ${missing[*]})" >&2
  exit 1
fi
echo "installing ${missing[*]} (Debian)"
# Another apt may hold the lock on a shared machine: wait for it rather than fail.
apt-get -o DPkg::Lock::Timeout=600 update -qq
DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
