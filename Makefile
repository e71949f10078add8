# make demo — set up .venv and run the main example on 2 workers
# make test — set up .venv and run the whole test suite
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
# CPU wheels of torch; set TORCH_INDEX= to install torch from the default index only.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
PIP_TORCH_ARGS := $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))
DEMO := $(if $(wildcard examples/pytorch_digits.py),examples/pytorch_digits.py,examples/numpy_allreduce.py)

.PHONY: venv test demo clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet $(PIP_TORCH_ARGS) torch==2.13.0
	$(BIN)/python -m pip install --quiet $(PIP_TORCH_ARGS) -e ".[test,examples]"
	touch $@

test: venv
	$(BIN)/python -m pytest -q tests

demo: venv
	PATH="$(CURDIR)/$(BIN):$$PATH" horovodrun -np 2 python $(DEMO)

clean:
	rm -rf $(VENV) build *.egg-info
