"""The asynchronous Keras 3 optimizers on 3 spawned ranks (one job runs every check; the schedules themselves run at
2 and 3 ranks in test_async_torch.py).

Eager steps (``apply_gradients``): LocalSGD and the outer optimizer leave every rank with the same bits after each
averaging and differ between; ``DistributedOptimizer(staleness=1)`` equals a single-process reference applying the
previous step's average (1e-6); gossip partners hold the same bits after an exchange. ``model.fit`` (a traced step)
runs every mode, and ``synchronize()`` then makes the ranks agree.
"""

import numpy as np
import pytest

from horovod.testing import spawn_ranks


def make_model(keras, seed=0):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(3)])
    return model


def batch(step, rank):
    rng = np.random.default_rng(1000 * step + rank)
    return rng.standard_normal((4, 5)).astype(np.float32), rng.standard_normal((4, 3)).astype(np.float32)


def flat(model):
    return np.concatenate([np.asarray(w).reshape(-1) for w in model.get_weights()])


def identical(hvd, model):
    rows = hvd.allgather(flat(model)[None])
    return all(np.array_equal(rows[0].view(np.uint32), r.view(np.uint32)) for r in rows[1:])


def gradients(tf, model, step, rank):
    x, y = batch(step, rank)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((model(x) - y) ** 2)
    return tape.gradient(loss, model.trainable_variables)


def eager_steps(tf, hvd, model, opt, steps):
    out = []
    for step in range(steps):
        opt.apply_gradients(zip(gradients(tf, model, step, hvd.rank()), model.trainable_variables))
        out.append((opt.averaged, identical(hvd, model)))
    return out


def check_local_sgd_and_outer(tf, keras, hvd):
    model = make_model(keras)
    opt = hvd.LocalSGDOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), period=3, warmup_steps=1)
    rows = eager_steps(tf, hvd, model, opt, 8)
    # warm-up step 1; submissions after steps 4 and 7, applied after steps 5 and 8
    assert [a for a, _ in rows] == [False] * 4 + [True, False, False, True], rows
    assert rows[0][1] and all(s for a, s in rows if a) and not rows[2][1], rows
    model = make_model(keras)
    opt = hvd.OuterOptimizer(keras.optimizers.Adam(0.01), period=2, compression=hvd.Compression.fp16)
    rows = eager_steps(tf, hvd, model, opt, 4)
    assert [a for a, _ in rows] == [False, True, False, True] and rows[1][1] and rows[3][1] and not rows[0][1]


def check_stale(tf, keras, hvd):
    model, ref = make_model(keras), make_model(keras)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), staleness=1)
    ref_opt = keras.optimizers.SGD(0.1, momentum=0.9)
    previous = None
    for step in range(5):
        opt.apply_gradients(zip(gradients(tf, model, step, hvd.rank()), model.trainable_variables))
        grads = [gradients(tf, ref, step, r) for r in range(hvd.size())]
        average = [sum(g) / hvd.size() for g in zip(*grads)]
        if previous is not None:
            ref_opt.apply_gradients(zip(previous, ref.trainable_variables))
        previous = average
    assert np.abs(flat(model) - flat(ref)).max() < 1e-6
    assert np.abs(flat(model) - flat(make_model(keras))).max() > 1e-3


def check_gossip(tf, keras, hvd):
    model = make_model(keras, seed=hvd.rank())
    opt = hvd.GossipOptimizer(keras.optimizers.SGD(0.0), topology="exponential")
    rounds = opt._hvd_schedule
    for step in range(3):
        opt.apply_gradients(zip(gradients(tf, model, step, hvd.rank()), model.trainable_variables))
        rows = hvd.allgather(flat(model)[None])
        pair = [p for p in rounds.rounds[step % len(rounds.rounds)] if hvd.rank() in p]
        if pair:
            assert np.array_equal(rows[pair[0][0]], rows[pair[0][1]])
    assert hvd.allgather_object(rounds.rounds) == [rounds.rounds] * hvd.size()


def check_fit(tf, keras, hvd):
    x, y = batch(99, hvd.rank())
    x, y = np.repeat(x, 8, 0), np.repeat(y, 8, 0)
    for make in (lambda: hvd.LocalSGDOptimizer(keras.optimizers.SGD(0.05), period=2),
                 lambda: hvd.OuterOptimizer(keras.optimizers.SGD(0.05), period=2),
                 lambda: hvd.GossipOptimizer(keras.optimizers.SGD(0.05)),
                 lambda: hvd.DistributedOptimizer(keras.optimizers.SGD(0.05), staleness=1)):
        model = make_model(keras)
        opt = make()
        model.compile(optimizer=opt, loss="mse")
        history = model.fit(x, y, batch_size=4, epochs=2, verbose=0)
        assert np.isfinite(history.history["loss"][-1])
        if type(opt._hvd_schedule).__name__ != "StaleGradients":     # stale ranks always agree
            opt.synchronize()
        assert identical(hvd, model), type(opt._hvd_schedule).__name__


def _run():
    import keras
    import tensorflow as tf

    import horovod.tensorflow.keras as hvd
    hvd.init(process_sets="dynamic")
    try:
        for check in (check_local_sgd_and_outer, check_stale, check_gossip, check_fit):
            check(tf, keras, hvd)
    finally:
        hvd.shutdown()
    return True


@pytest.mark.ranks
# One world of 3 (the first size where a gossip ring and a pair differ): each TensorFlow rank costs seconds of
# import, and the schedules themselves run at 2 and 3 ranks in test_async_torch.py.
@pytest.mark.parametrize("size", [3])
def test_async_keras(size):
    assert spawn_ranks(_run, size, timeout=240) == [True] * size
