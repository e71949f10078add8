"""python -m horovod.tools.simulate: the simulated control plane's figures across world sizes, or seeded runs with
faults that check the invariants and replay exactly.

Without faults, one row of figures per world size (a step's negotiation, the first step with new names, start-up, a
rank lost mid-step and how soon every survivor knows). With --kill, --partition, --delay, --duplicate or --reorder,
one run per world size with those faults, checking the invariants (every survivor fails naming the lost rank, no
collective completes on some ranks only); a fault that cannot happen in the run (a rank or host that does not exist,
a time after the workload ended) is an error. With --varied, --drawn-faults or --buggify, one such run per world size
too: each rank's workload drawn from the seed, the faults drawn from it as the tests' seed sweep draws them, the fault
points inside the real code on (horovod.core.buggify); a failing seed of the tests prints the command that replays
it. Needs greenlet: the simulate extra. docs/scaling.md says what is run and what is modelled.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import List, Optional, Tuple

from horovod.runner.usage import HorovodArgumentParser


def _parser() -> argparse.ArgumentParser:
    parser = HorovodArgumentParser(prog="python -m horovod.tools.simulate", description=__doc__,
                                     formatter_class=_Formatter)
    parser.add_argument("--ranks", default="8,64,512,4096", help="world sizes, comma-separated")
    parser.add_argument("--seed", type=int, default=1, help="the seed every random draw comes from (same seed, "
                                                            "same run)")
    parser.add_argument("--steps", type=int, default=None,
                        help="training steps, the first with new names (default: 4; 3 with --varied)")
    parser.add_argument("--tensors", type=int, default=None, help="allreduces per step (default: 20; 6 with --varied)")
    parser.add_argument("--slots", type=int, default=8, help="ranks per host")
    parser.add_argument("--cores", type=int, default=8, help="cores per host")
    parser.add_argument("--negotiation", default="auto", choices=("auto", "peer", "star", "tree"),
                        help="HOROVOD_NEGOTIATION")
    parser.add_argument("--kill", default="", help="faults: RANK@SECONDS[,RANK@SECONDS...] (virtual time)")
    parser.add_argument("--partition", default="", help="faults: SECONDS@HOST (hosts from HOST on are cut off)")
    parser.add_argument("--delay", type=float, default=0.0, help="faults: probability a frame is held back")
    parser.add_argument("--duplicate", type=float, default=0.0, help="faults: probability a frame comes twice")
    parser.add_argument("--reorder", type=float, default=0.0,
                        help="faults: probability a frame is overtaken by later ones of its connection")
    parser.add_argument("--varied", action="store_true",
                        help="each rank's workload drawn from the seed (horovod.tools.simulate.varied: orders, times, "
                             "new names, process sets, every collective kind, a mismatch, join)")
    parser.add_argument("--drawn-faults", action="store_true",
                        help="faults drawn from the seed as the tests' seed sweep draws them (not with --kill, "
                             "--partition, --delay, --duplicate or --reorder)")
    parser.add_argument("--buggify", action="store_true",
                        help="the fault points inside the real negotiation and execution on, drawn from the seed "
                             "(horovod.core.buggify)")
    parser.add_argument("--horizon", type=float, default=float("inf"),
                        help="seconds of virtual time a run may take before it counts as stalled (default: none)")
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


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """The description as written (paragraphs), each flag's default after its help (none for an empty one)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default in (None, "", argparse.SUPPRESS) or action.option_strings == ["-h", "--help"]:
            return action.help
        return f"{action.help} (default: %(default)s)"


def _faults_given(args) -> bool:
    return bool(args.kill or args.partition or args.delay or args.duplicate or args.reorder)


def _seeded(args) -> bool:
    return bool(args.varied or args.drawn_faults or args.buggify)


def _checked(parser: argparse.ArgumentParser, args) -> Tuple[List[int], List[Tuple[float, int]],
                                                              Optional[Tuple[float, int]]]:
    """World sizes, kills and partition from the flags; a fault no run could have is a usage error."""
    try:
        sizes = [int(n) for n in args.ranks.split(",") if n.strip()]
        kill = [(float(t), int(r)) for r, t in (item.split("@") for item in args.kill.split(",") if item)]
        when, host = args.partition.split("@") if args.partition else (None, None)
        partition = (float(when), int(host)) if args.partition else None
    except ValueError as exc:
        parser.error(f"--ranks N,N..., --kill RANK@SECONDS,... and --partition SECONDS@HOST take numbers ({exc})")
    if args.drawn_faults and _faults_given(args):
        parser.error("--drawn-faults draws the faults from the seed: give no --kill, --partition, --delay, "
                     "--duplicate or --reorder with it")
    if not sizes or min(sizes) < 2:
        parser.error(f"--ranks {args.ranks}: world sizes of at least 2")
    for when, rank in kill:
        if rank < 0 or rank >= min(sizes) or when < 0:
            parser.error(f"--kill {rank}@{when:g}: no rank {rank} at a time >= 0 in a run of {min(sizes)} ranks")
    hosts = -(-min(sizes) // args.slots)
    if partition is not None and not (1 <= partition[1] < hosts and partition[0] >= 0):
        parser.error(f"--partition {args.partition}: HOST must be 1..{hosts - 1} (a run of {min(sizes)} ranks at "
                     f"--slots {args.slots} has {hosts} host{'s' if hosts > 1 else ''}), SECONDS >= 0")
    return sizes, kill, partition


def main(argv=None) -> int:
    """Run the simulation; 1 when an invariant broke."""
    parser = _parser()
    args = parser.parse_args(argv)
    env = {"HOROVOD_NEGOTIATION": args.negotiation}
    sizes, kill, partition = _checked(parser, args)
    args.steps = args.steps if args.steps is not None else 3 if args.varied else 4
    args.tensors = args.tensors if args.tensors is not None else 6 if args.varied else 20
    try:
        from horovod.tools.simulate.job import InvariantViolation      # (needs greenlet: --help does not)
        from horovod.tools.simulate.report import figures, table
    except ImportError as missing:
        print(f"{parser.prog}: {missing}", file=sys.stderr)
        return 1
    try:
        if _faults_given(args) or _seeded(args):
            return max(_one_run(args, size, env, kill, partition) for size in sizes)
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


def _one_run(args, size: int, env, kill, partition) -> int:
    """One seeded run of ``size`` ranks with the faults; 2 when a fault could not happen in it (it came after the
    workload ended), so that no one reads "0 killed ... invariants held" as a fault survived."""
    from horovod.tools.simulate.job import Workload
    from horovod.tools.simulate.replay import seeded
    from horovod.tools.simulate.report import scenario
    from horovod.tools.simulate.world import Faults

    faults = Faults(delay=args.delay, duplicate=args.duplicate, reorder=args.reorder, kill=kill, partition=partition)
    shape = dict(steps=args.steps, tensors=args.tensors, slots=args.slots, cores=args.cores,
                 negotiation=args.negotiation)
    if _seeded(args):      # (its violation prints the command that replays it)
        job = seeded(size, args.seed, args.varied, args.drawn_faults, args.buggify, args.horizon, faults=faults,
                     **shape)
    else:
        job = scenario(size, args.seed, args.slots, args.cores, Workload(args.steps, args.tensors), faults, env,
                       horizon=args.horizon)
    failed = [r for r in job.ranks if r.error is not None]
    missed = [f"--kill {r}@{t:g}" for t, r in kill if r not in job.killed and job.ranks[r].finished]
    missed += [f"--partition {args.partition}"] if partition is not None and not job.world.cut else []
    if missed:
        clean = seeded(size, args.seed, args.varied, **shape)
        print(f"error: seed {args.seed}, {size} ranks: {' and '.join(missed)} cannot happen in this run: the "
              f"workload ({args.steps} steps of {args.tensors} allreduces) ends at {clean.world.now:.6f} s "
              f"(virtual) without faults; give an earlier time or more --steps", file=sys.stderr)
        return 2
    print(f"seed {args.seed}, {size} ranks: {len(failed)} failed, {len(job.killed)} killed, "
          f"{job.world.events_run} events, ended at {job.world.now:.6f} s (virtual); invariants held; "
          f"{job.answers.results} results checked")
    if args.buggify:
        print(f"  buggify: enabled {dict(sorted(job.points.chances.items()))}, fired "
              f"{dict(sorted(job.points.fired.items()))}")
    for rank in failed[:5]:
        print(f"  rank {rank.rank} at {job.failed_at[rank.rank]:.6f} s: {rank.error}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
