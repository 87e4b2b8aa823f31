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

test: $(VENV)/.installed-dev
	$(PY) -m pytest -q -m "not slow"

test-slow: $(VENV)/.installed-dev
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
