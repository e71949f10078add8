"""Where a small allreduce's CPU goes as ranks share the cores: per rank, CPU and wake-ups per op, and what emptying
the caches before each op adds.

    python bench/rank_cpu.py --np 8,16,32,64            # per rank: CPU per op and voluntary context switches per op
    python bench/rank_cpu.py --np 4 --evict 16          # also: CPU per op with 16 MiB written before each op
    python bench/rank_cpu.py --np 4 --evict 16 --names 20   # the same for a cycle of 20 async allreduces

Each job (``horovodrun -np N``, default settings) runs a loop of blocking 4 B allreduces and prints, rank by rank,
the process CPU and the main thread's voluntary context switches (its sleeps) per op; in the tree (above 16 ranks)
ranks from (N - 1) // 3 + 1 on are leaves, whose work per op is the same at every size. With ``--evict MIB`` each
rank first times the loop as is, then with MIB MiB of its own memory written before each op (outside the timed
op): the difference is what an op costs a rank whose data the caches no longer hold. docs/scaling-notebook.md reads these.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _switches() -> int:
    with open(f"/proc/self/task/{threading.main_thread().native_id}/status") as handle:
        return next(int(line.split()[1]) for line in handle if line.startswith("voluntary_ctxt_switches"))


def _loop(op, ops: int, evict=None):
    cpu, began = 0.0, _switches()
    for _ in range(ops):
        if evict is not None:
            evict += 1
        start = time.process_time()
        op()
        cpu += time.process_time() - start
    return cpu / ops * 1e6, (_switches() - began) / ops


def op_of(hvd, names: int):
    """One op: a blocking 4 B allreduce, or ``names`` async ones submitted at once and then waited for (a cycle);
    bench/scale_control.py times the same two."""
    import numpy as np
    bufs = [np.ones(1, np.float32) for _ in range(names)]
    if names == 1:
        return lambda: hvd.allreduce_(bufs[0], op=hvd.Average, name="ar4")

    def cycle():
        for handle in [hvd.allreduce_async_(b, op=hvd.Average, name=f"cycle.{i}") for i, b in enumerate(bufs)]:
            hvd.synchronize(handle)
    return cycle


def _worker(ops: int, evict_mib: int, names: int) -> None:
    import numpy as np
    import horovod.numpy as hvd
    hvd.init()
    op = op_of(hvd, names)
    for _ in range(50):
        op()
    cpu, wakes = _loop(op, ops)
    row = [cpu, wakes]
    if evict_mib:
        row.append(_loop(op, ops, np.zeros(evict_mib << 20, np.uint8))[0])
    rows = hvd.allgather(np.array([row]), name="rows")
    if hvd.rank() == 0:
        for rank, values in enumerate(rows):
            evicted = f", {values[2]:.0f} us with the caches emptied" if evict_mib else ""
            print(f"RANK {rank}: {values[0]:.0f} us CPU, {values[1]:.2f} sleeps per op{evicted}", flush=True)
    hvd.shutdown()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--np", default="8,16,32,64")
    parser.add_argument("--ops", type=int, default=300)
    parser.add_argument("--evict", type=int, default=0, help="MiB written before each op in a second loop")
    parser.add_argument("--names", type=int, default=1, help="each op: this many async 4 B allreduces, then the wait")
    args = parser.parse_args(argv)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")]))
    for np_ in [int(n) for n in args.np.split(",")]:
        out = subprocess.run([sys.executable, "-m", "horovod.runner", "-np", str(np_), sys.executable,
                              os.path.abspath(__file__), "--worker", str(args.ops), str(args.evict), str(args.names)],
                             capture_output=True, text=True, env=env, timeout=600 + 10 * np_)
        rows = [line.split("RANK ", 1)[1] for line in out.stdout.splitlines() if "RANK " in line]
        if out.returncode or not rows:
            print(out.stdout[-2000:] + out.stderr[-2000:])
            return 1
        leaves = [float(r.split(": ")[1].split()[0]) for r in rows[(np_ - 1) // 3 + 1:]] if np_ > 16 else []
        print(f"np {np_}" + (f": leaves' mean {sum(leaves) / len(leaves):.0f} us CPU per op" if leaves else ""))
        for row in rows:
            print(f"  rank {row}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 4 and sys.argv[1] == "--worker":
        _worker(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
    else:
        sys.exit(main())
