"""Digests of seeded simulations: whether a change to the control plane changed what any simulated job did.

    python bench/sim_digest.py [--seeds 200] [--out digests.json] [--against OLD.json]

Each line is one seeded job (`horovod.tools.simulate.replay.seeded`): its events run, its end time, who failed when,
every rank's cycles and errors. A refactor of a protocol or of the engine that keeps every digest identical changed
no decision, no frame and no timing the simulation can see (issue 46's migration, docs/control-plane-plan.md,
step 0). The jobs: the varied seeded sweep with drawn faults and fault points on, at sizes where each negotiation
runs under ``auto`` (peer up to 4 ranks, the star to 16, the tree above), and each ``--negotiation`` forced at 4 and
16 ranks. ``--against`` compares with an earlier run's file and exits 1 on any difference, naming the first jobs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from horovod.tools.simulate.replay import seeded  # noqa: E402

SIZES = (2, 3, 4, 8, 16, 32, 64, 256)
MODES = ("peer", "star", "tree")


def digest(job) -> str:
    """What a job did, as test_simulate's replay test compares it."""
    return json.dumps([job.world.events_run, repr(job.world.now), sorted(job.failed_at.items()),
                       [r.cycles for r in job.ranks], [str(r.error) for r in job.ranks]])


def jobs(seeds: int):
    """(key, arguments of seeded) for every job of the run."""
    for seed in range(seeds):
        size = SIZES[seed % len(SIZES)]
        yield f"varied {size} {seed}", dict(size=size, seed=seed, varied=True, drawn_faults=True,
                                            buggify=seed % 2 == 1)
    for mode in MODES:
        for size in (4, 16):
            for seed in range(max(1, seeds // 20)):
                yield f"{mode} {size} {seed}", dict(size=size, seed=seed, varied=True, negotiation=mode,
                                                     buggify=seed % 2 == 0)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=200, help="seeds of the varied sweep (default 200)")
    parser.add_argument("--out", default=None, help="write the digests here (JSON)")
    parser.add_argument("--against", default=None, help="an earlier run's file: exit 1 on any difference")
    args = parser.parse_args(argv)
    began = time.monotonic()
    digests = {}
    for key, kwargs in jobs(args.seeds):
        try:
            digests[key] = digest(seeded(**kwargs))
        except Exception as exc:    # an invariant broken is part of what a job did
            digests[key] = f"{type(exc).__name__}: {exc}"
    print(f"{len(digests)} jobs in {time.monotonic() - began:.1f} s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(digests, f, indent=0, sort_keys=True)
    if args.against:
        with open(args.against) as f:
            old = json.load(f)
        differ = sorted(key for key in old.keys() | digests.keys() if old.get(key) != digests.get(key))
        if differ:
            print(f"{len(differ)} of {len(digests)} jobs differ, first: {differ[:5]}")
            for key in differ[:2]:
                print(f"  {key}:\n    was {old.get(key)}\n    now {digests.get(key)}")
            return 1
        print(f"all {len(digests)} digests identical")
    return 0


if __name__ == "__main__":
    sys.exit(main())
