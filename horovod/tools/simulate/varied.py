"""Workloads that differ per rank, drawn from a seed, as real jobs submit: each rank its own order and its own times,
names that first appear mid-job, a second process set, grouped ops, every collective kind (allgathers of different
first dimensions, a broadcast from a drawn root, alltoalls of per-rank splits, reducescatters, allreduces too large
to ride the negotiation, reduce ops besides the average) and a tensor whose shape or dtype differs on one rank (the
coordinator's mismatch error must reach every rank, the job going on).

With ``join`` (uneven data), one rank joins a step before the others, which allreduce meanwhile (its zeros
count, and an average divides by every member); every other rank joins in the last step. Not drawn yet: elastic
resets
(a simulated job ends at a loss; :mod:`~horovod.tools.simulate.elastic` models the reset around two simulations
rather than running one job through it).
"""

from __future__ import annotations

import random
from typing import Dict, List, Tuple

from horovod.common.types import OpType, ReduceOp, Request
from horovod.tools.simulate.job import Workload

__all__ = ["FEATURES", "Varied"]

FEATURES = ("order", "times", "new", "sets", "grouped", "kinds", "mismatch", "reduce_ops", "join")
JOIN = Request("join", OpType.JOIN, "uint8", ())


class Varied(Workload):
    """A per-rank workload for ``seed`` and ``size`` ranks; ``features`` (a subset of :data:`FEATURES`) is drawn
    from the seed unless given."""

    def __init__(self, seed: int, size: int, steps: int = 3, tensors: int = 6, features=None, **kwargs):
        super().__init__(steps=steps, tensors=tensors, **kwargs)
        rng = random.Random(seed * 104_729 + size)
        # Past 64 ranks the kinds are left out of draws: an alltoall's request carries a split per rank, so the
        # tree passes n^2 of them up, and a sweep of such jobs would take minutes of the real codec's time.
        self.features = frozenset(features if features is not None else
                                  [f for f in FEATURES if rng.random() < 0.5 and (f != "kinds" or size <= 64)])
        self.size = size
        self.odd = rng.randrange(size)                              # the rank that mismatches
        self.root = rng.randrange(size)                             # the broadcast's root
        self.set_members = sorted(rng.sample(range(size), max(2, size // 2)))
        self.mismatch_step = rng.randrange(steps)
        self.dtype_mismatch = rng.random() < 0.5
        self.delay_max = rng.choice((2e-4, 1e-3, 4e-3))
        self.reduce_op = rng.choice((ReduceOp.SUM, ReduceOp.MIN, ReduceOp.MAX))
        self.joiner = rng.randrange(size)                           # the rank whose data ends a step early
        if "join" in self.features:     # the mismatch's step is one where every rank submits
            self.mismatch_step = rng.randrange(max(steps - 2, 1))

    def process_sets(self, size: int) -> Dict[int, List[int]]:
        return {1: self.set_members} if "sets" in self.features else {}

    def fails(self, name: str) -> bool:
        return name.startswith("bad.")

    def submissions(self, seed: int, rank: int, step: int, size: int) -> List[Tuple[float, int, Request]]:
        rng = random.Random((seed * 1_000_003 + rank) * 1_009 + step)
        f = self.features
        if "join" in f and step >= self.steps - 2:
            return self._joining(rng, rank, step)
        plan = [(0, r) for r, _ in self.requests()]
        if "reduce_ops" in f:
            plan = [(0, r._replace(reduce_op=self.reduce_op)) if i % 3 == 2 else (0, r) for i, (_, r) in
                    enumerate(plan)]
        if "new" in f and step:
            plan += [(0, Request(f"new.{step}.{i}", OpType.ALLREDUCE, "float32", (3,))) for i in range(step)]
        if "grouped" in f:
            plan += [(0, Request(f"grp.{i}", OpType.ALLREDUCE, "float32", (2 + i,), group=7)) for i in range(3)]
        if "kinds" in f:
            plan += self._kinds(rank, list(range(size)), 0, "all")
        if "sets" in f and rank in self.set_members:
            plan += [(1, Request("set1.sum", OpType.ALLREDUCE, "float64", (4,)))]
            plan += self._kinds(rank, self.set_members, 1, "set1") if "kinds" in f else []
        if "mismatch" in f and step == self.mismatch_step:
            dtype, shape = ("float64", (5,)) if self.dtype_mismatch else ("float32", (6,))
            odd = rank == self.odd
            plan.append((0, Request(f"bad.{step}", OpType.ALLREDUCE, dtype if odd else "float32", shape if odd else (5,))))
        if "order" in f:
            rng.shuffle(plan)
        times = [rng.choice((0.0, 0.0, rng.random() * self.delay_max)) if "times" in f else 0.0 for _ in plan]
        return [(at, set_id, request) for at, (set_id, request) in zip(times, plan)]

    def _joining(self, rng: random.Random, rank: int, step: int) -> List[Tuple[float, int, Request]]:
        """``join`` with uneven data: the joiner joins a step before the others, which meanwhile allreduce (the
        joiner's zeros count); in the last step every other rank joins, once its last data came back."""
        if step == self.steps - 1:
            return [] if rank == self.joiner else [(0.0, 0, JOIN)]
        if rank == self.joiner:
            return [(0.0, 0, JOIN)]
        plan = [(0, r) for r, _ in self.requests()]
        if "reduce_ops" in self.features:
            plan = [(0, r._replace(reduce_op=self.reduce_op)) if i % 3 == 2 else (0, r) for i, (_, r) in
                    enumerate(plan)]
        if "order" in self.features:
            rng.shuffle(plan)
        return [(rng.random() * self.delay_max if "times" in self.features else 0.0, s, r) for s, r in plan]

    def _kinds(self, rank: int, members: List[int], set_id: int, prefix: str) -> List[Tuple[int, Request]]:
        n, me = len(members), members.index(rank)
        splits = tuple((me + j) % 3 for j in range(n))
        root = self.root if self.root in members else members[-1]
        return [(set_id, request) for request in (
            Request(f"{prefix}.gather", OpType.ALLGATHER, "float32", (me % 3 + 1, 2)),
            Request(f"{prefix}.bcast", OpType.BROADCAST, "float64", (3,), root_rank=root),
            Request(f"{prefix}.alltoall", OpType.ALLTOALL, "int32", (sum(splits), 2), splits=splits),
            Request(f"{prefix}.scatter", OpType.REDUCESCATTER, "float32", (n + 1, 2)),
            Request(f"{prefix}.big", OpType.ALLREDUCE, "float32", (300,)),
        )]
