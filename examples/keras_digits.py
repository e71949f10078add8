"""Train a small Keras 3 CNN on scikit-learn's bundled 8x8 digits with Horovod, on CPU, offline.

    horovodrun -np 2 python examples/keras_digits.py
    python examples/keras_digits.py                              # a single worker works too

Each worker fits on its shard of the training set with ``model.fit``; the wrapped optimizer averages the gradients,
the callbacks broadcast rank 0's initial weights, warm the learning rate up and average the metrics; rank 0 prints
the final test accuracy (the same on every worker).
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
try:  # the data set and its split come from scikit-learn, the 'examples' extra
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
except ImportError as missing:
    raise SystemExit(f"{os.path.basename(__file__)}: {missing}; this example needs scikit-learn: pip install "
                     f"scikit-learn, or in a checkout horovod-py's extras: "
                     f"pip install -e '.[tensorflow,examples]'") from None

import horovod.tensorflow.keras as hvd  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32, help="per worker")
    parser.add_argument("--lr", type=float, default=0.02, help="per worker; scaled by the number of workers")
    parser.add_argument("--warmup-epochs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--fp16-allreduce", action="store_true", help="compress gradients to float16")
    return parser.parse_args(argv)


def build_model():
    return keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ])


def train(args):
    """Fit, evaluate and return the test accuracy (averaged over the workers' test shards)."""
    hvd.init()
    threads = max(1, (os.cpu_count() or 1) // hvd.local_size())
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    keras.utils.set_random_seed(args.seed + hvd.rank())   # different initial weights until the broadcast

    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[..., None]
    x_train, x_test, y_train, y_test = train_test_split(images, digits.target, test_size=0.2,
                                                        random_state=args.seed, stratify=digits.target)
    x_train, y_train = x_train[hvd.rank()::hvd.size()], y_train[hvd.rank()::hvd.size()]
    x_test, y_test = x_test[hvd.rank()::hvd.size()], y_test[hvd.rank()::hvd.size()]

    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(args.lr * hvd.size(), momentum=0.9),
                                         compression=compression)
    model = build_model()
    model.compile(optimizer=optimizer, metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(args.lr * hvd.size(), warmup_epochs=args.warmup_epochs,
                                                 verbose=1 if hvd.rank() == 0 else 0),
    ]
    if hvd.rank() == 0:
        print(f"training on {hvd.size()} worker(s), {len(x_train)} images each", flush=True)
    model.fit(x_train, y_train, batch_size=args.batch_size, epochs=args.epochs, callbacks=callbacks,
              verbose=2 if hvd.rank() == 0 else 0)
    _, accuracy = model.evaluate(x_test, y_test, verbose=0)
    accuracy = float(hvd.allreduce(accuracy, name="test_accuracy"))
    if hvd.rank() == 0:
        print(f"final test accuracy: {accuracy:.4f}", flush=True)
    hvd.shutdown()
    return accuracy


if __name__ == "__main__":
    train(parse_args())
