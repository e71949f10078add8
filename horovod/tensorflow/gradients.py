"""Reducing a list of gradients over the ranks: the one routine behind ``DistributedGradientTape`` and the Keras
``DistributedOptimizer``.

The rules (scale factors, groups, sparse gradients, local gradients, argument checks) are
:mod:`horovod.runtime.gradient_policy`'s; this module applies them to TensorFlow tensors. Every dense gradient of one
step travels in a single op (one ``tf.numpy_function`` while tracing) that submits all allreduces, then waits for all
of them, so the engine negotiates and fuses them together as Horovod's background thread would.
``tf.IndexedSlices`` are gathered (Horovod's rule) unless ``sparse_as_dense``; ``None`` gradients stay ``None``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence

import keras
import tensorflow as tf

from horovod.runtime import basics
from horovod.runtime import collectives as _c
from horovod.runtime import gradient_policy as _policy
from horovod.runtime.compression import compress_all, decompress_all
from horovod.runtime.process_sets import ProcessSet, global_process_set
from horovod.tensorflow import mpi_ops as _ops
from horovod.tensorflow._tensors import run_async, to_core
from horovod.tensorflow.compression import Compression
from horovod.tensorflow.queries import size_op

__all__ = ["GradientReducer", "check_arguments", "local_layer_variables", "var_key"]


def check_arguments(op, gradient_predivide_factor, groups, num_groups=0, backward_passes_per_step=1,
                    average_aggregated_gradients=False):
    """:func:`horovod.runtime.gradient_policy.check_optimizer_arguments` for TensorFlow's variables; returns
    ``groups``."""
    return _policy.check_optimizer_arguments(op, gradient_predivide_factor, backward_passes_per_step, groups,
                                             num_groups, average_aggregated_gradients, what="tf.Variable")


def local_layer_variables(local_layers) -> list:
    """The trainable weights of ``local_layers`` (None, one Keras layer, or a sequence of them), whose gradients
    ``PartialDistributedGradientTape`` and ``PartialDistributedOptimizer`` keep local.

    Raises:
        ValueError: it holds something other than Keras layers.
    """
    if local_layers is None:
        return []
    if isinstance(local_layers, keras.layers.Layer):
        local_layers = [local_layers]
    if not all(isinstance(layer, keras.layers.Layer) for layer in local_layers):
        raise ValueError("All local layers must be of keras.layers.Layer type.")
    return [var for layer in local_layers for var in layer.trainable_weights]


def var_key(variable):
    """A hashable identity of a variable (``tf.Variable`` hashes by value, so not the variable itself)."""
    return variable.ref() if hasattr(variable, "ref") else id(variable)


def _divide(grad, size):
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values / tf.cast(size, grad.values.dtype), grad.indices, grad.dense_shape)
    return grad / tf.cast(size, grad.dtype)


@dataclass
class GradientReducer:
    """Reduces gradients over ``process_set`` with Horovod's options (see ``DistributedGradientTape``); variables
    registered with :meth:`register_local` keep their local gradient, divided by the set's size when
    ``scale_local_gradients``."""

    name: str
    compression: type = Compression.none
    sparse_as_dense: bool = False
    op: Any = _c.Average
    gradient_predivide_factor: float = 1.0
    groups: Any = None
    process_set: ProcessSet = global_process_set
    scale_local_gradients: bool = True
    local: set = field(default_factory=set)

    def __post_init__(self):
        check_arguments(self.op, self.gradient_predivide_factor, self.groups)

    def register_local(self, variable) -> None:
        """Keep ``variable``'s gradient local (not reduced)."""
        self.local.add(var_key(variable))

    def active(self) -> bool:
        """Whether reducing does anything (:func:`horovod.runtime.gradient_policy.reduction_active`)."""
        return _policy.reduction_active(self.process_set)

    def __call__(self, grads: Sequence, variables: Optional[Sequence] = None) -> List:
        """The reduced gradients, in order; ``variables`` (same length) names them, places them in groups and
        says which are local."""
        grads = list(grads)
        variables = list(variables) if variables is not None else [None] * len(grads)
        if not self.active():
            return grads
        is_local = [v is not None and var_key(v) in self.local for v in variables]
        shared = [i for i, local in enumerate(is_local) if not local]
        out = list(grads)
        for i, g in zip(shared, self._reduce_shared([grads[i] for i in shared], [variables[i] for i in shared])):
            out[i] = g
        if self.scale_local_gradients and any(is_local):
            size = self._size()
            for i, local in enumerate(is_local):
                if local and out[i] is not None:
                    out[i] = _divide(out[i], size)
        return out

    def _size(self):
        """The set's size; an op read at run time in an elastic job, whose size changes between traces' runs."""
        if _policy.reduction_active(self.process_set) and self._elastic():
            return size_op(self.process_set.process_set_id)
        return _policy.set_size(self.process_set)

    @staticmethod
    def _elastic() -> bool:
        return bool(basics.context().config.elastic)

    def _reduce_shared(self, grads: List, variables: List) -> List:
        out = list(grads)
        pre, post = _policy.predivide_factors(self.op, self.gradient_predivide_factor)
        dense = []
        for i, grad in enumerate(grads):
            if grad is None:
                continue
            if isinstance(grad, tf.IndexedSlices) and not self.sparse_as_dense:
                out[i] = _ops.allreduce(grad, op=self.op, prescale_factor=pre, postscale_factor=post,
                                        compression=self.compression, name=f"{self.name}.{i}.sparse",
                                        ignore_name_scope=True, process_set=self.process_set)
                continue
            dense.append((i, tf.convert_to_tensor(grad)))
        if dense:
            groups = _policy.split_groups(self.groups, [variables[i] for i, _ in dense], key=var_key,
                                          what="tf.Variable")
            compressed, ctxs = compress_all(self.compression, [g for _, g in dense])
            reduced = self._reduce_dense(compressed, groups, pre, post)
            for (i, _), r in zip(dense, decompress_all(self.compression, reduced, ctxs)):
                out[i] = r
        return out

    def _reduce_dense(self, tensors: List[tf.Tensor], groups: List[List[int]], pre: float, post: float):
        # Submitted and waited for as a collective (run_async): its wait passes a timeout and leaves the engine's
        # loop to the engine thread, with no hop through the job's thread pool (docs/tensorflow.md).
        def submit(*arrays):
            inputs = [to_core(a) for a in arrays]
            return _policy.submit_groups([a for a, _ in inputs], groups, self.name, self.op, pre, post,
                                         self.process_set, dtypes=[d for _, d in inputs])
        return run_async(submit, tensors, [t.dtype for t in tensors], [t.shape for t in tensors],
                         "HorovodAllreduceGradients")
