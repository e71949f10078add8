"""The per-process Horovod context: ``init``, ``shutdown``, topology queries and capability queries.

One explicit context object per process (:class:`horovod.runtime.context.Context`), created by :func:`init` and
dropped by :func:`shutdown`, which leaves nothing of it behind; ``shutdown()`` then ``init()`` again builds a fresh
one (elastic training relies on it).
"""

from __future__ import annotations

import atexit
import sys
from typing import List, Optional, Sequence

from horovod import timeline as _timeline
from horovod.common import config as _config
from horovod.common.util import ccl_built, ddl_built, gloo_built, mpi_built, nccl_built, torch_cuda_version
from horovod.common.exceptions import HorovodInternalError
from horovod.core.bootstrap import connect
from horovod.core.engine import Engine
from horovod.core.negotiation import peer_negotiation
from horovod.runtime import context as _ctx
from horovod.runtime import device
from horovod.runtime import elastic_worker
from horovod.runtime.process_sets import (ProcessSet, global_process_set, _add_process_set_impl,  # noqa: F401
                                          _get_process_set_ids_and_ranks, _process_set_rank, _process_set_size,
                                          _remove_process_set_impl)
from horovod.runtime.topology import resolve

__all__ = ["init", "shutdown", "is_initialized", "size", "rank", "local_size", "local_rank", "cross_size",
           "cross_rank", "is_homogeneous", "engine", "context", "mpi_threads_supported", "mpi_enabled", "mpi_built",
           "gloo_enabled", "gloo_built", "nccl_built", "ddl_built", "ccl_built", "cuda_built", "rocm_built",
           "start_timeline", "stop_timeline", "NOT_INITIALIZED"]

NOT_INITIALIZED = _ctx.NOT_INITIALIZED
# Outlive shutdown() on purpose. Each init's mesh (outside an elastic job, whose driver numbers its rounds) is
# formed in a rendezvous scope named after this count, which must never repeat in a process: a re-init must not
# meet the records of the previous one.
_generation = 0
# atexit.register(shutdown) once per process, however often init runs.
_atexit_registered = False
# init(process_sets="dynamic") holds for every later init of this process, as in Horovod (which sets
# HOROVOD_DYNAMIC_PROCESS_SETS for it): an elastic reset re-initialises without arguments.
_dynamic_asked = False


def _require() -> _ctx.Context:
    return _ctx.current()


def context() -> _ctx.Context:
    """The live context; ValueError before ``init``."""
    return _ctx.current()


def _static_sets(process_sets, size: int) -> List[ProcessSet]:
    static_sets: List[ProcessSet] = list(process_sets or [])
    seen = set()
    for ps in static_sets:
        key = tuple(ps.ranks)
        if key in seen:
            raise ValueError(f"{ps} is a duplicate of another process set in init(process_sets=...)")
        if any(r < 0 or r >= size for r in ps.ranks):
            raise ValueError(f"{ps} names ranks outside 0..{size - 1}")
        seen.add(key)
    return static_sets


def _start_engine(config, topo, static_sets: List[ProcessSet]) -> _ctx.Context:
    global _generation
    rank, size = topo.rank, topo.size
    peer_negotiation(config, size)      # a contradictory setting fails before any connection is made
    _generation += 1
    transport = None
    generation = _generation if topo.generation is None else topo.generation
    if size > 1:
        abandoned = (lambda: elastic_worker.round_broken(generation)) if config.elastic else None
        transport = connect(config, topo, f"{topo.scope}.mesh.{generation}", abandoned)
    timeline = _timeline.from_config(config, rank)
    try:
        plane = device.make_plane(config, topo, f"{topo.scope}.device.{generation}")
    except BaseException:
        transport.close() if transport is not None else None
        raise
    engine = Engine(config, rank, size, transport, timeline, plane)
    engine.add_static_set(0, range(size))
    for index, ps in enumerate(static_sets, start=1):
        engine.add_static_set(index, ps.ranks)
        ps.process_set_id = index
    engine.start()
    return _ctx.Context(config, topo, engine, timeline, process_sets=list(static_sets))


def _start_round(config, topo, static_sets: List[ProcessSet]) -> _ctx.Context:
    """Start the engine; in an elastic job a round that breaks while its mesh forms (a peer died during start-up)
    is followed by the driver's next one, here, so that the first ``init`` (outside ``hvd.elastic.run``) survives
    it too."""
    while True:
        try:
            return _start_engine(config, topo, static_sets)
        except HorovodInternalError as exc:
            if not config.elastic:
                raise
            print(f"horovod: round {topo.generation} broke while connecting ({exc}); asking the driver for the "
                  f"next one", file=sys.stderr, flush=True)
            topo = resolve(config)


def init(comm: Optional[Sequence[int]] = None, process_sets=None) -> None:
    """Start Horovod in this process: connect to the other ranks and start the background engine.

    Args:
        comm: None for all ranks; an mpi4py communicator, whose ranks then form the job; or a list naming every
            rank.
        process_sets: None, a list of :class:`ProcessSet` to register statically (ids 1, 2, ...), or
            ``"dynamic"`` to allow ``add_process_set``/``remove_process_set`` at run time.
    Raises:
        ValueError: duplicate process sets or an unsupported ``comm``.
        HorovodInternalError: the peers could not be reached within the start timeout.
    """
    global _atexit_registered, _dynamic_asked
    with _ctx.lock:
        if _ctx.get() is not None:
            return
        if process_sets == "dynamic":
            _dynamic_asked, process_sets = True, None
        config = _config.load_config()
        if _dynamic_asked:      # (the process environment stays as it was)
            config = config.replace(dynamic_process_sets=True)
        topo = resolve(config, comm)
        size = topo.size
        if isinstance(comm, (list, tuple, range)) and sorted(comm) != list(range(size)):
            raise ValueError("init(comm=[ranks]) with a subset of the ranks needs MPI; pass an mpi4py communicator "
                             "of those ranks, or use process sets")
        _ctx.install(_start_round(config, topo, _static_sets(process_sets, size)))
        if not _atexit_registered:
            atexit.register(shutdown)
            _atexit_registered = True


def shutdown() -> None:
    """Stop the engine (every rank stops at the same cycle) and drop the context, taking back the process sets'
    ids (but the global set's 0); a no-op when not initialized."""
    ctx = _ctx.clear()
    if ctx is None or ctx.foreign():
        return      # (a forked child: the engine, its thread and connections are the parent's)
    ctx.engine.shutdown()
    if ctx.timeline is not None:
        ctx.timeline.close()
    for ps in ctx.process_sets:
        ps.process_set_id = None


def is_initialized() -> bool:
    """Whether ``init`` has run in this process (and ``shutdown`` has not)."""
    return _ctx.get() is not None


def size() -> int:
    """The number of ranks in the job."""
    return _require().size


def rank() -> int:
    """This process's rank in the job, 0..size()-1."""
    return _require().rank


def local_size() -> int:
    """The number of ranks on this host."""
    return _require().topo.local_size


def local_rank() -> int:
    """This process's rank among the ranks on its host."""
    return _require().topo.local_rank


def cross_size() -> int:
    """The number of hosts (ranks with the same local rank, one per host)."""
    return _require().topo.cross_size


def cross_rank() -> int:
    """This host's index among the hosts."""
    return _require().topo.cross_rank


def is_homogeneous() -> bool:
    """True when every host runs the same number of ranks."""
    ctx = _require()
    return ctx.size == ctx.topo.local_size * ctx.topo.cross_size


# The live engine; ValueError before ``init``, HorovodInternalError once it has failed. (The context's own function,
# not a wrapper: it runs once per submitted tensor.)
engine = _ctx.engine


# Capability queries: answered for this implementation, truthfully.
def mpi_threads_supported() -> bool:
    """False: this build has no MPI."""
    _require()
    return False


def mpi_enabled() -> bool:
    """False: this build has no MPI."""
    return False



def gloo_enabled() -> bool:
    """Our TCP/shared-memory controller plays the role of Horovod's Gloo controller."""
    return True






def cuda_built() -> bool:
    """Whether CUDA tensors can go through the device plane: the installed torch was built with CUDA."""
    return torch_cuda_version() is not None


def rocm_built() -> bool:
    """False: tensors are reduced on the CPU."""
    return False


def _timeline_of(ctx):
    if not ctx.config.timeline:
        raise ValueError("Set HOROVOD_TIMELINE=DYNAMIC to enable dynamic timeline usage.")
    return ctx.timeline  # None on ranks other than 0: they succeed and write nothing, as in Horovod


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Start writing a timeline (needs ``HOROVOD_TIMELINE`` set, e.g. ``DYNAMIC``); every rank may call it, rank 0
    writes."""
    timeline = _timeline_of(_require())
    if timeline is not None:
        timeline.start_file(file_path, mark_cycles)


def stop_timeline() -> None:
    """Stop writing the timeline started by :func:`start_timeline` (every rank may call it)."""
    timeline = _timeline_of(_require())
    if timeline is not None:
        timeline.stop_file()
