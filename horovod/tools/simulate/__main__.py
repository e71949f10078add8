"""``python -m horovod.tools.simulate``: the simulated control plane's figures across world sizes (see
:mod:`horovod.tools.simulate.report`), or one seeded run with faults (``--kill``, ``--partition``, ``--reorder``...)
that checks the invariants and replays exactly."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from horovod.tools.simulate.job import InvariantViolation, Workload
from horovod.tools.simulate.report import figures, scenario, table
from horovod.tools.simulate.world import Faults


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m horovod.tools.simulate", description=__doc__)
    parser.add_argument("--ranks", default="8,64,512,4096", help="world sizes, comma-separated")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--steps", type=int, default=4, help="training steps (the first with new names)")
    parser.add_argument("--tensors", type=int, default=20, help="allreduces per step")
    parser.add_argument("--slots", type=int, default=8, help="ranks per host")
    parser.add_argument("--cores", type=int, default=8, help="cores per host")
    parser.add_argument("--negotiation", default="auto", help="HOROVOD_NEGOTIATION: auto, star or tree")
    parser.add_argument("--kill", default="", help="one run only: RANK@SECONDS[,RANK@SECONDS...] (virtual time)")
    parser.add_argument("--partition", default="", help="one run only: SECONDS@HOST (hosts from HOST on are cut off)")
    parser.add_argument("--delay", type=float, default=0.0, help="one run only: probability a frame is held back")
    parser.add_argument("--duplicate", type=float, default=0.0, help="one run only: probability a frame comes twice")
    parser.add_argument("--reorder", type=float, default=0.0,
                        help="one run only: probability a frame is overtaken by later ones of its connection")
    parser.add_argument("--calibrated", default="",
                        help="bench/scale_control.py's JSON: the costs fitted to its np 2 and 4 (this machine's "
                             "CPU and loopback; across hosts the default link), instead of the first guesses")
    parser.add_argument("--reinit", type=float, default=0.0,
                        help="seconds of CPU for an elastic reset's survivor to start its engine again (what "
                             "bench/elastic_reset.py fits; 0: left out)")
    parser.add_argument("--fold", type=float, default=None,
                        help="seconds of rank 0's CPU per contribution it folds (a member's input of a small "
                             "allreduce that rode the negotiation), instead of the fitted or default cost")
    parser.add_argument("--json", default="", help="write the figures here")
    return parser


def main(argv=None) -> int:
    """Run the simulation; 1 when an invariant broke."""
    args = _parser().parse_args(argv)
    env = {"HOROVOD_NEGOTIATION": args.negotiation}
    sizes = [int(n) for n in args.ranks.split(",") if n]
    try:
        if args.kill or args.partition or args.delay or args.duplicate or args.reorder:
            return _one_run(args, sizes[0], env)
        costs = _costs(args.calibrated)
        costs = dataclasses.replace(costs, startup=dataclasses.replace(costs.startup, reinit=args.reinit))
        if args.fold is not None:
            costs = dataclasses.replace(costs, cpu=dataclasses.replace(costs.cpu, fold=args.fold))
        rows = []
        for size in sizes:
            print(f"simulating {size} ranks ...", file=sys.stderr, flush=True)
            rows.append(figures(size, args.seed, args.steps, args.tensors, args.slots, args.cores, env, costs.cpu,
                                costs.startup, link=costs.link))
            print(f"  done in {rows[-1]['sim_cpu_s']:.1f} s", file=sys.stderr, flush=True)
    except InvariantViolation as exc:
        print(f"invariant broken: {exc}", file=sys.stderr)
        return 1
    print(table(rows))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=1)
    return 0


def _costs(results: str):
    """The costs fitted to a benchmark's JSON (see :mod:`~horovod.tools.simulate.calibration`), or the defaults."""
    from horovod.tools.simulate import calibration
    if not results:
        return calibration.Costs()
    with open(results) as handle:
        saved = json.load(handle)
    costs = calibration.fit_saved(saved)
    print(f"calibrated from {results}: {calibration.describe(costs)}", file=sys.stderr, flush=True)
    return costs


def _one_run(args, size: int, env) -> int:
    kill = [(float(t), int(r)) for r, t in (item.split("@") for item in args.kill.split(",") if item)]
    partition = tuple(float(x) if i == 0 else int(x) for i, x in enumerate(args.partition.split("@"))) \
        if args.partition else None
    faults = Faults(delay=args.delay, duplicate=args.duplicate, reorder=args.reorder, kill=kill, partition=partition)
    job = scenario(size, args.seed, args.slots, args.cores, Workload(args.steps, args.tensors), faults, env)
    failed = [r for r in job.ranks if r.error is not None]
    print(f"seed {args.seed}, {size} ranks: {len(failed)} failed, {len(job.killed)} killed, "
          f"{job.world.events_run} events, ended at {job.world.now:.6f} s (virtual); invariants held")
    for rank in failed[:5]:
        print(f"  rank {rank.rank} at {job.failed_at[rank.rank]:.6f} s: {rank.error}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
