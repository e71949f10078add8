"""Elastic training with TensorFlow: ``hvd.elastic.run`` and states holding variables or a Keras model.

The reset-and-retry loop and the host-update protocol are the framework-agnostic ones of :mod:`horovod.elastic`;
this module only says how TensorFlow state is saved (numpy copies of variable values), restored (assigned back) and
synced (broadcast from rank 0). A Keras optimizer that has not created its variables yet is built on the model's
trainable variables first, so every rank broadcasts the same list.
"""

from __future__ import annotations

import functools
from typing import Any, List

import numpy as np
import tensorflow as tf

from horovod.runtime import basics
from horovod.elastic import ObjectState, reset_horovod, run_fn
from horovod.tensorflow._tensors import take_graph_error
from horovod.tensorflow.functions import broadcast_object, broadcast_variables


def run(func):
    """``@hvd.elastic.run``: call ``func(state, ...)`` again after a failure or a membership change, with Horovod
    re-initialised and the state restored (failure) or kept (host update), then synced from rank 0.

    A Horovod error raised inside a ``tf.function`` (Keras ``fit``) reaches Python as a ``tf.errors.OpError``;
    it is turned back into the Horovod error so that the loop can tell a failure from a host update.
    """
    @functools.wraps(func)
    def unwrapped_errors(state, *args, **kwargs):
        take_graph_error()
        try:
            return func(state, *args, **kwargs)
        except tf.errors.OpError as error:
            original = take_graph_error()
            if original is None:
                raise
            raise original from error
    return run_fn(unwrapped_errors, reset_horovod)


class _VariablesState(ObjectState):
    """An ObjectState that also saves, restores and syncs a list of variables (got fresh by ``_variables()``)."""

    def __init__(self, **kwargs: Any):
        self._saved_values: List[np.ndarray] = []
        super().__init__(bcast_object=broadcast_object, get_rank=basics.rank, **kwargs)

    def _variables(self) -> list:
        raise NotImplementedError

    def save(self) -> None:
        self._saved_values = [np.array(v.numpy(), copy=True) for v in self._variables()]
        super().save()

    def restore(self) -> None:
        variables = self._variables()
        if len(variables) == len(self._saved_values):
            for variable, value in zip(variables, self._saved_values):
                variable.assign(value)
        super().restore()

    def sync(self) -> None:
        variables = self._variables()
        if variables:
            broadcast_variables(variables, root_rank=0)
            # The synced values are what a failure before the next commit returns to (as ObjectState's sync
            # replaces its saved attributes with rank 0's), so every rank restores the same state.
            self._saved_values = [np.array(v.numpy(), copy=True) for v in variables]
        super().sync()


class TensorFlowState(_VariablesState):
    """Elastic state of TensorFlow variables plus picklable attributes.

    Args:
        variables: the ``tf.Variable`` (or Keras variables) to keep; ``session`` is accepted for compatibility.
        **kwargs: attributes such as ``epoch=0, batch=0``.
    """

    def __init__(self, variables=None, session=None, **kwargs: Any):
        self.variables = list(variables or [])
        self.session = session
        super().__init__(**kwargs)

    def _variables(self) -> list:
        return self.variables


class TensorFlowKerasState(_VariablesState):
    """Elastic state of a Keras model, its optimizer and picklable attributes.

    Args:
        model: a built Keras model.
        optimizer: its optimizer (default ``model.optimizer``).
        backend: accepted for compatibility.
        **kwargs: attributes such as ``epoch=0, batch=0``.
    """

    def __init__(self, model, optimizer=None, backend=None, **kwargs: Any):
        self.model = model
        self.optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        self.backend = backend
        if self.optimizer is not None and not self.optimizer.built and model.built:
            self.optimizer.build(model.trainable_variables)
        super().__init__(**kwargs)

    def _variables(self) -> list:
        variables = list(self.model.variables)
        if self.optimizer is not None:
            opt_vars = self.optimizer.variables
            variables += list(opt_vars() if callable(opt_vars) else opt_vars)
        return variables


__all__ = ["run", "TensorFlowState", "TensorFlowKerasState"]
