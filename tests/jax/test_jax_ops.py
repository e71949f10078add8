"""horovod.jax collectives on 1 and 3 spawned ranks: every op, eagerly and inside jax.jit, against numpy; pytrees
keep structure and dtypes; jax.grad through the collectives against their definitions; vmap; negotiation by name
when ranks start jitted collectives in different orders; errors (a shape mismatch fails on every rank with the
engine's message). One spawn per world size runs every check; each check is reported as its own test.

(No ``__init__.py`` in this folder: pytest would then import it as a package named ``jax``.)
"""

import traceback

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from horovod.testing import spawn_ranks  # noqa: E402

# One rank (the short cuts of a world of one) and three (uneven splits, a ring that is not a pair); every JAX rank
# costs seconds of import and compilation, and two ranks run in test_jax_optimizer.py and the examples.
WORLDS = (1, 3)
BF16 = np.dtype(jnp.bfloat16)
FLOATS = [np.float32, np.float16, BF16]
INTS = [np.int32, np.int8, np.uint8]
ENV = {"XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1", "JAX_PLATFORMS": "cpu"}


def data(rank, shape, dtype=np.float32, salt=0):
    rng = np.random.RandomState(1009 * salt + rank)
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.randint(0, 2, shape).astype(bool)
    if np.issubdtype(dtype, np.integer):
        return rng.randint(0 if dtype == np.uint8 else -4, 5, shape).astype(dtype)
    return rng.randn(*shape).astype(dtype)


def everyone(n, shape, dtype=np.float32, salt=0):
    return [data(r, shape, dtype, salt) for r in range(n)]


def reduce_ref(arrays, op, hvd):
    stack = np.stack([np.asarray(a, dtype=np.float64) for a in arrays])
    return {hvd.Sum: stack.sum(0), hvd.Average: stack.mean(0), hvd.Min: stack.min(0), hvd.Max: stack.max(0),
            hvd.Product: stack.prod(0)}[op]


def close(got, want, what=""):
    assert isinstance(got, jax.Array), f"{what}: got {type(got)}"
    want = np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    tol = {np.dtype(np.float16): 2e-2, BF16: 6e-2, np.dtype(np.float32): 1e-5}.get(np.dtype(got.dtype), 1e-9)
    g, w = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert np.allclose(g, w, rtol=tol, atol=tol), f"{what}: {g} != {w}"


def both(fn):
    """The function eagerly and jitted: every check runs each collective both ways."""
    return (("eager", fn), ("jit", jax.jit(fn)))


# -- collectives against numpy --------------------------------------------------------------------------------------

def check_allreduce_ops_and_dtypes(hvd, n, me):
    for dtype in FLOATS + INTS:
        ops = [op for op in (hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product)
               if not (op == hvd.Average and np.issubdtype(dtype, np.integer))]
        for mode, fn in both(lambda x, ops=ops: [hvd.allreduce(x, op=op) for op in ops]):   # one program per dtype
            for op, got in zip(ops, fn(jnp.asarray(data(me, (3, 4), dtype, salt=1)))):
                assert np.dtype(got.dtype) == np.dtype(dtype), (mode, got.dtype, dtype)
                want = reduce_ref(everyone(n, (3, 4), dtype, 1), op, hvd)
                close(got, want.astype(dtype) if np.issubdtype(dtype, np.integer) else want, f"{mode} {dtype} {op}")
    for mode, fn in both(lambda x: hvd.allreduce(x, op=hvd.Max)):
        assert fn(jnp.asarray([me == 0, False, True])).tolist() == [True, False, True], mode


def check_scale_factors_and_average_argument(hvd, n, me):
    want = 1.5 * reduce_ref(everyone(n, (5,), salt=2), hvd.Sum, hvd)
    for mode, fn in both(lambda x: hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0)):
        close(fn(jnp.asarray(data(me, (5,), salt=2))), want, f"{mode} scaled")
    with pytest.warns(DeprecationWarning):
        close(hvd.allreduce(jnp.asarray(data(me, (5,), salt=2)), average=False), want / 1.5, "average=False")
    with pytest.raises(ValueError):
        hvd.allreduce(jnp.ones(2), average=True, op=hvd.Sum)
    scalar = hvd.allreduce(jnp.float32(me + 1), op=hvd.Sum)
    assert scalar.shape == () and float(scalar) == n * (n + 1) / 2


def _tree(rank, salt):
    return {"w": data(rank, (2, 3), np.float32, salt), "layers": [data(rank, (4,), BF16, salt + 1),
                                                                   (data(rank, (), np.int32, salt + 2),)]}


def check_pytrees_keep_structure_and_dtypes(hvd, n, me):
    tree = jax.tree_util.tree_map(jnp.asarray, _tree(me, 3))
    want = jax.tree_util.tree_map(lambda *xs: reduce_ref(xs, hvd.Sum, hvd), *[_tree(r, 3) for r in range(n)])
    for mode, fn in both(lambda t: hvd.allreduce(t, op=hvd.Sum)):
        got = fn(tree)
        assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(tree), mode
        for g, x, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(tree),
                           jax.tree_util.tree_leaves(want)):
            assert g.dtype == x.dtype, (mode, g.dtype, x.dtype)
            close(g, w.astype(np.dtype(x.dtype)), f"{mode} pytree leaf")
    for mode, fn in both(lambda xs: hvd.grouped_allreduce(xs, op=hvd.Average)):
        got = fn([jnp.asarray(data(me, (2,), salt=6)), jnp.asarray(data(me, (3,), np.float16, salt=7))])
        assert isinstance(got, list) and got[1].dtype == jnp.float16
        close(got[0], reduce_ref(everyone(n, (2,), salt=6), hvd.Average, hvd), f"{mode} grouped 0")
        close(got[1], reduce_ref(everyone(n, (3,), np.float16, 7), hvd.Average, hvd), f"{mode} grouped 1")


def check_allgather(hvd, n, me):
    dtypes = FLOATS + INTS + [np.bool_]
    for dtype in dtypes:
        got = hvd.allgather(jnp.asarray(data(me, (me + 1, 3), dtype, salt=8)))
        assert np.dtype(got.dtype) == np.dtype(dtype)
        close(got, np.concatenate([data(r, (r + 1, 3), dtype, 8) for r in range(n)]), f"ragged eager {dtype}")
    for mode, fn in both(lambda xs: [hvd.allgather(x) for x in xs]):
        for dtype, got in zip(dtypes, fn([jnp.asarray(data(me, (2, 3), d, salt=9)) for d in dtypes])):
            assert np.dtype(got.dtype) == np.dtype(dtype)
            close(got, np.concatenate(everyone(n, (2, 3), dtype, 9)), f"{mode} {dtype}")
    tree = {"a": jnp.asarray(data(me, (1, 2), salt=10)), "b": jnp.asarray(data(me, (), np.int32, salt=11))}
    for mode, fn in both(hvd.allgather):
        got = fn(tree)
        close(got["a"], np.concatenate(everyone(n, (1, 2), salt=10)), f"{mode} tree a")
        close(got["b"], np.stack(everyone(n, (), np.int32, 11)), f"{mode} tree scalar leaf")
    for mode, fn in both(lambda xs: hvd.grouped_allgather(xs)):
        got = fn([jnp.asarray(data(me, (2,), salt=12))])
        close(got[0], np.concatenate(everyone(n, (2,), salt=12)), f"{mode} grouped_allgather")


def check_broadcast(hvd, n, me):
    dtypes = [np.float32, BF16, np.int8, np.bool_]
    for root in range(n):
        for mode, fn in both(lambda xs, root=root: [hvd.broadcast(x, root) for x in xs]):
            for dtype, got in zip(dtypes, fn([jnp.asarray(data(me, (2, 3), d, salt=13)) for d in dtypes])):
                close(got, data(root, (2, 3), dtype, 13), f"{mode} {dtype} root {root}")
        for mode, fn in both(lambda t, root=root: hvd.broadcast(t, root_rank=root)):
            got = fn({"x": jnp.asarray(data(me, (2,), salt=14)), "y": [jnp.asarray(data(me, (1,), np.int32, 15))]})
            close(got["x"], data(root, (2,), salt=14), f"{mode} tree x")
            close(got["y"][0], data(root, (1,), np.int32, 15), f"{mode} tree y")


def check_alltoall(hvd, n, me):
    want = np.concatenate([data(r, (2 * n, 3), salt=16)[2 * me:2 * me + 2] for r in range(n)])
    for mode, fn in both(hvd.alltoall):
        close(fn(jnp.asarray(data(me, (2 * n, 3), salt=16))), want, f"{mode} alltoall")
    split_of = lambda r: [1 + (r + i) % 2 for i in range(n)]  # noqa: E731
    got, received = hvd.alltoall(jnp.asarray(data(me, (sum(split_of(me)), 2), BF16, salt=17)), splits=split_of(me))
    parts = [np.split(data(r, (sum(split_of(r)), 2), BF16, 17), np.cumsum(split_of(r))[:-1])[me] for r in range(n)]
    close(got, np.concatenate(parts), "alltoall splits")
    assert received.dtype == jnp.int32 and received.tolist() == [split_of(r)[me] for r in range(n)]


def _rows(total, n, rank):
    base, extra = divmod(total, n)
    return rank * base + min(rank, extra), base + (1 if rank < extra else 0)


def check_reducescatter(hvd, n, me):
    start, count = _rows(5, n, me)
    dtypes = (np.float32, np.float16, BF16)
    for op in (hvd.Sum, hvd.Average):
        for mode, fn in both(lambda xs, op=op: [hvd.reducescatter(x, op=op) for x in xs]):
            for dtype, got in zip(dtypes, fn([jnp.asarray(data(me, (5, 2), d, salt=18)) for d in dtypes])):
                want = reduce_ref(everyone(n, (5, 2), dtype, 18), op, hvd)[start:start + count]
                close(got, want, f"{mode} {dtype} {op}")
    for mode, fn in both(lambda xs: hvd.grouped_reducescatter(xs, op=hvd.Sum, prescale_factor=2.0)):
        got = fn([jnp.asarray(data(me, (5, 2), salt=19)), jnp.asarray(data(me, (5,), salt=20))])
        close(got[0], 2 * reduce_ref(everyone(n, (5, 2), salt=19), hvd.Sum, hvd)[start:start + count], f"{mode} g0")
        close(got[1], 2 * reduce_ref(everyone(n, (5,), salt=20), hvd.Sum, hvd)[start:start + count], f"{mode} g1")


def check_async_handles(hvd, n, me):
    want = reduce_ref(everyone(n, (4,), salt=21), hvd.Sum, hvd)
    handle = hvd.allreduce_async(jnp.asarray(data(me, (4,), salt=21)), op=hvd.Sum, name="async")
    assert isinstance(hvd.poll(handle), bool)
    close(hvd.synchronize(handle), want, "eager async")
    got = hvd.synchronize(hvd.allgather_async({"g": jnp.asarray(data(me, (1,), salt=22))}))
    close(got["g"], np.concatenate(everyone(n, (1,), salt=22)), "eager allgather_async")
    got = jax.jit(lambda x: hvd.synchronize(hvd.broadcast_async(x, n - 1)))(jnp.asarray(data(me, (2,), salt=23)))
    close(got, data(n - 1, (2,), salt=23), "jit broadcast_async")


def check_ranks_start_collectives_in_different_orders(hvd, n, me):
    """Each call site names its collective, so the ranks pair them by name whatever order they start them in."""
    def first(x):
        return hvd.allreduce_async(x, op=hvd.Sum)

    def second(x):
        return hvd.allgather_async(x)

    def step(a, b):
        handles = [first(a), second(b)] if me % 2 == 0 else [second(b), first(a)][::-1]
        return [hvd.synchronize(h) for h in handles]

    def named(a, b):
        order = ["a", "b"] if me % 2 == 0 else ["b", "a"]
        handles = {k: hvd.allreduce_async(a if k == "a" else b, op=hvd.Sum, name=f"order.{k}") for k in order}
        return hvd.synchronize(handles["a"]), hvd.synchronize(handles["b"])

    a, b = jnp.asarray(data(me, (3,), salt=24)), jnp.asarray(data(me, (2,), salt=25))
    for mode, fn in both(step):
        got = fn(a, b)
        close(got[0], reduce_ref(everyone(n, (3,), salt=24), hvd.Sum, hvd), f"{mode} site-named allreduce")
        close(got[1], np.concatenate(everyone(n, (2,), salt=25)), f"{mode} site-named allgather")
    for mode, fn in both(named):
        got = fn(a, b)
        close(got[1], reduce_ref(everyone(n, (2,), salt=25), hvd.Sum, hvd), f"{mode} user-named")


# -- process sets, objects, compression -----------------------------------------------------------------------------

def check_process_sets(hvd, n, me, sets):
    last, all_ranks = sets
    x = jnp.asarray(data(me, (3,), salt=26))
    if last.included():
        for mode, fn in both(lambda t: hvd.allreduce(t, op=hvd.Sum, name="one", process_set=last)):
            close(fn(x), data(me, (3,), salt=26), f"{mode} one-rank set")
    for mode, fn in both(lambda t: hvd.allreduce(t, op=hvd.Sum, process_set=all_ranks)):
        close(fn(x), reduce_ref(everyone(n, (3,), salt=26), hvd.Sum, hvd), f"{mode} registered set")
    hvd.barrier(process_set=all_ranks)


def check_objects_barrier_join(hvd, n, me):
    assert hvd.broadcast_object({"r": me}, root_rank=n - 1) == {"r": n - 1}
    assert hvd.allgather_object(("r", me)) == [("r", r) for r in range(n)]
    params = hvd.broadcast_parameters({"w": jnp.full(2, float(me)), "step": me}, root_rank=n - 1)
    close(params["w"], np.full(2, n - 1.0), "broadcast_parameters")
    assert params["step"] == n - 1
    hvd.barrier()
    with pytest.raises(RuntimeError, match="eagerly"):
        jax.jit(lambda x: (hvd.barrier(), x)[1])(jnp.ones(1))
    assert hvd.join() in range(n)


def check_compression(hvd, n, me):
    want = reduce_ref(everyone(n, (6,), salt=27), hvd.Sum, hvd)
    for compression in (hvd.Compression.fp16, hvd.Compression.bf16):
        for mode, fn in both(lambda x, c=compression: hvd.allreduce(x, op=hvd.Sum, compression=c)):
            got = fn(jnp.asarray(data(me, (6,), salt=27)))
            assert got.dtype == jnp.float32
            assert np.allclose(np.asarray(got), want, rtol=5e-2, atol=2e-1), (mode, compression, got, want)


# -- gradients: each rank's loss is sum(op(x) * w_r); the gradient is that of the sum of every rank's loss ------------

def _grad(mode, loss):
    g = jax.grad(loss)
    return g if mode == "eager" else jax.jit(g)


def check_grad_allreduce(hvd, n, me):
    w = everyone(n, (3,), salt=31)
    for op, pre, post in ((hvd.Sum, 1.0, 1.0), (hvd.Average, 1.0, 1.0), (hvd.Sum, 0.5, 4.0)):
        for mode in ("eager", "jit"):
            g = _grad(mode, lambda x, op=op, pre=pre, post=post: jnp.sum(
                hvd.allreduce(x, op=op, prescale_factor=pre, postscale_factor=post) * w[me]))
            want = np.sum(w, 0) * pre * post / (n if op == hvd.Average else 1)
            close(g(jnp.asarray(data(me, (3,), salt=30))), want, f"{mode} allreduce grad op {op}")
    tree_loss = lambda t: jnp.sum(hvd.allreduce(t, op=hvd.Sum)["a"] * w[me]) + jnp.sum(  # noqa: E731
        hvd.allreduce(t, op=hvd.Sum)["b"])
    for mode in ("eager", "jit"):
        got = _grad(mode, tree_loss)({"a": jnp.ones(3), "b": jnp.ones(2)})
        close(got["a"], np.sum(w, 0), f"{mode} pytree grad a")
        close(got["b"], np.full(2, float(n)), f"{mode} pytree grad b")


def check_grad_allgather_broadcast_reducescatter_alltoall(hvd, n, me):
    for mode in ("eager", "jit"):
        w = everyone(n, (2 * n, 2), salt=33)
        g = _grad(mode, lambda x: jnp.sum(hvd.allgather(x) * w[me]))(jnp.asarray(data(me, (2, 2), salt=32)))
        close(g, np.mean(w, 0)[2 * me:2 * me + 2], f"{mode} allgather grad (averaged, Horovod's rule)")
        v = everyone(n, (4,), salt=35)
        g = _grad(mode, lambda x: jnp.sum(hvd.broadcast(x, n - 1) * v[me]))(jnp.asarray(data(me, (4,), salt=34)))
        close(g, np.mean(v, 0) if me == n - 1 else np.zeros(4), f"{mode} broadcast grad")
        start, count = _rows(5, n, me)
        for op in (hvd.Sum, hvd.Average):
            u = [data(k, (_rows(5, n, k)[1], 2), salt=37) for k in range(n)]
            g = _grad(mode, lambda x, op=op: jnp.sum(hvd.reducescatter(x, op=op) * u[me]))(
                jnp.asarray(data(me, (5, 2), salt=36)))
            close(g, np.concatenate(u) * (n if op == hvd.Sum else 1), f"{mode} reducescatter grad {op}")
        z = everyone(n, (2 * n, 2), salt=39)
        g = _grad(mode, lambda x: jnp.sum(hvd.alltoall(x) * z[me]))(jnp.asarray(data(me, (2 * n, 2), salt=38)))
        close(g, np.concatenate([z[k][2 * me:2 * me + 2] for k in range(n)]), f"{mode} alltoall grad")


def check_inside_control_flow(hvd, n, me):
    """A collective in a scan body runs once per iteration, in a cond branch only when taken."""
    def body(carry, _):
        return hvd.allreduce(carry, op=hvd.Sum, name="scan"), None
    got = jax.jit(lambda x: jax.lax.scan(body, x, None, length=3)[0])(jnp.full(2, 1.0))
    close(got, np.full(2, float(n) ** 3), "scan")
    cond = jax.jit(lambda x, p: jax.lax.cond(p, lambda v: hvd.allreduce(v, op=hvd.Sum), lambda v: v * 10, x))
    close(cond(jnp.ones(2), True), np.full(2, float(n)), "cond taken")
    close(cond(jnp.ones(2), False), np.full(2, 10.0), "cond not taken")


def check_vmap(hvd, n, me):
    x = jnp.asarray(data(me, (4, 3), salt=40))
    for mode, fn in both(jax.vmap(lambda row: hvd.allreduce(row, op=hvd.Sum))):
        close(fn(x), reduce_ref(everyone(n, (4, 3), salt=40), hvd.Sum, hvd), f"{mode} vmap allreduce")
    for mode, fn in both(jax.vmap(hvd.allgather)):
        rows = everyone(n, (4, 3), salt=40)
        close(fn(x), np.stack([np.concatenate([d[b] for d in rows]) for b in range(4)]), f"{mode} vmap allgather")
    g = jax.vmap(jax.grad(lambda r: jnp.sum(hvd.allreduce(r, op=hvd.Sum) * 2.0)))(x)
    close(g, np.full((4, 3), 2.0 * n), "vmap of grad")


# -- errors ---------------------------------------------------------------------------------------------------------

def check_mismatched_shapes_fail_everywhere_with_the_engine_message(hvd, n, me):
    if n == 1:
        return
    with pytest.raises(hvd.TensorMismatchError) as eager:
        hvd.allreduce(jnp.ones(me + 1), name="mismatch")
    assert "Mismatched ALLREDUCE shape for tensor 'allreduce.mismatch'" in str(eager.value)
    with pytest.raises(jax.errors.JaxRuntimeError) as traced:
        jax.jit(lambda x: hvd.allreduce(x, name="mismatch"))(jnp.ones(me + 1)).block_until_ready()
    assert str(eager.value) in str(traced.value), str(traced.value)[-2000:]
    close(hvd.allreduce(jnp.ones(2), op=hvd.Sum, name="after"), np.full(2, float(n)), "the job goes on")
    if n == 3:   # 1, 2, 3 rows: the middle rank's share looks right, yet every rank must fail
        with pytest.raises(jax.errors.JaxRuntimeError, match="same first dimension"):
            jax.jit(hvd.allgather)(jnp.ones((me + 1, 2))).block_until_ready()


def check_argument_errors(hvd, n, me):
    with pytest.raises(ValueError, match="unsupported data type"):
        jax.jit(hvd.allreduce)(jnp.ones(2, jnp.uint32))
    with pytest.raises(ValueError, match="inside jax.jit"):
        jax.jit(lambda x: hvd.alltoall(x, splits=[1] * n)[0])(jnp.ones(n))
    with pytest.raises(RuntimeError):       # the shared policy's UnsupportedOperationError, as Horovod's torch
        hvd.reducescatter(jnp.ones(4), op=hvd.Max)
    with pytest.raises(ValueError):
        hvd.broadcast(jnp.ones(2), root_rank=n + 3)
    if n > 1:
        with pytest.raises(ValueError):
            hvd.alltoall(jnp.ones(2 * n + 1))
    hvd.barrier()


CHECKS = {name: fn for name, fn in sorted(globals().items()) if name.startswith("check_")}


def _run_all(world):
    import horovod.jax as hvd
    last, all_ranks = hvd.ProcessSet([world - 1]), hvd.ProcessSet(list(range(world)))
    hvd.init(process_sets=[last, all_ranks] if world > 1 else [last])
    if world == 1:
        all_ranks = last
    n, me = hvd.size(), hvd.rank()
    results = {}
    for name, fn in CHECKS.items():
        try:
            fn(hvd, n, me, (last, all_ranks)) if name == "check_process_sets" else fn(hvd, n, me)
            results[name] = None
        except Exception:  # reported per check by the test below
            results[name] = traceback.format_exc()
    hvd.shutdown()
    return results


@pytest.fixture(scope="module", params=WORLDS, ids=[f"{w}ranks" for w in WORLDS])
def results(request):
    return spawn_ranks(_run_all, request.param, timeout=240, args=(request.param,), env=ENV)


@pytest.mark.ranks
@pytest.mark.parametrize("check", list(CHECKS))
def test_jax_op(results, check):
    failures = [f"rank {rank}:\n{r[check]}" for rank, r in enumerate(results) if r[check] is not None]
    assert not failures, "\n".join(failures)
