"""``DistributedGradientTape``: a ``tf.GradientTape`` whose ``gradient()`` returns gradients reduced over ranks.

As in Horovod, the result is an instance of a subclass of the given tape's class that shares the tape's recorded
state, so ``isinstance(tape, tf.GradientTape)`` holds and it can also be used as the ``with`` context itself.
Sources registered as local (``register_local_source``, or ``PartialDistributedGradientTape(local_layers=...)``)
keep their local gradient, divided by the set's size when ``scale_local_gradients`` (Horovod's rule, applied by
:class:`horovod.tensorflow.gradients.GradientReducer`).
"""

from __future__ import annotations

from typing import Dict

import tensorflow as tf

from horovod.runtime import collectives as _c
from horovod.runtime.process_sets import global_process_set
from horovod.tensorflow.compression import Compression
from horovod.tensorflow.gradients import GradientReducer, check_arguments, local_layer_variables

__all__ = ["DistributedGradientTape", "PartialDistributedGradientTape"]


class _DistributedGradientTape:
    """Mixin placed before the wrapped tape's class; see :func:`DistributedGradientTape`."""

    def register_local_source(self, source) -> None:
        """Mark ``source`` (a variable) as worker-local: its gradient is not reduced."""
        self._hvd_reducer.register_local(source)

    def gradient(self, target, sources, output_gradients=None, *args, **kwargs):
        """The tape's gradients of ``target`` with respect to ``sources``, reduced over the process set."""
        grads = super().gradient(target, sources, output_gradients, *args, **kwargs)
        flat_sources = tf.nest.flatten(sources)
        flat_grads = tf.nest.flatten(grads, expand_composites=False)
        return tf.nest.pack_sequence_as(grads, self._hvd_reducer(flat_grads, flat_sources))


_TAPE_CLASSES: Dict[type, type] = {}


def _distributed_class(base: type) -> type:
    cls = _TAPE_CLASSES.get(base)
    if cls is None:
        cls = type(base.__name__, (_DistributedGradientTape, base), {"__module__": base.__module__})
        _TAPE_CLASSES[base] = cls
    return cls


def DistributedGradientTape(gradtape, device_dense="", device_sparse="", compression=Compression.none,
                            sparse_as_dense=False, op=_c.Average, gradient_predivide_factor=1.0, num_groups=0,
                            groups=None, process_set=global_process_set, scale_local_gradients=True):
    """Wrap ``gradtape`` so that ``gradient()`` returns gradients reduced over the ranks of ``process_set``.

    Args:
        gradtape: the ``tf.GradientTape`` that recorded the forward pass (or will: the result is a tape too).
        device_dense, device_sparse: accepted for compatibility; reductions run on the CPU.
        compression: ``hvd.Compression.none``, ``fp16`` or ``bf16`` for the gradients on the wire.
        sparse_as_dense: reduce ``tf.IndexedSlices`` gradients as dense tensors instead of gathering them.
        op: ``hvd.Average`` (default), ``hvd.Sum`` or ``hvd.Adasum``.
        gradient_predivide_factor: with Average, divide by this before the sum and by size/factor after.
        num_groups: deprecated; use ``groups``.
        groups: an int n (fuse the gradients in n groups, in order) or a list of lists of variables.
        process_set: the ranks that reduce their gradients.
        scale_local_gradients: divide the gradients of local sources by the set's size.
    Raises:
        ValueError: ``gradient_predivide_factor`` with an op other than Average, or malformed ``groups``.
    """
    groups = check_arguments(op, gradient_predivide_factor, groups, num_groups)
    cls = _distributed_class(type(gradtape))
    tape = cls.__new__(cls)
    tape.__dict__.update(gradtape.__dict__)
    tape._hvd_reducer = GradientReducer("DistributedGradientTape", compression, sparse_as_dense, op,
                                        gradient_predivide_factor, groups, process_set, scale_local_gradients)
    tape.process_set = process_set
    tape.scale_local_gradients = scale_local_gradients
    return tape


def PartialDistributedGradientTape(gradtape, device_dense="", device_sparse="", compression=Compression.none,
                                   sparse_as_dense=False, op=_c.Average, gradient_predivide_factor=1.0,
                                   num_groups=0, groups=None, process_set=global_process_set, local_layers=None,
                                   scale_local_gradients=True):
    """A :func:`DistributedGradientTape` that keeps the gradients of ``local_layers``' trainable weights local.

    Raises:
        ValueError: ``local_layers`` holds something other than Keras layers.
    """
    local_variables = local_layer_variables(local_layers)
    tape = DistributedGradientTape(gradtape, device_dense, device_sparse, compression, sparse_as_dense, op,
                                   gradient_predivide_factor, num_groups, groups, process_set,
                                   scale_local_gradients)
    for var in local_variables:
        tape.register_local_source(var)
    return tape
