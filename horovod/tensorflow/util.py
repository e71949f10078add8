"""``horovod.tensorflow.util`` as Horovod has it: eager-mode checks and small graph helpers for TensorFlow 2."""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Tuple

import tensorflow as tf

from horovod.tensorflow.mpi_ops import _executing_eagerly

__all__ = ["vars_to_refs", "refs_to_vars"]

_has_eager = True  # every TensorFlow this package supports (2.16+) has eager execution


def _make_subgraph(func: Callable) -> Callable:
    """``func`` as one TensorFlow graph function (``tf.function``)."""
    return tf.function(func)


def _cache(func: Callable) -> Callable:
    """Remember ``func``'s result per arguments and per mode (eager or graph), as Horovod's helper does."""
    results: Dict[Tuple[Any, ...], Any] = {}

    def wrapper(*args):
        key = (args, _executing_eagerly())
        if key not in results:
            results[key] = func(*args)
        return results[key]
    return wrapper


def vars_to_refs(variables: Iterable[tf.Variable]) -> List[Any]:
    """Hashable references of ``variables`` (``v.ref()``), usable as dict keys and set members."""
    return [v.ref() for v in variables]


def refs_to_vars(refs: Iterable[Any]) -> List[tf.Variable]:
    """The variables behind references made by :func:`vars_to_refs`."""
    return [r.deref() for r in refs]
