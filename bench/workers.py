"""The measuring side of the benchmark suite: one worker per implementation, the same measurements in each.

Every worker runs the same plan (ops × sizes, the many-small-tensors step) and rank 0 writes a JSON list of
``{"op", "bytes", "seconds"}`` rows. Ranks agree on iteration counts (rank 0 calibrates, then broadcasts) and report
the slowest rank's median, so every implementation is timed the same way.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

STEP_TENSORS = 200
STEP_BYTES = 4096
# "model": one synchronous step allreducing a model's gradients (sizes 2^10..2^21 and 12 biases: 4.2 M parameters,
# 16.8 MB of float32), no compute: what bench/crosshost.py measures for the scaling planner to predict.
MODEL_TENSORS = [1 << k for k in range(10, 22)] + [256] * 12


def sizes(max_bytes: int, min_bytes: int = 4, listed=None):
    if listed:
        yield from (n for n in listed if n <= max_bytes)
        return
    size = min_bytes
    while size <= max_bytes:
        yield size
        size *= 4 if size < (1 << 20) else 2


def _median_of(run, iters: int) -> float:
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def _measure(run, seconds: float, agree, slowest, warmups: int = 2, min_iters: int = 3) -> float:
    for _ in range(warmups):
        run()
    start = time.perf_counter()
    run()
    one = max(time.perf_counter() - start, 1e-7)
    iters = agree(int(min(1000, max(min_iters, seconds / one))))
    return slowest(_median_of(run, iters))


def _plan(plan, ops_for, agree, slowest, rank, size):
    rows = []
    # "warmups" and "min_iters" (2 and 3 unless the plan says): fewer where one op takes seconds (bench/scale.py)
    counts = {k: plan[k] for k in ("warmups", "min_iters") if k in plan}
    for op in plan["ops"]:
        if op == "model":
            run = ops_for("model", 0)
            rows.append({"op": "model", "bytes": 4 * sum(MODEL_TENSORS),
                         "seconds": _measure(run, plan["seconds"], agree, slowest, **counts)})
            continue
        if op == "step":
            run = ops_for("step", STEP_BYTES)
            rows.append({"op": "step", "bytes": STEP_TENSORS * STEP_BYTES,
                         "seconds": _measure(run, plan["seconds"], agree, slowest, **counts)})
            continue
        for nbytes in sizes(plan["max_bytes"], listed=plan.get("sizes")):
            run = ops_for(op, nbytes)
            seconds = _measure(run, plan["seconds"], agree, slowest, **counts)
            rows.append({"op": op, "bytes": nbytes, "seconds": seconds})
            if rank == 0:
                print(f"  {plan['impl']} {op} {nbytes} B: {rows[-1]['seconds'] * 1e6:.0f} us", file=sys.stderr,
                      flush=True)
    return rows


def horovod_ops(hvd, size):
    """The plan's operations through ``horovod.numpy``: ``ops_for(op, nbytes)`` returns a callable running one."""
    def ops_for(op, nbytes):
        count = max(1, nbytes // 4)
        if op == "allreduce":
            buf = np.ones(count, np.float32)
            return lambda: hvd.allreduce_(buf, op=hvd.Average, name="ar")
        if op == "allgather":
            buf = np.ones(max(1, count // size), np.float32)
            return lambda: hvd.allgather(buf, name="ag")
        if op == "broadcast":
            buf = np.ones(count, np.float32)
            return lambda: hvd.broadcast_(buf, 0, name="bc")
        bufs = [np.ones(n if op == "model" else count, np.float32)
                for n in (MODEL_TENSORS if op == "model" else [count] * STEP_TENSORS)]

        def step():
            handles = [hvd.allreduce_async_(b, op=hvd.Average, name=f"{op}{i}") for i, b in enumerate(bufs)]
            for h in handles:
                h.result()
        return step
    return ops_for


def horovod_sync(hvd):
    """``agree`` (rank 0's count, everywhere) and ``slowest`` (the largest value) through ``horovod.numpy``."""
    return (lambda n: int(hvd.broadcast(np.array([n]), 0, name="iters")[0]),
            lambda t: float(hvd.allreduce(np.array([t]), op=hvd.Max, name="slowest")[0]))


def horovod(plan) -> None:
    import horovod.numpy as hvd
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    rows = _plan(plan, horovod_ops(hvd, size), *horovod_sync(hvd), rank, size)
    if rank == 0:
        json.dump(rows, open(plan["out"], "w"))
    hvd.shutdown()


def horovod_torch_ops(hvd, size):
    """The plan's operations through ``horovod.torch`` (what torch users call): tensors, integer handles,
    ``synchronize``."""
    import torch

    def ops_for(op, nbytes):
        count = max(1, nbytes // 4)
        if op == "allreduce":
            buf = torch.ones(count)
            return lambda: hvd.allreduce_(buf, op=hvd.Average, name="ar")
        if op == "allgather":
            buf = torch.ones(max(1, count // size))
            return lambda: hvd.allgather(buf, name="ag")
        if op == "broadcast":
            buf = torch.ones(count)
            return lambda: hvd.broadcast_(buf, 0, name="bc")
        bufs = [torch.ones(count) for _ in range(STEP_TENSORS)]

        def step():
            handles = [hvd.allreduce_async_(b, op=hvd.Average, name=f"g{i}") for i, b in enumerate(bufs)]
            for h in handles:
                hvd.synchronize(h)
        return step
    return ops_for


def horovod_torch_sync(hvd):
    import torch
    return (lambda n: int(hvd.broadcast(torch.tensor([n]), 0, name="iters")[0]),
            lambda t: float(hvd.allreduce(torch.tensor([t], dtype=torch.float64), op=hvd.Max, name="slowest")[0]))


def horovod_torch(plan) -> None:
    """The same plan through ``horovod.torch``."""
    import torch
    import horovod.torch as hvd
    torch.set_num_threads(1)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    rows = _plan(plan, horovod_torch_ops(hvd, size), *horovod_torch_sync(hvd), rank, size)
    if rank == 0:
        json.dump(rows, open(plan["out"], "w"))
    hvd.shutdown()


def gloo_ops(dist, size):
    """The plan's operations through ``torch.distributed`` (an initialized process group)."""
    import torch

    def ops_for(op, nbytes):
        count = max(1, nbytes // 4)
        if op == "allreduce":
            buf = torch.ones(count)
            return lambda: dist.all_reduce(buf)
        if op == "allgather":
            buf = torch.ones(max(1, count // size))
            out = torch.empty(buf.numel() * size)
            return lambda: dist.all_gather_into_tensor(out, buf)
        if op == "broadcast":
            buf = torch.ones(count)
            return lambda: dist.broadcast(buf, 0)
        bufs = [torch.ones(count) for _ in range(STEP_TENSORS)]

        def step():
            works = [dist.all_reduce(b, async_op=True) for b in bufs]
            for w in works:
                w.wait()
        return step
    return ops_for


def ddp_step(count: int):
    """The step's peer that buckets as Horovod fuses: DistributedDataParallel's reducer over Gloo (an initialized
    process group), its default bucket caps, over ``STEP_TENSORS`` gradients of ``count`` float32.

    Returns ``(step, local)``: ``step`` is a backward pass that sets every gradient (to ones: the parameters are
    concatenated and summed, so autograd's work is one copy and a hook per parameter) and averages them through DDP's
    buckets; ``local`` is the same pass under ``no_sync()``, which reduces nothing. The reduction's time is the
    difference, which is what the ``horovod`` side's step (the 200 async allreduces, then wait) is set beside."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    class Gradients(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.grads = torch.nn.ParameterList(torch.nn.Parameter(torch.zeros(count)) for _ in range(STEP_TENSORS))

        def forward(self):
            return torch.cat(list(self.grads)).sum()

    model = DistributedDataParallel(Gradients())

    def step():
        model.zero_grad(set_to_none=True)
        model().backward()

    def local():
        with model.no_sync():
            step()
    return step, local


def gloo_sync(dist):
    import torch

    def agree(n):
        t = torch.tensor([n])
        dist.broadcast(t, 0)
        return int(t[0])

    def slowest(t):
        v = torch.tensor([t], dtype=torch.float64)
        dist.all_reduce(v, op=dist.ReduceOp.MAX)
        return float(v[0])
    return agree, slowest


def gloo(rank: int, size: int, port: int, plan, addr: str = "127.0.0.1") -> None:
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank, world_size=size)
    rows = _plan(plan, gloo_ops(dist, size), *gloo_sync(dist), rank, size)
    if rank == 0:
        json.dump(rows, open(plan["out"], "w"))
    dist.destroy_process_group()


def mpi(plan) -> None:
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()

    def ops_for(op, nbytes):
        count = max(1, nbytes // 4)
        if op == "allreduce":
            buf = np.ones(count, np.float32)
            out = np.empty_like(buf)
            return lambda: comm.Allreduce(buf, out, op=MPI.SUM)
        if op == "allgather":
            buf = np.ones(max(1, count // size), np.float32)
            out = np.empty(buf.size * size, np.float32)
            return lambda: comm.Allgather(buf, out)
        if op == "broadcast":
            buf = np.ones(count, np.float32)
            return lambda: comm.Bcast(buf, root=0)
        bufs = [np.ones(count, np.float32) for _ in range(STEP_TENSORS)]
        outs = [np.empty_like(b) for b in bufs]

        def step():
            MPI.Request.Waitall([comm.Iallreduce(b, o, op=MPI.SUM) for b, o in zip(bufs, outs)])
        return step

    rows = _plan(plan, ops_for, lambda n: comm.bcast(n, root=0), lambda t: comm.allreduce(t, op=MPI.MAX),
                 rank, size)
    if rank == 0:
        json.dump(rows, open(plan["out"], "w"))


if __name__ == "__main__":
    spec = json.loads(sys.argv[2])
    if sys.argv[1] == "gloo":   # gloo PLAN RANK SIZE ADDR PORT: one rank started by hand (bench/crosshost.py)
        gloo(int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[6]), spec, addr=sys.argv[5])
    else:
        {"horovod": horovod, "horovod-torch": horovod_torch, "mpi": mpi}[sys.argv[1]](spec)
