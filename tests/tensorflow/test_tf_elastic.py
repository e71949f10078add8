"""examples/keras_elastic_digits.py under the real elastic horovodrun: a worker killed mid-epoch inside Keras
``fit`` (a ``tf.function``), the survivors restore the last commit, go on with 2 workers and end with equal weights."""

import os
import re
import sys

import pytest

from horovod.testing.fixtures import run_horovodrun, skip_module_without

skip_module_without("tensorflow")

EXAMPLE = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "examples", "keras_elastic_digits.py")
TF_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "0"}


@pytest.mark.cli
def test_keras_state_survives_a_killed_worker():
    # Three TensorFlow imports at once on a loaded 2-core machine can take the default start timeout (30 s).
    result = run_horovodrun(["-np", "3", "--min-np", "1", "-H", "127.0.0.1:1,127.0.0.2:1,127.0.0.3:1",
                             "--start-timeout", "100",
                             sys.executable, EXAMPLE, "--epochs", "2", "--crash-host", "127.0.0.3"],
                            timeout=150, env=TF_ENV)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-5000:]
    assert "worker 127.0.0.3:0 ended with signal SIGKILL" in log and "round 2: 2 worker(s)" in log, log[-3000:]
    assert "reset: now 2 worker(s)" in log
    finals = re.findall(r"final test accuracy: ([\d.]+)% on rank (\d) of (\d); weight checksum (\S+)", log)
    assert sorted(f[1:3] for f in finals) == [("0", "2"), ("1", "2")], log[-3000:]
    assert len({f[3] for f in finals}) == 1, "the survivors' weights differ"
    assert float(finals[0][0]) > 50.0
