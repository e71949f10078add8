"""Elastic Keras 3 training on scikit-learn's 8x8 digits: workers may die or join, ``model.fit`` goes on.

    horovodrun -np 2 --min-np 1 -H 127.0.0.1:1,127.0.0.2:1 \\
        python examples/keras_elastic_digits.py --crash-host 127.0.0.2 --crash-epoch 1

(Addresses of this machine such as ``127.0.0.2`` act as separate hosts.) ``KerasState`` holds the model, the
optimizer and the epoch/batch counters; ``CommitStateCallback`` commits every few batches, so a worker that dies
costs at most the batches since the last commit. ``--crash-host`` kills the worker on that host mid-epoch once.
"""

import argparse
import os
import signal

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
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=32, help="per worker")
    parser.add_argument("--lr", type=float, default=0.02, help="per worker; scaled by the number of workers")
    parser.add_argument("--batches-per-commit", type=int, default=4)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--crash-host", help="the worker on this host kills itself once, mid-epoch")
    parser.add_argument("--crash-epoch", type=int, default=1)
    return parser.parse_args(argv)


def build_model():
    return keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ])


class CrashOnce(keras.callbacks.Callback):
    """Kill this worker at batch 3 of ``epoch`` (counted across resets through the state)."""

    def __init__(self, state, epoch):
        super().__init__()
        self.state, self.epoch = state, epoch

    def on_train_batch_begin(self, batch, logs=None):
        if self.state.epoch == self.epoch and batch == 3:
            os.kill(os.getpid(), signal.SIGKILL)


def main(args):
    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    keras.utils.set_random_seed(args.seed)
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[..., None]
    x_train, x_test, y_train, y_test = train_test_split(images, digits.target, test_size=0.2,
                                                        random_state=args.seed, stratify=digits.target)
    model = build_model()
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(args.lr * hvd.size(), momentum=0.9))
    model.compile(optimizer=optimizer, metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    state = hvd.elastic.KerasState(model, epoch=0, batch=0)

    def on_reset():
        # A new membership: scale the learning rate with the number of workers, as when the job started.
        model.optimizer.learning_rate.assign(args.lr * hvd.size())
        if hvd.rank() == 0:
            print(f"reset: now {hvd.size()} worker(s); resuming at epoch {state.epoch + 1}", flush=True)
    state.register_reset_callbacks([on_reset])

    def evaluate():
        _, accuracy = model.evaluate(x_test[hvd.rank()::hvd.size()], y_test[hvd.rank()::hvd.size()], verbose=0)
        return float(hvd.allreduce(accuracy, name="test_accuracy"))

    @hvd.elastic.run
    def train(state):
        callbacks = [hvd.callbacks.MetricAverageCallback(),
                     hvd.elastic.UpdateEpochStateCallback(state),
                     hvd.elastic.UpdateBatchStateCallback(state),
                     hvd.elastic.CommitStateCallback(state, batches_per_commit=args.batches_per_commit)]
        if args.crash_host == os.environ.get("HOROVOD_HOSTNAME"):
            callbacks.append(CrashOnce(state, args.crash_epoch))
        history = model.fit(x_train[hvd.rank()::hvd.size()], y_train[hvd.rank()::hvd.size()],
                            batch_size=args.batch_size, epochs=args.epochs - state.epoch, callbacks=callbacks,
                            verbose=0)
        if hvd.rank() == 0:
            print(f"fit finished on {hvd.size()} worker(s): train accuracy {history.history['accuracy'][-1]:.4f}",
                  flush=True)
        return evaluate()

    accuracy = train(state)
    checksum = float(sum(np.sum(v.numpy().astype(np.float64)) for v in model.variables))
    print(f"final test accuracy: {100 * accuracy:.2f}% on rank {hvd.rank()} of {hvd.size()}; "
          f"weight checksum {checksum:.10f}", flush=True)


if __name__ == "__main__":
    main(parse_args())
