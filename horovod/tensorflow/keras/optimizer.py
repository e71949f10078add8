"""The Keras 3 ``DistributedOptimizer``: any Keras optimizer, applying gradients reduced over the ranks.

As in Horovod, the wrapper is a fresh instance of a subclass of the optimizer's class made from its config (the
subclass keeps the class name and module, so a saved model names the original optimizer). ``apply`` (which
``apply_gradients`` and ``model.fit`` call) reduces the gradients first, all in one op per step. With
``backward_passes_per_step`` = n > 1, gradients are summed locally in accumulator variables for n calls; the n-th call
reduces the sums (divided by n when ``average_aggregated_gradients``) and applies them; the other calls only count
the step (``iterations`` advances every call, like Keras' own ``gradient_accumulation_steps``).
"""

from __future__ import annotations

from typing import Dict

import keras
import tensorflow as tf

from horovod.runtime import collectives as _c
from horovod.runtime import gradient_policy as _policy
from horovod.runtime.process_sets import global_process_set
from horovod.tensorflow.compression import Compression
from horovod.tensorflow.gradients import GradientReducer, check_arguments, local_layer_variables
from horovod.tensorflow.keras import async_optimizers as _async


class _DistributedOptimizer:
    """Mixin placed before the wrapped optimizer's class; see :func:`DistributedOptimizer`."""

    _hvd_reducer = None  # set by _hvd_setup; an instance made from config alone gets the defaults

    def _hvd_ensure(self) -> None:
        if self._hvd_reducer is None:
            self._hvd_setup(*_hvd_args(None, Compression.none, False, 1.0, _c.Average, 1, False, 0, None,
                                       global_process_set, True))

    def _hvd_setup(self, reducer: GradientReducer, backward_passes_per_step: int,
                   average_aggregated_gradients: bool) -> None:
        self._hvd_reducer = reducer
        self._hvd_passes = backward_passes_per_step
        self._hvd_aggregation_scale = _policy.aggregation_scale(backward_passes_per_step,
                                                                average_aggregated_gradients)
        self._hvd_accumulators = None
        self._hvd_counter = None

    @property
    def process_set(self):
        """The ranks over which gradients are reduced."""
        return self._hvd_reducer.process_set

    @property
    def backward_passes_per_step(self) -> int:
        """Calls accumulated locally before the gradients are reduced and applied."""
        return self._hvd_passes

    def register_local_var(self, var) -> None:
        """Keep ``var``'s gradient local: it is not reduced (and is divided by the set's size when
        ``scale_local_gradients``)."""
        self._hvd_ensure()
        self._hvd_reducer.register_local(var)

    def build(self, variables):
        """Build the optimizer's variables, and the accumulators when ``backward_passes_per_step`` > 1."""
        if self.built:
            return
        self._hvd_ensure()
        super().build(variables)
        if self._hvd_passes > 1:
            self._hvd_accumulators = [self.add_variable_from_reference(v, name="hvd_accumulator")
                                      for v in variables]
            self._hvd_counter = self.add_variable(shape=(), dtype="int64", initializer="zeros",
                                                  name="hvd_counter")

    def apply(self, grads, trainable_variables=None):
        """Reduce ``grads`` over the process set, then apply them (every ``backward_passes_per_step`` calls)."""
        self._hvd_ensure()
        grads = list(grads)
        if not grads:
            return super().apply(grads, trainable_variables)
        if trainable_variables is None:
            variables = list(self._trainable_variables)
        else:
            trainable_variables = list(trainable_variables)
            variables = trainable_variables
            if not self.built:
                with keras.name_scope(self.name, caller=self):
                    self.build(variables)
                self.built = True
        if self._hvd_passes == 1:
            return super().apply(self._hvd_reducer(grads, variables), trainable_variables)
        return self._hvd_accumulate(grads, variables, trainable_variables)

    def _hvd_accumulate(self, grads, variables, trainable_variables):
        base_apply = super(_DistributedOptimizer, self).apply
        accumulators = [self._hvd_accumulators[self._get_variable_index(v)] for v in variables]
        for acc, g in zip(accumulators, grads):
            if g is not None:
                acc.assign_add(tf.convert_to_tensor(g))
        count = self._hvd_counter.assign_add(1)

        def apply_now():
            scale = self._hvd_aggregation_scale
            summed = [None if g is None else tf.convert_to_tensor(acc) for acc, g in zip(accumulators, grads)]
            if scale != 1.0:
                summed = [None if s is None else s * tf.cast(scale, s.dtype) for s in summed]
            base_apply(self._hvd_reducer(summed, variables), trainable_variables)
            for acc in accumulators:
                acc.assign(tf.zeros_like(acc))
            self._hvd_counter.assign(0)
            return tf.constant(True)

        def count_only():
            self._iterations.assign_add(1)
            return tf.constant(False)
        return tf.cond(count >= self._hvd_passes, apply_now, count_only)


_CLASSES: Dict[type, type] = {}


def wrap_optimizer_class(base: type) -> type:
    """The distributed subclass of a Keras optimizer class (made once per class)."""
    if issubclass(base, _DistributedOptimizer):
        return base
    cls = _CLASSES.get(base)
    if cls is None:
        cls = type(base.__name__, (_DistributedOptimizer, base), {"__module__": base.__module__})
        _CLASSES[base] = cls
    return cls


def distribute_in_place(optimizer, compression=Compression.none) -> None:
    """Make a built Keras optimizer (e.g. one loaded with a model) a :func:`DistributedOptimizer` with default
    options, changing its class in place: its variables, and a compiled model holding it, stay as they are."""
    object.__setattr__(optimizer, "__class__", wrap_optimizer_class(type(optimizer)))
    optimizer._hvd_setup(*_hvd_args(None, compression, False, 1.0, _c.Average, 1, False, 0, None,
                                    global_process_set, True))


def _hvd_args(name, compression, sparse_as_dense, gradient_predivide_factor, op, backward_passes_per_step,
              average_aggregated_gradients, num_groups, groups, process_set, scale_local_gradients):
    groups = check_arguments(op, gradient_predivide_factor, groups, num_groups, backward_passes_per_step,
                             average_aggregated_gradients)
    reducer = GradientReducer(name or "DistributedOptimizer", compression, sparse_as_dense, op,
                              gradient_predivide_factor, groups, process_set, scale_local_gradients)
    return reducer, backward_passes_per_step, average_aggregated_gradients


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="", compression=Compression.none,
                         sparse_as_dense=False, gradient_predivide_factor=1.0, op=_c.Average,
                         backward_passes_per_step=1, average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=global_process_set, scale_local_gradients=True, staleness=0):
    """Wrap a Keras 3 optimizer so that it applies gradients reduced over the ranks of ``process_set``.

    Args:
        optimizer: any ``keras.optimizers.Optimizer`` (its config is copied; built state is copied too).
        name: the prefix of the gradient reductions' names (default ``"DistributedOptimizer"``).
        device_dense, device_sparse: accepted for compatibility; reductions run on the CPU.
        compression: ``hvd.Compression.none``, ``fp16`` or ``bf16`` for the gradients on the wire.
        sparse_as_dense: reduce ``tf.IndexedSlices`` gradients (embeddings) as dense tensors.
        gradient_predivide_factor: with Average, divide by this before the sum and by size/factor after.
        op: ``hvd.Average`` (default), ``hvd.Sum`` or ``hvd.Adasum``.
        backward_passes_per_step: calls accumulated locally before the gradients are reduced and applied.
        average_aggregated_gradients: divide the accumulated gradients by ``backward_passes_per_step``.
        num_groups: deprecated; use ``groups``.
        groups: an int n (fuse the gradients in n groups, in order) or a list of lists of variables.
        process_set: the ranks that reduce their gradients.
        scale_local_gradients: divide the gradients of variables registered with ``register_local_var`` by the
            set's size.
        staleness: s > 0 applies the gradients averaged s steps earlier, so their allreduce overlaps the next
            steps (docs/async.md; compression only).
    Raises:
        ValueError: not a Keras optimizer, ``gradient_predivide_factor`` with an op other than Average,
            ``backward_passes_per_step`` < 1, or malformed ``groups``.
    """
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise ValueError(f"DistributedOptimizer needs a keras.optimizers.Optimizer, not {type(optimizer).__name__}")
    if staleness:
        return _async.stale_optimizer(optimizer, compression, staleness, op, process_set, {k for k, v in [
            ("backward_passes_per_step", backward_passes_per_step != 1), ("groups", groups or num_groups),
            ("gradient_predivide_factor", gradient_predivide_factor != 1.0)] if v})
    args = _hvd_args(name, compression, sparse_as_dense, gradient_predivide_factor, op, backward_passes_per_step,
                     average_aggregated_gradients, num_groups, groups, process_set, scale_local_gradients)
    cls = wrap_optimizer_class(type(optimizer))
    wrapped = cls.from_config(optimizer.get_config())
    wrapped._hvd_setup(*args)
    if optimizer.built:
        wrapped.build(list(optimizer._trainable_variables))
        for target, source in zip(wrapped.variables, optimizer.variables):
            target.assign(source)
    return wrapped


def PartialDistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="",
                                compression=Compression.none, sparse_as_dense=False, gradient_predivide_factor=1.0,
                                op=_c.Average, backward_passes_per_step=1, average_aggregated_gradients=False,
                                groups=None, process_set=global_process_set, local_layers=None,
                                scale_local_gradients=True):
    """A :func:`DistributedOptimizer` that keeps the gradients of ``local_layers``' trainable weights local.

    Raises:
        ValueError: ``local_layers`` holds something other than Keras layers.
    """
    local_variables = local_layer_variables(local_layers)
    wrapped = DistributedOptimizer(optimizer, name, device_dense, device_sparse, compression, sparse_as_dense,
                                   gradient_predivide_factor, op, backward_passes_per_step,
                                   average_aggregated_gradients, 0, groups, process_set, scale_local_gradients)
    for var in local_variables:
        wrapped.register_local_var(var)
    return wrapped


__all__ = ["DistributedOptimizer", "PartialDistributedOptimizer", "wrap_optimizer_class", "distribute_in_place"]
