# Two commands a new user needs: `make demo` and `make test`. Each creates or updates .venv itself.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
FAIL_RATE ?= 0

.PHONY: venv demo demo-cluster test test-fast lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

demo: venv
	$(PY) examples/http_delivery/demo.py --fail-rate $(FAIL_RATE)

demo-cluster: venv
	$(PY) examples/cluster/demo.py

lint: venv
	$(VENV)/bin/ruff check src tests examples benchmarks
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports  # the layers drawn in pyproject.toml [tool.importlinter]

test: lint
	$(PY) -m pytest

test-fast: venv
	$(PY) -m pytest -m "not integration and not e2e"

bench: venv
	$(PY) benchmarks/delivery.py

clean:
	rm -rf $(VENV) .egress .pytest_cache .mypy_cache .ruff_cache .import_linter_cache

# The chaos harness: 100 random faults, then the audit (docs/reliability.md);
# `make chaos CHAOS_ARGS=--cluster` runs the flights on 2 NATS workers.
CHAOS_FAULTS ?= 100
CHAOS_ARGS ?=
.PHONY: chaos
chaos: venv
	$(PY) benchmarks/chaos.py --faults $(CHAOS_FAULTS) $(CHAOS_ARGS)
