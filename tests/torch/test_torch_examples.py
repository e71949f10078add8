"""The torch examples end to end: the demo job under the real horovodrun reaches >= 95% test accuracy and writes
its checkpoint; the synthetic benchmark reports images/sec; horovod.run starts the same training from Python."""

import os
import re
import subprocess
import sys

import pytest

from horovod.runner.launch import package_pythonpath
from horovod.testing.fixtures import run_horovodrun

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(ROOT, "examples")


@pytest.mark.cli
def test_digits_demo_reaches_95_percent_and_checkpoints(tmp_path):
    checkpoint = tmp_path / "ck" / "digits.pt"
    proc = run_horovodrun(["-np", "2", sys.executable, os.path.join(EXAMPLES, "pytorch_digits.py"),
                           "--checkpoint", str(checkpoint)], timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    accuracy = float(re.search(r"final test accuracy: ([\d.]+)%", proc.stdout).group(1))
    assert accuracy >= 95.0, proc.stdout
    assert proc.stdout.count("epoch ") == 12 and "[1]<stdout>:epoch" not in proc.stdout   # rank 0 prints
    assert checkpoint.exists()


@pytest.mark.cli
def test_synthetic_benchmark_reports_throughput():
    proc = run_horovodrun(["-np", "2", sys.executable, os.path.join(EXAMPLES, "pytorch_synthetic_benchmark.py"),
                           "--num-iters", "2", "--num-batches-per-iter", "2", "--num-warmup-batches", "1",
                           "--batch-size", "8", "--fp16-allreduce"], timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert re.search(r"Img/sec per CPU: [\d.]+", proc.stdout)
    assert re.search(r"Total img/sec on 2 CPU\(s\): [\d.]+", proc.stdout)


@pytest.mark.cli
def test_run_api_example(tmp_path):
    env = {**os.environ, **package_pythonpath()}
    proc = subprocess.run([sys.executable, os.path.join(EXAMPLES, "pytorch_run_api.py"), "--np", "2", "--epochs",
                           "2", "--checkpoint", str(tmp_path / "run.pt")], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert re.search(r"test accuracy by rank: [\d.]+%, [\d.]+%", proc.stdout), proc.stdout


@pytest.mark.unit
def test_digits_example_without_scikit_learn_names_it_and_the_extra():
    blocked = ("import runpy, sys; sys.modules['sklearn'] = None; sys.argv = ['x']; "
               f"runpy.run_path({os.path.join(EXAMPLES, 'pytorch_digits.py')!r}, run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", blocked], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "needs scikit-learn: pip install scikit-learn" in proc.stderr and "'.[examples]'" in proc.stderr
