"""horovod.torch against Horovod 0.28.1's semantics (issue 18 item 1), on 2, 3 and 4 spawned ranks.

Every expected value is derived here from Horovod's definitions with numpy/float64 references, not from this
project's output: the reducescatter gradient's scale, the errors' types, the grouped ops' gradients, optimizer-state
broadcast with missing gradients and lazily created state, sparse gradient averaging, the delta-based Adasum
optimizer, and Adasum's bits (Horovod's vector-halving distance-doubling as written in ``adasum.h``).

(No ``__init__.py`` in this folder: pytest would then import it as a package named ``torch``.)
"""

import traceback

import numpy as np
import pytest
import torch

from horovod.testing import spawn_ranks

from adasum_reference import horovod_adasum  # noqa: E402 (tests/torch is on sys.path under rootdir import mode)

WORLDS = (2, 3, 4)


def data(rank, shape, dtype=torch.float64, salt=0):
    g = torch.Generator().manual_seed(7919 * salt + rank)
    return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)


def rows(total, n, rank):
    """Horovod's reducescatter split: ranks below ``total % n`` get one extra row; returns (start, count)."""
    base, extra = divmod(total, n)
    return rank * base + min(rank, extra), base + (1 if rank < extra else 0)


def same(got, want, what=""):
    got, want = torch.as_tensor(got), torch.as_tensor(want)
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert torch.allclose(got.double(), want.double(), rtol=1e-12, atol=1e-12), f"{what}: {got} != {want}"


# -- reducescatter: the gradient's scale, the errors -----------------------------------------------------------------

def check_reducescatter_grad_ones(hvd, n, me):
    """Horovod's test: a cotangent of ones gives ``size`` on every input element for Sum, 1 for Average."""
    for op, want in ((hvd.Sum, float(n)), (hvd.Average, 1.0)):
        x = data(me, (4 * n, 3), salt=1).requires_grad_()
        y = hvd.reducescatter(x, op=op)
        y.backward(torch.ones_like(y))
        same(x.grad, torch.full((4 * n, 3), want), f"ones cotangent, op {op}")


def check_reducescatter_grad_weighted(hvd, n, me):
    """Uneven rows, a different cotangent on each rank, and scale factors: the allgather of the cotangents times
    (size for Sum, 1 for Average) times both factors."""
    for op in (hvd.Sum, hvd.Average):
        for pre, post in ((1.0, 1.0), (0.5, 3.0)):
            x = data(me, (5, 2), salt=2).requires_grad_()
            y = hvd.reducescatter(x, op=op, prescale_factor=pre, postscale_factor=post)
            w = [data(k, (rows(5, n, k)[1], 2), salt=3) for k in range(n)]
            (y * w[me]).sum().backward()
            want = torch.cat(w) * (n if op == hvd.Sum else 1) * pre * post
            same(x.grad, want, f"reducescatter grad op {op} pre {pre} post {post}")


def _raises_runtime_error(fn, what):
    try:
        fn()
    except RuntimeError as err:
        assert not isinstance(err, ValueError), f"{what}: {type(err).__name__} is a ValueError"
        return
    raise AssertionError(f"{what} did not raise")


def check_reducescatter_errors(hvd, n, me):
    scalar, matrix = torch.tensor(1.5, dtype=torch.float64), data(me, (2 * n, 2))
    _raises_runtime_error(lambda: hvd.reducescatter(scalar), "reducescatter of a 0-d tensor")
    _raises_runtime_error(lambda: hvd.reducescatter_async(scalar, op=hvd.Sum), "reducescatter_async of a 0-d tensor")
    _raises_runtime_error(lambda: hvd.grouped_reducescatter([matrix, scalar]), "grouped_reducescatter with a 0-d")
    _raises_runtime_error(lambda: hvd.grouped_reducescatter_async([scalar]), "grouped_reducescatter_async 0-d")
    _raises_runtime_error(lambda: hvd.reducescatter(matrix, op=hvd.Adasum), "reducescatter with Adasum")
    _raises_runtime_error(lambda: hvd.reducescatter_async(matrix, op=hvd.Adasum), "reducescatter_async Adasum")
    _raises_runtime_error(lambda: hvd.grouped_reducescatter([matrix], op=hvd.Adasum), "grouped Adasum")
    # the job goes on: nothing was submitted
    same(hvd.reducescatter(matrix, op=hvd.Sum), sum(data(k, (2 * n, 2)) for k in range(n))[2 * me:2 * me + 2])


# -- the grouped ops are differentiable ------------------------------------------------------------------------------

def check_grouped_allgather_grad(hvd, n, me):
    xs = [data(me, (me + 1, 2), salt=4).requires_grad_(), data(me, (2,), salt=5).requires_grad_()]
    outs = hvd.grouped_allgather(xs)
    same(outs[0], torch.cat([data(k, (k + 1, 2), salt=4) for k in range(n)]), "grouped_allgather forward")
    total = sum(k + 1 for k in range(n))
    u = [data(k, (total, 2), salt=6) for k in range(n)]
    v = [data(k, (2 * n,), salt=7) for k in range(n)]
    ((outs[0] * u[me]).sum() + (outs[1] * v[me]).sum()).backward()
    start = sum(k + 1 for k in range(me))
    same(xs[0].grad, (sum(u) / n)[start:start + me + 1], "grouped_allgather grad 0 (averaged, own rows)")
    same(xs[1].grad, (sum(v) / n)[2 * me:2 * me + 2], "grouped_allgather grad 1")


def check_grouped_reducescatter_grad(hvd, n, me):
    for op in (hvd.Sum, hvd.Average):
        xs = [data(me, (5, 2), salt=8).requires_grad_(), data(me, (2 * n + 1,), salt=9).requires_grad_()]
        outs = hvd.grouped_reducescatter(xs, op=op, postscale_factor=2.0)
        scale = (n if op == hvd.Sum else 1) * 2.0
        for i, (x, out) in enumerate(zip(xs, outs)):
            start, count = rows(x.shape[0], n, me)
            total = sum(data(k, tuple(x.shape), salt=8 + i) for k in range(n)) * 2.0 / (n if op == hvd.Average else 1)
            same(out, total[start:start + count], f"grouped_reducescatter forward {i} op {op}")
        ws = [[data(k, (rows(x.shape[0], n, k)[1],) + tuple(x.shape[1:]), salt=10 + i) for k in range(n)]
              for i, x in enumerate(xs)]
        sum((out * w[me]).sum() for out, w in zip(outs, ws)).backward()
        for i, x in enumerate(xs):
            same(x.grad, torch.cat(ws[i]) * scale, f"grouped_reducescatter grad {i} op {op}")


# -- Adasum: Horovod's bits, Horovod's rank counts ------------------------------------------------------------------

def _bits(t):
    return torch.as_tensor(t, dtype=torch.float64).numpy().view(np.int64)


def check_adasum_bits(hvd, n, me):
    """float64 Adasum equals Horovod's VHDD bit for bit (one tensor of several lengths, and a fused group of three);
    a non-power-of-two count raises NotImplementedError, as Horovod's CPU Adasum does."""
    if n & (n - 1):
        with pytest.raises(NotImplementedError):
            hvd.allreduce(data(me, (5,)), op=hvd.Adasum)
        return
    for length in (1, 2, 7, 1001, 4099):
        xs = [data(k, (length,), salt=20 + length) * 10.0 ** k + 0.3 for k in range(n)]   # unequal norms
        got = hvd.allreduce(xs[me], op=hvd.Adasum, name=f"adasum.{length}")
        want = horovod_adasum([x.numpy() for x in xs])
        assert np.array_equal(_bits(got), want.view(np.int64)), f"length {length}: {got} != {want}"
    shapes = [(3, 5), (1,), (17,)]
    group = [[data(k, s, salt=30 + i) * 10.0 ** k - 0.1 * k for i, s in enumerate(shapes)] for k in range(n)]
    got = hvd.grouped_allreduce(group[me], op=hvd.Adasum, name="adasum.group")
    want = horovod_adasum([np.concatenate([t.numpy().ravel() for t in g]) for g in group],
                          [int(np.prod(s)) for s in shapes])
    assert np.array_equal(np.concatenate([_bits(t).ravel() for t in got]), want.view(np.int64)), "fused group"


CHECKS = {name: fn for name, fn in sorted(globals().items()) if name.startswith("check_")}


def _run_all(only=None):
    import horovod.torch as hvd
    torch.set_num_threads(1)   # ranks share the machine's cores
    hvd.init()
    n, me = hvd.size(), hvd.rank()
    results = {}
    for name, fn in CHECKS.items():
        if only is not None and name not in only:
            continue
        try:
            fn(hvd, n, me)
            results[name] = None
        except Exception:  # reported per check by the test below
            results[name] = traceback.format_exc()
    hvd.shutdown()
    return results


@pytest.fixture(scope="module", params=WORLDS, ids=lambda w: f"{w}ranks")
def results(request):
    return spawn_ranks(_run_all, request.param, timeout=120)


@pytest.mark.ranks
@pytest.mark.parametrize("check", list(CHECKS))
def test_torch_semantics(results, check):
    failures = [f"rank {rank}:\n{r[check]}" for rank, r in enumerate(results) if r[check] is not None]
    assert not failures, "\n".join(failures)
