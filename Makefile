# One-command entry points (README "Quick start"). Every target installs what it needs first.
VENV ?= .venv
PY := $(VENV)/bin/python
# CPU build of torch; on these machines it lies on disk, so this is fast (a bare `torch` pulls CUDA).
TORCH_SPEC ?= torch==2.13.0

.PHONY: install test lint serve bench-core proto

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

test: install lint
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
