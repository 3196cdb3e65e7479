# The commands README and .ci/run use. Everything installs into .venv from nothing but Python + pip.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: setup test unit fast lint format typecheck bench demo up clean soak flaky-check screenshots \
	probe-model i18n

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

lint: setup
	$(PY) -m ruff format --check .
	$(PY) -m ruff check .

format: setup
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

typecheck: setup
	$(PY) -m mypy

# The whole suite: lint, types, then every test (unit, integration, e2e, reliability).
test: lint typecheck clients
	$(PY) -m pytest $(PYTEST_ARGS)

# Third-party clients the tests drive that cannot share memq's venv (langchain-mcp-adapters needs
# the MCP SDK 1.x; memq serves with 2.x): their own venv, found by tests/test_deerflow_mcp.py.
clients: .venv-clients/.installed

.venv-clients/.installed:
	$(PYTHON) -m venv .venv-clients
	.venv-clients/bin/python -m pip install -q "langchain-mcp-adapters>=0.3,<0.4"
	touch $@

unit: setup
	$(PY) -m pytest -m "not e2e and not reliability" $(PYTEST_ARGS)

# The pure tests alone: no redis-server, no Celery (the `integration` marker is derived in
# tests/conftest.py from what a test uses).
fast: setup
	$(PY) -m pytest -m "not integration" $(PYTEST_ARGS)

bench: setup
	$(PY) -m bench

# A real 1.5B model in the loop (issue 31): serves ../shared/tools/local-llm's model (run its
# setup.sh once, ~9 min), hands it the probe conversations through the real stack and prints what
# it learnt. Slow (tens of minutes on 2 cores); never part of `test`, `bench` or CI.
# PROBE_ARGS="--only 1,3 --base-url http://127.0.0.1:8088/v1".
PROBE_ARGS ?=
probe-model: setup
	$(PY) -m bench.probe_model $(PROBE_ARGS)

# The whole suite several times, the last runs beside a CPU hog; per-test failure counts, exit 1
# on any failure. Narrow it with FLAKY_ARGS='--runs 3 --hog-runs 2 -- -m "e2e or reliability"'.
FLAKY_ARGS ?= --runs 4 --hog-runs 2
flaky-check: setup
	$(PY) -m tests.flaky_check $(FLAKY_ARGS)

# The inspector's main pages as PNGs in docs/screenshots/ (headless Chromium on a real stack).
screenshots: setup
	$(PY) -m tests.support.screenshots docs/screenshots

# The inspector's strings: extract them from the templates and merge them into the Chinese
# catalogue (translate the new, empty entries; the .po is compiled when the inspector starts).
i18n: setup
	cd memq/server/ui && $(VENV)/bin/pybabel extract -F locale/babel.cfg -o locale/messages.pot --no-location --omit-header . \
	  && $(VENV)/bin/pybabel update -i locale/messages.pot -d locale -D messages -l zh_Hans --no-fuzzy-matching

demo: setup
	$(VENV)/bin/memq demo

up: setup
	$(VENV)/bin/memq up

clean:
	rm -rf $(VENV) .memq .pytest_cache .mypy_cache .ruff_cache

# The chaos soak (issue 11): the whole stack under load and faults, then the oracle; exit 1 on any
# lost, duplicated or invalid item. SOAK_ARGS="--minutes 30 --appendfsync always --report".
SOAK_ARGS ?=
soak: setup
	$(PY) -m bench.soak $(SOAK_ARGS)
