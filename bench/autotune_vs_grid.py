"""Does autotune earn its keep? Its chosen settings against the best point of a grid, on the synthetic benchmark.

    python bench/autotune_vs_grid.py [--np 2] [--model resnet8] [--rounds 3]

1. The grid: ``examples/pytorch_synthetic_benchmark.py`` under ``horovodrun`` at every (fusion threshold, cycle time)
   of ``--fusion-mib`` x ``--cycle-ms``, one run each; the best throughput is the grid's best point.
2. Autotune: one run with ``HOROVOD_AUTOTUNE=1`` long enough for the search to settle; its log's last row is the
   point it kept (and every row says why it was tried).
3. The kept point and the grid's best point, ``--rounds`` times alternating; the ratio reported is the median of the
   rounds' ratios (a shared machine's speed drifts between runs). A benchmark: nothing asserts on time.
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BENCHMARK = os.path.join(ROOT, "examples", "pytorch_synthetic_benchmark.py")
MIB = 1 << 20


def run(args, env_extra, iters=None) -> float:
    """Total images/sec of one benchmark run with ``env_extra`` set."""
    env = dict(os.environ, PYTHONPATH=ROOT, **env_extra)
    cmd = [sys.executable, "-m", "horovod.runner", "-np", str(args.np), sys.executable, BENCHMARK,
           "--model", args.model, "--batch-size", str(args.batch_size), "--threads", "1",
           "--num-iters", str(iters or args.num_iters), "--num-batches-per-iter", str(args.batches_per_iter)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    match = re.search(r"Total img/sec on \d+ CPU\(s\): ([\d.]+)", proc.stdout)
    if proc.returncode != 0 or not match:
        sys.exit(f"benchmark failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return float(match.group(1))


def fixed(fusion_bytes: int, cycle_ms: float):
    return {"HOROVOD_FUSION_THRESHOLD": str(int(fusion_bytes)), "HOROVOD_CYCLE_TIME": f"{cycle_ms:g}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--model", default="resnet8")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--num-iters", type=int, default=3)
    parser.add_argument("--batches-per-iter", type=int, default=5)
    parser.add_argument("--fusion-mib", default="1,4,16,64")
    parser.add_argument("--cycle-ms", default="1,5,25")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tune-iters", type=int, default=40, help="benchmark iterations of the autotune run")
    args = parser.parse_args()
    grid = {}
    for f in (float(x) for x in args.fusion_mib.split(",")):
        for c in (float(x) for x in args.cycle_ms.split(",")):
            grid[(f, c)] = run(args, fixed(f * MIB, c))
            print(f"grid {f:g} MiB, {c:g} ms: {grid[(f, c)]:.1f} img/sec", flush=True)
    best = max(grid, key=grid.get)
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "autotune.csv")
        run(args, {"HOROVOD_AUTOTUNE": "1", "HOROVOD_AUTOTUNE_LOG": log, "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": "1",
                   "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": "5", "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "14"},
            iters=args.tune_iters)
        rows = list(csv.DictReader(open(log)))
    for row in rows:
        print(f"autotune: {int(row['tensor_fusion_threshold']) / MIB:.3g} MiB, {row['cycle_time_ms']} ms, "
              f"score {float(row['score']):.3g}: {row['note']}")
    kept = (int(rows[-1]["tensor_fusion_threshold"]), float(rows[-1]["cycle_time_ms"]))
    if not rows[-1]["note"].startswith("settled"):
        print("autotune did not settle within the run: raise --tune-iters", flush=True)
    ratios = []
    for round_ in range(args.rounds):
        tuned = run(args, fixed(*kept))
        gridded = run(args, fixed(best[0] * MIB, best[1]))
        ratios.append(tuned / gridded)
        print(f"round {round_ + 1}: autotune's point {tuned:.1f} img/sec, grid's best {gridded:.1f}: "
              f"{ratios[-1]:.3f}", flush=True)
    print(f"grid's best point: {best[0]:g} MiB, {best[1]:g} ms; autotune kept {kept[0] / MIB:.3g} MiB, "
          f"{kept[1]:g} ms; ratio (median of rounds) {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
