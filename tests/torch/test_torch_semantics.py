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


# -- DistributedOptimizer(op=Adasum): Horovod's delta-based optimizer ------------------------------------------------

def _linear_problem(k, salt):
    return data(k, (4, 3), salt=salt), data(k, (4, 2), salt=salt + 1)


def check_adasum_optimizer(hvd, n, me):
    """Each rank steps SGD with momentum on its own gradient; the parameter deltas are combined with Adasum and
    added to the parameters before the step. Reference: numpy float64, per-rank momentum buffers, Horovod's Adasum
    of each parameter's deltas."""
    model = torch.nn.Linear(3, 2).double()
    with torch.no_grad():
        model.weight.copy_(data(99, (2, 3), salt=40))
        model.bias.copy_(data(99, (2,), salt=41))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5),
                                   named_parameters=model.named_parameters(), op=hvd.Adasum)
    if n & (n - 1):     # Horovod's CPU Adasum refuses a non-power-of-two count, at the first reduction
        x, y = _linear_problem(me, 42)
        with pytest.raises(NotImplementedError):
            (0.5 * ((model(x) - y) ** 2).sum()).backward()
            opt.step()
        return
    with pytest.raises(AssertionError):
        with opt.skip_synchronize():
            pass
    w, b = data(99, (2, 3), salt=40).numpy(), data(99, (2,), salt=41).numpy()
    bufs = [None] * n
    for step in range(3):
        x, y = _linear_problem(me, 42 + 2 * step)
        opt.zero_grad()
        (0.5 * ((model(x) - y) ** 2).sum()).backward()
        opt.step()
        deltas = []
        for k in range(n):
            xk, yk = (t.numpy() for t in _linear_problem(k, 42 + 2 * step))
            r = xk @ w.T + b - yk
            g = (r.T @ xk, r.sum(0))
            bufs[k] = g if bufs[k] is None else tuple(0.5 * m + gi for m, gi in zip(bufs[k], g))
            deltas.append(tuple(-0.1 * m for m in bufs[k]))
        w = w + horovod_adasum([d[0].ravel() for d in deltas]).reshape(w.shape)
        b = b + horovod_adasum([d[1] for d in deltas])
        same(model.weight, torch.from_numpy(w), f"weight after step {step}")
        same(model.bias, torch.from_numpy(b), f"bias after step {step}")


# -- sparse gradients -------------------------------------------------------------------------------------------------

def check_sparse_gradients_averaged_sparse(hvd, n, me):
    """``nn.Embedding(sparse=True)`` with SparseAdam: the gradient is averaged as a sparse tensor (indices and values
    gathered, values divided by the size), and the update equals SparseAdam on that average; also with
    ``sparse_as_dense=True``, where the dense average goes back to sparse for the update."""
    idx = [torch.tensor([k % 10, (3 * k + 1) % 10, 7]) for k in range(n)]
    wts = [data(k, (3, 3), salt=50) for k in range(n)]
    init = data(98, (10, 3), salt=51)
    dense = sum(torch.zeros(10, 3).double().index_add_(0, idx[k], wts[k]) for k in range(n)) / n
    rows_ = torch.unique(torch.cat(idx))
    ref = torch.nn.Parameter(init.clone())
    ref.grad = torch.sparse_coo_tensor(rows_[None], dense[rows_], (10, 3))
    torch.optim.SparseAdam([ref], lr=0.1).step()
    for as_dense in (False, True):
        emb = torch.nn.Embedding(10, 3, sparse=True).double()
        with torch.no_grad():
            emb.weight.copy_(init)
        opt = hvd.DistributedOptimizer(torch.optim.SparseAdam(emb.parameters(), lr=0.1),
                                       named_parameters=emb.named_parameters(), sparse_as_dense=as_dense)
        (emb(idx[me]) * wts[me]).sum().backward()
        opt.synchronize()
        assert emb.weight.grad.is_sparse, "the gradient the update sees is sparse"
        same(emb.weight.grad.to_dense(), dense, f"averaged sparse gradient (sparse_as_dense={as_dense})")
        with opt.skip_synchronize():
            opt.step()
        same(emb.weight, ref, f"SparseAdam update (sparse_as_dense={as_dense})")


# -- broadcast_optimizer_state --------------------------------------------------------------------------------------

def _state_snapshot(opt):
    params = [p for group in opt.param_groups for p in group["params"]]
    return {i: {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in opt.state[p].items()}
            for i, p in enumerate(params) if p in opt.state and opt.state[p]}


def _assert_state_equal(got, want, what):
    assert sorted(got) == sorted(want), f"{what}: parameters with state {sorted(got)} != root's {sorted(want)}"
    for i in want:
        assert sorted(got[i]) == sorted(want[i]), f"{what}: param {i} keys {sorted(got[i])} != {sorted(want[i])}"
        for key, value in want[i].items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(got[i][key], value), f"{what}: param {i} {key}"
            else:
                assert got[i][key] == value, f"{what}: param {i} {key}: {got[i][key]!r} != {value!r}"


class _LazyMomentum(torch.optim.Optimizer):
    """State created lazily, only for parameters that had a gradient, with a non-tensor entry."""

    def __init__(self, params, lr=0.1):
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                state["buf"] = state.get("buf", torch.zeros_like(p)) * 0.9 + p.grad
                state["seen"] = state.get("seen", 0) + 1
                p.sub_(group["lr"] * state["buf"])


def check_broadcast_optimizer_state_missing_grads(hvd, n, me):
    """The root trained with a layer that never gets a gradient (Adam leaves it stateless); the other ranks are
    fresh, or trained differently. Afterwards every rank's state is the root's: same entries, same values."""
    for make, root in ((lambda ps: torch.optim.Adam(ps, lr=0.01), 0), (lambda ps: _LazyMomentum(ps), n - 1)):
        torch.manual_seed(5)
        used, unused = torch.nn.Linear(3, 2).double(), torch.nn.Linear(3, 2).double()
        opt = make(list(used.parameters()) + list(unused.parameters()))
        for step in range(2 if me == root else me % 2):      # the root trains; some others too, one step
            opt.zero_grad()
            used(data(me, (4, 3), salt=60 + step)).sum().backward()
            opt.step()
        opt.param_groups[0]["lr"] = 0.5 if me == root else 0.25
        before = [p.detach().clone() for p in list(used.parameters()) + list(unused.parameters())]
        fresh = not opt.state
        hvd.broadcast_optimizer_state(opt, root_rank=root)
        want = hvd.broadcast_object(_state_snapshot(opt) if me == root else None, root_rank=root, name="want")
        _assert_state_equal(_state_snapshot(opt), want, type(opt).__name__)
        assert opt.param_groups[0]["lr"] == 0.5
        for p, q in zip(list(used.parameters()) + list(unused.parameters()), before):
            assert torch.equal(p.detach(), q), "parameters untouched"
        if fresh:   # Horovod's zero-gradient step gives every parameter a zero gradient
            assert all(p.grad is not None and not p.grad.any() for p in unused.parameters()), "zero gradients"
        else:
            assert all(p.grad is None for p in unused.parameters()), "a missing gradient stays missing"


def check_broadcast_optimizer_state_fresh_root(hvd, n, me):
    """A fresh root (state created lazily by one step on zero gradients, as Horovod does) and trained others: the
    others end with the root's freshly created state, for a plain and a distributed optimizer."""
    for distributed in (False, True):
        torch.manual_seed(6)
        model = torch.nn.Linear(3, 2).double()
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        if me != 0:
            model(data(me, (4, 3), salt=70)).sum().backward()
            opt.step()
            opt.zero_grad()
        if distributed:
            opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        want = hvd.broadcast_object(_state_snapshot(opt) if me == 0 else None, root_rank=0, name="want0")
        _assert_state_equal(_state_snapshot(opt), want, f"fresh root (distributed={distributed})")
        assert float(opt.state[model.weight]["step"]) == 1.0, "Horovod's zero-gradient step counts"


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
