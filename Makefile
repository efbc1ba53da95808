# One entry point for users and CI: `make test` builds .venv, installs the
# package with its test extra, lints, and runs the suite under the TensorFlow,
# JAX and PyTorch backends.
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
# Two workers on two cores, one compute thread each (1.10x faster than each taking every
# core). Modules marked xdist_group run on one worker, so their module fixtures are built once.
# Each run lists its 20 slowest tests and fixtures: the suite's time budget is spent there.
PYTEST := OMP_NUM_THREADS=1 TF_NUM_INTRAOP_THREADS=1 TF_CPP_MIN_LOG_LEVEL=2 \
	$(PY) -m pytest -n 2 --dist loadgroup --durations=20
# oneDNN kernels: some TensorFlow builds leave them off on AMD CPUs; training ran
# 1.35x faster with them than without (benchmarks/onednn_training.py).
RUN_ENV := KERAS_BACKEND=tensorflow TF_CPP_MIN_LOG_LEVEL=2 TF_ENABLE_ONEDNN_OPTS=1
# Tests of backend-agnostic code (keras_transformer/); pipelines/ runs on TensorFlow,
# and its training also on JAX (tests/jax_training).
AGNOSTIC_TESTS := tests --ignore=tests/pipelines --ignore=tests/jax_training
# Training on JAX, data-parallel over two virtual CPU devices (set before JAX starts).
JAX_TRAINING := KERAS_BACKEND=jax XLA_FLAGS=--xla_force_host_platform_device_count=2

.PHONY: install demo train test test-slow test-release lint

$(VENV)/.installed: setup.py pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[tensorflow,test]'
	touch $@

install: $(VENV)/.installed

# The whole product on the embedded corpus: train, export, translate with the
# SavedModel, score. No data, no network.
demo: install
	$(RUN_ENV) $(PY) -m pipelines demo

# Train the default recipe on the embedded corpus (no data, no network).
train: install
	$(RUN_ENV) $(PY) -m pipelines train

lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

test: lint
	KERAS_BACKEND=tensorflow $(PYTEST) tests
	KERAS_BACKEND=jax $(PYTEST) $(AGNOSTIC_TESTS)
	$(JAX_TRAINING) $(PYTEST) tests/jax_training
	KERAS_BACKEND=torch $(PYTEST) $(AGNOSTIC_TESTS)

# pytest exits 5 when no test carries the marker; that is not a failure.
# The release checks are slow checks too, run before a release (CONTRIBUTING.md), not by CI.
test-slow: install
	KERAS_BACKEND=tensorflow $(PYTEST) -m "slow and not release" tests || [ $$? -eq 5 ]
	$(JAX_TRAINING) $(PYTEST) -m "slow and not release" tests/jax_training || [ $$? -eq 5 ]
	KERAS_BACKEND=torch $(PYTEST) -m "slow and not release" $(AGNOSTIC_TESTS) || [ $$? -eq 5 ]

test-release: install
	KERAS_BACKEND=tensorflow $(PYTEST) -m release tests || [ $$? -eq 5 ]
	$(JAX_TRAINING) $(PYTEST) -m release tests/jax_training || [ $$? -eq 5 ]
