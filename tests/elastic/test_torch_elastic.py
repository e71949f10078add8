"""examples/pytorch_elastic_digits.py through a worker's death (tier: cli), and TorchState on its own (unit)."""

import os
import re
import sys

import pytest

from horovod.testing.fixtures import run_horovodrun

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "pytorch_elastic_digits.py")


@pytest.mark.cli
def test_example_trains_through_a_killed_worker():
    result = run_horovodrun(["-np", "3", "--min-np", "1", "-H", "127.0.0.1:1,127.0.0.2:1,127.0.0.3:1",
                             sys.executable, EXAMPLE, "--epochs", "2", "--crash-host", "127.0.0.3"], timeout=120)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-5000:]
    assert "worker 127.0.0.3:0 ended with signal SIGKILL" in log and "round 2: 2 worker(s)" in log
    finals = re.findall(r"final test accuracy: ([\d.]+)% on rank (\d) of (\d); parameter checksum (\S+)", log)
    assert sorted(f[1:3] for f in finals) == [("0", "2"), ("1", "2")], log[-3000:]
    assert len({f[3] for f in finals}) == 1, "the survivors' parameters differ"
    assert float(finals[0][0]) > 50.0


@pytest.mark.unit
def test_torch_state_commit_restore_and_reset_callbacks():
    import torch

    import horovod.torch as hvd
    hvd.init()
    try:
        model = torch.nn.Linear(3, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        sampler = hvd.elastic.ElasticSampler(list(range(10)), seed=3)
        state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, history=[])
        model(torch.ones(1, 3)).sum().backward()
        optimizer.step()
        sampler.record_batch(0, 4)
        state.epoch, committed = 1, model.weight.detach().clone()
        state.history.append(1)
        state.commit()
        model(torch.ones(1, 3)).sum().backward()
        optimizer.step()
        sampler.record_batch(1, 4)
        state.epoch = 2
        state.history.append(2)
        state.restore()
        assert torch.equal(model.weight, committed)
        assert state.epoch == 1 and state.history == [1] and sampler.processed_num == 4
        assert list(sampler) == sampler.indices() and len(list(sampler)) == 6
        assert state.model is model and state.optimizer is optimizer and state.sampler is sampler
        calls = []
        state.register_reset_callbacks([lambda: calls.append(hvd.size())])
        state.on_reset()
        assert calls == [1]
        state.sync()
        assert state.history == [1]
    finally:
        hvd.shutdown()
