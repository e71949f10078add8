"""The torch binding's own cost: ``horovod.torch`` against ``horovod.numpy`` in one job, alternating.

    python bench/binding_cost.py [--np 2] [--rounds 60] [--repeats 5]

Both bindings call the same core; what differs is the binding (views of tensors, integer handles, ``synchronize``).
Separate jobs, as in ``bench/suite.py``, differ by more than that on a shared machine (one job's slow phase is not the
other's), so here every rank runs both bindings in the same processes, round after round: ``--repeats`` calls through
numpy, then the same through torch, and so on. The figure is the median over rounds of each round's torch/numpy time
ratio, with its quartiles. Cases:

- ``allreduce 1 MiB``: ``hvd.allreduce_`` of one float32 buffer;
- ``step 200 x 4 KiB``: 200 in-place async allreduces, then waiting for all of them (the suite's step);
- ``step, new tensors``: the same with new buffers every step, as gradients are after
  ``zero_grad(set_to_none=True)`` (PyTorch's default); the numpy side makes new arrays alike.

A benchmark, not a test: nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

STEP_TENSORS, STEP_FLOATS, BIG_FLOATS = 200, 1024, 1 << 18


def _cases(np, torch, hvdn, hvdt):
    """name -> (numpy callable, torch callable)."""
    big_n, big_t = np.ones(BIG_FLOATS, np.float32), torch.ones(BIG_FLOATS)
    small_n = [np.ones(STEP_FLOATS, np.float32) for _ in range(STEP_TENSORS)]
    small_t = [torch.ones(STEP_FLOATS) for _ in range(STEP_TENSORS)]

    def step_numpy(bufs):
        handles = [hvdn.allreduce_async_(b, op=hvdn.Average, name=f"n{i}") for i, b in enumerate(bufs)]
        for h in handles:
            h.result()

    def step_torch(bufs):
        handles = [hvdt.allreduce_async_(b, op=hvdt.Average, name=f"t{i}") for i, b in enumerate(bufs)]
        for h in handles:
            hvdt.synchronize(h)

    return {
        "allreduce 1 MiB": (lambda: hvdn.allreduce_(big_n, op=hvdn.Average, name="big.n"),
                            lambda: hvdt.allreduce_(big_t, op=hvdt.Average, name="big.t")),
        f"step {STEP_TENSORS} x 4 KiB": (lambda: step_numpy(small_n), lambda: step_torch(small_t)),
        f"step {STEP_TENSORS} x 4 KiB, new tensors": (
            lambda: step_numpy([np.ones(STEP_FLOATS, np.float32) for _ in range(STEP_TENSORS)]),
            lambda: step_torch([torch.ones(STEP_FLOATS) for _ in range(STEP_TENSORS)])),
    }


def worker(rounds: int, repeats: int, out: str) -> None:
    import numpy as np
    import torch
    torch.set_num_threads(1)
    import horovod.numpy as hvdn
    import horovod.torch as hvdt
    hvdt.init()
    rows = []
    for name, (with_numpy, with_torch) in _cases(np, torch, hvdn, hvdt).items():
        times = {"numpy": [], "torch": []}
        for _ in range(rounds):
            for binding, call in (("numpy", with_numpy), ("torch", with_torch)):
                call()
                hvdt.barrier()       # both ranks start the timed calls together
                start = time.perf_counter()
                for _ in range(repeats):
                    call()
                times[binding].append((time.perf_counter() - start) / repeats)
        ratios = sorted(t / n for t, n in zip(times["torch"], times["numpy"]))
        q = lambda f: ratios[min(len(ratios) - 1, int(f * len(ratios)))]  # noqa: E731
        rows.append({"case": name, "numpy_s": float(np.median(times["numpy"])),
                     "torch_s": float(np.median(times["torch"])), "ratio": q(0.5), "q25": q(0.25), "q75": q(0.75)})
    if hvdt.rank() == 0:
        with open(out, "w") as handle:
            json.dump(rows, handle)
    hvdt.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "binding_cost.json"))
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.rounds, args.repeats, args.out)
        return
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    subprocess.run([sys.executable, "-m", "horovod.runner", "-np", str(args.np), sys.executable, __file__, "--worker",
                    "--rounds", str(args.rounds), "--repeats", str(args.repeats), "--out", args.out],
                   check=True, env=env, timeout=3600)
    rows = json.load(open(args.out))
    print(f"\n### horovod.torch against horovod.numpy, {args.np} ranks, alternating in one job "
          f"({args.rounds} rounds of {args.repeats})\n")
    print("| case | numpy | torch | torch / numpy (median of rounds) | quartiles |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['case']} | {r['numpy_s'] * 1e3:.3f} ms | {r['torch_s'] * 1e3:.3f} ms | {r['ratio']:.3f}x | "
              f"{r['q25']:.3f}-{r['q75']:.3f} |")


if __name__ == "__main__":
    main()
