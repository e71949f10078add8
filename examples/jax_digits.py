"""Train a small network in plain JAX + optax on scikit-learn's bundled 8x8 digits with Horovod, on CPU, offline.

    horovodrun -np 2 python examples/jax_digits.py
    python examples/jax_digits.py                                # a single worker works too

Each worker trains on its shard of the training set with one jitted step (forward, backward, gradient averaging
through ``hvd.DistributedOptimizer``, update); rank 0 prints one line per epoch (metrics averaged over all
workers), saves a checkpoint, and prints the final test accuracy.
"""

import argparse
import os
import pickle
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
try:  # the data set and its split come from scikit-learn, the 'examples' extra
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
except ImportError as missing:
    raise SystemExit(f"{os.path.basename(__file__)}: {missing}; this example needs scikit-learn: pip install "
                     f"scikit-learn, or in a checkout horovod-py's extras: pip install -e '.[jax,examples]'") from None

import horovod.jax as hvd


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=32, help="per worker")
    parser.add_argument("--lr", type=float, default=0.05, help="per worker; scaled by the number of workers")
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--fp16-allreduce", action="store_true", help="compress gradients to float16")
    parser.add_argument("--checkpoint", default=os.path.join(".", "checkpoints", "jax_digits.pkl"),
                        help="written by rank 0 after every epoch")
    return parser.parse_args(argv)


def init_params(key, sizes=(64, 128, 64, 10)):
    """A multilayer perceptron: a list of {"w", "b"} per layer."""
    params = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        key, sub = jax.random.split(key)
        params.append({"w": jax.random.normal(sub, (fan_in, fan_out)) * jnp.sqrt(2.0 / fan_in),
                       "b": jnp.zeros(fan_out)})
    return params


def predict(params, x):
    for layer in params[:-1]:
        x = jax.nn.relu(x @ layer["w"] + layer["b"])
    return x @ params[-1]["w"] + params[-1]["b"]


def loss_fn(params, x, y):
    return optax.softmax_cross_entropy_with_integer_labels(predict(params, x), y).mean()


def datasets(seed):
    digits = load_digits()
    images = (digits.images / 16.0).reshape(len(digits.images), -1).astype(np.float32)   # N x 64 in [0, 1]
    return train_test_split(images, digits.target.astype(np.int32), test_size=0.2, random_state=seed,
                            stratify=digits.target)


def evaluate(params, x, y):
    """Loss and accuracy over the whole test set: each worker scores its shard, the sums are allreduced."""
    x, y = x[hvd.rank()::hvd.size()], y[hvd.rank()::hvd.size()]
    logits = predict(params, x)
    loss = float(optax.softmax_cross_entropy_with_integer_labels(logits, y).sum())
    correct = float((logits.argmax(1) == y).sum())
    totals = hvd.allreduce(jnp.asarray([loss, correct, len(y)], jnp.float32), op=hvd.Sum, name="eval")
    return float(totals[0] / totals[2]), float(totals[1] / totals[2])


def train(args):
    """Train and return the final test accuracy (the same on every worker)."""
    hvd.init()
    x_train, x_test, y_train, y_test = datasets(args.seed)
    params = hvd.broadcast_parameters(init_params(jax.random.PRNGKey(args.seed + hvd.rank())), root_rank=0)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optax.sgd(args.lr * hvd.size(), momentum=args.momentum),
                                         compression=compression)
    opt_state = optimizer.init(params)

    @jax.jit
    def step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    per_step = args.batch_size * hvd.size()
    steps = len(x_train) // per_step          # every worker runs the same number of equal batches
    if hvd.rank() == 0:
        print(f"training on {hvd.size()} worker(s), {steps} steps of {args.batch_size} images each per epoch",
              flush=True)
    accuracy = 0.0
    for epoch in range(args.epochs):
        started = time.time()
        order = np.random.RandomState(args.seed + epoch).permutation(len(x_train))[:steps * per_step]
        mine = order[hvd.rank()::hvd.size()].reshape(steps, args.batch_size)
        total = 0.0
        for batch in mine:
            params, opt_state, loss = step(params, opt_state, x_train[batch], y_train[batch])
            total += float(loss)
        train_loss = float(hvd.allreduce(jnp.float32(total / steps), name="train_loss"))
        test_loss, accuracy = evaluate(params, x_test, y_test)
        if hvd.rank() == 0:
            print(f"epoch {epoch + 1:2d}/{args.epochs}  train loss {train_loss:.4f}  test loss {test_loss:.4f}  "
                  f"test accuracy {100 * accuracy:5.2f}%  ({time.time() - started:.1f}s)", flush=True)
            os.makedirs(os.path.dirname(os.path.abspath(args.checkpoint)), exist_ok=True)
            with open(args.checkpoint, "wb") as handle:
                pickle.dump({"params": jax.device_get(params), "epoch": epoch + 1}, handle)
    if hvd.rank() == 0:
        print(f"final test accuracy: {100 * accuracy:.2f}%  (checkpoint: {args.checkpoint})", flush=True)
    hvd.shutdown()
    return accuracy


if __name__ == "__main__":
    train(parse_args())
