"""Fit a PyTorch MLP to a Spark DataFrame of the 8x8 digits with ``TorchEstimator``, then ``transform`` held-out rows.

    python examples/spark_digits_estimator.py                 # a local Spark cluster of 2 executors, 2 ranks
    python examples/spark_digits_estimator.py --store /shared/path --master spark://host:7077

``fit`` writes the DataFrame to Parquet in the store, trains on ``--num-proc`` Horovod ranks (each reads its shard),
checkpoints to the store, and returns a ``TorchModel``: a Spark ML Transformer whose ``transform`` adds
``label__output`` (the 10 logits). The script prints the held-out accuracy and saves and reloads the model.
"""

import argparse
import os
import sys
import tempfile


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--master", default="local-cluster[2,1,1024]", help="Spark master URL")
    parser.add_argument("--num-proc", type=int, default=2, help="Horovod ranks (Spark tasks)")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--store", default=None, help="the store's folder (default: a temporary one)")
    return parser.parse_args(argv)


def digits_frames(spark):
    """Training and held-out DataFrames: ``features`` (64 doubles) and ``label`` (0-9)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    digits = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(digits.data / 16.0, digits.target, test_size=0.2,
                                                        random_state=0, stratify=digits.target)
    schema = "features array<double>, label long"
    return (spark.createDataFrame([(r.tolist(), int(y)) for r, y in zip(x_train, y_train)], schema),
            spark.createDataFrame([(r.tolist(), int(y)) for r, y in zip(x_test, y_test)], schema))


def main(args):
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    import numpy as np
    import torch
    import torch.nn.functional as F
    from pyspark.sql import SparkSession

    from horovod.spark.common.store import Store
    from horovod.spark.torch import TorchEstimator, TorchModel

    spark = (SparkSession.builder.master(args.master).appName("horovod-spark-estimator")
             .config("spark.ui.showConsoleProgress", "false").config("spark.log.level", "ERROR").getOrCreate())
    folder = args.store or tempfile.mkdtemp(prefix="horovod-store-")
    try:
        train_df, test_df = digits_frames(spark)
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
        estimator = TorchEstimator(num_proc=args.num_proc, model=net,
                                   optimizer=torch.optim.Adam(net.parameters(), lr=0.01), loss=F.cross_entropy,
                                   store=Store.create(folder), feature_cols=["features"], label_cols=["label"],
                                   input_shapes=[[-1, 64]], batch_size=args.batch_size, epochs=args.epochs,
                                   validation=0.1)
        model = estimator.fit(train_df)
        print("validation loss by epoch:", [round(v, 4) for v in model.getHistory()["validation"]["loss"]])
        predictions = model.transform(test_df).select("label", "label__output").toPandas()
        guesses = np.array([np.argmax(v) for v in predictions["label__output"]])
        accuracy = float((guesses == predictions["label"].to_numpy()).mean())
        print(f"held-out accuracy: {accuracy:.4f}")
        model.save(os.path.join(folder, "digits-model"))
        reloaded = TorchModel.load(os.path.join(folder, "digits-model"))
        print("reloaded model's history matches:", reloaded.getHistory() == model.getHistory())
        return accuracy
    finally:
        spark.stop()


if __name__ == "__main__":
    main(parse_args())
