"""The small-message floor: a 4-byte allreduce through ``horovod.torch`` beside torch.distributed with Gloo.

    python bench/small_message.py [--np 2] [--rounds 7] [--iters 3000] [--ab OTHER_CHECKOUT ...] [--json OUT]

Both sides start the same way (``horovodrun -np N python small_message.py --worker SIDE``): the Gloo ranks read
their rank and size from the launcher's environment and meet on a port of their own. A round runs every side once,
in an order that rotates from round to round, each as a fresh job; a job times ``--iters`` blocking allreduces of
one float32 (``op=Average``) one by one and reports the median, and its rank's CPU time per op (the process's, all
threads): a rank whose CPU per op is close to its wall time per op is spinning a core while it waits.

Reported per side: the median over rounds of each round's median (slowest rank), the quartiles over rounds, CPU per
op; per round the ratio of each side to Gloo, and the median of those ratios. ``--ab`` adds the same horovod.torch
job run from another checkout (``git worktree add /tmp/hvd-old 1837082``), so a regression is measured in one run.

A benchmark, not a test: nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WARMUP = 300


def worker(side: str, iters: int, out: str, port: int) -> None:
    if os.environ.get("SMALL_MESSAGE_PIN"):     # before torch loads: one core per local rank, both sides alike
        os.sched_setaffinity(0, {int(os.environ["HOROVOD_LOCAL_RANK"]) % (os.cpu_count() or 1)})
    import torch
    torch.set_num_threads(1)
    tensor = torch.ones(1)
    if side == "gloo":
        import torch.distributed as dist
        rank, size = int(os.environ["HOROVOD_RANK"]), int(os.environ["HOROVOD_SIZE"])
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
        op = lambda: dist.all_reduce(tensor, op=dist.ReduceOp.AVG)  # noqa: E731
        barrier = dist.barrier
        finish = dist.destroy_process_group
    else:
        import horovod.torch as hvd
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        op = lambda: hvd.allreduce_(tensor, op=hvd.Average, name="small")  # noqa: E731
        barrier = hvd.barrier
        finish = hvd.shutdown
    for _ in range(WARMUP):
        op()
    barrier()
    times = []
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for _ in range(iters):
        start = time.perf_counter_ns()
        op()
        times.append(time.perf_counter_ns() - start)
    cpu = (time.process_time() - cpu0) / iters
    wall = (time.perf_counter() - wall0) / iters
    assert abs(float(tensor[0]) - 1.0) < 1e-6, f"rank {rank}: average of ones is {float(tensor[0])}"
    barrier()
    finish()
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"rank": rank, "median_us": statistics.median(times) / 1e3, "cpu_us": cpu * 1e6,
                   "wall_us": wall * 1e6}, f)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_side(side: str, root: str, np_: int, iters: int, workdir: str, extra_env=None) -> dict:
    """One job of ``side`` from the checkout ``root``; the slowest rank's median and the ranks' mean CPU per op."""
    out = os.path.join(workdir, f"{side}-{time.monotonic_ns()}")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]), **(extra_env or {}))
    cmd = [sys.executable, "-m", "horovod.runner", "-np", str(np_), sys.executable, os.path.abspath(__file__),
           "--worker", "gloo" if side == "gloo" else "horovod", "--iters", str(iters), "--out", out,
           "--port", str(_free_port())]
    subprocess.run(cmd, check=True, env=env, timeout=600, cwd=workdir, stdout=subprocess.DEVNULL)
    ranks = [json.load(open(f"{out}.{r}")) for r in range(np_)]
    return {"median_us": max(r["median_us"] for r in ranks),
            "cpu_us": statistics.mean(r["cpu_us"] for r in ranks),
            "wall_us": max(r["wall_us"] for r in ranks)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--iters", type=int, default=3000)
    parser.add_argument("--ab", action="append", default=[], help="another checkout to run beside this one")
    parser.add_argument("--pin", action="store_true",
                        help="pin each rank of every side to its own core (local rank modulo cores) before it loads "
                             "torch: two ranks the scheduler puts on one core take 3-5 times as long")
    parser.add_argument("--no-spin", action="store_true",
                        help="also run this checkout with HOROVOD_SPIN_US=0 (no rank polls while it waits)")
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.iters, args.out, args.port)
        return

    if args.pin:
        os.environ["SMALL_MESSAGE_PIN"] = "1"
    sides = [("this", ROOT, None)] + ([("this, spin 0", ROOT, {"HOROVOD_SPIN_US": "0"})] if args.no_spin else [])
    sides += [(f"ab:{os.path.basename(p.rstrip('/'))}", os.path.abspath(p), None) for p in args.ab]
    sides.append(("gloo", ROOT, None))
    results = {name: [] for name, _, _ in sides}
    with tempfile.TemporaryDirectory(prefix="hvd-small-") as workdir:
        for round_ in range(args.rounds):
            order = sides[round_ % len(sides):] + sides[:round_ % len(sides)]
            for name, root, extra_env in order:
                results[name].append(run_side("gloo" if name == "gloo" else "horovod", root, args.np, args.iters,
                                              workdir, extra_env))
            line = "  ".join(f"{name} {results[name][-1]['median_us']:.1f} us" for name, _, _ in sides)
            print(f"round {round_ + 1}/{args.rounds}: {line}", flush=True)

    def quart(values, q):
        values = sorted(values)
        return values[min(len(values) - 1, int(q * len(values)))]

    table = {}
    print(f"\n4 B allreduce (op=Average), np {args.np}, {args.rounds} rounds x {args.iters} ops, "
          f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores{', ranks pinned' if args.pin else ''}")
    print(f"{'side':<22}{'median us':>10}{'q25':>8}{'q75':>8}{'cpu us/op':>11}{'cpu/wall':>9}{'x gloo':>8}")
    for name, _, _ in sides:
        medians = [r["median_us"] for r in results[name]]
        ratios = [r["median_us"] / g["median_us"] for r, g in zip(results[name], results["gloo"])]
        cpu = statistics.median(r["cpu_us"] for r in results[name])
        cpu_share = statistics.median(r["cpu_us"] / r["wall_us"] for r in results[name])
        table[name] = {"median_us": statistics.median(medians), "q25_us": quart(medians, 0.25),
                       "q75_us": quart(medians, 0.75), "cpu_us_per_op": cpu, "cpu_per_wall": cpu_share,
                       "ratio_to_gloo": statistics.median(ratios), "rounds": results[name]}
        row = table[name]
        print(f"{name:<22}{row['median_us']:>10.1f}{row['q25_us']:>8.1f}{row['q75_us']:>8.1f}{cpu:>11.1f}"
              f"{cpu_share:>9.2f}{row['ratio_to_gloo']:>8.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"np": args.np, "rounds": args.rounds, "iters": args.iters, "pinned": args.pin, "sides": table,
                       "date": time.strftime("%Y-%m-%d"), "cores": os.cpu_count()}, f, indent=1)


if __name__ == "__main__":
    main()
