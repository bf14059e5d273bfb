#!/usr/bin/env bash
# setup.sh WORKDIR: builds the TorchServe peer under WORKDIR (this folder is only read).
#   WORKDIR/venv         torch (CPU), torchserve, torch-model-archiver, grpc, numpy, pyyaml (versions pinned below)
#   WORKDIR/gen          Python stubs of inference.proto (taken from the installed TorchServe's jar)
#   WORKDIR/model_store  aaren.mar: peer_handler.py + peer_model.py + model-config.yaml
#   WORKDIR/versions.txt what was installed
# Safe to rerun: the venv is kept, stubs and archive are rebuilt. Env: PYTHON (default python3), JAVA_HOME.
set -euo pipefail

KIT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
WORK="${1:-${TS_WORK:-}}"
fail() { echo "setup.sh: $*" >&2; exit 1; }
[ -n "$WORK" ] || fail "usage: setup.sh WORKDIR"
mkdir -p "$WORK" && WORK="$(cd "$WORK" && pwd)"
PY="${PYTHON:-python3}"

TORCH=torch==2.13.0
SERVE="torchserve==0.12.0 torch-model-archiver==0.12.0"
# pyyaml: TorchServe 0.12's worker imports it without declaring it.
CLIENT="pyyaml grpcio grpcio-tools protobuf numpy"

# TorchServe's front end is Java; 0.12 needs 17 or newer.
JAVA="${JAVA_HOME:+$JAVA_HOME/bin/}java"
command -v "$JAVA" >/dev/null 2>&1 || fail "no java: TorchServe needs Java 17+ (Debian: apt-get install openjdk-17-jre-headless)"
JAVA_VERSION="$("$JAVA" -version 2>&1 | head -1)"
MAJOR="$(sed -E 's/[^"]*"([0-9]+).*/\1/' <<<"$JAVA_VERSION")"
[[ "$MAJOR" =~ ^[0-9]+$ && "$MAJOR" -ge 17 ]] || fail "TorchServe 0.12 needs Java 17+, found: $JAVA_VERSION"

[ -x "$WORK/venv/bin/python" ] || "$PY" -m venv "$WORK/venv" || fail "$PY -m venv failed (Debian: python3-venv)"
VPY="$WORK/venv/bin/python"
export TMPDIR="$WORK/tmp"; mkdir -p "$TMPDIR"
echo "setup.sh: installing $TORCH, then $SERVE $CLIENT"
"$VPY" -m pip install -q "$TORCH"            # first, so that nothing pulls a CUDA build
"$VPY" -m pip install -q $SERVE $CLIENT

rm -rf "$WORK/proto" "$WORK/gen" && mkdir -p "$WORK/proto" "$WORK/gen"
"$VPY" - "$WORK/proto" <<'PY'
import pathlib, sys, zipfile
import ts
jar = pathlib.Path(ts.__file__).parent / "frontend" / "model-server.jar"
with zipfile.ZipFile(jar) as archive:
    for name in ("inference.proto", "google/rpc/status.proto"):
        archive.extract(name, sys.argv[1])
PY
"$VPY" -m grpc_tools.protoc -I"$WORK/proto" --python_out="$WORK/gen" --grpc_python_out="$WORK/gen" \
  inference.proto google/rpc/status.proto

mkdir -p "$WORK/model_store"
"$WORK/venv/bin/torch-model-archiver" --model-name aaren --version 1.0 --force \
  --handler "$KIT/peer_handler.py" --extra-files "$KIT/peer_model.py" \
  --config-file "$KIT/model-config.yaml" --export-path "$WORK/model_store"
[ -f "$WORK/model_store/aaren.mar" ] || fail "the model archive was not built"

# The stubs import and the model builds, from the kit's files as the worker and client will.
PYTHONDONTWRITEBYTECODE=1 "$VPY" - "$WORK/gen" "$KIT" <<'PY'
import sys
sys.path[:0] = sys.argv[1:3]
import inference_pb2_grpc  # noqa: F401
from peer_model import PeerModel
print("setup.sh: stubs import; model parameters:", sum(p.numel() for p in PeerModel().parameters()))
PY

{ "$VPY" -m pip list 2>/dev/null | grep -iE '^(torch|torchserve|torch-model-archiver|grpcio|grpcio-tools|protobuf|numpy|pyyaml) ' || true
  echo "$JAVA_VERSION"; } > "$WORK/versions.txt"
echo "setup.sh: done in $WORK"; sed 's/^/  /' "$WORK/versions.txt"
