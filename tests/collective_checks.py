"""Every collective × dtype × shape against a numpy reference, run on every rank.

Used by the spawned-ranks tier (tests/test_collectives.py) and the CLI tier (under the real ``horovodrun``). Each
rank derives every rank's input from a seed, so it can compute the exact expected result locally.
"""

import numpy as np

from horovod.common.bfloat16 import from_bfloat16, to_bfloat16

DTYPES = ["uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64"]
SHAPES = [(), (0,), (1,), (7,), (3, 5), (2, 3, 4)]


def make(dtype, shape, rank, salt=0):
    rng = np.random.default_rng(1000 * rank + salt)
    if dtype in ("float16", "float32", "float64"):
        return rng.uniform(-4, 4, size=shape).astype(dtype)
    if dtype == "bfloat16":
        return to_bfloat16(rng.uniform(-4, 4, size=shape))
    if dtype == "bool":
        return rng.integers(0, 2, size=shape).astype(bool)
    lo, hi = (0, 20) if dtype == "uint8" else (-20, 20)
    return rng.integers(lo, hi, size=shape).astype(dtype)


def as_f64(array, dtype):
    return from_bfloat16(array).astype(np.float64) if dtype == "bfloat16" else array.astype(np.float64)


def tolerance(dtype):
    return {"float16": 2e-2, "bfloat16": 6e-2, "float32": 1e-5, "float64": 1e-12}.get(dtype, 0)


class Checker:
    def __init__(self, hvd):
        self.hvd = hvd
        self.failures = []
        self.count = 0

    def close(self, what, got, want, dtype):
        self.count += 1
        got64, want64 = as_f64(np.asarray(got), dtype), np.asarray(want, dtype=np.float64)
        if got64.shape != want64.shape:
            self.failures.append(f"{what}: shape {got64.shape} != {want64.shape}")
        elif not np.allclose(got64, want64, rtol=tolerance(dtype), atol=tolerance(dtype) * 4):
            self.failures.append(f"{what}: max error {np.max(np.abs(got64 - want64)) if got64.size else 0}")


def reference_reduce(dtype, shape, size, op, salt):
    inputs = [as_f64(make(dtype, shape, r, salt), dtype) for r in range(size)]
    if op == "sum":
        return np.sum(inputs, axis=0)
    if op == "average":
        total = np.sum(inputs, axis=0) / size
        return np.trunc(total) if dtype not in ("float16", "bfloat16", "float32", "float64") else total
    if op == "min":
        return np.min(inputs, axis=0)
    if op == "max":
        return np.max(inputs, axis=0)
    return np.prod(inputs, axis=0)


def _overflows(dtype, opname, size):
    """Whether ``size`` ranks' inputs (|x| < 20) can leave an integer dtype's range: the float reference does not
    wrap (larger world sizes than the 1-4 ranks these checks were written for)."""
    if not dtype.startswith(("int", "uint")):
        return False
    limit = np.iinfo(dtype).max
    if opname in ("sum", "average"):
        return 20 * size > limit
    return opname == "product" and 20.0 ** size > limit


def check_allreduce(c, ranks=None, process_set=None):
    hvd = c.hvd
    size = hvd.size() if ranks is None else len(ranks)
    kw = {} if process_set is None else {"process_set": process_set}
    ops = {"sum": hvd.Sum, "average": hvd.Average, "min": hvd.Min, "max": hvd.Max, "product": hvd.Product}
    handles = []
    salt = 0
    for dtype in DTYPES:
        for shape in SHAPES:
            for opname, op in ops.items():
                salt += 1
                if opname == "product" and dtype in ("int8", "uint8", "int16", "float16", "bfloat16") \
                        or _overflows(dtype, opname, size):
                    continue   # overflow in the reference, not a property of the op
                me = hvd.rank() if ranks is None else ranks.index(hvd.rank())
                x = make(dtype, shape, me, salt)
                extra = {"dtype": "bfloat16"} if dtype == "bfloat16" else {}
                handles.append((f"allreduce {dtype}{shape} {opname}", dtype, shape, opname, salt,
                                hvd.allreduce_async(x, name=f"ar.{dtype}.{shape}.{opname}", op=op, **extra, **kw)))
    # Submit the waits in a rank-dependent order: negotiation must not care.
    order = list(range(len(handles)))
    if hvd.rank() % 2:
        order.reverse()
    for i in order:
        what, dtype, shape, opname, salt, h = handles[i]
        c.close(what, h.result(), reference_reduce(dtype, shape, size, opname, salt), dtype)


def check_scaling_and_inplace(c):
    hvd = c.hvd
    n = hvd.size()
    x = make("float32", (10,), hvd.rank(), 77)
    got = hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0, name="scaled")
    c.close("prescale/postscale", got, 1.5 * reference_reduce("float32", (10,), n, "sum", 77), "float32")
    y = x.copy()
    hvd.allreduce_(y, op=hvd.Average, name="inplace")
    c.close("in-place average", y, reference_reduce("float32", (10,), n, "average", 77), "float32")
    a = [make("float64", (3,), hvd.rank(), 80 + i) for i in range(3)]
    outs = hvd.grouped_allreduce(a, op=hvd.Sum, name="grp")
    for i, out in enumerate(outs):
        c.close(f"grouped allreduce {i}", out, reference_reduce("float64", (3,), n, "sum", 80 + i), "float64")


def check_large(c):
    """Larger than the fusion threshold the test sets (HOROVOD_FUSION_THRESHOLD=64 KiB in these tests)."""
    hvd = c.hvd
    n = hvd.size()
    handles = [hvd.allreduce_async(make("float32", (50_000 + i,), hvd.rank(), 200 + i), op=hvd.Sum,
                                   name=f"big{i}") for i in range(3)]
    for i, h in enumerate(handles):
        c.close(f"large allreduce {i}", h.result(), reference_reduce("float32", (50_000 + i,), n, "sum", 200 + i),
                "float32")


def check_allgather(c):
    hvd = c.hvd
    n, me = hvd.size(), hvd.rank()
    salt = 500
    for dtype in DTYPES + ["bool"]:
        for trailing in [(), (3,), (2, 2)]:
            salt += 1
            rows = lambda r: (r % 3) + (0 if dtype != "int32" else 1)   # includes ranks sending 0 rows
            x = make(dtype, (rows(me),) + trailing, me, salt)
            extra = {"dtype": "bfloat16"} if dtype == "bfloat16" else {}
            got = hvd.allgather(x, name=f"ag.{dtype}.{trailing}", **extra)
            want = np.concatenate([make(dtype, (rows(r),) + trailing, r, salt) for r in range(n)])
            c.close(f"allgather {dtype}{trailing}", got, as_f64(want, dtype), dtype)
    got = hvd.grouped_allgather([np.full((me + 1,), me, np.int64), np.full((1, 2), me, np.float32)], name="gag")
    c.close("grouped allgather 0", got[0], np.concatenate([np.full((r + 1,), r) for r in range(n)]), "int64")
    c.close("grouped allgather 1", got[1], np.concatenate([np.full((1, 2), r) for r in range(n)]), "float32")


def broadcast_roots(n):
    """Every rank up to 8 ranks; above, the first and last four positions and the middle ones. A broadcast per root,
    dtype and shape on every rank is n^2 work across the job: at 32 ranks every root was 1,920 broadcasts, 130 of
    rank 0's 140 s in this suite."""
    if n <= 8:
        return list(range(n))
    return sorted({0, 1, 2, 3, n // 2 - 1, n // 2, n - 2, n - 1})


def broadcast_shapes(n, root):
    """Small shapes from every root; the chunked ones (262_394 float32 = 1 MiB + 1000 B: chunks and a small tail)
    from every root up to 8 ranks and from the first and last above: at 32 ranks they took 32 of the test's 75 CPU-s
    (every rank building and checking 2 MiB per dtype and root), and a third root shows nothing the first two do not."""
    small = [(), (0,), (5,), (2, 3)]
    return small + [(300_000,), (262_394,)] if n <= 8 or root in (0, n - 1) else small


def check_broadcast(c):
    hvd = c.hvd
    n, me = hvd.size(), hvd.rank()
    for root in broadcast_roots(n):
        for dtype in DTYPES + ["bool"]:
            for shape in broadcast_shapes(n, root):
                x = make(dtype, shape, me, root)
                extra = {"dtype": "bfloat16"} if dtype == "bfloat16" else {}
                got = hvd.broadcast(x, root_rank=root, name=f"bc.{root}.{dtype}.{shape}", **extra)
                c.close(f"broadcast root {root} {dtype}{shape}", got, as_f64(make(dtype, shape, root, root), dtype),
                        dtype)
    y = make("float32", (4,), me, 5)
    hvd.broadcast_(y, root_rank=n - 1, name="bc_inplace")
    c.close("in-place broadcast", y, make("float32", (4,), n - 1, 5), "float32")
    c.count += 1
    if hvd.broadcast_object({"from": me, "list": [1, 2]}, root_rank=n - 1) != {"from": n - 1, "list": [1, 2]}:
        c.failures.append("broadcast_object")
    c.count += 1
    if hvd.allgather_object(("r", me)) != [("r", r) for r in range(n)]:
        c.failures.append("allgather_object")


def check_alltoall(c):
    hvd = c.hvd
    n, me = hvd.size(), hvd.rank()
    for dtype in ["int32", "float32", "bfloat16", "uint8"]:
        # rank r sends (r + j) % 3 rows to rank j
        splits = [(me + j) % 3 for j in range(n)]
        x = make(dtype, (sum(splits), 2), me, 9)
        extra = {"dtype": "bfloat16"} if dtype == "bfloat16" else {}
        out, received = hvd.alltoall(x, splits=splits, name=f"a2a.{dtype}", **extra)
        want = []
        for r in range(n):
            theirs = [(r + j) % 3 for j in range(n)]
            start = sum(theirs[:me])
            want.append(make(dtype, (sum(theirs), 2), r, 9)[start:start + theirs[me]])
        c.close(f"alltoall {dtype}", out, as_f64(np.concatenate(want), dtype), dtype)
        c.count += 1
        if list(received) != [(r + me) % 3 for r in range(n)]:
            c.failures.append(f"alltoall received splits {list(received)}")
    out = hvd.alltoall(np.arange(2 * n) + 100 * me, name="a2a.even")
    out = out[0] if isinstance(out, tuple) else out
    c.close("alltoall even", out, np.concatenate([[100 * r + 2 * me, 100 * r + 2 * me + 1] for r in range(n)]),
            "int64")


def check_reducescatter(c):
    hvd = c.hvd
    n, me = hvd.size(), hvd.rank()
    for dtype in ["int32", "float32", "float16", "bfloat16", "float64"]:
        for dim0 in [n, 2 * n + 1, 1, 7]:
            for opname, op in (("sum", hvd.Sum), ("average", hvd.Average)):
                salt = dim0 * 10 + (opname == "sum")
                x = make(dtype, (dim0, 3), me, salt)
                extra = {"dtype": "bfloat16"} if dtype == "bfloat16" else {}
                got = hvd.reducescatter(x, op=op, name=f"rs.{dtype}.{dim0}.{opname}", **extra)
                full = reference_reduce(dtype, (dim0, 3), n, opname, salt)
                base, extra_rows = divmod(dim0, n)
                rows = [base + (1 if r < extra_rows else 0) for r in range(n)]
                start = sum(rows[:me])
                c.close(f"reducescatter {dtype} dim0={dim0} {opname}", got, full[start:start + rows[me]], dtype)
    outs = hvd.grouped_reducescatter([make("float32", (2 * n, 2), me, 1), make("float32", (n,), me, 2)],
                                     op=hvd.Sum, name="grs")
    c.close("grouped reducescatter 0", outs[0], reference_reduce("float32", (2 * n, 2), n, "sum", 1)[2 * me:2 * me + 2],
            "float32")
    c.close("grouped reducescatter 1", outs[1], reference_reduce("float32", (n,), n, "sum", 2)[me:me + 1], "float32")


def check_bool_allreduce(c):
    hvd = c.hvd
    n, me = hvd.size(), hvd.rank()
    x = np.array([me == 0, True, False, me % 2 == 1])
    got = hvd.allreduce(x, op=hvd.Max, name="bool.max")
    c.close("bool max", got, np.array([True, True, False, n > 1]), "bool")
    got = hvd.allreduce(x, op=hvd.Min, name="bool.min")
    c.close("bool min", got, np.array([n == 1, True, False, n == 1 and False]), "bool")


def check_process_sets(c, subset_set, odd_set):
    hvd = c.hvd
    me = hvd.rank()
    if subset_set is not None and subset_set.included():
        check_allreduce_subset(c, subset_set)
    if odd_set is not None and odd_set.included():
        got = hvd.allgather(np.array([me]), name="ps.ag", process_set=odd_set)
        c.close("process set allgather", got, np.array(odd_set.ranks), "int64")
        got = hvd.broadcast(np.array([me]), root_rank=odd_set.ranks[-1], name="ps.bc", process_set=odd_set)
        c.close("process set broadcast", got, np.array([odd_set.ranks[-1]]), "int64")
    hvd.barrier()


def check_allreduce_subset(c, ps):
    hvd = c.hvd
    me = ps.ranks.index(hvd.rank())
    for dtype in ["float32", "int64"]:
        x = make(dtype, (6,), me, 31)
        got = hvd.allreduce(x, op=hvd.Sum, name=f"ps.ar.{dtype}", process_set=ps)
        c.close(f"process set allreduce {dtype}", got, reference_reduce(dtype, (6,), len(ps.ranks), "sum", 31), dtype)


def check_join(c):
    """Rank r runs r + 1 steps of allreduce, then joins; joined ranks contribute zeros."""
    hvd = c.hvd
    n, me = hvd.size(), hvd.rank()
    for step in range(me + 1):
        got = hvd.allreduce(np.ones(3, np.float32) * (1 + step), op=hvd.Sum, name=f"join.step{step}")
        active = [r for r in range(n) if r >= step]
        c.close(f"join step {step}", got, np.ones(3) * (1 + step) * len(active), "float32")
    last = hvd.join()
    c.count += 1
    if last != n - 1:
        c.failures.append(f"join returned {last}, expected {n - 1}")


def run_all(hvd, subset_set=None, odd_set=None):
    c = Checker(hvd)
    check_allreduce(c)
    check_scaling_and_inplace(c)
    check_large(c)
    check_bool_allreduce(c)
    check_allgather(c)
    check_broadcast(c)
    check_alltoall(c)
    check_reducescatter(c)
    check_process_sets(c, subset_set, odd_set)
    check_join(c)
    return c.count, c.failures


def main():
    """Entry point under horovodrun: prints a summary line and exits non-zero on any failure."""
    import sys
    import horovod.numpy as hvd
    hvd.init()
    n = hvd.size()
    subset = hvd.ProcessSet(list(range(0, n, 2)))
    odd = hvd.ProcessSet(list(range(1, n, 2))) if n > 1 else None
    hvd.shutdown()
    hvd.init(process_sets=[s for s in (subset, odd) if s is not None])
    count, failures = run_all(hvd, subset, odd)
    print(f"rank {hvd.rank()}: {count} checks, {len(failures)} failures", flush=True)
    for failure in failures[:20]:
        print("FAIL", failure, flush=True)
    hvd.shutdown()
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
