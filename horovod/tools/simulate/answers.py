"""Answers checked: every simulated collective carries small real data, and every rank's result is compared, byte for
byte, with the reduction computed here from what every member submitted.

Each rank's input of a name is a small integer-valued array drawn from the job's seed, the rank, the name and how many
times the rank submitted it before (:func:`tensor`), so that sums are exact in any order and the expected result
(:func:`reference`) does not depend on how the system folded it. Allreduces whose data rode the negotiation get
their results from the real protocol and the real execution (:mod:`horovod.core.negotiation.inline`); every other
collective is run by :class:`DataPlane`, the simulated data plane: the k-th collective each member of a set executes
is combined with every other member's k-th, position by position, as a real ring combines whatever each rank
hands it. A rank that executes other names at that position gets other tensors' data, and the check names the byte.
Each such collective costs its data phase (:mod:`~horovod.tools.simulate.dataphase`: the algorithm the engine would
choose, on the world's link and memory models): it starts once every member handed it in and each member's data plane
finished its previous one (a rank's engine executes in order), and every member holds its result at its end.
"""

from __future__ import annotations

import zlib
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from horovod.common.types import OpType, ReduceOp, Request
from horovod.core.ops import reducescatter_rows
from horovod.tools.simulate import dataphase

__all__ = ["PENDING", "tensor", "reference", "DataPlane", "Answers"]

PENDING = object()      # a result the data plane hands over once every member has run the collective
DATA_OPS = (OpType.ALLREDUCE, OpType.ALLGATHER, OpType.BROADCAST, OpType.ALLTOALL, OpType.REDUCESCATTER)
_CRC: Dict[str, int] = {}


def tensor(seed: int, rank: int, name: str, occurrence: int, dtype: str, shape: Tuple[int, ...]) -> np.ndarray:
    """Rank ``rank``'s input of ``name`` (its ``occurrence``-th submission): integers in [-8, 8], cheap to make."""
    crc = _CRC.get(name)
    if crc is None:
        crc = _CRC[name] = zlib.crc32(name.encode())
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    values = (np.arange(count, dtype=np.int64) * 7 + (seed * 31 + rank * 131 + crc * 11 + occurrence * 17)) % 17 - 8
    return values.astype(dtype).reshape(shape)


def _scaled(acc: np.ndarray, dtype: np.dtype, factor: float) -> np.ndarray:
    out = acc.astype(dtype)
    if factor != 1.0:
        np.multiply(out, out.dtype.type(factor), out=out)
    return out


def _reduced(request: Request, arrays: Sequence[np.ndarray]) -> np.ndarray:
    """The elementwise reduction of every member's input (exact: integer values), scaled as Horovod scales."""
    wide = np.stack([np.asarray(a, np.float64).reshape(-1) for a in arrays])
    op = request.reduce_op
    acc = wide.min(0) if op == ReduceOp.MIN else wide.max(0) if op == ReduceOp.MAX else wide.sum(0)
    post = request.postscale / len(arrays) if op == ReduceOp.AVERAGE else request.postscale
    return _scaled(acc, np.dtype(request.dtype), post)


def reference(requests: Sequence[Request], arrays: Sequence[np.ndarray], members: Sequence[int]):
    """What each member of one collective must get: a function of a member's index in ``members`` (the set's
    ranks), from every member's request and input in set order (what all members share is computed once)."""
    request, dtype = requests[0], np.dtype(requests[0].dtype)
    op = request.op
    if op == OpType.ALLREDUCE:
        whole = _reduced(request, arrays)
        return lambda index: whole.reshape(np.shape(arrays[index]))
    if op == OpType.ALLGATHER:
        whole = np.concatenate([np.asarray(a, dtype).reshape((-1,) + tuple(request.shape[1:])) for a in arrays])
        return lambda index: whole
    if op == OpType.BROADCAST:
        whole = np.asarray(arrays[list(members).index(request.root_rank)], dtype)
        return lambda index: whole
    if op == OpType.ALLTOALL:
        starts = [np.cumsum((0,) + tuple(req.splits)) for req in requests]

        def alltoall(index: int):
            parts = [np.asarray(a)[start[index]:start[index + 1]] for start, a in zip(starts, arrays)]
            return np.concatenate(parts), np.asarray([req.splits[index] for req in requests], np.int32)
        return alltoall
    if op == OpType.REDUCESCATTER:
        bounds = np.cumsum([0] + reducescatter_rows(request.shape[0], len(arrays)))
        whole = _reduced(request, arrays).reshape(tuple(request.shape))
        return lambda index: whole[bounds[index]:bounds[index + 1]]
    raise ValueError(f"no reference for op {op}")


def _same(got, want) -> Optional[str]:
    """None when ``got`` has ``want``'s dtype, shape and bytes; else where they differ."""
    if isinstance(want, tuple):
        if not isinstance(got, tuple) or len(got) != 2:
            return f"got {type(got).__name__}, expected (rows, received splits)"
        return _same(got[0], want[0]) or _same(got[1], want[1])
    got = np.asarray(got)
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"got {got.dtype}{list(got.shape)}, expected {want.dtype}{list(want.shape)}"
    a, b = got.tobytes(), want.tobytes()
    if a == b:
        return None
    at = next(i for i in range(len(a)) if a[i] != b[i])
    return f"byte {at} is {a[at]:#04x}, expected {b[at]:#04x} (got {got.reshape(-1)[:6]}, expected " \
           f"{want.reshape(-1)[:6]})"


class _Zeros:
    """What a joined rank hands the data plane for a tensor it never submitted: zeros (as ``fusion.pack`` does)."""

    request = handle = None

    def __init__(self, array: np.ndarray):
        self.array = array


class DataPlane:
    """The simulated data plane: the k-th collective every member of a set runs, combined position by position."""

    def __init__(self, job, hierarchical: bool = False):
        self._job, self._hierarchical = job, hierarchical
        self._count: Dict[Tuple[int, int], int] = {}           # (set, rank) -> collectives it ran
        self._open: Dict[Tuple[int, int], Dict[int, tuple]] = {}  # (set, k) -> member index -> what it handed in
        self._free: Dict[int, float] = {}                      # rank -> when its data plane finished its last
        self.seconds = 0.0                                      # every collective's data phase, summed
        self.phases = 0

    def run(self, rank, state, response, entries) -> Dict[str, object]:
        """Hand in ``rank``'s part of ``response`` (its names in order); results come once every member did."""
        key = (state.id, rank.rank)
        k = self._count.get(key, 0)
        self._count[key] = k + 1
        parts = [entries[name] for name in response.names if name in entries]
        if rank.executor.joined and response.op == OpType.ALLREDUCE and not parts:   # a joined rank: zeros
            parts = [_Zeros(np.zeros(shape, response.dtype)) for shape in response.shapes]
        members = state.group.ranks
        held = self._open.setdefault((state.id, k), {})
        held[state.group.index] = (rank, response, parts, max(rank.clock(), self._free.get(rank.rank, 0.0)))
        if len(held) == len(members):
            del self._open[(state.id, k)]
            self._combine(state.id, k, [held[i] for i in range(len(members))], members)
        return {name: PENDING for name in entries}

    def _ends(self, held: List[tuple], members: Sequence[int]) -> float:
        """When the collective ``held`` describes ends: its data phase from when its last member was ready."""
        first = held[0]
        nbytes = sum(int(np.asarray(part.array).nbytes) for part in first[2])
        if first[1].op == OpType.ALLGATHER:
            nbytes *= len(members)
        took = dataphase.seconds(self._job.world, first[1].op, members, nbytes, self._hierarchical)
        self.seconds += took
        self.phases += 1
        end = max(ready for _, _, _, ready in held) + took
        for rank, _, _, _ in held:
            self._free[rank.rank] = end
        return end

    def _combine(self, set_id: int, k: int, held: List[tuple], members: Sequence[int]) -> None:
        first = held[0]
        for rank, response, parts, _ in held:
            if response.op != first[1].op or len(parts) != len(first[2]):
                self._job.violation(f"collective {k} of set {set_id}: rank {rank.rank} runs {OpType(response.op).name} "
                                    f"of {list(response.names)[:4]}, rank {first[0].rank} runs "
                                    f"{OpType(first[1].op).name} of {list(first[1].names)[:4]} (the data plane would "
                                    f"hang or mix them)")
        results = []
        for t in range(len(first[2])):
            request = next((parts[t].request for _, _, parts, _ in held if parts[t].request is not None), None)
            if request is None:
                self._job.violation(f"collective {k} of set {set_id}: no member submitted its tensor {t}")
            requests = [parts[t].request or request for _, _, parts, _ in held]
            arrays = [parts[t].array for _, _, parts, _ in held]
            shapes = {np.shape(a)[1:] if requests[0].op != OpType.ALLREDUCE else np.size(a) for a in arrays}
            if len(shapes) > 1 and requests[0].op != OpType.BROADCAST:
                self._job.violation(f"collective {k} of set {set_id}: position {t} holds tensors of shapes "
                                    f"{sorted(map(str, shapes))[:4]} (the data plane would fail or hang)")
            result = reference(requests, arrays, members)
            results += [(parts[t].handle, result(index)) for index, (_, _, parts, _) in enumerate(held)
                        if parts[t].handle is not None]
        self._job.world.at(self._ends(held, members), lambda: self._deliver(results))

    @staticmethod
    def _deliver(results: List[tuple]) -> None:
        # A member that died, or failed (its handles failed with it), while the data phase ran gets nothing.
        for handle, value in results:
            if not handle.done and not handle.rank.dead:
                handle.set_result(value)


class Answers:
    """Every rank's inputs by (set, name, occurrence), and each result checked against :func:`reference`."""

    def __init__(self, job, hierarchical: bool = False):
        self._job = job
        self.plane = DataPlane(job, hierarchical)
        self._times: Dict[Tuple[int, int, str], int] = {}       # (rank, set, name) -> submissions so far
        self._inputs: Dict[Tuple[int, str, int], Dict[int, Tuple[Request, np.ndarray]]] = {}
        self._checked: Dict[Tuple[int, str, int], int] = {}
        self._expected: Dict[Tuple[int, str, int], object] = {}
        self.results = 0                                        # results compared

    def input(self, rank: int, set_id: int, request: Request) -> Tuple[np.ndarray, int]:
        """``rank``'s input for ``request`` and which submission of its name it is."""
        times = self._times.get((rank, set_id, request.name), 0)
        self._times[(rank, set_id, request.name)] = times + 1
        array = tensor(self._job.world.seed, rank, request.name, times, request.dtype, request.shape)
        self._inputs.setdefault((set_id, request.name, times), {})[rank] = (request, array)
        return array, times

    def check(self, rank, handle, value) -> None:
        """Compare ``handle``'s result on ``rank`` with the reduction of every member's input."""
        key = (handle.set_id, handle.name, handle.occurrence)
        if handle.name == "join" or value is None and key not in self._inputs:
            return
        members = self._job.ranks[rank.rank].sets[handle.set_id].group.ranks
        got = self._inputs.get(key, {})
        missing = [m for m in members if m not in got and not self._job.ranks[m].executor.joined]
        if missing:
            self._job.violation(f"rank {rank.rank}: {handle.name!r} completed before ranks {missing[:8]} submitted it")
        if len(got) < len(members):     # ranks that joined contribute zeros
            some = next(iter(got.values()))[0]
            got = {m: got.get(m) or (some, np.zeros(some.shape, some.dtype)) for m in members}
        expected = self._expected.get(key)
        if expected is None:
            expected = self._expected[key] = reference([got[m][0] for m in members], [got[m][1] for m in members],
                                                       members)
        wrong = _same(value, expected(members.index(rank.rank)))
        if wrong is not None:
            self._job.violation(f"rank {rank.rank}: the result of {handle.name!r} (submission {handle.occurrence}) "
                                f"is wrong: {wrong}")
        self.results += 1
        done = self._checked.get(key, 0) + 1
        if done == len(members):
            self._checked.pop(key, None)
            self._inputs.pop(key, None)
            self._expected.pop(key, None)
        else:
            self._checked[key] = done
