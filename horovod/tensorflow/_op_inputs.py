"""What a TensorFlow collective takes, before it reaches the core: the name this rank gives it, its inputs checked
and converted, its process set checked, and the static shape of a gathered result (``mpi_ops`` re-exports them under
Horovod's names: ``mpi_ops._normalize_name``, ``mpi_ops._executing_eagerly``)."""

from __future__ import annotations

import re
from typing import List, Optional, Sequence

import tensorflow as tf

from horovod.runtime import collectives as _c
from horovod.tensorflow._errors import as_tf_error
from horovod.tensorflow._tensors import check_dtype

__all__ = ["_executing_eagerly", "_normalize_name", "_op_name", "_check_set", "_inputs", "_gathered_shape"]


def _executing_eagerly() -> bool:
    """True when TensorFlow runs ops immediately (not tracing a graph)."""
    return tf.executing_eagerly()


def _normalize_name(name: str) -> str:
    return re.sub("[^a-zA-Z0-9_]", "_", name)


def _op_name(name: Optional[str], tensors: Sequence, ignore_name_scope: bool) -> Optional[str]:
    """The name this rank gives the core, which adds the op prefix (None: numbered in call order)."""
    if name is None:
        if tf.executing_eagerly() or not tensors or not hasattr(tensors[0], "name"):
            return None
        graph_name = tensors[0].name if len(tensors) == 1 else f"{tensors[0].name}_{tensors[-1].name}"
        return _normalize_name(graph_name)
    scope = "" if ignore_name_scope else tf.get_current_name_scope()
    return f"{scope.rstrip('/')}/{name}" if scope else name


def _check_set(process_set) -> None:
    """A process set no ``init`` or ``add_process_set`` registered fails at the call, as in Horovod (``ValueError``;
    ours is also the ``tf.errors.InvalidArgumentError`` it would be in a graph).

    Raises:
        ValueError: the set is not registered.
    """
    try:
        _c._set_ranks(_c._set_id(process_set))
    except ValueError as error:
        raise as_tf_error(error) from None


def _inputs(tensors) -> List[tf.Tensor]:
    out = [tf.convert_to_tensor(t) for t in tensors]
    for t in out:
        check_dtype(t.dtype)
    return out


def _gathered_shape(shape: tf.TensorShape) -> tf.TensorShape:
    return tf.TensorShape([None]).concatenate(shape[1:]) if shape.rank else tf.TensorShape([None])
