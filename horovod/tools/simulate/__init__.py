"""A deterministic simulation of the control plane: the real negotiation, coordinator, response cache and frames of
thousands of ranks in one process, over a virtual network and clock, with faults drawn from a seed.

:mod:`~horovod.tools.simulate.world` (clock, events, cores, links, faults), :mod:`~horovod.tools.simulate.rank` (one
rank behind the engine's loop seam), :mod:`~horovod.tools.simulate.transport` (its end of the connections),
:mod:`~horovod.tools.simulate.job` (the training loop and the invariants),
:mod:`~horovod.tools.simulate.answers` (real data, the simulated data plane and every result checked),
:mod:`~horovod.tools.simulate.varied` (workloads that differ per rank, drawn from a seed),
:mod:`~horovod.tools.simulate.mutants` (bugs planted in the real protocol code, for the test that the sweep catches them),
:mod:`~horovod.tools.simulate.replay` (the one command that replays a seed, and :mod:`horovod.core.buggify`'s fault
points inside the real code, within what the protocols allow, that a run turns on by seed: ``--buggify``),
:mod:`~horovod.tools.simulate.startup` and :mod:`~horovod.tools.simulate.elastic` (start-up and an elastic reset,
modelled around the real parts), :mod:`~horovod.tools.simulate.calibration` (its costs fitted to a benchmark's small
jobs, the larger ones predicted);
``python -m horovod.tools.simulate`` runs it (``docs/scaling.md`` says how to use it, ``docs/scaling-notebook.md`` what
is run and what is modelled).
"""
