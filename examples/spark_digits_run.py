"""Train a small PyTorch MLP on scikit-learn's 8x8 digits with ``horovod.spark.run``: one Horovod rank per Spark task.

    python examples/spark_digits_run.py                       # a local Spark cluster of 2 executors, 2 ranks
    python examples/spark_digits_run.py --master spark://host:7077 --num-proc 4

Each rank trains on its shard (``rank::size``) with Horovod's ``DistributedOptimizer``; rank 0's test accuracy comes
back to the driver with the other ranks' results, in rank order. Needs the spark extra and Java 17+
(``make sysdeps``); the executors' Python (``PYSPARK_PYTHON``, set here to this interpreter) must import horovod.
"""

import argparse
import os
import sys
import time


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--master", default="local-cluster[2,1,1024]", help="Spark master URL")
    parser.add_argument("--num-proc", type=int, default=2, help="Horovod ranks (Spark tasks)")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.01, help="per rank; scaled by the number of ranks")
    return parser.parse_args(argv)


def train(epochs, batch_size, lr):
    """Runs on every rank: returns (rank, size, test accuracy)."""
    import numpy as np
    import torch
    import torch.nn.functional as F
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    import horovod.torch as hvd

    hvd.init()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(x, digits.target, test_size=0.2, random_state=0,
                                                        stratify=digits.target)
    x_train = torch.from_numpy(x_train[hvd.rank()::hvd.size()])
    y_train = torch.from_numpy(y_train[hvd.rank()::hvd.size()]).long()
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=lr * hvd.size())
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    steps = len(x_train) // batch_size
    for epoch in range(epochs):
        order = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(epoch))
        for step in range(steps):
            index = order[step * batch_size:(step + 1) * batch_size]
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x_train[index]), y_train[index])
            loss.backward()
            optimizer.step()
        if hvd.rank() == 0:
            print(f"epoch {epoch + 1}: loss {loss.item():.4f}", flush=True)
    with torch.no_grad():
        accuracy = float((model(torch.from_numpy(x_test)).argmax(1).numpy() == y_test).mean())
    return hvd.rank(), hvd.size(), accuracy


def main(args):
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import horovod.spark

    spark = (SparkSession.builder.master(args.master).appName("horovod-spark-digits")
             .config("spark.ui.showConsoleProgress", "false").config("spark.log.level", "ERROR").getOrCreate())
    try:
        start = time.monotonic()
        results = horovod.spark.run(train, args=(args.epochs, args.batch_size, args.lr), num_proc=args.num_proc)
        for rank, size, accuracy in results:
            print(f"rank {rank} of {size}: test accuracy {accuracy:.4f}")
        print(f"horovod.spark.run took {time.monotonic() - start:.1f}s")
        return results
    finally:
        spark.stop()


if __name__ == "__main__":
    main(parse_args())
