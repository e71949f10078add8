"""horovod.torch collectives on 1 and 2 spawned ranks: every op and variant against a numpy/torch reference, autograd
against the analytic gradients, and the errors. One spawn per world size runs every check; each check is reported as
its own test. The checks hold at any world size.

(No ``__init__.py`` in this folder: pytest would then import it as a package named ``torch``.)
"""

import traceback

import numpy as np
import pytest
import torch

from horovod.testing import spawn_ranks

WORLDS = (1, 2)
FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int32, torch.int64, torch.int8, torch.uint8]


def data(rank, shape, dtype=torch.float32, salt=0):
    g = torch.Generator().manual_seed(1009 * salt + rank)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    low = 0 if dtype == torch.uint8 else -10
    return torch.randint(low, 10, shape, generator=g).to(dtype)


def close(got, want, what=""):
    assert isinstance(got, torch.Tensor), f"{what}: got {type(got)}"
    want = torch.as_tensor(want)
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    tol = {torch.float16: 2e-2, torch.bfloat16: 6e-2, torch.float32: 1e-5}.get(got.dtype, 1e-10)
    g, w = got.to(torch.float64), want.to(torch.float64)
    assert torch.allclose(g, w, rtol=tol, atol=tol), f"{what}: {g} != {w}"


def all_data(n, shape, dtype, salt=0):
    return [data(r, shape, dtype, salt) for r in range(n)]


def reduce_ref(tensors, op, hvd):
    stack = torch.stack([t.to(torch.float64) for t in tensors])
    if op == hvd.Sum:
        return stack.sum(0)
    if op == hvd.Average:
        return stack.mean(0)
    if op == hvd.Min:
        return stack.min(0).values
    if op == hvd.Max:
        return stack.max(0).values
    return stack.prod(0)


# -- op checks ------------------------------------------------------------------------------------------------------

def check_allreduce_ops_and_dtypes(hvd, n, me):
    for dtype in FLOATS + INTS:
        for op in (hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product):
            if op == hvd.Average and not dtype.is_floating_point:
                continue
            x = data(me, (3, 4), dtype, salt=1)
            got = hvd.allreduce(x, op=op)
            assert got.dtype == dtype
            want = reduce_ref(all_data(n, (3, 4), dtype, salt=1), op, hvd)
            close(got, want.to(dtype) if not dtype.is_floating_point else want, f"{dtype} op {op}")
    flags = hvd.allreduce(torch.tensor([me == 0, False, True]), op=hvd.Max)
    assert flags.tolist() == [True, False, True]


def check_scale_factors(hvd, n, me):
    x = data(me, (5,), salt=2)
    got = hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0)
    close(got, 1.5 * reduce_ref(all_data(n, (5,), torch.float32, 2), hvd.Sum, hvd), "scaled")
    with pytest.warns(DeprecationWarning):
        close(hvd.allreduce(x, average=False), reduce_ref(all_data(n, (5,), torch.float32, 2), hvd.Sum, hvd))
    with pytest.raises(ValueError):
        hvd.allreduce(x, average=True, op=hvd.Sum)


def check_inplace_async_and_noncontiguous(hvd, n, me):
    ref = reduce_ref(all_data(n, (4, 6), torch.float32, 3), hvd.Sum, hvd)
    x = data(me, (4, 6), salt=3)
    assert hvd.allreduce_(x, op=hvd.Sum) is x
    close(x, ref, "allreduce_")
    base = data(me, (4, 6), salt=3)
    out = hvd.allreduce(base.t(), op=hvd.Sum, name="noncontig")
    close(out, ref.t(), "non-contiguous input")
    close(base, data(me, (4, 6), salt=3), "input untouched")
    view = base.t()
    assert hvd.allreduce_(view, op=hvd.Sum) is view
    close(base, ref, "non-contiguous in place writes through")
    handle = hvd.allreduce_async(data(me, (4, 6), salt=3), op=hvd.Sum, name="async")
    assert isinstance(hvd.poll(handle), bool)
    close(hvd.synchronize(handle), ref, "allreduce_async")
    assert hvd.synchronize(handle) is None
    y = data(me, (4, 6), salt=3)
    handle = hvd.allreduce_async_(y, op=hvd.Sum)
    assert hvd.synchronize(handle) is y
    close(y, ref, "allreduce_async_")
    scalar = hvd.allreduce(torch.tensor(float(me + 1)), op=hvd.Sum)
    assert scalar.shape == () and float(scalar) == n * (n + 1) / 2


def check_inplace_views_follow_the_tensor(hvd, n, me):
    # Fresh gradients every step (zero_grad(set_to_none=True)) land at addresses the cache has seen: each in-place
    # result must be that step's reduction, in that step's tensor.
    for step in range(4):
        grads = [data(me, (64,), salt=40 + step + i) for i in range(6)]
        handles = [hvd.allreduce_async_(g, op=hvd.Sum, name=f"fresh.{i}") for i, g in enumerate(grads)]
        for i, (g, h) in enumerate(zip(grads, handles)):
            assert hvd.synchronize(h) is g
            close(g, reduce_ref(all_data(n, (64,), torch.float32, 40 + step + i), hvd.Sum, hvd), f"step {step} #{i}")
        del grads, handles
    # The caller may drop its tensor before synchronize: the handle keeps it (the view does not own the memory).
    handle = hvd.allreduce_async_(data(me, (256,), salt=50), op=hvd.Max, name="dropped")
    litter = [torch.full((256,), -1.0) for _ in range(8)]     # would reuse the memory if the handle had let it go
    close(hvd.synchronize(handle), reduce_ref(all_data(n, (256,), torch.float32, 50), hvd.Max, hvd), "dropped")
    del litter
    # Same address, new shape, dtype or layout: a new view each time.
    t = data(me, (16,), salt=51)
    hvd.allreduce_(t, op=hvd.Sum, name="meta.a")
    t.resize_(8)
    t.copy_(data(me, (8,), salt=52))
    close(hvd.allreduce_(t, op=hvd.Sum, name="meta.b"), reduce_ref(all_data(n, (8,), torch.float32, 52), hvd.Sum, hvd),
          "resized")
    ints = data(me, (8,), torch.int32, salt=53)
    t.data = ints.view(torch.float32).view(torch.int32)      # the same memory seen as int32 again
    close(hvd.allreduce_(t, op=hvd.Max, name="meta.c"), reduce_ref(all_data(n, (8,), torch.int32, 53), hvd.Max, hvd),
          "dtype")
    square = data(me, (3, 3), salt=54)
    hvd.allreduce_(square, op=hvd.Sum, name="meta.d")
    square.copy_(data(me, (3, 3), salt=55))
    square.t_()                                               # same address, shape and dtype; not contiguous
    close(hvd.allreduce_(square, op=hvd.Sum, name="meta.e"),
          reduce_ref(all_data(n, (3, 3), torch.float32, 55), hvd.Sum, hvd).t(), "transposed in place")
    for dtype in (torch.bfloat16, torch.int64, torch.bool):
        x = data(me, (12,), dtype, salt=56)
        op = hvd.Max if dtype == torch.bool else hvd.Sum
        close(hvd.allreduce_(x, op=op, name=f"dt.{dtype}"), reduce_ref(all_data(n, (12,), dtype, 56), op, hvd).to(dtype),
              f"in place {dtype}")


def check_grouped_allreduce(hvd, n, me):
    shapes = [((3,), torch.float32), ((2, 2), torch.float64), ((5,), torch.bfloat16), ((4,), torch.int32)]
    make = lambda r: [data(r, s, d, salt=4 + i) for i, (s, d) in enumerate(shapes)]  # noqa: E731
    refs = [reduce_ref([make(r)[i] for r in range(n)], hvd.Sum, hvd) for i in range(len(shapes))]
    for got, want in zip(hvd.grouped_allreduce(make(me), op=hvd.Sum), refs):
        close(got, want.to(got.dtype), "grouped_allreduce")
    tensors = make(me)
    outs = hvd.grouped_allreduce_(tensors, op=hvd.Sum)
    assert all(a is b for a, b in zip(outs, tensors))
    for got, want in zip(tensors, refs):
        close(got, want.to(got.dtype), "grouped_allreduce_")
    outs = hvd.synchronize(hvd.grouped_allreduce_async(make(me), op=hvd.Sum, name="g"))
    for got, want in zip(outs, refs):
        close(got, want.to(got.dtype), "grouped_allreduce_async")
    tensors = make(me)
    hvd.synchronize(hvd.grouped_allreduce_async_(tensors, op=hvd.Sum))
    for got, want in zip(tensors, refs):
        close(got, want.to(got.dtype), "grouped_allreduce_async_")


def check_allgather(hvd, n, me):
    for dtype in FLOATS + INTS + [torch.bool]:
        got = hvd.allgather(data(me, (me + 1, 3), dtype, salt=5))
        assert got.dtype == dtype
        close(got, torch.cat([data(r, (r + 1, 3), dtype, salt=5) for r in range(n)]), f"allgather {dtype}")
    got = hvd.synchronize(hvd.allgather_async(data(me, (2, 2), salt=6).t()))
    close(got, torch.cat([data(r, (2, 2), salt=6).t() for r in range(n)]), "allgather_async non-contiguous")
    outs = hvd.grouped_allgather([data(me, (me + 1,), salt=7), data(me, (1, 2), torch.bfloat16, salt=8)])
    close(outs[0], torch.cat([data(r, (r + 1,), salt=7) for r in range(n)]), "grouped_allgather 0")
    close(outs[1], torch.cat([data(r, (1, 2), torch.bfloat16, salt=8) for r in range(n)]), "grouped_allgather 1")
    outs = hvd.synchronize(hvd.grouped_allgather_async([data(me, (2,), salt=9)]))
    close(outs[0], torch.cat([data(r, (2,), salt=9) for r in range(n)]), "grouped_allgather_async")


def check_broadcast(hvd, n, me):
    for root in range(n):
        for dtype in FLOATS + INTS + [torch.bool]:
            x = data(me, (2, 3), dtype, salt=10)
            got = hvd.broadcast(x, root)
            close(got, data(root, (2, 3), dtype, salt=10), f"broadcast {dtype} root {root}")
            close(x, data(me, (2, 3), dtype, salt=10), "broadcast leaves its input alone")
        x = data(me, (3,), torch.bfloat16, salt=11)
        assert hvd.broadcast_(x, root) is x
        close(x, data(root, (3,), torch.bfloat16, salt=11), "broadcast_")
        close(hvd.synchronize(hvd.broadcast_async(data(me, (3,), salt=12), root, name=f"b{root}")),
              data(root, (3,), salt=12), "broadcast_async")
        x = data(me, (3, 2), salt=13).t()
        hvd.synchronize(hvd.broadcast_async_(x, root))
        close(x, data(root, (3, 2), salt=13).t(), "broadcast_async_ non-contiguous")


def check_alltoall(hvd, n, me):
    x = data(me, (2 * n, 3), salt=14)
    got = hvd.alltoall(x)
    close(got, torch.cat([data(r, (2 * n, 3), salt=14)[2 * me:2 * me + 2] for r in range(n)]), "alltoall equal")
    split_of = lambda r: [1 + (r + i) % 2 for i in range(n)]  # noqa: E731
    x = data(me, (sum(split_of(me)), 2), torch.bfloat16, salt=15)
    got, received = hvd.alltoall(x, splits=torch.tensor(split_of(me), dtype=torch.int32))
    parts = [torch.split(data(r, (sum(split_of(r)), 2), torch.bfloat16, salt=15), split_of(r))[me] for r in range(n)]
    close(got, torch.cat(parts), "alltoall splits")
    assert received.dtype == torch.int32 and received.tolist() == [split_of(r)[me] for r in range(n)]
    got, received = hvd.synchronize(hvd.alltoall_async(data(me, (n, 1), salt=16)))
    close(got, torch.cat([data(r, (n, 1), salt=16)[me:me + 1] for r in range(n)]), "alltoall_async")


def _rows(total, n, rank):
    base, extra = divmod(total, n)
    start = rank * base + min(rank, extra)
    return start, base + (1 if rank < extra else 0)


def check_reducescatter(hvd, n, me):
    start, count = _rows(5, n, me)
    for op in (hvd.Sum, hvd.Average):
        for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
            got = hvd.reducescatter(data(me, (5, 2), dtype, salt=17), op=op)
            want = reduce_ref(all_data(n, (5, 2), dtype, 17), op, hvd)[start:start + count]
            close(got, want, f"reducescatter {dtype} {op}")
    got = hvd.synchronize(hvd.reducescatter_async(data(me, (5, 2), salt=17), op=hvd.Sum, prescale_factor=2.0))
    close(got, 2 * reduce_ref(all_data(n, (5, 2), torch.float32, 17), hvd.Sum, hvd)[start:start + count], "async")
    outs = hvd.grouped_reducescatter([data(me, (5, 2), salt=17), data(me, (5,), torch.float64, salt=18)],
                                     op=hvd.Sum)
    close(outs[0], reduce_ref(all_data(n, (5, 2), torch.float32, 17), hvd.Sum, hvd)[start:start + count], "g0")
    close(outs[1], reduce_ref(all_data(n, (5,), torch.float64, 18), hvd.Sum, hvd)[start:start + count], "g1")
    outs = hvd.synchronize(hvd.grouped_reducescatter_async([data(me, (5,), salt=19)], op=hvd.Average))
    close(outs[0], reduce_ref(all_data(n, (5,), torch.float32, 19), hvd.Average, hvd)[start:start + count], "ga")


def check_process_sets(hvd, n, me, sets):
    last, everyone = sets
    assert hvd.global_process_set.size() == n and everyone.size() == n
    x = data(me, (3,), salt=20)
    if last.included():
        # Named: unnamed ops are numbered per op over all sets, so only this rank's counter would advance.
        close(hvd.allreduce(x, op=hvd.Sum, name="one", process_set=last), x, "allreduce on a one-rank set")
        close(hvd.allgather(x, name="one", process_set=last), x, "allgather on a one-rank set")
        assert last.rank() == 0 and last.size() == 1
    else:
        assert last.rank() is None
    close(hvd.allreduce(x, op=hvd.Sum, process_set=everyone),
          reduce_ref(all_data(n, (3,), torch.float32, 20), hvd.Sum, hvd), "allreduce on a registered set")
    close(hvd.broadcast(x, n - 1, process_set=everyone), data(n - 1, (3,), salt=20), "broadcast on a set")
    hvd.barrier(process_set=everyone)


def check_objects_barrier_join(hvd, n, me):
    assert hvd.broadcast_object({"rank": me, "s": "x" * me}, root_rank=n - 1) == {"rank": n - 1, "s": "x" * (n - 1)}
    assert hvd.allgather_object(("r", me)) == [("r", r) for r in range(n)]
    hvd.barrier()
    if me == 0:
        got = hvd.allreduce(torch.ones(3), op=hvd.Sum, name="while_others_joined")
        close(got, torch.ones(3), "joined ranks contribute zeros")
    assert hvd.join() in range(n)


def check_sparse(hvd, n, me):
    def sparse(r):
        return torch.sparse_coo_tensor(torch.tensor([[r, (r + 1) % 3]]), torch.tensor([[1.0, 2.0], [3.0, r]]), (3, 2))
    want = sum(sparse(r).to_dense() for r in range(n))
    close(hvd.sparse_allreduce_async(sparse(me), "sp", hvd.Sum)().to_dense(), want, "sparse sum")
    close(hvd.sparse_allreduce_async(sparse(me), "sp", hvd.Average)().to_dense(), want / n, "sparse average")


def check_compression(hvd, n, me):
    x = data(me, (6,), salt=21)
    want = reduce_ref(all_data(n, (6,), torch.float32, 21), hvd.Sum, hvd)
    for compression, tol in ((hvd.Compression.fp16, 1e-2), (hvd.Compression.bf16, 5e-2)):
        wire, ctx = compression.compress(x)
        assert wire.dtype in (torch.float16, torch.bfloat16) and compression.decompress(wire, ctx).dtype == x.dtype
        got = hvd.allreduce(x, op=hvd.Sum, compression=compression)
        assert got.dtype == torch.float32
        assert torch.allclose(got.double(), want, atol=tol * 4, rtol=tol), (got, want)
        ints = torch.arange(3, dtype=torch.int64)
        assert compression.compress(ints)[0] is ints
    got = hvd.reducescatter(data(me, (4,), salt=22), compression=hvd.Compression.fp16, op=hvd.Sum)
    assert got.dtype == torch.float32


def _pending_name_refused(hvd, n, me):
    """A second submission of a name still pending raises ValueError. With other ranks the name stays pending on
    rank 0 until they submit it after a barrier (as tests/test_error_soak.py). A rank alone cannot hold it: its engine
    may complete the first before the second comes (a loaded machine deschedules the caller between the two, as one
    run of the suite did), so it tries again with a new name, up to 50 times."""
    if n > 1:
        if me == 0:
            handle = hvd.allreduce_async(torch.ones(2), name="dup")
            with pytest.raises(ValueError, match="Duplicate tensor name"):
                hvd.allreduce_async(torch.ones(2), name="dup")
        hvd.barrier()
        if me == 0:
            hvd.synchronize(handle)
        else:
            hvd.allreduce(torch.ones(2), name="dup")
        return
    for attempt in range(50):
        handle = hvd.allreduce_async(torch.ones(2), name=f"dup.{attempt}")
        try:
            second = hvd.allreduce_async(torch.ones(2), name=f"dup.{attempt}")
        except ValueError as exc:
            assert "Duplicate tensor name" in str(exc)
            hvd.synchronize(handle)
            return
        hvd.synchronize(handle)
        hvd.synchronize(second)
    pytest.fail("a name still pending was never refused in 50 tries")


def check_errors(hvd, n, me):
    from horovod.common.exceptions import HorovodInternalError  # noqa: F401 (the family of synchronize errors)
    if n > 1:   # ranks can disagree only where there are several
        with pytest.raises(RuntimeError):
            hvd.allreduce(torch.ones(me + 1), name="mismatched_shape")
        with pytest.raises(RuntimeError):
            hvd.allreduce(torch.ones(2, dtype=torch.float32 if me == 0 else torch.float64), name="mismatched_dtype")
        with pytest.raises(ValueError):
            hvd.alltoall(torch.ones(2 * n + 1))
    _pending_name_refused(hvd, n, me)
    with pytest.raises(ValueError, match=r"\.cpu\(\)"):
        hvd.allreduce(torch.empty(2, device="meta"))
    with pytest.raises(RuntimeError):       # Horovod's type (see test_torch_semantics.py)
        hvd.reducescatter(torch.ones(4), op=hvd.Max)
    with pytest.raises(TypeError, match="prescale_factor"):
        hvd.allreduce(torch.ones(2), prescale_factor="2")
    with pytest.raises(ValueError):
        hvd.broadcast(torch.ones(2), root_rank=n + 3)
    with pytest.raises(TypeError):
        hvd.allreduce([1.0, 2.0])
    hvd.barrier()


# -- autograd checks (the objective is the sum of every rank's loss, except where Horovod averages) ---------------

def check_autograd_allreduce(hvd, n, me):
    for op, pre, post in ((hvd.Sum, 1.0, 1.0), (hvd.Average, 1.0, 1.0), (hvd.Sum, 0.5, 4.0)):
        x = data(me, (3,), salt=30).requires_grad_()
        (hvd.allreduce(x, op=op, prescale_factor=pre, postscale_factor=post) * data(me, (3,), salt=31)).sum().backward()
        weights = torch.stack(all_data(n, (3,), torch.float32, 31)).sum(0)
        close(x.grad, weights * pre * post / (n if op == hvd.Average else 1), f"allreduce grad op {op}")


def check_autograd_grouped_allreduce(hvd, n, me):
    a, b = data(me, (2,), salt=32).requires_grad_(), data(me, (3,), salt=33).requires_grad_()
    ya, yb = hvd.grouped_allreduce([a, b], op=hvd.Sum)
    ((ya * data(me, (2,), salt=34)).sum() + (yb * data(me, (3,), salt=35)).sum()).backward()
    close(a.grad, torch.stack(all_data(n, (2,), torch.float32, 34)).sum(0), "grouped grad a")
    close(b.grad, torch.stack(all_data(n, (3,), torch.float32, 35)).sum(0), "grouped grad b")


def check_autograd_allgather(hvd, n, me):
    total = n * (n + 1) // 2
    x = data(me, (me + 1, 2), salt=36).requires_grad_()
    (hvd.allgather(x) * data(me, (total, 2), salt=37)).sum().backward()
    start = me * (me + 1) // 2
    mean_w = torch.stack(all_data(n, (total, 2), torch.float32, 37)).mean(0)
    close(x.grad, mean_w[start:start + me + 1], "allgather grad (Horovod averages)")


def check_autograd_broadcast(hvd, n, me):
    root = n - 1
    x = data(me, (4,), salt=38).requires_grad_()
    (hvd.broadcast(x, root) * data(me, (4,), salt=39)).sum().backward()
    want = torch.stack(all_data(n, (4,), torch.float32, 39)).mean(0) if me == root else torch.zeros(4)
    close(x.grad, want, "broadcast grad")


def check_autograd_alltoall(hvd, n, me):
    x = data(me, (2 * n, 2), salt=40).requires_grad_()
    (hvd.alltoall(x) * data(me, (2 * n, 2), salt=41)).sum().backward()
    want = torch.cat([data(k, (2 * n, 2), salt=41)[2 * me:2 * me + 2] for k in range(n)])
    close(x.grad, want, "alltoall grad")
    split_of = lambda r: [1 + (r + i) % 2 for i in range(n)]  # noqa: E731
    x = data(me, (sum(split_of(me)), 1), salt=42).requires_grad_()
    out, _ = hvd.alltoall(x, splits=split_of(me))
    (out * torch.arange(out.shape[0], dtype=torch.float32).view(-1, 1)).sum().backward()
    want = []
    for k in range(n):   # rows sent to rank k land there after the rows from ranks < me
        offset = sum(split_of(r)[k] for r in range(me))
        want.append(torch.arange(offset, offset + split_of(me)[k], dtype=torch.float32).view(-1, 1))
    close(x.grad, torch.cat(want), "alltoall splits grad")


def check_autograd_reducescatter(hvd, n, me):
    for op in (hvd.Sum, hvd.Average):
        x = data(me, (5, 2), salt=43).requires_grad_()
        y = hvd.reducescatter(x, op=op)
        (y * data(me, tuple(y.shape), salt=44)).sum().backward()
        want = torch.cat([data(k, (_rows(5, n, k)[1], 2), salt=44) for k in range(n)])
        close(x.grad, want * (n if op == hvd.Sum else 1), f"reducescatter grad {op} (Horovod: size for Sum)")


CHECKS = {name: fn for name, fn in sorted(globals().items()) if name.startswith("check_")}


def _process_sets(hvd, world):
    """The last rank alone, and every rank (the global set itself at world size 1, where both are [0])."""
    last, everyone = hvd.ProcessSet([world - 1]), hvd.ProcessSet(list(range(world)))
    return [last, everyone] if world > 1 else [last]


def _run_all(world, only=None):
    import horovod.torch as hvd
    from horovod.runtime import basics
    torch.set_num_threads(1)   # ranks share the machine's cores
    hvd.init(process_sets=_process_sets(hvd, world))
    sets = _registered_sets(hvd, world)
    n, me = hvd.size(), hvd.rank()
    results = {}
    for name, fn in CHECKS.items():
        if only is not None and name not in only:
            continue
        try:
            fn(hvd, n, me, sets) if name == "check_process_sets" else fn(hvd, n, me)
            results[name] = None
        except Exception:  # reported per check by the test below
            results[name] = traceback.format_exc()
    plane = basics.context().engine.device_plane    # what the device plane carried, where the job has one
    results["_plane_stats"] = dict(plane.stats) if plane is not None else None
    hvd.shutdown()
    return results


def _registered_sets(hvd, world):
    from horovod.runtime import basics
    ids = basics._get_process_set_ids_and_ranks()
    sets = _process_sets(hvd, world)
    for set_id, ps in enumerate(sets, start=1):
        ps.process_set_id = set_id
        assert ids[set_id] == ps.ranks, ids
    return sets[0], sets[-1] if world > 1 else hvd.global_process_set


@pytest.fixture(scope="module", params=WORLDS, ids=lambda w: f"{w}ranks")
def results(request):
    return spawn_ranks(_run_all, request.param, timeout=90, args=(request.param,))


@pytest.mark.ranks
@pytest.mark.parametrize("check", list(CHECKS))
def test_torch_op(results, check):
    failures = [f"rank {rank}:\n{r[check]}" for rank, r in enumerate(results) if r[check] is not None]
    assert not failures, "\n".join(failures)


@pytest.mark.unit
def test_non_cpu_tensor_error_needs_no_init():
    import horovod.torch as hvd
    with pytest.raises(ValueError, match="CPU"):
        hvd.allreduce_async(torch.empty(1, device="meta"))
