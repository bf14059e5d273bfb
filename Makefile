# One-command entry points (README "Quick start"). Every target installs what it needs first.
VENV ?= .venv
PY := $(VENV)/bin/python
# CPU build of torch; on these machines it lies on disk, so this is fast (a bare `torch` pulls CUDA).
TORCH_SPEC ?= torch==2.13.0

# buf (the protobuf linter the tests run) ships as a binary inside its npm package; pinned so that
# its rules change only when we bump it.
BUF_VERSION ?= 1.75.0
TOOLS := .tools

.PHONY: install tools test lint serve bench-core proto

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

tools: $(TOOLS)/.buf-$(BUF_VERSION)

$(TOOLS)/.buf-$(BUF_VERSION):
	npm install --silent --no-audit --no-fund --prefix $(TOOLS) "@bufbuild/buf@$(BUF_VERSION)"
	touch $@

lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

test: install lint tools
	$(PY) -m pytest -q

serve: install
	$(VENV)/bin/aaren serve

bench-core: install
	$(PY) bench/core.py

proto: install
	$(PY) proto/generate.py
