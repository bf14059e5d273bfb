#!/usr/bin/env bash
# `make image`: build the Dockerfile on a machine that reaches PyPI and Debian but no registry of
# images and no PyTorch index, with a private Docker engine (dockerd.sh). Settings (environment):
#   IMAGE        tag to build (aaren:latest)
#   BASE_IMAGE   base with python3 + python3-venv; the default is made by base-image.sh once
#   TORCH_SPEC   the torch the image gets; pip downloads it here with the host's own configuration
#                (its find-links hold the CPU wheel), so the build installs that file
#   TORCH_INDEX  index for torch's dependencies; empty: pip's default (PyPI), as on the host
#                (the Dockerfile's own default is PyTorch's CPU index, unreachable here)
#   EXTRA_CA_DIR the host's extra CA certificates (as update-ca-certificates took them), passed
#                as the build secret extra_ca so pip trusts a TLS-inspecting proxy
set -euo pipefail
cd "$(dirname "$0")/../.."

IMAGE="${IMAGE:-aaren:latest}"
BASE_IMAGE="${BASE_IMAGE:-aaren-base:bookworm}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0+cpu}"
TORCH_INDEX="${TORCH_INDEX-}"
EXTRA_CA_DIR="${EXTRA_CA_DIR:-/usr/local/share/ca-certificates}"
DOCKER="${DOCKER:-/usr/bin/docker}"
ROOT="${AAREN_DOCKER_ROOT:-${TMPDIR:-/tmp}/aaren-docker}"
export AAREN_DOCKER_ROOT="$ROOT" DOCKER

deploy/docker/install-engine.sh
DOCKER_HOST="$(deploy/docker/dockerd.sh start)"
export DOCKER_HOST
echo "docker engine: $DOCKER_HOST"

if [[ "$BASE_IMAGE" == aaren-base:* ]]; then
  deploy/docker/base-image.sh "$BASE_IMAGE"
fi

# The image's Python is 3.11 (bookworm); ask for a wheel of that Python whatever the host's is.
wheels=deploy/docker/wheels
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 --dest "$wheels" "$TORCH_SPEC"

# Outside the build context: the certificates reach the build only as a secret.
ca="$ROOT/extra-ca.pem"
find "$EXTRA_CA_DIR" -name '*.crt' -type f -print0 2>/dev/null | sort -z | xargs -0 -r cat >"$ca.new"
mv "$ca.new" "$ca"

# --network host: the build's pip reaches PyPI as the host does (this engine runs no NAT).
DOCKER_BUILDKIT=1 "$DOCKER" build --network host --progress plain \
  --secret id=extra_ca,src="$ca" \
  --build-arg BASE_IMAGE="$BASE_IMAGE" --build-arg TORCH_SPEC="$TORCH_SPEC" --build-arg TORCH_INDEX="$TORCH_INDEX" \
  --tag "$IMAGE" .
echo "image $IMAGE: $("$DOCKER" image inspect --format '{{.Size}}' "$IMAGE" | awk '{printf "%.2f GB", $1 / 1e9}')"
