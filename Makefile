# batchrl: `make train` and `make test` work from a fresh clone; both install into .venv.
# The virtualenv is rebuilt only when pyproject.toml changes (the TensorFlow wheel is large).

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CONFIG ?= pendulum
LOGDIR ?= runs/$(CONFIG)

.PHONY: install train test lint clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

train: install
	$(PY) -m batchrl.scripts.train --config=$(CONFIG) --logdir=$(LOGDIR)

test: install
	$(PY) -m pytest -q

lint: install
	$(PY) -m ruff check batchrl scripts tests

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .ruff_cache
