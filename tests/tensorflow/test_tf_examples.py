"""The TensorFlow examples end to end under the real horovodrun: Keras 3 ``model.fit`` on the digits reaches
>= 95% test accuracy on 2 workers; the synthetic benchmark reports its throughput."""

import os
import re
import sys

import pytest

from horovod.testing.fixtures import run_horovodrun, skip_module_without

skip_module_without("tensorflow")

EXAMPLES = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "examples")
TF_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "0"}


@pytest.mark.cli
def test_keras_digits_reaches_95_percent():
    proc = run_horovodrun(["-np", "2", sys.executable, os.path.join(EXAMPLES, "keras_digits.py"), "--epochs", "8"],
                          timeout=150, env=TF_ENV)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    match = re.search(r"final test accuracy: ([0-9.]+)", proc.stdout)
    assert match, proc.stdout
    assert float(match.group(1)) >= 0.95, proc.stdout
    assert "training on 2 worker(s)" in proc.stdout


@pytest.mark.cli
def test_tensorflow2_synthetic_benchmark_reports_throughput():
    # VGG16: 32 variables to trace DistributedGradientTape and the broadcasts over (MobileNet's 137 plus its batch
    # norms' took two thirds of this test's 50-110 s tracing); at 32x32 its 38 M parameters cost 0.7 GB a rank.
    proc = run_horovodrun(["-np", "2", sys.executable, os.path.join(EXAMPLES, "tensorflow2_synthetic_benchmark.py"),
                           "--model", "VGG16", "--image-size", "32", "--batch-size", "4",
                           "--num-warmup-batches", "1", "--num-batches-per-iter", "1", "--num-iters", "2"],
                          timeout=150, env=TF_ENV)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"Total img/sec on 2 CPU\(s\): [0-9.]+", proc.stdout), proc.stdout
