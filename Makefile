# `make demo` and `make test` each set up everything they need on a fresh machine.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# TensorFlow is the user's; this is the build the demo and tests train with.
TF_PACKAGE ?= tensorflow-cpu==2.21.0
DEPS_STAMP := $(VENV)/.deps-installed
PKG_STAMP := $(VENV)/.package-installed
SOURCES := $(wildcard agent/*.py agent/detect/*.py server/*.py server/routes/*.py server/notify/*.py web/*)

.PHONY: demo test lint typecheck bench screenshot system clean

$(DEPS_STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[server,demo,dev]' '$(TF_PACKAGE)'
	touch $@

# A strict editable install (a link tree of the package as it installs) lets mypy and the
# tests see `trainvitals` exactly as a wheel lays it out; it is redone when files come or go.
$(PKG_STAMP): $(DEPS_STAMP) $(SOURCES)
	$(PY) -m pip install -q --no-deps -e . --config-settings editable_mode=strict
	touch $@

system:
	./scripts/ensure-system.sh

# `make demo SCENARIO=leak` shows one of the failure scenarios (trainvitals demo --help).
demo: $(PKG_STAMP)
	./scripts/demo.sh $(if $(SCENARIO),--scenario $(SCENARIO))

lint: $(PKG_STAMP)
	$(PY) -m ruff check agent server tests benchmarks

typecheck: $(PKG_STAMP)
	$(PY) -m mypy -p trainvitals -p tests

test: $(PKG_STAMP) system lint typecheck
	$(PY) -m pytest

bench: $(PKG_STAMP)
	$(PY) benchmarks/ingest.py
	$(PY) benchmarks/writer.py
	$(PY) benchmarks/agent_overhead.py
	$(PY) benchmarks/reliability.py
	$(PY) benchmarks/notify.py
	$(PY) benchmarks/scenarios.py

# Regenerates the README's screenshot from the browser test.
screenshot: $(PKG_STAMP) system
	TRAINVITALS_SCREENSHOT=docs/dashboard.png $(PY) -m pytest -q tests/test_dashboard.py -k live_run

clean:
	rm -rf $(VENV) build dist *.egg-info demo-data .pytest_cache .mypy_cache .ruff_cache
