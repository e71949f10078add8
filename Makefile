# make demo — set up .venv with what the demo needs (torch, scikit-learn) and run the main example on 2 workers
# make test — set up .venv with every extra and run the whole test suite
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
# torch is pinned: an unpinned torch pulls a multi-GB CUDA build; 2.13.0 is the CPU wheel this project tests with.
# The tensorflow extra is tensorflow-cpu + Keras 3 (about 30 s to install here); the jax, ray and spark extras are
# optional for users but tested here; torch stays pinned in the same command.
TORCH := torch==2.13.0
DEMO := $(if $(wildcard examples/pytorch_digits.py),examples/pytorch_digits.py,examples/numpy_allreduce.py)
# The demo trains on scikit-learn's digits with torch: the examples extra, nothing else (no TensorFlow, JAX, Ray,
# Spark: the full set is a 4 GB environment).
DEMO_EXTRAS := examples
TEST_EXTRAS := test,examples,tensorflow,jax,ray,spark
# ml_dtypes 0.7.0 (which TensorFlow, Keras and JAX all import) spends 0.8-1.2 CPU-s initialising its extension
# module, against 0.1 s for 0.6.0: every TensorFlow or JAX rank the suite starts paid it (docs/performance.md).
# TensorFlow, Keras and JAX accept ml_dtypes>=0.5.1.
FAST_IMPORTS := "ml_dtypes<0.7"

.PHONY: venv demo-venv test soak demo clean sysdeps bytecode

venv: $(VENV)/.installed

demo-venv: $(VENV)/.demo-installed

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet $(TORCH)
	$(BIN)/python -m pip install --quiet -e ".[$(TEST_EXTRAS)]" $(TORCH) $(FAST_IMPORTS)
	touch $@ $(VENV)/.demo-installed

# The demo's environment; the full one (above) holds it too, so after `make test` the demo installs nothing more.
$(VENV)/.demo-installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet $(TORCH)
	$(BIN)/python -m pip install --quiet -e ".[$(DEMO_EXTRAS)]" $(TORCH)
	touch $@

sysdeps:
	bash scripts/system-deps.sh

# Three phases: most tests wait on processes, sockets and timeouts rather than compute, so four run at once on two
# cores (a test that shares a module's spawned job or the Spark cluster goes to the worker that builds it: see
# horovod/testing/fixtures.py); the tests that bound a time while the machine stays idle (marker timed) then run five
# at once beside each other only (their waits, not their CPU, set the phase's length); those that bound a time under
# load or load the whole machine (marker serial) run last, one at a time.
TEST_WORKERS ?= 4
TIMED_WORKERS ?= 5
# --strict-skips (horovod/testing/skips.py): each phase lists every skip with its reason and fails when a test
# skipped for a reason this machine does not explain (not root, no mpirun, ...); a missing extra never is one.
PYTEST = $(BIN)/python -m pytest -q --strict-skips
# The later phases collect only the files that mark a test timed or serial: collecting the whole suite imports
# torch and JAX (about 5 CPU-s per pytest process), and the timed phase starts four of them.
TIMED_FILES = $(shell grep -rlE 'mark\.timed' tests --include='test_*.py' | sort)
SERIAL_FILES = $(shell grep -rlE 'mark\.serial' tests --include='test_*.py' | sort)

# Every rank is a new interpreter: where PYTHONDONTWRITEBYTECODE is set (this machine, and CI) and the package is
# installed editable (no .pyc from pip), each rank compiled the package's sources again on import, 0.17-0.28 CPU-s
# of its start-up against 0.06-0.09 s from bytecode, paid by every rank the suite starts. compileall writes only what
# is missing or stale, and a stale .pyc is never used (its source's time stamp differs).
bytecode:
	$(BIN)/python -m compileall -q -j 0 horovod tests examples bench > /dev/null

test: venv sysdeps bytecode
	$(PYTEST) -p xdist -n $(TEST_WORKERS) --dist loadgroup -m "not serial and not timed" tests
	$(PYTEST) -p xdist -n $(TIMED_WORKERS) --dist loadgroup -m timed $(TIMED_FILES)
	$(PYTEST) -m serial $(SERIAL_FILES)

# Repeated trials of the tests that hunt rare failures (one trial each runs in make test), the size-independent
# multi-rank tests at 5 and 8 ranks (make test runs them at 2 and 3: horovod.testing.fixtures.world_sizes), and the
# large variants make test runs smaller (every op at 32 ranks; make test: 8).
WORLD_SIZE_FILES = tests/test_collectives.py tests/test_negotiation.py tests/test_negotiated_data.py \
	tests/test_engine_errors.py tests/test_bad_input.py tests/elastic/test_elastic_cli.py
soak: venv sysdeps bytecode
	$(BIN)/python -m pytest -q -p xdist -n 2 --dist loadgroup -m "not serial and not slow" --world-sizes 5,8 \
		$(WORLD_SIZE_FILES)
	$(BIN)/python -m pytest -q -m "serial and not slow" --world-sizes 5,8 $(WORLD_SIZE_FILES)
	HVD_SOAK_REPEATS=20 HVD_SOAK_HOGS=1 $(BIN)/python -m pytest -q tests/test_error_soak.py
	HVD_SOAK_TRIALS=5 $(BIN)/python -m pytest -q tests/test_hostile_user.py
	HVD_SOAK_TRIALS=3 $(BIN)/python -m pytest -q tests/test_failure_matrix.py
	HVD_SIM_SEEDS=2000 $(BIN)/python -m pytest -q tests/test_simulate.py -k seeded_faults_and_workloads
	HVD_SPARK_EXAMPLES=keras $(BIN)/python -m pytest -q tests/spark/test_horovod_mnist_examples.py -k keras
	HVD_LARGE_WORLD_SIZES=32 $(BIN)/python -m pytest -q tests/test_collectives.py -k larger_world_sizes
	HVD_BUGGIFY_SEEDS=1000 $(BIN)/python -m pytest -q tests/test_simulate_buggify.py -k every_point_fires
	for i in 1 2 3; do $(BIN)/python -m pytest -q tests/test_scale.py tests/elastic/test_elastic_scale.py || exit 1; done

demo: demo-venv bytecode
	PATH="$(CURDIR)/$(BIN):$$PATH" horovodrun -np 2 python $(DEMO)

clean:
	rm -rf $(VENV) build *.egg-info
