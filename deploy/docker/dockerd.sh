#!/usr/bin/env bash
# A private Docker engine for `make image` and the container test, on machines that have none
# running (Debian's docker.io installed, no systemd). Everything it owns lives under one folder:
# data root (images and build cache, kept between runs so rebuilds are warm), exec root, pidfile
# and socket, so it never collides with another engine on the same machine.
#
#   deploy/docker/dockerd.sh start    # idempotent; prints the DOCKER_HOST to use
#   deploy/docker/dockerd.sh status   # exit 0 when it answers
#   deploy/docker/dockerd.sh stop
#
# Networking is kept off the host's shared state: no default bridge (--bridge=none) and no
# iptables rules (--iptables=false). Builds use the host network (`docker build --network host`),
# the test's containers a network of their own, reached through published ports (docker-proxy).
set -euo pipefail

ROOT="${AAREN_DOCKER_ROOT:-${TMPDIR:-/tmp}/aaren-docker}"
SOCK="$ROOT/docker.sock"
PIDFILE="$ROOT/dockerd.pid"
# Debian's engine; /usr/local/bin may hold a newer client only, which the daemon would not match.
DOCKERD="${DOCKERD:-/usr/sbin/dockerd}"
DOCKER="${DOCKER:-/usr/bin/docker}"
export DOCKER_HOST="unix://$SOCK"

up() { "$DOCKER" version >/dev/null 2>&1; }

start() {
  if up; then echo "$DOCKER_HOST"; return; fi
  mkdir -p "$ROOT"
  # Two callers at once (make image beside a test run) must not start two engines on one root.
  exec 9>"$ROOT/start.lock"
  flock 9
  if up; then echo "$DOCKER_HOST"; return; fi
  if [ ! -x "$DOCKERD" ]; then
    echo "dockerd.sh: no $DOCKERD: apt-get install -y docker.io (Debian's Docker engine)" >&2
    exit 1
  fi
  mkdir -p "$ROOT/data" "$ROOT/exec"
  # The egress here has an MTU below 1500; a bridge at 1500 would stall large TLS packets.
  mtu="$(cat /sys/class/net/"$(ip -o route show default 2>/dev/null | awk '{print $5; exit}')"/mtu 2>/dev/null || echo 1500)"
  nohup "$DOCKERD" \
    --data-root "$ROOT/data" --exec-root "$ROOT/exec" --pidfile "$PIDFILE" --host "$DOCKER_HOST" \
    --bridge=none --iptables=false --ip-masq=false --mtu "$mtu" \
    >"$ROOT/dockerd.log" 2>&1 9>&- &
  for _ in $(seq 1 120); do
    if up; then echo "$DOCKER_HOST"; return; fi
    if ! kill -0 $! 2>/dev/null; then break; fi
    sleep 0.5
  done
  echo "dockerd.sh: the Docker engine did not start; its log ($ROOT/dockerd.log) ends with:" >&2
  tail -n 20 "$ROOT/dockerd.log" >&2
  exit 1
}

stop() {
  if [ -f "$PIDFILE" ]; then
    pid="$(cat "$PIDFILE")"
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  fi
  # The engine leaves the host's network namespace mounted in its exec root; a later start or an
  # `rm -r` of the folder would trip over it.
  if mountpoint -q "$ROOT/exec/netns/default" 2>/dev/null; then
    umount "$ROOT/exec/netns/default" || true
  fi
}

case "${1:-start}" in
  start) start ;;
  status) up ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
