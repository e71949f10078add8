"""Broadcasting variables from one rank, and collectives on Python objects."""

from __future__ import annotations

from typing import Any, Callable, List, Optional

from horovod.runtime import collectives as _c
from horovod.runtime.process_sets import ProcessSet, global_process_set
from horovod.tensorflow.mpi_ops import broadcast_


def broadcast_variables(variables, root_rank: int, process_set: ProcessSet = global_process_set,
                        inplace: bool = False):
    """Overwrite every variable with ``root_rank``'s value (model and optimizer variables before training).

    Args:
        variables: ``tf.Variable`` or Keras variables, in the same order on every rank.
        root_rank: the global rank whose values everyone receives.
        process_set: the ranks taking part.
        inplace: accepted for compatibility (assignment is always in place).
    Returns:
        The assign results (ops while tracing a graph).
    """
    variables = list(variables)
    if not variables:
        return []
    return broadcast_(variables, root_rank, process_set=process_set)


def broadcast_global_variables(root_rank: int):
    """Broadcast every global variable of the default graph from ``root_rank`` (TensorFlow 1 graphs: returns the
    broadcast op group).

    Raises:
        RuntimeError: executing eagerly, where there are no global variables (as in Horovod); use
            :func:`broadcast_variables` with the model's and optimizer's variables.
    """
    import tensorflow as tf
    if tf.executing_eagerly():
        raise RuntimeError("hvd.broadcast_global_variables() does not support eager execution; use "
                           "hvd.broadcast_variables(<model/optimizer variables>) instead")
    return tf.group(*broadcast_variables(tf.compat.v1.global_variables(), root_rank))


def broadcast_object(obj: Any, root_rank: int = 0, session=None, name: Optional[str] = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    """Return ``root_rank``'s ``obj`` (any cloudpicklable object) on every rank of the set; ``session`` is
    ignored (TensorFlow 1 sessions do not exist in TensorFlow 2)."""
    return _c.broadcast_object(obj, root_rank, name=name, process_set=process_set)


def broadcast_object_fn(root_rank: int = 0, session=None, name: Optional[str] = None,
                        process_set: ProcessSet = global_process_set) -> Callable[[Any], Any]:
    """A function ``fn(obj)`` that broadcasts ``obj`` from ``root_rank`` (see :func:`broadcast_object`)."""
    def broadcast_fn(obj: Any) -> Any:
        return _c.broadcast_object(obj, root_rank, name=name, process_set=process_set)
    return broadcast_fn


def allgather_object(obj: Any, session=None, name: Optional[str] = None,
                     process_set: ProcessSet = global_process_set) -> List[Any]:
    """Every rank's ``obj`` (any cloudpicklable object), ordered by rank."""
    return _c.allgather_object(obj, name=name, process_set=process_set)


__all__ = ["broadcast_variables", "broadcast_global_variables", "broadcast_object", "broadcast_object_fn", "allgather_object"]
