"""Training with horovod.tensorflow and horovod.tensorflow.keras on 2 spawned ranks.

The central property: data-parallel training leaves every rank with the weights that single-process training on
the union of the ranks' batches gives (same initial weights), with ``DistributedGradientTape`` and with Keras
``model.fit`` and the wrapped optimizer; plus the callbacks (broadcast, metric averaging, warmup), local gradient
accumulation, ``load_model``, ``SyncBatchNormalization`` and the elastic Keras state. One spawn runs every check.
"""

import os
import tempfile
import traceback

import numpy as np
import pytest

from horovod.testing import spawn_ranks

WORLD = 2
# A check failing on one rank leaves the other waiting in a collective: the stall shutdown turns that wait into an
# error within seconds, so the failure is reported instead of a timeout.
TF_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "0", "HOROVOD_STALL_CHECK_TIME_SECONDS": "5",
          "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "15"}
BATCH, STEPS = 4, 4


def dataset(n):
    """Features and targets; rank k's shard is rows k::n, global batch s is the union of the shards' batch s."""
    rng = np.random.default_rng(7)
    x = rng.normal(size=(n * BATCH * STEPS, 5)).astype("float32")
    y = (x @ rng.normal(size=(5, 2)) + 0.1 * rng.normal(size=(len(x), 2))).astype("float32")
    return x, y


def shard(x, n, k):
    return x[k::n]


def union_order(x, n):
    """The rows in the order single-process training sees them: batch s = every shard's batch s."""
    shards = [shard(x, n, k) for k in range(n)]
    return np.concatenate([s[i * BATCH:(i + 1) * BATCH] for i in range(STEPS) for s in shards])


def make_model(keras, seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((5,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(2)])


def same_on_every_rank(hvd, arrays, what):
    gathered = hvd.allgather_object([np.asarray(a) for a in arrays])
    for k, other in enumerate(gathered[1:], 1):
        for a, b in zip(gathered[0], other):
            assert np.allclose(a, b, atol=1e-6), f"{what}: rank {k} differs from rank 0"


# -- checks ---------------------------------------------------------------------------------------------------------

def check_gradient_tape_equals_full_batch(tf, keras, hvd, n, me):
    x, y = dataset(n)
    model = make_model(keras, 100 + me)
    hvd.broadcast_variables(model.variables, root_rank=0)
    reference = make_model(keras, 0)
    reference.set_weights([v.numpy() for v in model.variables])
    opt, ref_opt = keras.optimizers.SGD(0.1), keras.optimizers.SGD(0.1)
    xs, ys = shard(x, n, me), shard(y, n, me)
    xu, yu = union_order(x, n), union_order(y, n)

    @tf.function(autograph=False)
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(xb) - yb))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply(grads, model.trainable_variables)
        return loss

    from horovod.runtime import basics
    engine = basics.engine()
    drives = engine._drives
    for s in range(STEPS):
        step(xs[s * BATCH:(s + 1) * BATCH], ys[s * BATCH:(s + 1) * BATCH])
        # A graph op's wait leaves the engine's loop to the engine thread: driving it from a thread of the
        # binding's made VGG16's step 3-25 times slower at 2 ranks (tests/test_waiting_threads.py drives eagerly).
        assert engine._drives == drives, "a graph step's gradient reduction drove the engine's loop"
        xb, yb = xu[s * n * BATCH:(s + 1) * n * BATCH], yu[s * n * BATCH:(s + 1) * n * BATCH]
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(reference(xb) - yb))
        ref_opt.apply(tape.gradient(loss, reference.trainable_variables), reference.trainable_variables)
    for a, b in zip(model.variables, reference.variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)
    same_on_every_rank(hvd, [v.numpy() for v in model.variables], "tape training")


def check_partial_tape_keeps_local_gradients(tf, keras, hvd, n, me):
    model = make_model(keras, 3)
    x = tf.constant(np.full((2, 5), me + 1.0, np.float32))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(x))
    local = model.layers[1]
    plain = tf.GradientTape()
    with plain:
        plain_loss = tf.reduce_sum(model(x))
    local_grads = plain.gradient(plain_loss, model.trainable_variables)
    tape = hvd.PartialDistributedGradientTape(tape, local_layers=[local])
    grads = tape.gradient(loss, model.trainable_variables)
    averaged = [hvd.allreduce(g).numpy() for g in local_grads]
    for var, g, lg, avg in zip(model.trainable_variables, grads, local_grads, averaged):
        is_local = any(var is w for w in local.trainable_weights)
        want = lg.numpy() / n if is_local else avg
        np.testing.assert_allclose(g.numpy(), want, rtol=1e-5, atol=1e-6)
    assert isinstance(tape, tf.GradientTape)


def check_keras_fit_equals_full_batch(tf, keras, hvd, n, me):
    x, y = dataset(n)
    model = make_model(keras, 200 + me)             # different on every rank until the broadcast callback
    reference = make_model(keras, 0)
    reference.set_weights(hvd.broadcast_object([v.numpy() for v in model.variables], root_rank=0))
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss="mse")
    reference.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")

    raw = []

    class Raw(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            raw.append(dict(logs))

    history = model.fit(shard(x, n, me), shard(y, n, me), batch_size=BATCH, epochs=2, shuffle=False, verbose=0,
                        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), Raw(),
                                   hvd.callbacks.MetricAverageCallback()])
    reference.fit(union_order(x, n), union_order(y, n), batch_size=n * BATCH, epochs=2, shuffle=False, verbose=0)
    for a, b in zip(model.variables, reference.variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)
    same_on_every_rank(hvd, [v.numpy() for v in model.variables], "fit")
    every_raw = hvd.allgather_object([r["loss"] for r in raw])
    np.testing.assert_allclose(history.history["loss"], np.mean(every_raw, axis=0), rtol=1e-6)
    same_on_every_rank(hvd, [history.history["loss"]], "averaged metrics")


def check_keras_accumulation_warmup_and_momentum(tf, keras, hvd, n, me):
    x, y = dataset(n)
    model = make_model(keras, 300 + me)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), backward_passes_per_step=2,
                                   average_aggregated_gradients=True, compression=hvd.Compression.fp16)
    model.compile(optimizer=opt, loss="mse")
    warmup = hvd.callbacks.LearningRateWarmupCallback(0.1, warmup_epochs=2)
    history = model.fit(shard(x, n, me), shard(y, n, me), batch_size=BATCH, epochs=2, verbose=0,
                        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), warmup])
    same_on_every_rank(hvd, [v.numpy() for v in model.variables], "accumulated fit")
    assert int(opt.iterations.numpy()) == 2 * STEPS
    # The rate after the last batch of epoch e is 0.1 / n * ((e + 1) * (n - 1) / 2 + 1).
    want = [0.1 / n * ((e + (STEPS - 1 + 1) / STEPS) * (n - 1) / 2 + 1) for e in range(2)]
    np.testing.assert_allclose(history.history["lr"], want, rtol=1e-5)


def check_load_model_rewraps(tf, keras, hvd, n, me, tmpdir):
    x, y = dataset(n)
    model = make_model(keras, 5)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss="mse")
    model.fit(shard(x, n, me), shard(y, n, me), batch_size=BATCH, epochs=1, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    path = os.path.join(tmpdir, f"model.{me}.keras")
    model.save(path)
    loaded = hvd.load_model(path)
    from horovod.tensorflow.keras.optimizer import _DistributedOptimizer
    assert isinstance(loaded.optimizer, _DistributedOptimizer) and isinstance(loaded.optimizer,
                                                                             keras.optimizers.Adam)
    for a, b in zip(loaded.optimizer.variables, model.optimizer.variables):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b))
    loaded.fit(shard(x, n, me), shard(y, n, me), batch_size=BATCH, epochs=1, verbose=0)
    same_on_every_rank(hvd, [v.numpy() for v in loaded.variables], "loaded model")
    plain = keras.models.load_model(path)       # a saved wrapped optimizer names the plain class
    assert type(plain.optimizer) is keras.optimizers.Adam


def check_sync_batch_norm(tf, keras, hvd, n, me):
    rng = np.random.default_rng(11)
    full = rng.normal(size=(n * 3, 4)).astype("float32") * 3 + 1
    mine = full[me * 3:(me + 1) * 3]
    sync, plain = hvd.SyncBatchNormalization(), keras.layers.BatchNormalization()
    for layer in (sync, plain):
        layer.build((None, 4))
    target = rng.normal(size=(n * 3, 4)).astype("float32")

    @tf.function(autograph=False)
    def sync_grads(xb, tb):
        with tf.GradientTape() as tape:
            tape.watch(xb)
            out = sync(xb, training=True)
            loss = tf.reduce_sum(out * tb)
        return out, tape.gradient(loss, xb)

    out, grad = sync_grads(tf.constant(mine), tf.constant(target[me * 3:(me + 1) * 3]))
    xf = tf.constant(full)
    with tf.GradientTape() as tape:
        tape.watch(xf)
        ref = plain(xf, training=True)
        loss = tf.reduce_sum(ref * target)
    ref_grad = tape.gradient(loss, xf)
    np.testing.assert_allclose(out.numpy(), ref.numpy()[me * 3:(me + 1) * 3], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(grad.numpy(), ref_grad.numpy()[me * 3:(me + 1) * 3], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(sync.moving_mean.numpy(), plain.moving_mean.numpy(), rtol=1e-4, atol=1e-5)


def check_elastic_keras_state(tf, keras, hvd, n, me):
    model = make_model(keras, 400 + me)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.5)), loss="mse")
    state = hvd.elastic.KerasState(model, batch=me, epoch=0)
    state.sync()                                      # rank 0's weights and attributes everywhere
    assert state.batch == 0
    committed = [v.numpy() for v in model.variables]
    same_on_every_rank(hvd, committed, "synced state")
    for v in model.trainable_variables:
        v.assign(v + 1.0)
    state.batch = 5
    state.restore()
    assert state.batch == 0
    for v, c in zip(model.variables, committed):
        np.testing.assert_allclose(v.numpy(), c)
    x, y = dataset(n)
    callbacks = [hvd.elastic.UpdateEpochStateCallback(state), hvd.elastic.UpdateBatchStateCallback(state),
                 hvd.elastic.CommitStateCallback(state, batches_per_commit=2)]
    model.fit(shard(x, n, me), shard(y, n, me), batch_size=BATCH, epochs=2, verbose=0, callbacks=callbacks)
    assert state.epoch == 2 and state.batch == 0
    same_on_every_rank(hvd, [v.numpy() for v in model.variables], "after elastic fit")


CHECKS = {name: fn for name, fn in sorted(globals().items()) if name.startswith("check_")}


def _run_all(tmpdir):
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    import keras
    import horovod.tensorflow.keras as hvd_keras
    import horovod.tensorflow as hvd_tf
    hvd_tf.init()

    class Both:
        """horovod.tensorflow and horovod.tensorflow.keras names in one namespace, as the checks use them."""

        def __getattr__(self, name):
            return getattr(hvd_tf, name) if hasattr(hvd_tf, name) else getattr(hvd_keras, name)

    hvd = Both()
    hvd.elastic = hvd_keras.elastic
    hvd.callbacks = hvd_keras.callbacks
    hvd.DistributedOptimizer = hvd_keras.DistributedOptimizer
    results = {}
    for name, fn in CHECKS.items():
        try:
            args = (tmpdir,) if name == "check_load_model_rewraps" else ()
            fn(tf, keras, hvd, hvd_tf.size(), hvd_tf.rank(), *args)
            results[name] = None
        except Exception:  # reported per check by the test below
            results[name] = traceback.format_exc()
    hvd_tf.shutdown()
    return results


@pytest.fixture(scope="module")
def results():
    pytest.importorskip("tensorflow")
    with tempfile.TemporaryDirectory(prefix="horovod-tf-") as tmpdir:
        yield spawn_ranks(_run_all, WORLD, timeout=240, args=(tmpdir,), env=TF_ENV)


@pytest.mark.ranks
@pytest.mark.parametrize("check", list(CHECKS))
def test_tf_training(results, check):
    failures = [f"rank {rank}:\n{r[check]}" for rank, r in enumerate(results) if r[check] is not None]
    assert not failures, "\n".join(failures)
