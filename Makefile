# batchrl: `make train` and `make test` work from a fresh clone; both install into .venv.
# The virtualenv is rebuilt only when pyproject.toml or the Python version changes (the
# TensorFlow wheel is large).

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# One stamp per interpreter version: `make test PYTHON=python3.12` rebuilds a 3.11 .venv.
PYVERSION := $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])')
STAMP := $(VENV)/.installed-$(PYVERSION)
CONFIG ?= pendulum
LOGDIR ?= runs/$(CONFIG)
# The commands write the bytecode of what they import into .venv (and __pycache__/, ignored
# by git), even where PYTHONDONTWRITEBYTECODE is set: else every process would compile
# TensorFlow's Python anew (`import tensorflow` 13 s instead of 4 s here).
RUN := PYTHONDONTWRITEBYTECODE= $(PY)

.PHONY: install train test bench lint clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@# Off-screen MuJoCo rendering (visualize) needs Mesa's EGL; install it where we can.
	@if ! ldconfig -p | grep -q libEGL_mesa; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && apt-get install -y -qq libegl1 libegl-mesa0 libgl1-mesa-dri; \
	  else \
	    echo "note: MuJoCo videos need libegl1 libegl-mesa0 libgl1-mesa-dri (apt-get)"; \
	  fi; \
	fi
	@# A .venv of another Python version is removed; one of this version is reused.
	@if [ -x $(PY) ] && [ "$$($(PY) -c 'import sys; print("%d.%d" % sys.version_info[:2])')" != "$(PYVERSION)" ]; then \
	  echo "rebuilding $(VENV) for Python $(PYVERSION)"; rm -rf $(VENV); \
	fi
	$(PYTHON) -m venv $(VENV)
	@# uv installs the same pinned set as pip in half the time (1 min against 2). It does
	@# not compile the bytecode of all 17,000 modules (28 s here); the commands below write
	@# it as they first import each module (`RUN`).
	$(PY) -m pip install --quiet uv==0.13.9
	$(PY) -m uv pip install --quiet --python $(PY) -e '.[dev,ray]'
	touch $(STAMP)

train: install
	$(RUN) -m batchrl.scripts.train --config=$(CONFIG) --logdir=$(LOGDIR)

# Both cores: each test module runs whole on one worker (tests/conftest.py schedules them).
test: install
	$(RUN) -m pytest -q -n 2

bench: install
	$(RUN) -m benchmarks.throughput

lint: install
	$(RUN) -m ruff check batchrl benchmarks examples tests

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .ruff_cache
