"""Process sets: collectives among a subset of ranks, with Horovod's API and id numbering.

Id 0 is the global set. Static sets are given to ``init(process_sets=[...])``; in dynamic mode
(``HOROVOD_DYNAMIC_PROCESS_SETS=1`` or ``init(process_sets="dynamic")``) every rank calls ``add_process_set`` and
``remove_process_set`` in the same order, and the engine applies the change at the same point on every rank.
Ids are assigned 1, 2, ... in registration order. Which sets hold an id is the live context's
(:mod:`horovod.runtime.context`): ``shutdown`` takes every id back except the global set's 0.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Union

from horovod.common.types import OpType, Request
from horovod.runtime import context, mpi_bootstrap

__all__ = ["ProcessSet", "global_process_set", "add_process_set", "remove_process_set"]


class ProcessSet:
    """A set of global ranks. ``size()`` and ``rank()`` are None until the set is registered."""

    def __init__(self, ranks_or_comm: Union[Sequence[int], object]):
        self.mpi_comm = None
        if mpi_bootstrap.is_communicator(ranks_or_comm):  # an mpi4py communicator: its members' world ranks
            self.mpi_comm, ranks_or_comm = ranks_or_comm, mpi_bootstrap.world_ranks(ranks_or_comm)
        self.ranks: Optional[List[int]] = sorted(int(r) for r in ranks_or_comm) if ranks_or_comm is not None else None
        if self.ranks is not None and len(set(self.ranks)) != len(self.ranks):
            raise ValueError(f"ProcessSet ranks contain duplicates: {self.ranks}")
        self.process_set_id: Optional[int] = None

    def _registered(self) -> bool:
        return self.process_set_id is not None and context.get() is not None

    def size(self) -> Optional[int]:
        """The number of ranks in the set, or None when the set is not registered."""
        return len(self.ranks) if self._registered() and self.ranks is not None else None

    def rank(self) -> Optional[int]:
        """This process's rank within the set, or None when it is not a member or the set is not registered."""
        if not self._registered():
            return None
        me = context.current().rank
        return self.ranks.index(me) if me in self.ranks else None

    def included(self) -> Optional[bool]:
        """Whether this process is a member, or None when the set is not registered."""
        if not self._registered():
            return None
        return context.current().rank in self.ranks

    def __eq__(self, other) -> bool:
        return isinstance(other, ProcessSet) and self.ranks == other.ranks and \
            self.process_set_id == other.process_set_id

    def __hash__(self) -> int:
        return hash((tuple(self.ranks or ()), self.process_set_id))

    def __repr__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"

    def __str__(self) -> str:
        """As Horovod prints a process set."""
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}, mpi_comm={self.mpi_comm})"


class _GlobalProcessSet(ProcessSet):
    """The set of every rank (id 0): its ranks are the live context's, none before ``init`` or after ``shutdown``."""

    def __init__(self):
        super().__init__(None)
        self.process_set_id = 0

    @property
    def ranks(self) -> List[int]:
        """Every rank of the job, or none when Horovod is not initialized."""
        ctx = context.get()
        return list(range(ctx.size)) if ctx is not None else []

    @ranks.setter
    def ranks(self, value) -> None:
        if value is not None:      # (ProcessSet.__init__ sets None; the ranks are the context's)
            raise AttributeError("the global process set's ranks are every rank of the job")


global_process_set = _GlobalProcessSet()


def add_process_set(process_set: Union[ProcessSet, Sequence[int]]) -> ProcessSet:
    """Register a new process set on every rank (dynamic mode only); returns it with its id set.

    Raises:
        ValueError: not in dynamic mode, the ranks are invalid, or a set with these ranks exists.
    """
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    if ps.process_set_id is not None:
        raise ValueError(f"{ps} is already registered")
    ps.process_set_id = _add_process_set_impl(ps.ranks)
    context.current().process_sets.append(ps)
    return ps


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister a set on every rank; False for the global set or an unregistered one."""
    if process_set.process_set_id in (None, 0):
        return False
    removed = _remove_process_set_impl(process_set.process_set_id)
    if removed:
        process_set.process_set_id = None
        registered = context.current().process_sets
        if process_set in registered:
            registered.remove(process_set)
    return removed


# -- the engine side of dynamic sets ----------------------------------------------------------------------------------

def _set_change(op: OpType, payload) -> object:
    ctx = context.current()
    if not ctx.dynamic_sets:
        raise ValueError("Process sets can only be added or removed in dynamic mode: set "
                         "HOROVOD_DYNAMIC_PROCESS_SETS=1 or call hvd.init(process_sets='dynamic')")
    name = f"process_set.{op.name.lower()}.{ctx.counters.next('process_set') + 1}"
    handle = context.engine().submit(Request(name, op, "uint8", (), payload=tuple(payload)), None)
    return handle.result()


def _add_process_set_impl(ranks: Sequence[int]) -> int:
    ctx = context.current()
    if not ranks or any(r < 0 or r >= ctx.size for r in ranks):
        raise ValueError(f"process set ranks {list(ranks)} must be non-empty and within 0..{ctx.size - 1}")
    set_id = _set_change(OpType.ADD_PROCESS_SET, sorted(ranks))
    if set_id < 0:
        raise ValueError(f"a process set with ranks {sorted(ranks)} is already registered (id {-set_id - 1}); "
                         f"this is a duplicate")
    return set_id


def _remove_process_set_impl(set_id: int) -> bool:
    return bool(_set_change(OpType.REMOVE_PROCESS_SET, [set_id]))


def _get_process_set_ids_and_ranks() -> Dict[int, List[int]]:
    return {i: list(r) for i, r in context.engine().set_ids().items()}


def _process_set_rank(set_id: int) -> int:
    ranks = context.engine().set_ranks(set_id)
    me = context.current().rank
    return ranks.index(me) if ranks and me in ranks else -1


def _process_set_size(set_id: int) -> int:
    ranks = context.engine().set_ranks(set_id)
    return len(ranks) if ranks else -1
