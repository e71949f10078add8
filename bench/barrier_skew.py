"""How far apart the ranks of one host leave an allreduce, seen by a barrier timed from its end (issue 30 item 5).

    horovodrun -np 3 python bench/barrier_skew.py [--runs 100] [--sleep-ms 20] [--elements 1]

Each run: barrier, allreduce of ``--elements`` float32, note the time, rank 0 sleeps ``--sleep-ms``, barrier, note
the time. A rank that left the allreduce later than rank 0 sees its barrier last less than rank 0 slept when the
barrier's own latency does not cover the difference (Horovod's barrier test times it this way). Rank 0 prints, per
other rank, the offsets of its allreduce exits from rank 0's, how often rank 0 left first, and the runs in which a
rank's barrier was shorter than the sleep, with the worst shortfall. Wall clocks are compared across processes, so
run it on one host. A benchmark, not a test.
"""

import argparse
import statistics
import time

import numpy as np

import horovod.numpy as hvd


def _runs(count: int, sleep_s: float, elements: int):
    data = np.ones(elements, dtype=np.float32)
    times = []
    for i in range(count):
        hvd.barrier()
        hvd.allreduce(data, name=f"skew.{i}", op=hvd.Sum)
        left = time.time()
        if hvd.rank() == 0:
            time.sleep(sleep_s)
        hvd.barrier()
        times.append((left, time.time()))
    return times


def _report(by_rank, sleep_s: float) -> None:
    runs, size = len(by_rank[0]), len(by_rank)
    for rank in range(1, size):
        offsets = sorted((by_rank[rank][i][0] - by_rank[0][i][0]) * 1e3 for i in range(runs))
        print(f"rank {rank} left the allreduce after rank 0 by: median {statistics.median(offsets):.3f} ms, "
              f"p95 {offsets[int(0.95 * (runs - 1))]:.3f} ms, max {offsets[-1]:.3f} ms, min {offsets[0]:.3f} ms")
    first = sum(1 for i in range(runs) if min(range(size), key=lambda r: by_rank[r][i][0]) == 0)
    short = [max(sleep_s - (t1 - t0) for t0, t1 in (by_rank[r][i] for r in range(size))) for i in range(runs)]
    failed = [s for s in short if s > 0]
    print(f"rank 0 left first in {first}/{runs} runs; barrier shorter than rank 0's sleep in {len(failed)}/{runs} "
          f"runs" + (f", by at most {max(failed) * 1e3:.3f} ms" if failed else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--sleep-ms", type=float, default=20.0)
    parser.add_argument("--elements", type=int, default=1)
    args = parser.parse_args()
    hvd.init()
    times = _runs(args.runs, args.sleep_ms / 1e3, args.elements)
    by_rank = hvd.allgather_object(times, name="skew.times")
    if hvd.rank() == 0:
        print(f"{hvd.size()} ranks, {args.runs} runs, {args.elements} float32, rank 0 sleeps {args.sleep_ms:g} ms")
        _report(by_rank, args.sleep_ms / 1e3)
    hvd.shutdown()


if __name__ == "__main__":
    main()
