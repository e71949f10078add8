"""HorovodTrainer on Ray Train: fit() on 2 workers returns a Result with reported metrics and a checkpoint (tier
ranks)."""

import json
import os
import tempfile

import numpy as np
import pytest

from ray_clusters import local_ray

ray = pytest.importorskip("ray")
pytest.importorskip("ray.train")
from horovod.ray import HorovodConfig, HorovodTrainer  # noqa: E402

pytestmark = pytest.mark.ranks


@pytest.fixture(scope="module", autouse=True)
def cluster():
    with local_ray(3):
        yield


def train_loop(config):
    import horovod.numpy as hvd
    import ray.train
    hvd.init()
    context = ray.train.get_context()
    assert hvd.rank() == context.get_world_rank() and hvd.size() == context.get_world_size() == 2
    assert hvd.local_rank() == context.get_local_rank()
    weights = np.zeros(3)
    for epoch in range(config["epochs"]):
        grad = hvd.allreduce(np.full(3, float(hvd.rank() + 1)))       # average of 1 and 2
        weights = weights - config["lr"] * grad
        checkpoint = None
        with tempfile.TemporaryDirectory() as folder:
            if hvd.rank() == 0:
                with open(os.path.join(folder, "weights.json"), "w") as handle:
                    json.dump(weights.tolist(), handle)
                checkpoint = ray.train.Checkpoint.from_directory(folder)
            ray.train.report({"epoch": epoch, "loss": float(np.abs(weights).sum()), "size": hvd.size(),
                              "rank": hvd.rank()}, checkpoint=checkpoint)


def test_fit_on_two_workers_returns_metrics_and_checkpoint(tmp_path):
    trainer = HorovodTrainer(train_loop, train_loop_config={"epochs": 3, "lr": 0.1},
                             horovod_config=HorovodConfig(timeout_s=60),
                             scaling_config=ray.train.ScalingConfig(num_workers=2),
                             run_config=ray.train.RunConfig(name="hvd", storage_path=str(tmp_path)))
    result = trainer.fit()
    assert result.error is None
    assert result.metrics["epoch"] == 2 and result.metrics["size"] == 2 and result.metrics["rank"] == 0
    assert result.metrics["loss"] == pytest.approx(3 * 3 * 0.1 * 1.5)
    assert result.checkpoint is not None
    with result.checkpoint.as_directory() as folder:
        with open(os.path.join(folder, "weights.json")) as handle:
            assert handle.read() and json.loads(open(os.path.join(folder, "weights.json")).read()) == \
                pytest.approx([-0.45] * 3)
