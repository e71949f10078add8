"""The per-process Horovod context: ``init``, ``shutdown``, topology queries and capability queries.

One explicit context object per process, created by :func:`init` and dropped by :func:`shutdown`;
``shutdown()`` then ``init()`` again builds a fresh one (elastic training relies on it).
"""

from __future__ import annotations

import atexit
import dataclasses
import threading
from typing import Dict, List, Optional, Sequence

from horovod.common import config as _config
from horovod.common.exceptions import HorovodInternalError
from horovod.common.process_sets import ProcessSet, global_process_set
from horovod.common.types import OpType, Request

NOT_INITIALIZED = "Horovod has not been initialized; use hvd.init()."


@dataclasses.dataclass
class _Context:
    config: object
    topo: object          # horovod.common.topology.Topology: this worker's place in the job
    engine: object
    dynamic_sets: bool
    timeline: object = None

    @property
    def rank(self) -> int:
        return self.topo.rank

    @property
    def size(self) -> int:
        return self.topo.size


_context: Optional[_Context] = None
_lock = threading.RLock()
_generation = 0
_atexit_registered = False


def _require() -> _Context:
    if _context is None:
        raise ValueError(NOT_INITIALIZED)
    return _context


def context() -> _Context:
    """The live context; ValueError before ``init``."""
    return _require()


def init(comm: Optional[Sequence[int]] = None, process_sets=None) -> None:
    """Start Horovod in this process: connect to the other ranks and start the background engine.

    Args:
        comm: None for all ranks (a list of ranks or an MPI communicator needs MPI, which this build lacks,
            unless it names every rank).
        process_sets: None, a list of :class:`ProcessSet` to register statically (ids 1, 2, ...), or
            ``"dynamic"`` to allow ``add_process_set``/``remove_process_set`` at run time.
    Raises:
        ValueError: duplicate process sets or an unsupported ``comm``.
        HorovodInternalError: the peers could not be reached within the start timeout.
    """
    global _context, _generation, _atexit_registered
    with _lock:
        if _context is not None:
            return
        if process_sets == "dynamic":
            _config.environ_set("HOROVOD_DYNAMIC_PROCESS_SETS", "1")
            process_sets = None
        config = _config.load_config()
        from horovod.common.topology import resolve
        topo = resolve(config)
        rank, size = topo.rank, topo.size
        if comm is not None and sorted(comm if isinstance(comm, (list, tuple, range)) else [-1]) != list(range(size)):
            raise ValueError("init(comm=...) with a subset of ranks or an MPI communicator needs MPI support, "
                             "which this build does not have; use process sets instead")
        static_sets: List[ProcessSet] = list(process_sets or [])
        seen = set()
        for ps in static_sets:
            key = tuple(ps.ranks)
            if key in seen:
                raise ValueError(f"{ps} is a duplicate of another process set in init(process_sets=...)")
            if any(r < 0 or r >= size for r in ps.ranks):
                raise ValueError(f"{ps} names ranks outside 0..{size - 1}")
            seen.add(key)

        from horovod.core.engine import Engine
        from horovod.core.peer_negotiation import peer_negotiation
        from horovod import timeline as _timeline
        peer_negotiation(config, size)      # a contradictory setting fails before any connection is made
        _generation += 1
        transport = None
        if size > 1:
            from horovod.core.bootstrap import connect
            generation = _generation if topo.generation is None else topo.generation
            transport = connect(config, topo, f"{topo.scope}.mesh.{generation}")
        timeline = _timeline.from_config(config, rank)
        engine = Engine(config, rank, size, transport, timeline)
        engine.add_static_set(0, range(size))
        global_process_set.ranks = list(range(size))
        global_process_set.process_set_id = 0
        for index, ps in enumerate(static_sets, start=1):
            engine.add_static_set(index, ps.ranks)
            ps.process_set_id = index
        engine.start()
        _context = _Context(config, topo, engine, bool(config.dynamic_process_sets), timeline)
        if not _atexit_registered:
            atexit.register(shutdown)
            _atexit_registered = True


def shutdown() -> None:
    """Stop the engine (every rank stops at the same cycle) and drop the context; a no-op when not initialized."""
    global _context
    with _lock:
        ctx, _context = _context, None
    if ctx is None:
        return
    ctx.engine.shutdown()
    if ctx.timeline is not None:
        ctx.timeline.close()


def is_initialized() -> bool:
    return _context is not None


def size() -> int:
    return _require().size


def rank() -> int:
    return _require().rank


def local_size() -> int:
    return _require().topo.local_size


def local_rank() -> int:
    return _require().topo.local_rank


def cross_size() -> int:
    return _require().topo.cross_size


def cross_rank() -> int:
    return _require().topo.cross_rank


def is_homogeneous() -> bool:
    """True when every host runs the same number of ranks."""
    ctx = _require()
    return ctx.size == ctx.topo.local_size * ctx.topo.cross_size


def engine():
    ctx = _require()
    if ctx.engine.error is not None:
        raise HorovodInternalError(ctx.engine.error)
    return ctx.engine


# Capability queries: answered for this implementation, truthfully.
def mpi_threads_supported() -> bool:
    _require()
    return False


def mpi_enabled() -> bool:
    return False


def mpi_built() -> bool:
    return False


def gloo_enabled() -> bool:
    """Our TCP/shared-memory controller plays the role of Horovod's Gloo controller."""
    return True


def gloo_built() -> bool:
    return True


def nccl_built() -> int:
    return 0


def ddl_built() -> bool:
    return False


def ccl_built() -> bool:
    return False


def cuda_built() -> bool:
    return False


def rocm_built() -> bool:
    return False


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Start writing a timeline (needs ``HOROVOD_TIMELINE=DYNAMIC``)."""
    ctx = _require()
    if ctx.timeline is None:
        raise ValueError("Set HOROVOD_TIMELINE=DYNAMIC to enable dynamic timeline usage.")
    ctx.timeline.start_file(file_path, mark_cycles)


def stop_timeline() -> None:
    ctx = _require()
    if ctx.timeline is None:
        raise ValueError("Set HOROVOD_TIMELINE=DYNAMIC to enable dynamic timeline usage.")
    ctx.timeline.stop_file()


# -- process sets ---------------------------------------------------------------------------------------------------

_set_change_counter = 0


def _set_change(op: OpType, payload) -> object:
    global _set_change_counter
    ctx = _require()
    if not ctx.dynamic_sets:
        raise ValueError("Process sets can only be added or removed in dynamic mode: set "
                         "HOROVOD_DYNAMIC_PROCESS_SETS=1 or call hvd.init(process_sets='dynamic')")
    _set_change_counter += 1
    name = f"process_set.{op.name.lower()}.{_set_change_counter}"
    handle = engine().submit(Request(name, op, "uint8", (), payload=tuple(payload)), None)
    return handle.result()


def _add_process_set_impl(ranks: Sequence[int]) -> int:
    ctx = _require()
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
    return {i: list(r) for i, r in engine().set_ids().items()}


def _process_set_rank(set_id: int) -> int:
    ranks = engine().set_ranks(set_id)
    return ranks.index(rank()) if ranks and rank() in ranks else -1


def _process_set_size(set_id: int) -> int:
    ranks = engine().set_ranks(set_id)
    return len(ranks) if ranks else -1
