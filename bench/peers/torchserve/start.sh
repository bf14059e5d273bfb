#!/usr/bin/env bash
# start.sh WORKDIR [PORT_BASE]: starts TorchServe from WORKDIR (made by setup.sh), waits until the model's
# worker is READY and prints "grpc: 127.0.0.1:PORT" last.
# Ports, all on 127.0.0.1: gRPC inference PORT_BASE, gRPC management +1, HTTP inference +2, HTTP management +3,
# metrics +4 (default PORT_BASE 7070). Writes WORKDIR/config.properties, logs/, tmp/, and while it runs
# torchserve.pid (the launcher), java.pid (the front end), worker.pid (the Python worker), grpc_address.
# Env: TS_START_TIMEOUT (seconds, default 180).
set -euo pipefail

KIT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
WORK="${1:-${TS_WORK:-}}"
BASE="${2:-${TS_PORT_BASE:-7070}}"
fail() { echo "start.sh: $*" >&2; exit 1; }
[ -n "$WORK" ] && [ -d "$WORK" ] || fail "usage: start.sh WORKDIR [PORT_BASE], WORKDIR made by setup.sh"
WORK="$(cd "$WORK" && pwd)"
[ -x "$WORK/venv/bin/torchserve" ] && [ -f "$WORK/model_store/aaren.mar" ] || fail "$WORK is not set up: run setup.sh $WORK"
[[ "$BASE" =~ ^[0-9]+$ && "$BASE" -ge 1024 && "$BASE" -le 65530 ]] || fail "PORT_BASE must be 1024..65530, got $BASE"
# The worker's unix socket lives under WORKDIR/tmp, and a socket path has at most 107 bytes.
[ ${#WORK} -le 80 ] || fail "WORKDIR is too long for TorchServe's worker socket (${#WORK} > 80 characters)"
cd "$WORK"
VPY="$WORK/venv/bin/python"

ours() { [ -n "${1:-}" ] && [ -r "/proc/$1/cmdline" ] && tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -qF -- "$WORK/"; }
for f in torchserve.pid java.pid worker.pid; do
  [ -f "$f" ] && ours "$(head -c 32 "$f" | cut -d' ' -f1)" && fail "already running from $WORK ($f): run stop.sh $WORK first"
done
rm -f torchserve.pid java.pid worker.pid grpc_address tmp/.model_server.pid

GRPC=$BASE GRPC_MGMT=$((BASE + 1)) HTTP=$((BASE + 2)) MGMT=$((BASE + 3)) METRICS=$((BASE + 4))
"$VPY" - $GRPC $GRPC_MGMT $HTTP $MGMT $METRICS <<'PY' || fail "a port of $BASE..$((BASE + 4)) is taken: pass another PORT_BASE"
import socket, sys
for port in map(int, sys.argv[1:]):
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
PY

mkdir -p logs tmp
cat > config.properties <<PROPS
inference_address=http://127.0.0.1:$HTTP
management_address=http://127.0.0.1:$MGMT
metrics_address=http://127.0.0.1:$METRICS
grpc_inference_address=127.0.0.1
grpc_management_address=127.0.0.1
grpc_inference_port=$GRPC
grpc_management_port=$GRPC_MGMT
model_store=$WORK/model_store
load_models=aaren.mar
default_workers_per_model=1
job_queue_size=1000
number_of_netty_threads=4
netty_client_threads=4
default_response_timeout=120
vmargs=-Xmx1g -XX:+ExitOnOutOfMemoryError
disable_token_authorization=true
enable_model_api=false
install_py_dep_per_model=false
disable_system_metrics=true
async_logging=true
PROPS

# TorchServe keeps its pid file in TMPDIR and unpacks the model (and its socket) in TEMP; setsid puts it in
# a session of its own, so a Ctrl-C in the caller's terminal does not stop half of it.
export TMPDIR="$WORK/tmp" TEMP="$WORK/tmp" LOG_LOCATION="$WORK/logs" METRICS_LOCATION="$WORK/logs"
setsid "$WORK/venv/bin/torchserve" --start --foreground --ncs --disable-token-auth \
  --ts-config "$WORK/config.properties" --model-store "$WORK/model_store" --models aaren.mar \
  --log-config "$KIT/log4j2.xml" >logs/torchserve_stdout.log 2>&1 </dev/null &
LAUNCHER=$!
echo "$LAUNCHER" >torchserve.pid

children() { local p; for p in /proc/[0-9]*; do
  [ "$(sed -E 's/.*\) [A-Za-z] ([0-9]+).*/\1/' "$p/stat" 2>/dev/null)" = "$1" ] && echo "${p#/proc/}"; done; return 0; }

deadline=$((SECONDS + ${TS_START_TIMEOUT:-180}))
until "$VPY" - "$MGMT" 2>/dev/null <<'PY'
import json, sys, urllib.request
with urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/models/aaren", timeout=2) as reply:
    workers = json.load(reply)[0].get("workers", [])
sys.exit(0 if any(w.get("status") == "READY" for w in workers) else 1)
PY
do
  if ! kill -0 "$LAUNCHER" 2>/dev/null; then
    rm -f torchserve.pid
    fail "TorchServe exited while starting; its log: $(tail -n 20 logs/torchserve_stdout.log 2>/dev/null)"
  fi
  if [ $SECONDS -ge $deadline ]; then
    bash "$KIT/stop.sh" "$WORK" >&2 || true
    fail "the model was not READY within ${TS_START_TIMEOUT:-180} s (logs in $WORK/logs); stopped what was started"
  fi
  sleep 1
done
JAVA_PID="$(children "$LAUNCHER" | head -1)"
echo "$JAVA_PID" >java.pid
echo "$(children "$JAVA_PID" | tr '\n' ' ' | sed 's/ $//')" >worker.pid
echo "127.0.0.1:$GRPC" >grpc_address
echo "TorchServe ready: launcher $LAUNCHER, java $JAVA_PID, worker $(cat worker.pid); logs in $WORK/logs"
echo "grpc: 127.0.0.1:$GRPC"
