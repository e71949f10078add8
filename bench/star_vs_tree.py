"""Is the star the tree with one level? The star against a tree whose root has every other rank as a child.

    python bench/star_vs_tree.py [--ranks 5,8,16] [--seeds 20] [--json OUT]

With ``ARITY >= n - 1`` the tree is rank 0 and n - 1 leaves, the star's shape; the two still differ in who starts a
cycle and when (the star's rank 0 reads every early message and starts a cycle when a name completes; the tree's
root reads WANT bits and starts one a batch spacing after every rank had requests, or when every message is in) and
in what the frames carry. Both run as their real protocol code in the deterministic simulation
(:mod:`horovod.tools.simulate`), on the same seeds:

- the training loop of :class:`~horovod.tools.simulate.job.Workload` (a backward pass's bursts of 20 gradients, 4
  steps): cycles per step, frames per rank and cached cycle (the busiest rank and the mean), the cached step's
  latency from its last submission to its last result, and how long the survivors take to fail after a rank dies;
- the varied seeded sweep (per-rank orders and times, new names, a process set, grouped ops, every collective kind,
  a mismatch on one rank, with drawn faults): whether every invariant and every answer holds, and the jobs' virtual
  end times.

Prints medians per size and the tree-to-star ratio of each figure. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from horovod.core.negotiation import tree_shape  # noqa: E402
from horovod.tools.simulate.replay import seeded  # noqa: E402
from horovod.tools.simulate.report import figures  # noqa: E402

FIGURES = ("cycles_per_step", "frames_max", "frames_mean", "step_latency_s", "detect_s")


def one_level(size: int):
    """Make the tree one level deep for ``size`` ranks (every rank a child of rank 0); returns the undo."""
    saved = tree_shape.ARITY
    tree_shape.ARITY = max(saved, size - 1)
    return lambda: setattr(tree_shape, "ARITY", saved)


def run_mode(mode: str, size: int, seeds: int) -> dict:
    """Both workloads of one protocol at one size."""
    undo = one_level(size) if mode == "tree" else (lambda: None)
    try:
        rows = [figures(size, seed, env={"HOROVOD_NEGOTIATION": mode}, lifecycle=False) for seed in range(seeds)]
        ends, broken = [], 0
        for seed in range(seeds):
            try:
                job = seeded(size, seed, varied=True, drawn_faults=True, negotiation=mode)
                ends.append(job.world.now)
            except Exception:   # an invariant or an answer broke: counted, and the sweep goes on
                broken += 1
    finally:
        undo()
    out = {name: statistics.median(r[name] for r in rows) for name in FIGURES}
    out.update(mode=rows[0]["mode"], varied_end_s=statistics.median(ends) if ends else float("nan"),
               varied_broken=broken)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="5,8,16", help="world sizes, comma-separated")
    parser.add_argument("--seeds", type=int, default=20, help="seeds per size and protocol")
    parser.add_argument("--json", default=None, help="write the figures here")
    args = parser.parse_args(argv)
    began = time.monotonic()
    results = {}
    print("| ranks | protocol | cycles / step | frames / rank / cached cycle (most, mean) | cached step, ms | "
          "lost rank detected, ms | varied sweep: end (ms), broken |")
    print("|---|---|---|---|---|---|---|")
    for size in [int(n) for n in args.ranks.split(",")]:
        for mode in ("star", "tree"):
            r = results[f"{size} {mode}"] = run_mode(mode, size, args.seeds)
            label = "star" if mode == "star" else "tree, one level"
            print(f"| {size} | {label} | {r['cycles_per_step']:.2f} | {r['frames_max']:.1f}, {r['frames_mean']:.1f} | "
                  f"{r['step_latency_s'] * 1e3:.3f} | {r['detect_s'] * 1e3:.2f} | "
                  f"{r['varied_end_s'] * 1e3:.1f}, {r['varied_broken']} of {args.seeds} |")
    for size in [int(n) for n in args.ranks.split(",")]:
        star, tree = results[f"{size} star"], results[f"{size} tree"]
        print(f"tree / star at {size} ranks: " + ", ".join(
            f"{name} {tree[name] / star[name]:.2f}" if star[name] else f"{name} -" for name in FIGURES))
    print(f"({args.seeds} seeds per size and protocol, {time.monotonic() - began:.0f} s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
