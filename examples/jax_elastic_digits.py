"""Elastic training in plain JAX + optax on scikit-learn's 8x8 digits: workers may die or join, training goes on.

    horovodrun -np 2 --min-np 1 --max-np 3 --host-discovery-script ./discover.sh \\
        python examples/jax_elastic_digits.py
    horovodrun -np 2 --min-np 1 -H 127.0.0.1:1,127.0.0.2:1 \\
        python examples/jax_elastic_digits.py --crash-host 127.0.0.2 --crash-epoch 1

(``discover.sh`` prints one ``host`` or ``host:slots`` per line; addresses of this machine such as ``127.0.0.2``
act as separate hosts.) The state (parameters, optimizer state, sampler position, epoch) is a ``hvd.elastic.JaxState``
committed every few batches; a worker that dies costs at most the batches since the last commit, a joining worker
receives the state before it trains. The learning rate lives in the optimizer state (``optax.inject_hyperparams``)
so a reset can scale it with the new number of workers. ``--crash-host`` kills the worker on that host mid-epoch
once, to watch the job go on without it.
"""

import argparse
import os
import signal

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
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=32, help="per worker")
    parser.add_argument("--lr", type=float, default=0.05, help="per worker; scaled by the number of workers")
    parser.add_argument("--batches-per-commit", type=int, default=5)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--crash-host", help="the worker on this host kills itself once, mid-epoch")
    parser.add_argument("--crash-epoch", type=int, default=1)
    return parser.parse_args(argv)


def init_params(key, sizes=(64, 64, 10)):
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
    images = (digits.images / 16.0).reshape(len(digits.images), -1).astype(np.float32)
    return train_test_split(images, digits.target.astype(np.int32), test_size=0.2, random_state=seed,
                            stratify=digits.target)


def accuracy(params, x, y):
    """Accuracy on the whole test set, computed by every worker (it is small)."""
    return float((predict(params, x).argmax(1) == y).mean())


def main(args):
    hvd.init()
    x_train, x_test, y_train, y_test = datasets(args.seed)
    optimizer = hvd.DistributedOptimizer(optax.inject_hyperparams(optax.sgd)(learning_rate=args.lr * hvd.size(),
                                                                             momentum=0.9))
    params = init_params(jax.random.PRNGKey(args.seed))
    sampler = hvd.elastic.ElasticSampler(len(x_train), shuffle=True, seed=args.seed)
    state = hvd.elastic.JaxState(params=params, opt_state=optimizer.init(params), sampler=sampler, epoch=0,
                                 batch=0)

    @jax.jit
    def step(params, opt_state, x, y):
        grads = jax.grad(loss_fn)(params, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    def on_reset():
        # A new membership: scale the learning rate with the number of workers, as when the job started.
        state.opt_state.hyperparams["learning_rate"] = jnp.asarray(args.lr * hvd.size(), jnp.float32)
        if hvd.rank() == 0:
            print(f"reset: now {hvd.size()} worker(s); resuming epoch {state.epoch + 1} at sample "
                  f"{sampler.processed_num}", flush=True)
    state.register_reset_callbacks([on_reset])

    @hvd.elastic.run
    def train(state):
        crash = args.crash_host == os.environ.get("HOROVOD_HOSTNAME")
        while state.epoch < args.epochs:
            indices = sampler.indices()
            for start in range(0, len(indices) - args.batch_size + 1, args.batch_size):
                if crash and state.epoch == args.crash_epoch and state.batch == 3:
                    os.kill(os.getpid(), signal.SIGKILL)  # a worker dies mid-epoch
                batch = indices[start:start + args.batch_size]
                state.params, state.opt_state = step(state.params, state.opt_state, x_train[batch], y_train[batch])
                sampler.record_batch(state.batch, args.batch_size)
                state.batch += 1
                if state.batch % args.batches_per_commit == 0:
                    state.commit()
            if hvd.rank() == 0:
                print(f"epoch {state.epoch + 1}/{args.epochs} on {hvd.size()} worker(s): "
                      f"test accuracy {100 * accuracy(state.params, x_test, y_test):.2f}%", flush=True)
            state.epoch += 1
            state.batch = 0
            sampler.set_epoch(state.epoch)
            state.commit()
        return accuracy(state.params, x_test, y_test)

    final = train(state)
    checksum = float(sum(np.asarray(leaf, np.float64).sum() for leaf in jax.tree_util.tree_leaves(state.params)))
    print(f"final test accuracy: {100 * final:.2f}% on rank {hvd.rank()} of {hvd.size()}; "
          f"parameter checksum {checksum:.10f}", flush=True)


if __name__ == "__main__":
    main(parse_args())
