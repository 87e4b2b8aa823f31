# Two commands on a fresh machine with only Python: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP_FLAGS := --disable-pip-version-check -q

.PHONY: run test test-slow bench clean

$(VENV)/bin/activate:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: $(VENV)/bin/activate pyproject.toml
	$(PY) -m pip install $(PIP_FLAGS) -e .
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(PY) -m pip install $(PIP_FLAGS) -e '.[dev]'
	touch $@

run: $(VENV)/.installed
	$(PY) -m sdm run

# One pytest worker per core (pytest-xdist): a clean clone's run is mostly Numba compiling
# kernels, one thread each, so the second core halves it (15 min to 8 on 2 cores). At most 8:
# each worker compiles the kernels its tests need and holds its own LLVM (a few hundred MB).
XDIST := -n auto --maxprocesses 8

test: $(VENV)/.installed-dev
	$(PY) -m pytest -q $(XDIST) -m "not slow"

test-slow: $(VENV)/.installed-dev
	$(PY) -m pytest -q $(XDIST)

# Every bench at toy size (each takes --quick), one after another; stops at the first failure.
# Full-size runs, whose figures go in bench/RESULTS.md, are one bench at a time without it.
bench: $(VENV)/.installed
	@for b in bench/bench_*.py; do echo "== $$b --quick"; $(PY) $$b --quick || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
