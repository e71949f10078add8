"""The asynchronous examples under the real horovodrun (tier: cli): every mode reaches 95 % on digits at two
workers, and every mode goes on through a killed worker of an elastic job with the same parameters on every rank."""

import os
import re
import sys

import pytest

from horovod.testing.fixtures import run_horovodrun

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")


@pytest.mark.cli
def test_every_mode_reaches_95_percent_on_digits_with_two_workers():
    result = run_horovodrun(["-np", "2", sys.executable, os.path.join(EXAMPLES, "pytorch_async_digits.py"),
                             "--mode", "all"], timeout=400)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-5000:]
    finals = dict(re.findall(r"(\w+): final test accuracy ([\d.]+)% on 2 worker", log))
    assert sorted(finals) == sorted(["sync", "localsgd", "outer", "stale", "gossip"]), log[-3000:]
    assert all(float(v) >= 95.0 for v in finals.values()), finals


@pytest.mark.cli
def test_every_mode_survives_a_killed_worker_under_elastic():
    result = run_horovodrun(["-np", "3", "--min-np", "1", "-H", "127.0.0.1:1,127.0.0.2:1,127.0.0.3:1",
                             sys.executable, os.path.join(EXAMPLES, "pytorch_async_elastic.py"),
                             "--crash-host", "127.0.0.3"], timeout=240)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-5000:]
    assert "worker 127.0.0.3:0 ended with signal SIGKILL" in log
    assert re.search(r"after reset 1: 2 worker\(s\) at step \d+; parameters identical on every rank", log), log[-3000:]
    finals = re.findall(r"rank (\d) of 2: final accuracy .*; checksums ([-\d. ]+); ranks agree: True", log)
    assert sorted(r for r, _ in finals) == ["0", "1"] and len({c for _, c in finals}) == 1, log[-3000:]
