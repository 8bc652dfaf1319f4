# `make demo`, `make test` and `make docs` each set up everything they need on a fresh machine.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# TensorFlow is the user's; this is the build the demo and tests train with.
TF_PACKAGE ?= tensorflow-cpu==2.21.0
KERAS_HUB_VERSION ?= 0.32.0
DEPS_STAMP := $(VENV)/.deps-installed
# The docs extra alone: building the site needs neither TensorFlow nor the server.
DOCS_STAMP := $(VENV)/.docs-installed
# pytest-xdist workers: the suite mostly waits (servers starting, runs streaming, deadlines),
# so even on 2 cores several workers finish it sooner. TEST_JOBS=0: one process.
TEST_JOBS ?= 3

.PHONY: demo test docs lint typecheck bench compat faults screenshot system clean

$(DEPS_STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[server,demo,dev,parquet,client]' '$(TF_PACKAGE)'
	# A real architecture for the shape tests; its tensorflow-text would pull `tensorflow`
	# beside the CPU build, and a tiny backbone with random weights needs none of it.
	$(PY) -m pip install -q --no-deps 'keras-hub==$(KERAS_HUB_VERSION)'
	touch $@

$(DOCS_STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -e '.[docs]'
	touch $@

system:
	./scripts/ensure-system.sh

# `make demo SCENARIO=leak` shows one of the failure scenarios (trainvitals demo --help).
demo: $(DEPS_STAMP)
	./scripts/demo.sh $(if $(SCENARIO),--scenario $(SCENARIO))

lint: $(DEPS_STAMP)
	$(PY) -m ruff check src tests harness benchmarks

typecheck: $(DEPS_STAMP)
	$(PY) -m mypy -p trainvitals -p tests -p harness

test: $(DEPS_STAMP) system lint typecheck
	$(PY) -m pytest -n $(TEST_JOBS)

# The documentation site from docs/ into site/ (mkdocs.yml); a broken link, a missing anchor or
# a page left out of the navigation fails it.
docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

bench: $(DEPS_STAMP) system
	$(PY) benchmarks/ingest.py
	$(PY) benchmarks/writer.py
	$(PY) benchmarks/agent_overhead.py
	$(PY) benchmarks/reliability.py
	$(PY) benchmarks/notify.py
	$(PY) benchmarks/scenarios.py
	$(PY) benchmarks/detector.py
	$(PY) benchmarks/abuse.py
	$(PY) benchmarks/scale.py
	$(PY) benchmarks/storage.py
	$(PY) benchmarks/soak.py
	$(PY) benchmarks/dashboard.py
	$(PY) benchmarks/early_warning.py
	$(PY) benchmarks/encode.py
	$(PY) benchmarks/replay.py
	$(PY) benchmarks/clocks.py
	$(PY) benchmarks/cli_startup.py
	$(PY) benchmarks/runs_list.py
	$(PY) benchmarks/metric_sort.py
	$(PY) benchmarks/idle_server.py
	$(PY) benchmarks/hand_over.py
	$(PY) benchmarks/ws_memory.py --token --against HEAD

# Private PostgreSQL stopped 1, 6 and 30 s, a full disk, a SIGKILL (docs/operations.md).
faults: $(DEPS_STAMP) system
	$(PY) benchmarks/faults.py

# Keras's own tests, bare and with the callback on every fit: any test whose outcome differs.
# trainer_test.py imports jax at module level: the CPU wheel, for this job only.
JAX_PACKAGE ?= jax[cpu]==0.10.2
compat: $(DEPS_STAMP)
	$(PY) -m pip install -q '$(JAX_PACKAGE)'
	$(PY) benchmarks/keras_suite.py -n $(TEST_JOBS) --json compat.json

# Regenerates the pictures of the README and the docs (light, dark, compare) from the browser tests.
screenshot: $(DEPS_STAMP) system
	TRAINVITALS_SCREENSHOT=docs/dashboard.png $(PY) -m pytest -q tests/e2e/test_dashboard.py -k live_run
	TRAINVITALS_SCREENSHOT=docs/dashboard.png $(PY) -m pytest -q tests/e2e/test_runs_page.py -k compared

clean:
	rm -rf $(VENV) build dist site *.egg-info demo-data .pytest_cache .mypy_cache .ruff_cache
