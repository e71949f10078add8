"""Broadcasting parameters and optimizer state (pytrees) from one rank, and the object collectives.

JAX values are immutable, so these return the broadcast pytree instead of writing in place:
``params = hvd.broadcast_parameters(params, root_rank=0)``.
"""

from __future__ import annotations

from typing import Any, List, Optional


from horovod.jax import mpi_ops as _ops
from horovod.jax._arrays import flatten, unflatten
from horovod.runtime import collectives as _c
from horovod.runtime.process_sets import ProcessSet, global_process_set


def _is_array(leaf) -> bool:
    return hasattr(leaf, "shape") and hasattr(leaf, "dtype") and not isinstance(leaf, (bool, int, float, complex))


def _broadcast_tree(tree, root_rank: int, name: str, process_set: ProcessSet):
    leaves, treedef = flatten(tree)
    arrays = [i for i, leaf in enumerate(leaves) if _is_array(leaf)]
    others = {i: leaf for i, leaf in enumerate(leaves) if i not in set(arrays)}
    if arrays:
        received = _ops.broadcast([leaves[i] for i in arrays], root_rank, name=name, process_set=process_set)
        for i, value in zip(arrays, received):
            leaves[i] = value
    if others:
        for i, value in _c.broadcast_object(others, root_rank, name=f"{name}.objects",
                                            process_set=process_set).items():
            leaves[i] = value
    return unflatten(treedef, leaves)


def broadcast_parameters(params, root_rank: int = 0, name: Optional[str] = None,
                         process_set: ProcessSet = global_process_set):
    """``root_rank``'s ``params`` (any pytree, e.g. a dict of arrays) on every rank, with the same structure.

    Array leaves travel as one grouped broadcast; other leaves (Python numbers...) as one pickled object. Call it
    before training, so every rank starts from the same weights. Eager only (it is a setup step).
    """
    return _broadcast_tree(params, root_rank, name or "broadcast_parameters", process_set)


def broadcast_optimizer_state(opt_state, root_rank: int = 0, name: Optional[str] = None,
                              process_set: ProcessSet = global_process_set):
    """``root_rank``'s optimizer state (an optax state pytree) on every rank; see :func:`broadcast_parameters`."""
    return _broadcast_tree(opt_state, root_rank, name or "broadcast_optimizer_state", process_set)


def broadcast_object(obj: Any, root_rank: int = 0, name: Optional[str] = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    """Return ``root_rank``'s ``obj`` (any cloudpicklable object) on every rank of the set (eager only)."""
    _ops._eager_only("broadcast_object()")
    return _c.broadcast_object(obj, root_rank, name=name, process_set=process_set)


def allgather_object(obj: Any, name: Optional[str] = None,
                     process_set: ProcessSet = global_process_set) -> List[Any]:
    """Every rank's ``obj``, as a list ordered by rank (eager only)."""
    _ops._eager_only("allgather_object()")
    return _c.allgather_object(obj, name=name, process_set=process_set)


__all__ = ["broadcast_parameters", "broadcast_optimizer_state", "broadcast_object", "allgather_object"]
