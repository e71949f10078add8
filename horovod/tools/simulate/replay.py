"""Replaying a seed: the run a seed sweep makes, the one command line that makes it again, and the fault points inside
the real code (:mod:`horovod.core.buggify`) that it turns on by its seed.

:func:`seeded` runs what :func:`replay_command` names, ``python -m horovod.tools.simulate --ranks N --seed S --varied
--drawn-faults --buggify``: the per-rank workload drawn from the seed (:class:`~horovod.tools.simulate.varied.Varied`),
the faults drawn from it as the tests' seed sweep draws them (:func:`~horovod.tools.simulate.world.draw_faults`), the
points on. A violation's message ends with that command and what fired until then.
"""

from __future__ import annotations

from typing import Dict, Optional

from horovod.core import buggify as core_buggify
from horovod.tools.simulate.job import Job, Workload
from horovod.tools.simulate.rank import greenlet
from horovod.tools.simulate.varied import Varied
from horovod.tools.simulate.world import Faults, World, draw_faults

__all__ = ["DRAWN_HORIZON", "Points", "replay_command", "seeded"]

DRAWN_HORIZON = 0.01    # the virtual seconds over which draw_faults places its faults (the tests' sweep)
_INF = float("inf")


class Points:
    """The fault points of one simulated job: which its seed enabled (at what chance per check) and how often each
    fired; a point that stalls charges the running rank's CPU."""

    def __init__(self, job: Job):
        self.job = job
        self.chances: Dict[str, float] = {}
        self.fired: Dict[str, int] = {}
        self._by_greenlet: Dict[object, object] = {}

    def run(self, max_events: int, horizon: float) -> Job:
        """Run the job with the points on."""
        with core_buggify.enabled(self.job.world.seed, self.stall) as chances:
            self.chances = chances
            try:
                return self.job.run(max_events, horizon)
            finally:
                self.fired = core_buggify.fired()

    def stall(self, seconds: float) -> None:
        """A point stalls the rank that runs: its core is busy ``seconds`` longer."""
        if not self._by_greenlet:
            self._by_greenlet = {rank._greenlet: rank for rank in self.job.ranks}
        rank = self._by_greenlet.get(greenlet.getcurrent())
        if rank is None:
            raise AssertionError("a buggify point was reached outside a simulated rank's run")
        rank.charge(seconds)


class _Replay:
    """What a violation prints to replay the run: the command, and the points fired so far."""

    def __init__(self, command: str, points: Optional[Points]):
        self.command, self.points = command, points

    def __str__(self) -> str:
        if self.points is None:
            return self.command
        return f"{self.command}; buggify fired {dict(sorted(core_buggify.fired().items()))}"


def replay_command(size: int, seed: int, varied: bool = False, drawn_faults: bool = False, buggify: bool = False,
                   horizon: float = _INF, steps: Optional[int] = None, tensors: Optional[int] = None,
                   slots: int = 8, cores: int = 8, negotiation: str = "auto") -> str:
    """The command line that runs :func:`seeded` with the same arguments (a default is left out)."""
    flags = [f"--ranks {size}", f"--seed {seed}"] + ["--varied"] * varied + ["--drawn-faults"] * drawn_faults \
        + ["--buggify"] * buggify + ([f"--horizon {horizon:g}"] if horizon != _INF else [])
    shape = (3, 6) if varied else (4, 20)       # (Varied's and Workload's defaults)
    for name, value, default in (("steps", steps, shape[0]), ("tensors", tensors, shape[1]), ("slots", slots, 8),
                                 ("cores", cores, 8), ("negotiation", negotiation, "auto")):
        flags += [f"--{name} {value}"] if value is not None and value != default else []
    return "python -m horovod.tools.simulate " + " ".join(flags)


def seeded(size: int, seed: int, varied: bool = False, drawn_faults: bool = False, buggify: bool = False,
           horizon: float = _INF, steps: Optional[int] = None, tensors: Optional[int] = None, slots: int = 8,
           cores: int = 8, negotiation: str = "auto", faults: Optional[Faults] = None,
           max_events: int = 50_000_000) -> Job:
    """One seeded job, run to its end: with ``varied``, each rank's workload drawn from the seed (else every rank
    submits the same allreduces); with ``drawn_faults``, the faults drawn from it (else ``faults``); with
    ``buggify``, the fault points inside the real code on (the job's ``points`` says which and how often they fired).
    ``steps`` and ``tensors`` default to the workload's (3 and 6 varied, else 4 and 20).

    Raises:
        InvariantViolation: an invariant broke; the message names the seed and ends with the command that replays
            the run (:func:`replay_command`) and what fired.
    """
    shape = {key: value for key, value in (("steps", steps), ("tensors", tensors)) if value is not None}
    workload = Varied(seed, size, **shape) if varied else Workload(**shape)
    if drawn_faults:
        faults = draw_faults(seed, size, slots, DRAWN_HORIZON)
    world = World(size, slots, cores, seed, faults=faults or Faults())
    job = Job(world, workload, {"HOROVOD_NEGOTIATION": negotiation})
    points = job.points = Points(job) if buggify else None
    job.replay = _Replay(replay_command(size, seed, varied, drawn_faults, buggify, horizon, steps, tensors, slots,
                                        cores, negotiation), points)
    return points.run(max_events, horizon) if points is not None else job.run(max_events, horizon)
