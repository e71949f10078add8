"""TorchEstimator and KerasEstimator on a real local Spark cluster: fit on a DataFrame of the digits on 2 ranks,
transform held-out rows with >= 95 % accuracy, save and load the model; the store and the data reader."""

import numpy as np
import pytest

from spark_helpers import bounded

pytestmark = pytest.mark.ranks


@pytest.fixture(scope="module")
def digits(spark):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    data = load_digits()
    x = (data.data / 16.0).astype(float)
    x_train, x_test, y_train, y_test = train_test_split(x, data.target, test_size=0.2, random_state=0,
                                                        stratify=data.target)
    as_df = lambda xs, ys: spark.createDataFrame(  # noqa: E731
        [(row.tolist(), int(y)) for row, y in zip(xs, ys)], "features array<double>, label long")
    # The held-out rows in one partition: every Python worker that runs a partition's inference imports the
    # framework (TensorFlow: about 3 CPU-s, several times that on the loaded machine), and a second one would cost
    # that again for the same check.
    return as_df(x_train, y_train), as_df(x_test, y_test).coalesce(1)


def predictions(spark, model, test_df):
    """The model's outputs for the held-out rows, with their labels, computed once (each action on a transformed
    DataFrame runs the inference again)."""
    return bounded(spark, lambda: model.transform(test_df).select("label", "label__output").toPandas(), 300)


def accuracy(frame) -> float:
    guesses = np.array([np.argmax(v) for v in frame["label__output"]])
    return float((guesses == frame["label"].to_numpy()).mean())


@pytest.mark.slow
def test_torch_estimator_fits_transforms_and_round_trips(spark, digits, tmp_path):
    import torch
    import torch.nn.functional as F
    from horovod.spark.common.store import Store
    from horovod.spark.torch import TorchEstimator, TorchModel
    train_df, test_df = digits
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    estimator = TorchEstimator(num_proc=2, model=net, optimizer=torch.optim.Adam(net.parameters(), lr=0.01),
                               loss=F.cross_entropy, store=Store.create(str(tmp_path / "store")),
                               feature_cols=["features"], label_cols=["label"], input_shapes=[[-1, 64]],
                               batch_size=32, epochs=10, validation=0.1, random_seed=1, start_timeout=120)
    model = bounded(spark, lambda: estimator.fit(train_df), 900)
    history = model.getHistory()
    assert len(history["train"]["loss"]) == 10 and len(history["validation"]["loss"]) == 10
    assert history["train"]["loss"][-1] < history["train"]["loss"][0]
    assert estimator.getStore().exists(estimator.getStore().get_checkpoint_path(model.getOrDefault("run_id")))
    assert set(test_df.columns) < set(model.transform(test_df).columns)
    first = predictions(spark, model, test_df)
    assert accuracy(first) >= 0.95
    model.save(str(tmp_path / "model"))
    loaded = TorchModel.load(str(tmp_path / "model"))
    assert loaded.getHistory() == history
    again = predictions(spark, loaded, test_df)
    np.testing.assert_allclose(np.stack(again["label__output"]), np.stack(first["label__output"]), rtol=1e-5)


@pytest.mark.slow
def test_keras_estimator_fits_transforms_and_round_trips(spark, digits, tmp_path):
    import keras
    from horovod.spark.common.store import Store
    from horovod.spark.keras import KerasEstimator, KerasModel
    train_df, test_df = digits
    keras.utils.set_random_seed(0)
    net = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"),
                            keras.layers.Dense(10, activation="softmax")])
    estimator = KerasEstimator(num_proc=2, model=net, optimizer=keras.optimizers.Adam(0.01),
                               loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                               store=Store.create(str(tmp_path / "store")), feature_cols=["features"],
                               label_cols=["label"], batch_size=32, epochs=10, validation=0.1, random_seed=1,
                               start_timeout=120, verbose=0)
    model = bounded(spark, lambda: estimator.fit(train_df), 900)
    history = model.getHistory()
    assert len(history["loss"]) == 10 and len(history["val_loss"]) == 10
    assert history["loss"][-1] < history["loss"][0]
    first = predictions(spark, model, test_df)
    assert accuracy(first) >= 0.95
    model.save(str(tmp_path / "model"))
    loaded = KerasModel.load(str(tmp_path / "model"))
    assert loaded.getHistory() == history
    again = predictions(spark, loaded, test_df)
    np.testing.assert_allclose(np.stack(again["label__output"]), np.stack(first["label__output"]), rtol=1e-5)


def test_shard_reader_gives_every_rank_the_same_number_of_disjoint_batches(spark, tmp_path):
    from horovod.spark.common.data import ShardReader, prepare_data
    from horovod.spark.common.store import Store
    store = Store.create(str(tmp_path / "store"))
    df = spark.createDataFrame([(float(i), [float(i), -float(i)]) for i in range(100)], "x double, v array<double>")
    info = bounded(spark, lambda: prepare_data(df, store, ["x", "v"], validation=None, num_partitions=6,
                                               dataset_idx="t"), 120)
    assert info.train_rows == 100 and info.val_path is None
    seen = []
    for rank in range(2):
        reader = ShardReader(store, info.train_path, ["x", "v"], rank, 2, batch_size=10, seed=3)
        batches = list(reader.batches(4))
        assert len(batches) == 4 and all(b["v"].shape == (10, 2) for b in batches)
        np.testing.assert_array_equal(batches[0]["v"][:, 0], batches[0]["x"])
        seen.append({float(x) for x in np.concatenate([b["x"] for b in reader.all_rows()])})
    assert not seen[0] & seen[1] and len(seen[0] | seen[1]) == 100


@pytest.mark.unit
def test_store_layout_and_hdfs_without_a_client(tmp_path):
    from horovod.spark.common.store import HDFSStore, LocalStore, Store, StoreError
    store = Store.create(str(tmp_path / "s"))
    assert isinstance(store, LocalStore)
    assert store.get_checkpoint_path("r1") == str(tmp_path / "s" / "runs" / "r1" / "checkpoint")
    assert store.get_full_path(store.get_train_data_path(3)).startswith("file://")
    store.write_text(store.get_logs_path("r1") + "/note", "hi")
    assert store.read(store.get_logs_path("r1") + "/note") == b"hi"
    with pytest.raises(StoreError, match="HDFSStore needs an HDFS client"):
        Store.create("hdfs://namenode.invalid:8020/x")
    assert issubclass(HDFSStore, Store)
