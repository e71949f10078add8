"""Allreduce latency and bus bandwidth: horovod-py beside torch.distributed (Gloo), in one run.

    python bench/allreduce.py [--np 2] [--max-mib 256] [--json out.json]

Bus bandwidth as nccl-tests define it: algbw × 2(n−1)/n, algbw = bytes / time. Each size runs a few warm-up
iterations, then enough timed iterations to fill about ``--seconds`` (at least 3); the median is reported.
This is a benchmark, not a test: it asserts nothing about time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def sizes_bytes(max_mib: int):
    size = 4
    while size <= max_mib * 1024 * 1024:
        yield size
        size *= 4 if size < 1024 * 1024 else 2


def _time_op(run, seconds: float):
    for _ in range(3):
        run()
    times = []
    deadline = time.perf_counter() + seconds
    while len(times) < 3 or (time.perf_counter() < deadline and len(times) < 2000):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def _agree(times_fn, value: float) -> float:
    """All ranks report the slowest rank's median (every rank must run the same number of iterations)."""
    return times_fn(value)


def worker_horovod(args) -> None:
    import horovod.numpy as hvd
    hvd.init()
    results = []
    for nbytes in sizes_bytes(args.max_mib):
        buf = np.ones(max(1, nbytes // 4), dtype=np.float32)
        # ranks must run the same iteration count: rank 0 decides it from a calibration run, then broadcasts it
        iters = _calibrate(lambda: hvd.allreduce_(buf, op=hvd.Average, name="bench"), args.seconds,
                           lambda n: int(hvd.broadcast(np.array([n]), 0, name="iters")[0]))
        t = _fixed(lambda: hvd.allreduce_(buf, op=hvd.Average, name="bench"), iters)
        t = float(hvd.allreduce(np.array([t]), op=hvd.Max, name="tmax")[0])
        results.append({"bytes": nbytes, "seconds": t})
    if hvd.rank() == 0:
        with open(args.out, "w") as handle:
            json.dump(results, handle)
    hvd.shutdown()


def _calibrate(run, seconds: float, agree) -> int:
    for _ in range(2):
        run()
    start = time.perf_counter()
    run()
    one = max(time.perf_counter() - start, 1e-6)
    return agree(int(min(2000, max(3, seconds / one))))


def _fixed(run, iters: int) -> float:
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def worker_gloo(rank: int, size: int, port: int, args) -> None:
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
    results = []
    for nbytes in sizes_bytes(args.max_mib):
        buf = torch.ones(max(1, nbytes // 4), dtype=torch.float32)

        def agree(n):
            t = torch.tensor([n])
            dist.broadcast(t, 0)
            return int(t[0])
        iters = _calibrate(lambda: dist.all_reduce(buf), args.seconds, agree)
        t = torch.tensor([_fixed(lambda: dist.all_reduce(buf), iters)], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        results.append({"bytes": nbytes, "seconds": float(t[0])})
    if rank == 0:
        with open(args.out, "w") as handle:
            json.dump(results, handle)
    dist.destroy_process_group()


def run_horovod(args, out: str):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "horovod.runner", "-np", str(args.np), sys.executable, __file__, "--worker",
           "horovod", "--out", out, "--max-mib", str(args.max_mib), "--seconds", str(args.seconds)]
    subprocess.run(cmd, check=True, env=env, timeout=1800)
    return json.load(open(out))


def run_gloo(args, out: str):
    import socket
    import torch.multiprocessing as mp
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    args.out = out
    mp.start_processes(worker_gloo, args=(args.np, port, args), nprocs=args.np, start_method="spawn")
    return json.load(open(out))


def busbw(nbytes: int, seconds: float, n: int) -> float:
    return nbytes / seconds * 2 * (n - 1) / n / 1e9


def human(nbytes: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--max-mib", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=0.5, help="timed seconds per size and implementation")
    parser.add_argument("--json", default=None, help="write the table as JSON here")
    parser.add_argument("--worker", choices=["horovod"], default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker == "horovod":
        return worker_horovod(args)
    with tempfile.TemporaryDirectory() as tmp:
        ours = run_horovod(args, os.path.join(tmp, "horovod.json"))
        gloo = run_gloo(args, os.path.join(tmp, "gloo.json"))
    rows = []
    print(f"allreduce, float32, {args.np} ranks; bus bandwidth GB/s = bytes/time x 2(n-1)/n")
    print(f"{'size':>10} | {'horovod-py':>12} {'busbw':>7} | {'torch gloo':>12} {'busbw':>7} | {'busbw ratio':>11}")
    for a, b in zip(ours, gloo):
        n = a["bytes"]
        ra, rb = busbw(n, a["seconds"], args.np), busbw(n, b["seconds"], args.np)
        rows.append({"bytes": n, "horovod_seconds": a["seconds"], "gloo_seconds": b["seconds"],
                     "horovod_busbw": ra, "gloo_busbw": rb, "ratio": ra / rb})
        print(f"{human(n):>10} | {a['seconds'] * 1e6:>10.0f}us {ra:>7.3f} | {b['seconds'] * 1e6:>10.0f}us {rb:>7.3f} |"
              f" {ra / rb:>10.2f}x")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"np": args.np, "rows": rows}, handle, indent=1)


if __name__ == "__main__":
    main()
