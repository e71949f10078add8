"""The JAX examples end to end under the real horovodrun (tier: cli), JaxState on its own (unit), and the optional
extra: without jax, ``import horovod.jax`` names the extra and ``horovodrun -cb`` does not list JAX."""

import os
import re
import subprocess
import sys

import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
pytest.importorskip("optax")

from horovod.runner.launch import package_pythonpath  # noqa: E402
from horovod.testing.fixtures import run_horovodrun  # noqa: E402

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples")
ENV = {"XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1", "JAX_PLATFORMS": "cpu"}


@pytest.mark.cli
def test_digits_example_reaches_95_percent(tmp_path):
    checkpoint = tmp_path / "ck" / "digits.pkl"
    proc = run_horovodrun(["-np", "2", sys.executable, os.path.join(EXAMPLES, "jax_digits.py"),
                           "--checkpoint", str(checkpoint)], timeout=240, env=ENV)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    accuracy = float(re.search(r"final test accuracy: ([\d.]+)%", proc.stdout).group(1))
    assert accuracy >= 95.0, proc.stdout
    assert proc.stdout.count("epoch ") == 12 and "[1]<stdout>:epoch" not in proc.stdout   # rank 0 prints
    assert checkpoint.exists()


@pytest.mark.cli
def test_elastic_example_trains_through_a_killed_worker():
    result = run_horovodrun(["-np", "3", "--min-np", "1", "-H", "127.0.0.1:1,127.0.0.2:1,127.0.0.3:1",
                             sys.executable, os.path.join(EXAMPLES, "jax_elastic_digits.py"), "--epochs", "2",
                             "--crash-host", "127.0.0.3"], timeout=240, env=ENV)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-5000:]
    assert "worker 127.0.0.3:0 ended with signal SIGKILL" in log and "round 2: 2 worker(s)" in log
    finals = re.findall(r"final test accuracy: ([\d.]+)% on rank (\d) of (\d); parameter checksum (\S+)", log)
    assert sorted(f[1:3] for f in finals) == [("0", "2"), ("1", "2")], log[-3000:]
    assert len({f[3] for f in finals}) == 1, "the survivors' parameters differ"
    assert float(finals[0][0]) > 50.0
    # A run that recovered and exited 0 is quiet: the lost peer's HorovodInternalError, caught by hvd.elastic.run,
    # is not logged with a traceback by JAX's host-callback machinery.
    assert "Traceback" not in log and "io_callback failed" not in log, log[-5000:]


@pytest.mark.unit
def test_jax_state_commit_restore_sync_and_reset_callbacks():
    import optax

    import horovod.jax as hvd
    hvd.init()
    try:
        params = {"w": jnp.ones(3), "b": [jnp.zeros(2)]}
        opt = optax.adam(0.1)
        sampler = hvd.elastic.ElasticSampler(10, seed=3)
        state = hvd.elastic.JaxState(params=params, opt_state=opt.init(params), sampler=sampler, epoch=0,
                                     history=[])
        state.params = {"w": jnp.full(3, 2.0), "b": [jnp.ones(2)]}
        sampler.record_batch(0, 4)
        state.epoch = 1
        state.history.append(1)
        state.commit()
        committed = state.params
        state.params["w"] = jnp.full(3, 9.0)        # mutating the live tree must not touch the commit
        _, state.opt_state = opt.update(state.params, state.opt_state, state.params)
        sampler.record_batch(1, 4)
        state.epoch, state.history = 2, state.history + [2]
        state.restore()
        assert float(state.params["w"][0]) == 2.0 and state.params is not committed
        assert int(state.opt_state[0].count) == 0
        assert state.epoch == 1 and state.history == [1] and sampler.processed_num == 4
        calls = []
        state.register_reset_callbacks([lambda: calls.append(hvd.size())])
        state.on_reset()
        assert calls == [1]
        state.sync()
        assert float(state.params["b"][0][0]) == 1.0 and state.history == [1]
    finally:
        hvd.shutdown()


_BLOCK_JAX = """
import importlib.abc, sys
class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('jax', 'jaxlib'):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None
sys.meta_path.insert(0, Blocker())
"""


def _python(code):
    env = {**os.environ, **package_pythonpath()}
    return subprocess.run([sys.executable, "-c", _BLOCK_JAX + code], capture_output=True, text=True, env=env,
                          timeout=60)


@pytest.mark.unit
def test_without_jax_the_import_names_the_extra_and_check_build_leaves_jax_out():
    proc = _python("import horovod.jax")
    assert proc.returncode != 0 and "pip install -e '.[jax]'" in proc.stderr, proc.stderr[-2000:]
    proc = _python("from horovod.runner.check_build import check_build_text; print(check_build_text('1'))")
    assert proc.returncode == 0 and "[ ] JAX" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.unit
def test_with_jax_horovod_jax_imports_and_check_build_lists_it():
    import horovod.jax  # noqa: F401
    from horovod.runner.check_build import check_build_text
    assert "[X] JAX" in check_build_text("1")
