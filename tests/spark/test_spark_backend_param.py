"""What Horovod's Spark MNIST examples rely on, without a Spark job: an estimator's ``backend`` (Horovod's
``SparkBackend``) against ``num_proc``, ``backward_passes_per_step`` in the torch training loop, the Keras
estimator's input shapes taken from the model, and ``inmemory_cache_all``'s reader cache."""

import numpy as np
import pytest

pytest.importorskip("pyspark", reason="the spark extra (pyspark) is not installed")

pytestmark = pytest.mark.unit


class FakeBackend:
    def __init__(self, size):
        self.size = size

    def num_processes(self):
        return self.size


def test_the_backend_gives_the_number_of_ranks_and_excludes_num_proc():
    pytest.importorskip("torch", reason="the torch extra is not installed")
    from horovod.spark.torch import TorchEstimator
    assert TorchEstimator(backend=FakeBackend(3))._num_proc() == 3
    with pytest.raises(ValueError, match='At most one of parameters "backend" and "num_proc"'):
        TorchEstimator(backend=FakeBackend(3), num_proc=2)._num_proc()
    estimator = TorchEstimator(backward_passes_per_step=4)
    assert estimator.getBackwardPassesPerStep() == 4 and estimator.getInMemoryCacheAll() is False
    assert estimator.setInMemoryCacheAll(True).getInmemoryCacheAll() is True


def test_backward_passes_per_step_accumulates_before_each_step(monkeypatch):
    torch = pytest.importorskip("torch", reason="the torch extra is not installed")
    from horovod.spark.torch import remote
    monkeypatch.setattr(remote.hvd, "allreduce", lambda tensor, **kwargs: tensor)
    calls = []

    class Optimizer:
        def zero_grad(self):
            calls.append("zero")

        def step(self):
            calls.append("step")

    class Reader:
        def batches(self, steps):
            for _ in range(steps):
                yield {"x": np.ones((4, 2)), "y": np.zeros(4)}

    model = torch.nn.Linear(2, 1)
    spec = {"feature_cols": ["x"], "label_cols": ["y"], "input_shapes": None, "backward_passes_per_step": 2}
    loss = lambda out, label: ((out.squeeze(1) - label) ** 2).mean()  # noqa: E731
    remote._train_epoch(model, Optimizer(), Reader(), 5, spec, [loss], [])
    # Batches 0-1 and 2-3 make a step each; the epoch's last, lone batch makes one too.
    assert calls == ["zero", "step", "zero", "step", "zero", "step"]


def test_keras_input_shapes_come_from_the_model_when_not_given():
    keras = pytest.importorskip("keras", reason="the tensorflow extra (Keras 3) is not installed")
    from horovod.spark.keras import KerasEstimator
    model = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(), keras.layers.Dense(10)])
    assert KerasEstimator(model=model)._input_shapes() == [[-1, 28, 28, 1]]
    assert KerasEstimator(model=model, input_shapes=[[-1, 784]])._input_shapes() == [[-1, 784]]


def test_the_reader_cache_reads_the_parquet_once(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from horovod.spark.common.data import ShardReader
    from horovod.spark.common.store import Store
    store = Store.create(str(tmp_path))
    folder = tmp_path / "data"
    folder.mkdir()
    pq.write_table(pa.table({"x": np.arange(10.0)}), folder / "part-0.parquet")
    reader = ShardReader(store, str(folder), ["x"], 0, 1, batch_size=5, shuffle=False, cache=True)
    first = [b["x"].tolist() for b in reader.batches(2)]
    (folder / "part-0.parquet").unlink()  # a second pass reads from memory only
    assert [b["x"].tolist() for b in reader.batches(2)] == first == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    assert [b["x"].tolist() for b in reader.all_rows()] == first
