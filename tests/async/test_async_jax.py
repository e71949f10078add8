"""The asynchronous JAX wrappers on 2 spawned ranks: the same policy as torch and Keras on pytrees (LocalSGD and the
outer optimizer give the same bits after each averaging, stale gradients equal the reference, gossip pairs agree)."""

import numpy as np
import pytest

from horovod.testing import spawn_ranks


def _run():
    import jax
    import jax.numpy as jnp

    import horovod.jax as hvd
    hvd.init(process_sets="dynamic")
    try:
        def loss(params, x):
            return jnp.mean((x @ params["w"] + params["b"]) ** 2)
        jitted = jax.jit(jax.grad(loss))       # compiled once; the data vary by step and rank

        def grad(params, step, rank):
            return jitted(params, jax.random.normal(jax.random.PRNGKey(100 * step + rank), (4, 3)))

        def same(params):
            flat = np.concatenate([np.asarray(leaf).reshape(-1) for leaf in jax.tree_util.tree_leaves(params)])
            rows = np.asarray(hvd.allgather(flat[None]))
            return all(np.array_equal(rows[0], r) for r in rows[1:])

        init = {"w": jnp.ones((3, 2)), "b": jnp.zeros(2)}
        for wrapper, expect in ((hvd.LocalSGDOptimizer(period=2, warmup_steps=1), [False, False, False, True]),
                                (hvd.OuterOptimizer(period=2, compression="bf16"), [False, True, False, True]),
                                (hvd.GossipOptimizer("ring"), [True] * 4)):
            params, seen = init, []
            for step in range(4):
                params = wrapper.before_step(params)
                g = grad(params, step, hvd.rank())
                if getattr(wrapper, "in_warmup", lambda: False)():
                    g = wrapper.average_gradients(g)
                params = jax.tree_util.tree_map(lambda p, d: p - 0.1 * d, params, g)
                params = wrapper.after_step(params)
                seen.append(wrapper.averaged)
                assert not wrapper.averaged or same(params)
            assert seen == expect, (type(wrapper).__name__, seen)
            assert params["w"].dtype == init["w"].dtype
        stale, params, ref, previous = hvd.StaleGradients(1), init, init, None
        for step in range(4):
            averaged = stale.exchange(grad(params, step, hvd.rank()))
            if averaged is not None:
                params = jax.tree_util.tree_map(lambda p, d: p - 0.1 * d, params, averaged)
            mean = jax.tree_util.tree_map(lambda *gs: sum(gs) / hvd.size(),
                                          *[grad(ref, step, r) for r in range(hvd.size())])
            if previous is not None:
                ref = jax.tree_util.tree_map(lambda p, d: p - 0.1 * d, ref, previous)
            previous = mean
        assert max(float(jnp.abs(a - b).max()) for a, b in zip(jax.tree_util.tree_leaves(params),
                                                               jax.tree_util.tree_leaves(ref))) < 1e-6
    finally:
        hvd.shutdown()
    return True


@pytest.mark.ranks
def test_async_jax_two_ranks():
    pytest.importorskip("jax")
    assert spawn_ranks(_run, 2, timeout=180) == [True, True]
