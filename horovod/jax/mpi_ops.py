"""Horovod's collectives on JAX arrays and pytrees of them, eagerly and inside ``jax.jit``, ``jax.grad``, ``jax.vmap``.

Every function takes a ``jax.Array`` (or anything ``jnp.asarray`` takes) or any pytree of them: a single array is
one op, a container is submitted as one group (negotiated and fused together), and the result has the input's
structure and dtypes. Eagerly a collective runs at once; traced, it runs when the compiled program runs, once per
call and in program order (see :mod:`horovod.jax._transforms`). Unnamed traced collectives are named after their
call site, so ranks need not trace or call them in the same order relative to eager ones.

Inside ``jax.jit`` shapes are static: an allgather needs the same first dimension on every rank (a ragged gather
fails on every rank) and an alltoall even splits. Eagerly both take any sizes, as in Horovod.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

import numpy as np

from horovod.jax import _transforms as _t
from horovod.jax._arrays import flatten, unflatten
from horovod.jax._naming import tracing
from horovod.jax.compression import Compression
from horovod.runtime import collectives as _c
from horovod.runtime.compression import compress_all, decompress_all
from horovod.runtime.gradient_policy import resolve_op
from horovod.runtime.process_sets import ProcessSet, global_process_set

Handle = _t.Handle


def _compressed(compression, tree, run):
    if compression is None or compression is Compression.none:
        return run(tree)
    leaves, treedef = flatten(tree)
    wire, ctxs = compress_all(compression, leaves)
    out = run(unflatten(treedef, wire))
    return unflatten(treedef, decompress_all(compression, flatten(out)[0], ctxs))


def _reduction(op, average, prescale_factor, postscale_factor, process_set):
    return dict(op=resolve_op(op, average), prescale=prescale_factor, postscale=postscale_factor,
                process_set=process_set)


# -- allreduce ------------------------------------------------------------------------------------------------------

def allreduce(tensor, average: Optional[bool] = None, name: Optional[str] = None, compression=Compression.none,
              op: Optional[int] = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: ProcessSet = global_process_set):
    """Reduce ``tensor`` (an array or a pytree, reduced as one group) over the ranks of ``process_set``.

    Differentiable: the gradient is the same allreduce of the output's gradient (same op and scale factors).

    Args:
        tensor: an array or pytree of arrays, the same shapes and dtypes on every rank.
        average: deprecated; use ``op``.
        name: a name unique among pending collectives (eagerly: numbered in submission order when None; traced:
            named after the call site).
        compression: applied before the reduction and undone after it (``hvd.Compression.fp16``...).
        op: ``hvd.Average`` (default), ``Sum``, ``Min``, ``Max``, ``Product`` or ``Adasum``.
        prescale_factor, postscale_factor: multiply the input before and the result after the reduction.
        process_set: the ranks taking part.
    Raises:
        ValueError: ``op`` and ``average`` both given, an unsupported dtype, or an op the dtype cannot take.
        TensorMismatchError: ranks disagree on shape, dtype or op (eagerly; traced, a ``JaxRuntimeError`` carrying
            the same message, on every rank).
    """
    options = _reduction(op, average, prescale_factor, postscale_factor, process_set)
    return _compressed(compression, tensor, lambda t: _t.collective("allreduce", t, name, **options))


def grouped_allreduce(tensors: Sequence, average: Optional[bool] = None, name: Optional[str] = None,
                      compression=Compression.none, op: Optional[int] = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0, process_set: ProcessSet = global_process_set) -> List[Any]:
    """Allreduce a list of arrays as one group (negotiated and fused together); see :func:`allreduce`."""
    return list(allreduce(list(tensors), average, name, compression, op, prescale_factor, postscale_factor,
                          process_set))


def allreduce_async(tensor, average: Optional[bool] = None, name: Optional[str] = None, op: Optional[int] = None,
                    prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    process_set: ProcessSet = global_process_set) -> Handle:
    """Start :func:`allreduce`; :func:`synchronize` returns the result. Works inside ``jax.jit`` too (the start
    and the wait are separate steps of the program, so ranks may start several collectives in different orders)."""
    return _t.collective_async("allreduce", tensor, name,
                               **_reduction(op, average, prescale_factor, postscale_factor, process_set))


def grouped_allreduce_async(tensors: Sequence, average: Optional[bool] = None, name: Optional[str] = None,
                            op: Optional[int] = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set: ProcessSet = global_process_set) -> Handle:
    """Start :func:`grouped_allreduce`; :func:`synchronize` returns the list of results."""
    return allreduce_async(list(tensors), average, name, op, prescale_factor, postscale_factor, process_set)


# -- allgather, broadcast, alltoall, reducescatter -------------------------------------------------------------------

def allgather(tensor, name: Optional[str] = None, process_set: ProcessSet = global_process_set):
    """Concatenate every rank's ``tensor`` on the first dimension (a pytree: each leaf, as one group).

    Eagerly the first dimension may differ between ranks; inside ``jax.jit`` it must not. Differentiable: the
    gradient is the averaged allreduce of the output's gradient, sliced to this rank's rows (Horovod's rule).
    """
    return _t.collective("allgather", tensor, name, process_set=process_set)


def grouped_allgather(tensors: Sequence, name: Optional[str] = None,
                      process_set: ProcessSet = global_process_set) -> List[Any]:
    """Allgather a list of arrays as one group; returns the list of outputs."""
    return list(allgather(list(tensors), name, process_set))


def allgather_async(tensor, name: Optional[str] = None, process_set: ProcessSet = global_process_set) -> Handle:
    """Start :func:`allgather`; :func:`synchronize` returns the result."""
    return _t.collective_async("allgather", tensor, name, process_set=process_set)


def grouped_allgather_async(tensors: Sequence, name: Optional[str] = None,
                            process_set: ProcessSet = global_process_set) -> Handle:
    """Start :func:`grouped_allgather`."""
    return allgather_async(list(tensors), name, process_set)


def broadcast(tensor, root_rank: int, name: Optional[str] = None, process_set: ProcessSet = global_process_set):
    """The value of ``tensor`` (an array or pytree) on global rank ``root_rank``, on every rank of the set.

    Differentiable: the root's gradient is the averaged allreduce of the output's gradient, the others' zero.
    """
    return _t.collective("broadcast", tensor, name, root_rank=int(root_rank), process_set=process_set)


def broadcast_async(tensor, root_rank: int, name: Optional[str] = None,
                    process_set: ProcessSet = global_process_set) -> Handle:
    """Start :func:`broadcast`."""
    return _t.collective_async("broadcast", tensor, name, root_rank=int(root_rank), process_set=process_set)


def _splits(splits):
    return None if splits is None else tuple(int(s) for s in np.asarray(splits).reshape(-1))


def alltoall(tensor, splits=None, name: Optional[str] = None, process_set: ProcessSet = global_process_set):
    """Send rows ``splits[i]`` of ``tensor``'s first dimension to rank i of the set (equal parts when None) and
    concatenate what the others send. Returns the output, or ``(output, received_splits)`` when ``splits`` is
    given. Explicit splits need eager code (the received sizes are not static); differentiable.

    Raises:
        ValueError: no ``splits`` and rows that do not divide by the set's size, or bad ``splits``.
    """
    return _t.collective("alltoall", tensor, name, splits=_splits(splits), process_set=process_set)


def alltoall_async(tensor, splits=None, name: Optional[str] = None,
                   process_set: ProcessSet = global_process_set) -> Handle:
    """Start :func:`alltoall`."""
    return _t.collective_async("alltoall", tensor, name, splits=_splits(splits), process_set=process_set)


def reducescatter(tensor, name: Optional[str] = None, compression=Compression.none, op: int = _c.Average,
                  process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0):
    """Reduce over the set and keep this rank's slice of the first dimension (ranks below ``rows % size`` get one
    extra row); a pytree is one group. Differentiable: the gradient is the allgather of the output's gradient,
    scaled like the reduction.

    Raises:
        ValueError: ``op`` other than ``hvd.Sum`` or ``hvd.Average``.
    """
    options = dict(op=op, prescale=prescale_factor, postscale=postscale_factor, process_set=process_set)
    return _compressed(compression, tensor, lambda t: _t.collective("reducescatter", t, name, **options))


def grouped_reducescatter(tensors: Sequence, name: Optional[str] = None, compression=Compression.none,
                          op: int = _c.Average, process_set: ProcessSet = global_process_set,
                          prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> List[Any]:
    """Reducescatter a list of arrays as one group; returns the list of outputs."""
    return list(reducescatter(list(tensors), name, compression, op, process_set, prescale_factor, postscale_factor))


def reducescatter_async(tensor, name: Optional[str] = None, op: int = _c.Average,
                        process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                        postscale_factor: float = 1.0) -> Handle:
    """Start :func:`reducescatter`."""
    return _t.collective_async("reducescatter", tensor, name, op=op, prescale=prescale_factor,
                               postscale=postscale_factor, process_set=process_set)


def grouped_reducescatter_async(tensors: Sequence, name: Optional[str] = None, op: int = _c.Average,
                                process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                                postscale_factor: float = 1.0) -> Handle:
    """Start :func:`grouped_reducescatter`."""
    return reducescatter_async(list(tensors), name, op, process_set, prescale_factor, postscale_factor)


# -- handles and synchronisation ------------------------------------------------------------------------------------

def synchronize(handle: Handle):
    """Wait for a started collective and return its result (inside ``jax.jit`` too).

    Raises:
        HorovodInternalError: the job broke. TensorMismatchError: ranks disagreed on the tensor.
    """
    return _t.synchronize(handle)


def poll(handle: Handle) -> bool:
    """True when the collective behind an eager ``handle`` has finished, so :func:`synchronize` will not block."""
    return handle.done()


def _eager_only(what: str) -> None:
    if tracing():
        raise RuntimeError(f"{what} takes no arrays and runs only eagerly: call it outside jax.jit/grad/vmap")


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Block until every rank of ``process_set`` reaches the barrier (eager only)."""
    _eager_only("barrier()")
    _c.barrier(process_set=process_set)


def join(device: int = -1) -> int:
    """Declare that this rank has no more batches; returns the rank that joined last. Until every rank joined,
    this rank contributes zeros to the others' allreduces (eager only; ``device`` is accepted for
    compatibility)."""
    _eager_only("join()")
    return _c.join()


__all__ = ["allreduce", "grouped_allreduce", "allreduce_async", "grouped_allreduce_async", "allgather",
           "grouped_allgather", "allgather_async", "grouped_allgather_async", "broadcast", "broadcast_async",
           "alltoall", "alltoall_async", "reducescatter", "grouped_reducescatter", "reducescatter_async",
           "grouped_reducescatter_async", "synchronize", "poll", "barrier", "join", "Handle"]
