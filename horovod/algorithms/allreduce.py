"""Allreduce: which algorithm reduces a flat buffer over a group, and how Adasum is composed.

In order of preference: shared memory (every rank of the group on this host, and the buffer at least
``HOROVOD_SHM_MIN_BYTES``), hierarchical (``HOROVOD_HIERARCHICAL_ALLREDUCE`` and a group spanning hosts), then up to
``ring.EXCHANGE_MAX_BYTES`` (latency-bound) the exchange (one hop) or recursive doubling (log2 n hops, one message
each), whichever :func:`latency.prefer_recursive_doubling` predicts faster for the size and rank count, and above it
the pipelined ring (bandwidth-bound). The timeline names the chosen algorithm, and the debug log
(``HOROVOD_LOG_LEVEL=debug``) says which one each group uses for each size class. Every rank of a
group chooses alike, since the choice reads only the group, the settings every rank agrees on and the buffer's size.
Adasum runs by vector halving and distance doubling (``adasum.vhdd_allreduce``), after a sum within each host when
the allreduce is hierarchical.
"""

from __future__ import annotations

import logging
from typing import Callable, Optional, Sequence

import numpy as np

from horovod.algorithms import adasum, hierarchical, latency, reduction, ring, shm_collectives
from horovod.algorithms.buffers import Buffers
from horovod.algorithms.collectives import use_shm
from horovod.algorithms.group import Group
from horovod.common.types import ReduceOp

__all__ = ["SHM", "HIERARCHICAL", "EXCHANGE", "RECURSIVE_DOUBLING", "RING", "choose", "allreduce",
           "adasum_allreduce"]

# The algorithms, named as the timeline names their activity.
SHM, HIERARCHICAL, EXCHANGE, RING = "SHM_ALLREDUCE", "HIERARCHICAL_ALLREDUCE", "EXCHANGE_ALLREDUCE", "RING_ALLREDUCE"
RECURSIVE_DOUBLING = "RECURSIVE_DOUBLING_ALLREDUCE"

_log = logging.getLogger("horovod.algorithms")
_announced = set()


def choose(group: Group, nbytes: int) -> str:
    """The algorithm that reduces ``nbytes`` over ``group`` (SHM, HIERARCHICAL, EXCHANGE, RECURSIVE_DOUBLING or
    RING)."""
    if group.hierarchy is not None:
        return HIERARCHICAL
    if use_shm(group, nbytes):
        return SHM
    if nbytes > ring.EXCHANGE_MAX_BYTES:
        return RING
    return RECURSIVE_DOUBLING if latency.prefer_recursive_doubling(group.size, nbytes) else EXCHANGE


def _announce(group: Group, nbytes: int, algorithm: str) -> None:
    """Log (debug) the first allreduce of each algorithm and size class (power of two) on each group."""
    key = (group.ranks, algorithm, nbytes.bit_length())
    if key not in _announced and _log.isEnabledFor(logging.DEBUG):
        _announced.add(key)
        _log.debug("allreduce of %d bytes over %d ranks %s: %s", nbytes, group.size, list(group.ranks), algorithm)


def allreduce(group: Group, buf: np.ndarray, reduce_op: int, prescale: float, postscale: float,
              counts: Sequence[int], buffers: Buffers, activity: Optional[Callable[[str], None]] = None) -> None:
    """Reduce the flat contiguous ``buf`` in place over ``group``: every contribution times ``prescale``, the
    result times ``postscale`` (and divided by the group's size for Average).

    Args:
        counts: the elements of each tensor packed in ``buf`` (Adasum combines tensor by tensor).
        buffers: scratch space that persists between calls.
        activity: called with the algorithm's name as it starts (for the timeline), if given.
    """
    if reduce_op == ReduceOp.ADASUM:
        if activity:
            activity("HIERARCHICAL_ADASUM" if group.hierarchy is not None else "ADASUM_ALLREDUCE")
        adasum_allreduce(group, buf, counts, buffers)
        reduction.scale(buf, prescale * postscale)
        return
    reduction.scale(buf, prescale)
    post = postscale / group.size if reduce_op == ReduceOp.AVERAGE else postscale
    ufunc = reduction.ufunc_for(reduce_op)
    algorithm = choose(group, buf.nbytes)
    _announce(group, buf.nbytes, algorithm)
    if activity:
        activity(algorithm)
    total, size = buf.size, group.size
    if algorithm == SHM:
        shm_collectives.allreduce(group, buf, ufunc, post)     # scales on the way out of shared memory
        return
    if algorithm == HIERARCHICAL:
        hierarchical.allreduce(group.hierarchy, buf, ufunc, buffers.get("scratch", buf.dtype, -(-total // 2) + 1))
    elif algorithm == RECURSIVE_DOUBLING:
        latency.recursive_doubling_allreduce(group, buf, ufunc, buffers.get("scratch", buf.dtype, total + 1))
    elif algorithm == EXCHANGE:
        ring.exchange_allreduce(group, buf, ufunc, buffers.get("scratch", buf.dtype, (size - 1) * total + 1))
    else:
        ring.ring_allreduce(group, buf, ufunc, buffers.get("scratch", buf.dtype, -(-total // size) + 1), post)
        return
    reduction.scale(buf, post)


def adasum_allreduce(group: Group, buf: np.ndarray, counts: Sequence[int], buffers: Buffers) -> None:
    """Combine ``buf`` over ``group`` with Adasum, tensor by tensor, by vector halving and distance doubling
    (:func:`adasum.vhdd_allreduce`); with a hierarchy, ranks of a host sum first (shared memory), the hosts' leaders
    combine with Adasum, and the result is shared back within each host."""
    if group.size == 1:
        return
    bounds = [0]
    for count in counts:
        bounds.append(bounds[-1] + count)
    scratch = buffers.get("adasum", buf.dtype, buf.size // 2 + 1)
    if group.hierarchy is None:
        adasum.vhdd_allreduce(group, buf, bounds, scratch)
        return
    hierarchical.allreduce(group.hierarchy, buf, np.add, buffers.get("scratch", buf.dtype, -(-buf.size // 2) + 1),
                           cross_op=lambda cross, data: adasum.vhdd_allreduce(cross, data, bounds, scratch))
