#!/usr/bin/env bash
# stop.sh WORKDIR: stops what start.sh started from WORKDIR, by the pids it wrote (and their children), each
# only while its command line still names WORKDIR (a reused pid is never signalled); never by process name.
# The launcher is frozen first (it can start nothing new), then java gets SIGTERM (it stops its worker), then
# whatever is left; SIGKILL after 20 s. Exits 0 once nothing of it runs.
set -uo pipefail

WORK="${1:-${TS_WORK:-}}"
fail() { echo "stop.sh: $*" >&2; exit 1; }
[ -n "$WORK" ] && [ -d "$WORK" ] || fail "usage: stop.sh WORKDIR"
WORK="$(cd "$WORK" && pwd)"
cd "$WORK"

ours() { [ -n "${1:-}" ] && [ -r "/proc/$1/cmdline" ] && tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -qF -- "$WORK/"; }
children() { local p; for p in /proc/[0-9]*; do
  [ "$(sed -E 's/.*\) [A-Za-z] ([0-9]+).*/\1/' "$p/stat" 2>/dev/null)" = "$1" ] && echo "${p#/proc/}"; done; return 0; }
pids_in() { [ -f "$1" ] && cat "$1"; return 0; }
only_ours() { local p out=; for p in "$@"; do ours "$p" && [[ " $out " != *" $p "* ]] && out="$out $p"; done; echo "${out# }"; }
gone_within() { # gone_within SECONDS PID...: 0 once none of them is ours
  local ticks=$(($1 * 10)) p alive; shift
  while [ $ticks -gt 0 ]; do
    alive=; for p in "$@"; do ours "$p" && alive=1; done
    [ -z "$alive" ] && return 0
    sleep 0.1; ticks=$((ticks - 1))
  done
  return 1
}

LAUNCHER="$(only_ours $(pids_in torchserve.pid))"
for p in $LAUNCHER; do kill -STOP "$p" 2>/dev/null; done
trap 'for p in $LAUNCHER; do kill -CONT "$p" 2>/dev/null; done' EXIT
sleep 0.2  # a java the launcher was forking shows up as its child now
JAVA="$(pids_in java.pid)"; for p in $LAUNCHER; do JAVA="$JAVA $(children "$p")"; done
JAVA="$(only_ours $JAVA)"
WORKERS="$(pids_in worker.pid)"; for p in $JAVA; do WORKERS="$WORKERS $(children "$p")"; done
WORKERS="$(only_ours $WORKERS)"
ALL="$(only_ours $JAVA $WORKERS $LAUNCHER)"

if [ -n "$ALL" ]; then
  echo "stop.sh: stopping java ${JAVA:-none}, worker ${WORKERS:-none}, launcher ${LAUNCHER:-none}"
  for p in $JAVA; do kill -TERM "$p" 2>/dev/null; done
  gone_within 20 $JAVA
  for p in $WORKERS $LAUNCHER; do ours "$p" && kill -TERM "$p" 2>/dev/null; done
  for p in $LAUNCHER; do kill -CONT "$p" 2>/dev/null; done
  if ! gone_within 20 $ALL; then
    for p in $ALL; do ours "$p" && { echo "stop.sh: SIGKILL $p"; kill -KILL "$p" 2>/dev/null; }; done
    gone_within 5 $ALL
  fi
  left=; for p in $ALL; do ours "$p" && left="$left $p"; done
  [ -z "$left" ] || fail "still running:$left"
  for _ in $(seq 20); do  # let the parents reap them, so that a look at /proc right after is clean
    left=; for p in $ALL; do [ -d "/proc/$p" ] && left=1; done; [ -z "$left" ] && break; sleep 0.1
  done
else
  echo "stop.sh: nothing runs from $WORK"
fi
rm -f torchserve.pid java.pid worker.pid grpc_address tmp/.model_server.pid
echo "stop.sh: stopped"
