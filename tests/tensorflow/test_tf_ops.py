"""horovod.tensorflow collectives on 1 and 2 spawned ranks: every op against a numpy reference, executed eagerly and
inside ``tf.function``, their gradients, and the query ops. One spawn per world size runs every check (TensorFlow
takes seconds to import); each check is reported as its own test. The checks hold at any world size.

(No ``__init__.py`` in this folder: pytest would then import it as a package named ``tensorflow``.)
"""

import traceback

import numpy as np
import pytest

from horovod.testing import spawn_ranks

WORLDS = (1, 2)
# A check failing on one rank leaves the other waiting in a collective: the stall shutdown turns that wait into an
# error within seconds, so the failure is reported instead of a timeout.
TF_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "0", "HOROVOD_STALL_CHECK_TIME_SECONDS": "5",
          "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "15"}


def data(rank, shape, dtype="float32", salt=0):
    rng = np.random.default_rng(1009 * salt + rank)
    if np.dtype(dtype).kind == "f":
        return rng.normal(size=shape).astype(dtype)
    return rng.integers(-10 if np.dtype(dtype).kind == "i" else 0, 10, size=shape).astype(dtype)


def close(got, want, what="", tol=1e-5):
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert np.allclose(got, want, rtol=tol, atol=tol), f"{what}: {got} != {want}"


def both(tf, fn, *args):
    """``fn(*args)`` eagerly and traced (``tf.function``), as numpy structures."""
    eager = fn(*args)
    traced = tf.function(fn, autograph=False)(*args)
    return [tf.nest.map_structure(lambda t: t.numpy(), r) for r in (eager, traced)]


def rows(total, n, k):
    """Rank k's rows of a reducescatter of ``total`` rows (ranks below total % n get one more)."""
    base, extra = divmod(total, n)
    start = k * base + min(k, extra)
    return start, base + (1 if k < extra else 0)


# -- checks ---------------------------------------------------------------------------------------------------------

def check_allreduce(tf, hvd, n, me):
    refs = {hvd.Sum: np.sum, hvd.Average: np.mean, hvd.Min: np.min, hvd.Max: np.max, hvd.Product: np.prod}
    for dtype in ("float32", "float64", "float16", "int32", "int64"):
        for op, ref in refs.items():
            if op == hvd.Average and dtype.startswith("int"):
                continue
            x = tf.constant(data(me, (3, 4), dtype, salt=1))
            want = ref(np.stack([data(k, (3, 4), dtype, salt=1).astype(np.float64) for k in range(n)]), axis=0)
            for got in both(tf, lambda t: hvd.allreduce(t, op=op), x):
                close(got, want, f"{dtype} {op}", tol=2e-2 if dtype == "float16" else 1e-5)
    x = tf.constant([1.5, -2.0], tf.bfloat16)
    for got in both(tf, lambda t: hvd.allreduce(t, op=hvd.Sum), x):
        close(got.astype(np.float32), [1.5 * n, -2.0 * n], "bfloat16")


def check_allreduce_options(tf, hvd, n, me):
    x = tf.constant(data(me, (5,), salt=2))
    total = sum(data(k, (5,), salt=2) for k in range(n))
    for got in both(tf, lambda t: hvd.allreduce(t, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0), x):
        close(got, 1.5 * total, "scaled")
    for got in both(tf, lambda t: hvd.allreduce(t, compression=hvd.Compression.fp16), x):
        assert got.dtype == np.float32
        close(got, total / n, "fp16 compression", tol=1e-2)
    for got in both(tf, lambda a, b: hvd.grouped_allreduce([a, b], op=hvd.Sum), x, 2 * x):
        close(got[0], total, "grouped 0")
        close(got[1], 2 * total, "grouped 1")
    with pytest.raises(ValueError):
        hvd.allreduce(x, average=True, op=hvd.Sum)
    with tf.name_scope("scope"):
        close(hvd.allreduce(x, name="named").numpy(), total / n, "named in a scope")
    var = tf.Variable(data(me, (5,), salt=2))
    close(hvd.allreduce(var, op=hvd.Sum).numpy(), total, "variable input")


def check_indexed_slices(tf, hvd, n, me):
    values = tf.constant(data(me, (2, 3), salt=3))
    slices = tf.IndexedSlices(values, tf.constant([me, 4], tf.int64), tf.constant([6, 3], tf.int64))
    for op, scale in ((hvd.Average, 1.0 / n), (hvd.Sum, 1.0)):
        out = hvd.allreduce(slices, op=op)
        assert isinstance(out, tf.IndexedSlices)
        close(out.values.numpy(), np.concatenate([data(k, (2, 3), salt=3) for k in range(n)]) * scale, "values")
        assert out.indices.numpy().tolist() == [i for k in range(n) for i in (k, 4)]
        dense = np.zeros((6, 3))
        for k in range(n):
            np.add.at(dense, [k, 4], data(k, (2, 3), salt=3) * scale)
        close(tf.convert_to_tensor(out).numpy(), dense, f"densified {op}")
    with pytest.raises(NotImplementedError):
        hvd.allreduce(slices, op=hvd.Adasum)


def check_horovod_tf_semantics(tf, hvd, n, me):
    """Issue 51: Horovod's TF exception classes (a mismatch is a FailedPreconditionError and still a
    TensorMismatchError; alltoall's bad splits an InvalidArgumentError), sparse rules (NotImplementedError for
    Min/Max and scaling; averaged integers become float), broadcast's gradient keeps its allreduce in the graph."""
    if n > 1:
        with pytest.raises(tf.errors.FailedPreconditionError) as caught:
            hvd.allreduce(tf.zeros([2 + me]), name="semantics.mismatch")
        assert isinstance(caught.value, hvd.TensorMismatchError) and "shape" in str(caught.value)
        graph = tf.Graph()
        with graph.as_default():
            session_op = hvd.allreduce(tf.zeros([2 + me]), name="semantics.session_mismatch")
        mismatched = tf.function(lambda: hvd.allreduce(tf.zeros([2 + me]), name="semantics.graph_mismatch"))
        for run in (mismatched, lambda: tf.compat.v1.Session(graph=graph).run(session_op)):   # from graph ops too
            with pytest.raises(tf.errors.FailedPreconditionError) as caught:
                run()
            assert isinstance(caught.value, hvd.TensorMismatchError) and "shape" in str(caught.value)
    with pytest.raises(tf.errors.InvalidArgumentError):
        hvd.alltoall(tf.zeros([4]), splits=[5] + [0] * (n - 1), name="semantics.splits")
    with pytest.raises(tf.errors.InvalidArgumentError):
        tf.function(lambda: hvd.alltoall(tf.zeros([4]), splits=[5] + [0] * (n - 1), name="semantics.gsplits"))()
    fake = hvd.ProcessSet([0])
    fake.process_set_id = 10        # never registered: a ValueError when the op is made, even in a graph
    with tf.Graph().as_default(), pytest.raises(ValueError):
        hvd.allreduce(tf.ones([2]), process_set=fake)
    for run in (lambda f: f(), lambda f: tf.function(f, autograph=False)()):   # a 0-d reducescatter: Horovod's
        with pytest.raises(tf.errors.InvalidArgumentError) as caught:            # kernel error, our RuntimeError
            run(lambda: hvd.reducescatter(tf.constant(1.0), op=hvd.Sum, name="semantics.scalar"))
        assert isinstance(caught.value, RuntimeError) and "0-d" in str(caught.value)
    slices = tf.IndexedSlices(tf.constant([[me + 1, 3]], tf.uint8), tf.constant([me], tf.int64),
                              tf.constant([n, 2], tf.int64))
    for kwargs in ({"op": hvd.Max}, {"op": hvd.Sum, "prescale_factor": 2.0}):
        with pytest.raises(NotImplementedError):
            hvd.allreduce(slices, **kwargs)
    averaged = hvd.allreduce(slices, op=hvd.Average)
    assert averaged.values.dtype.is_floating
    close(averaged.values.numpy(), np.array([[k + 1, 3] for k in range(n)]) / n, "sparse integer average")
    x = tf.constant(np.ones(3, np.float32) * (me + 1))

    @tf.function(autograph=False)
    def grad(root):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = hvd.broadcast(x, root, name=f"semantics.bcast{root}")
        return tape.gradient(y, x)
    for root in range(n):   # the root waited forever when other ranks' zeros dropped the allreduce
        close(grad(root).numpy(), np.ones(3) * (1.0 if me == root else 0.0), f"broadcast grad root {root}")
    v = tf.Variable([1.0, 2.0])   # a TensorFlow 1 optimizer wrapped as Horovod does: averaged gradients
    opt = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(1.0))
    opt.apply_gradients(opt.compute_gradients(lambda: tf.reduce_sum(v * float(me + 1)), var_list=[v]))
    close(v.numpy(), np.array([1.0, 2.0]) - (n + 1) / 2, "v1 optimizer")
    with pytest.raises(RuntimeError):
        hvd.broadcast_global_variables(0)


def check_allgather(tf, hvd, n, me):
    x = tf.constant(data(me, (me + 1, 3), salt=4))
    want = np.concatenate([data(k, (k + 1, 3), salt=4) for k in range(n)])
    for got in both(tf, hvd.allgather, x):
        close(got, want, "allgather")
    ints = tf.constant(np.arange(me + 2, dtype=np.int64))
    for got in both(tf, lambda a, b: hvd.grouped_allgather([a, b]), x, ints):
        close(got[0], want, "grouped allgather 0")
        assert got[1].tolist() == [i for k in range(n) for i in range(k + 2)]


def check_broadcast(tf, hvd, n, me):
    for root in range(n):
        x = tf.constant(data(me, (2, 2), "float64", salt=5))
        for got in both(tf, lambda t: hvd.broadcast(t, root), x):
            close(got, data(root, (2, 2), "float64", salt=5), f"broadcast root {root}")
    variables = [tf.Variable(data(me, (3,), salt=6)), tf.Variable(np.int32(me))]
    hvd.broadcast_(variables, root_rank=n - 1)
    close(variables[0].numpy(), data(n - 1, (3,), salt=6), "broadcast_")
    assert int(variables[1].numpy()) == n - 1
    variables = [tf.Variable(data(me, (3,), salt=7))]
    tf.function(lambda: hvd.broadcast_variables(variables, root_rank=0), autograph=False)()
    close(variables[0].numpy(), data(0, (3,), salt=7), "broadcast_variables in tf.function")
    with pytest.raises(ValueError):
        hvd.broadcast(tf.constant([1.0]), root_rank=n)


def check_alltoall(tf, hvd, n, me):
    x = tf.constant(np.arange(2 * n, dtype=np.float32) + 100 * me)
    want = np.concatenate([np.arange(2 * me, 2 * me + 2, dtype=np.float32) + 100 * k for k in range(n)])
    for got in both(tf, hvd.alltoall, x):
        close(got, want, "alltoall equal")
    splits = [k + 1 for k in range(n)] if me == 0 else [1] * n
    x = tf.constant(np.arange(sum(splits), dtype=np.float32) + 100 * me)

    def sent(k):
        s = [j + 1 for j in range(n)] if k == 0 else [1] * n
        start = sum(s[:me])
        return np.arange(start, start + s[me], dtype=np.float32) + 100 * k
    for got, received in both(tf, lambda t: hvd.alltoall(t, splits=tf.constant(splits)), x):
        close(got, np.concatenate([sent(k) for k in range(n)]), "alltoall splits")
        assert received.tolist() == [len(sent(k)) for k in range(n)]


def check_reducescatter(tf, hvd, n, me):
    x = tf.constant(data(me, (5, 2), salt=8))
    total = sum(data(k, (5, 2), salt=8) for k in range(n))
    start, count = rows(5, n, me)
    for op, scale in ((hvd.Sum, 1.0), (hvd.Average, 1.0 / n)):
        for got in both(tf, lambda t: hvd.reducescatter(t, op=op), x):
            close(got, total[start:start + count] * scale, f"reducescatter {op}")
    for got in both(tf, lambda a, b: hvd.grouped_reducescatter([a, b], op=hvd.Sum), x, 3 * x):
        close(got[1], 3 * total[start:start + count], "grouped reducescatter")
    with pytest.raises(RuntimeError):       # the shared policy's UnsupportedOperationError, as Horovod's torch
        hvd.reducescatter(x, op=hvd.Max)


def _grads(tf, fn, x, me):
    """d(sum(fn(x) * w * (1 + me)))/dx eagerly and inside tf.function, with w = 1, 2, 3... over fn(x)."""
    def compute(t):
        with tf.GradientTape() as tape:
            tape.watch(t)
            y = fn(t)
            w = tf.cast(tf.reshape(tf.range(tf.size(y)), tf.shape(y)), y.dtype) + 1.0
            loss = tf.reduce_sum(y * w * (1.0 + me))
        return tape.gradient(loss, t)
    return both(tf, compute, x)


def check_gradients(tf, hvd, n, me):
    factor = lambda k: 1.0 + k  # noqa: E731 — the rank factor in _grads' loss
    x = tf.constant(data(me, (3, 2), salt=9))
    weights = np.arange(6, dtype=np.float32).reshape(3, 2) + 1
    for op, scale in ((hvd.Sum, 1.0), (hvd.Average, 1.0 / n)):
        for got in _grads(tf, lambda t: hvd.allreduce(t, op=op, postscale_factor=2.0), x, me):
            close(got, weights * 2 * scale * sum(factor(k) for k in range(n)), f"allreduce grad {op}")
    # allgather: rows of rank me in the gathered output, gradient averaged over ranks.
    x = tf.constant(data(me, (me + 1, 2), salt=10))
    total_rows = sum(k + 1 for k in range(n))
    w = np.arange(total_rows * 2, dtype=np.float32).reshape(total_rows, 2) + 1
    start = sum(k + 1 for k in range(me))
    mean_factor = sum(factor(k) for k in range(n)) / n
    for got in _grads(tf, hvd.allgather, x, me):
        close(got, w[start:start + me + 1] * mean_factor, "allgather grad")
    x = tf.constant(data(me, (2, 2), salt=11))
    for got in _grads(tf, lambda t: hvd.broadcast(t, 0), x, me):
        want = (np.arange(4, dtype=np.float32).reshape(2, 2) + 1) * mean_factor if me == 0 else np.zeros((2, 2))
        close(got, want, "broadcast grad")
    x = tf.constant(data(me, (2 * n, 1), salt=12))
    w = np.arange(2 * n, dtype=np.float32).reshape(2 * n, 1) + 1
    for got in _grads(tf, hvd.alltoall, x, me):
        want = np.concatenate([w[2 * me:2 * me + 2] * factor(k) for k in range(n)])
        close(got, want, "alltoall grad")
    x = tf.constant(data(me, (5, 1), salt=13))
    for op, scale in ((hvd.Sum, float(n)), (hvd.Average, 1.0)):   # Horovod: size for Sum, 1 for Average
        for got in _grads(tf, lambda t: hvd.reducescatter(t, op=op), x, me):
            want = np.concatenate([(np.arange(rows(5, n, k)[1], dtype=np.float32) + 1).reshape(-1, 1) * factor(k)
                                   for k in range(n)]) * scale
            close(got, want, f"reducescatter grad {op}")


def check_queries_and_objects(tf, hvd, n, me):
    for value in both(tf, lambda: (hvd.rank_op(), hvd.size_op(), hvd.local_rank_op(), hvd.local_size_op(),
                                   hvd.process_set_included_op(1))):
        assert [int(v) for v in value] == [me, n, me, n, int(me == n - 1)]
    assert hvd.broadcast_object({"rank": me}, root_rank=n - 1) == {"rank": n - 1}
    assert hvd.broadcast_object_fn(root_rank=0)([me]) == [0]
    assert hvd.allgather_object(me * 10) == [10 * k for k in range(n)]
    hvd.barrier()
    assert hvd.check_num_rank_power_of_2(4) and not hvd.check_num_rank_power_of_2(3)


def check_process_sets(tf, hvd, n, me):
    last = hvd.ProcessSet([n - 1])
    last.process_set_id = 1
    if me == n - 1:
        for got in both(tf, lambda t: hvd.allreduce(t, op=hvd.Sum, process_set=last), tf.constant([2.0])):
            close(got, [2.0], "single-rank set")
    everyone = hvd.ProcessSet(list(range(n)))
    everyone.process_set_id = 2 if n > 1 else 0
    for got in both(tf, lambda t: hvd.allgather(t, process_set=everyone), tf.constant([float(me)])):
        close(got, np.arange(n), "set of everyone")


def check_join(tf, hvd, n, me):
    if me == 0:
        close(hvd.allreduce(tf.constant([4.0]), op=hvd.Sum).numpy(), [4.0], "allreduce while others joined")
    assert int(hvd.join().numpy()) in range(n)


def check_gpu_tensor_staged_through_the_host(tf, hvd, n, me):
    """A GPU tensor (described as one: this machine has no GPU) goes through the host-staged path and comes back a
    tensor; an eager CPU tensor stays a numpy view."""
    from horovod.common.device import DeviceTensor
    from horovod.runtime import collectives as core
    from horovod.tensorflow._tensors import TF_OPS, _eager_input, _gpu_index, from_core
    assert type(_eager_input(tf.ones(2))).__name__ == "ndarray"
    assert _gpu_index(type("T", (), {"device": "/job:localhost/replica:0/task:0/device:GPU:1"})()) == 1
    x = tf.reshape(tf.range(6, dtype=tf.float32), (2, 3)) * float(me + 1)
    summed = core.allreduce(DeviceTensor(x, "cuda:0", "float32", (2, 3), None, TF_OPS), name="staged", op=hvd.Sum)
    assert type(summed) is DeviceTensor and summed.device == "cuda:0"
    out = from_core(summed, tf.float32)
    assert isinstance(out, tf.Tensor) and out.numpy().tolist() == (np.arange(6).reshape(2, 3) * n * (n + 1) / 2).tolist()
    rows = DeviceTensor(tf.fill((me + 1, 2), float(me)), "cuda:0", "float32", (me + 1, 2), None, TF_OPS)
    gathered = from_core(core.allgather(rows, name="staged_rows"), tf.float32).numpy()[:, 0].tolist()
    assert gathered == [float(r) for r in range(n) for _ in range(r + 1)]


CHECKS = {name: fn for name, fn in sorted(globals().items()) if name.startswith("check_")}
CHECKS["check_join"] = CHECKS.pop("check_join")  # last: it leaves the engine joined


def _run_all(world):
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    import horovod.tensorflow as hvd
    sets = [hvd.ProcessSet([world - 1]), hvd.ProcessSet(list(range(world)))]
    hvd.init(process_sets=sets if world > 1 else sets[:1])   # at 1 rank both are [0]
    results = {}
    for name, fn in CHECKS.items():
        try:
            fn(tf, hvd, hvd.size(), hvd.rank())
            results[name] = None
        except Exception:  # reported per check by the test below
            results[name] = traceback.format_exc()
    hvd.shutdown()
    return results


@pytest.fixture(scope="module", params=WORLDS, ids=lambda w: f"{w}ranks")
def results(request):
    pytest.importorskip("tensorflow")
    return spawn_ranks(_run_all, request.param, timeout=150, env=TF_ENV, args=(request.param,))


@pytest.mark.ranks
@pytest.mark.parametrize("check", list(CHECKS))
def test_tf_op(results, check):
    failures = [f"rank {rank}:\n{r[check]}" for rank, r in enumerate(results) if r[check] is not None]
    assert not failures, "\n".join(failures)
