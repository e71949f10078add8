"""Training throughput of horovod-py beside torch DistributedDataParallel (Gloo), same model, same run.

    python bench/torch_ddp_vs_horovod.py --model resnet8 --batch-size 32 [--rounds 3]

1. ``horovodrun -np N python examples/pytorch_synthetic_benchmark.py ...`` (this package's launcher);
2. the same model, batch and timing loop under ``torch.nn.parallel.DistributedDataParallel`` with the Gloo
   backend on N processes started by ``torch.multiprocessing``.
Both use one torch thread per process by default, so the N processes share the cores the same way. Prints the
total images/sec of each and their ratio.
"""

import argparse
import os
import re
import socket
import subprocess
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHMARK = os.path.join(ROOT, "examples", "pytorch_synthetic_benchmark.py")


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--np", type=int, default=2, help="workers for each framework")
    parser.add_argument("--model", default="resnet8")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--num-warmup-batches", type=int, default=3)
    parser.add_argument("--num-batches-per-iter", type=int, default=5)
    parser.add_argument("--num-iters", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    parser.add_argument("--fp16-allreduce", action="store_true", help="horovod-py only: fp16 gradient compression")
    parser.add_argument("--rounds", type=int, default=3,
                        help="alternate the two this many times (a shared VM's speed drifts between runs); the "
                             "ratio reported is the median of the rounds' ratios")
    return parser.parse_args()


def benchmark_args(args):
    out = ["--model", args.model, "--batch-size", str(args.batch_size), "--image-size", str(args.image_size),
           "--num-warmup-batches", str(args.num_warmup_batches),
           "--num-batches-per-iter", str(args.num_batches_per_iter), "--num-iters", str(args.num_iters),
           "--threads", str(args.threads)]
    return out + (["--fp16-allreduce"] if args.fp16_allreduce else [])


def run_horovod(args):
    command = [sys.executable, "-m", "horovod.runner", "-np", str(args.np), sys.executable, BENCHMARK]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    proc = subprocess.run(command + benchmark_args(args), capture_output=True, text=True, env=env, timeout=900)
    match = re.search(r"Total img/sec on \d+ CPU\(s\): ([\d.]+)", proc.stdout)
    if proc.returncode != 0 or not match:
        sys.exit(f"horovodrun failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return float(match.group(1))


def _ddp_worker(rank, args, port, results):
    sys.path.insert(0, os.path.dirname(BENCHMARK))
    import pytorch_synthetic_benchmark as bench
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=args.np)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(bench.build_model(args.model, args.image_size))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * args.np)
    rates = bench.run_benchmark(bench.parse_args(benchmark_args(args)), model, optimizer, lambda message: None)
    total = torch.tensor(float(np.mean(rates)))
    dist.all_reduce(total)
    if rank == 0:
        results.put(float(total))
    dist.destroy_process_group()


def run_ddp(args, attempts=2):
    """DDP's total images/sec. Gloo sometimes aborts in teardown ("terminate called without an active exception")
    after the figure is in: that figure stands; a run that died before reporting is repeated once."""
    for attempt in range(attempts):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        ctx = mp.get_context("spawn")
        results = ctx.SimpleQueue()
        try:
            mp.start_processes(_ddp_worker, args=(args, port, results), nprocs=args.np, join=True,
                               start_method="spawn")
        except mp.ProcessExitedException as exc:
            print(f"DDP worker exited abnormally ({exc})", file=sys.stderr, flush=True)
            if results.empty() and attempt + 1 < attempts:
                continue
        if not results.empty():
            return results.get()
    sys.exit("DDP run failed twice without reporting a figure")


def main():
    args = parse_args()
    print(f"model {args.model}, batch {args.batch_size} per worker, images {args.image_size}x{args.image_size}, "
          f"{args.np} workers, {args.threads} thread(s) each, {args.rounds} alternating round(s)", flush=True)
    ratios = []
    for round_ in range(args.rounds):
        horovod_rate = run_horovod(args)
        print(f"round {round_ + 1}: horovod-py (horovodrun -np {args.np}"
              f"{', fp16 allreduce' if args.fp16_allreduce else ''}): {horovod_rate:8.1f} img/sec total", flush=True)
        ddp_rate = run_ddp(args)
        print(f"round {round_ + 1}: torch DDP  (Gloo, {args.np} processes):  {ddp_rate:8.1f} img/sec total",
              flush=True)
        ratios.append(horovod_rate / ddp_rate)
    print(f"ratios per round: {', '.join(f'{r:.2f}' for r in ratios)}")
    print(f"ratio horovod-py / DDP: {float(np.median(ratios)):.2f}")


if __name__ == "__main__":
    main()
