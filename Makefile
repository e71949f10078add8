# make demo — set up .venv and run the main example on 2 workers
# make test — set up .venv and run the whole test suite
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
# torch is pinned: an unpinned torch pulls a multi-GB CUDA build; 2.13.0 is the CPU wheel this project tests with.
# The tensorflow extra is tensorflow-cpu + Keras 3 (about 30 s to install here); the jax, ray and spark extras are
# optional for users but tested here; torch stays pinned in the same command.
TORCH := torch==2.13.0
DEMO := $(if $(wildcard examples/pytorch_digits.py),examples/pytorch_digits.py,examples/numpy_allreduce.py)

.PHONY: venv test demo clean sysdeps

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet $(TORCH)
	$(BIN)/python -m pip install --quiet -e ".[test,examples,tensorflow,jax,ray,spark]" $(TORCH)
	touch $@

sysdeps:
	bash scripts/system-deps.sh

test: venv sysdeps
	$(BIN)/python -m pytest -q tests

demo: venv
	PATH="$(CURDIR)/$(BIN):$$PATH" horovodrun -np 2 python $(DEMO)

clean:
	rm -rf $(VENV) build *.egg-info
