"""``hvd.DistributedOptimizer`` around a TensorFlow 1 optimizer (``tf.compat.v1.train.Optimizer``).

Its ``compute_gradients`` averages the gradients over the ranks (one grouped allreduce), as Horovod's
``_DistributedOptimizer`` does; ``apply_gradients`` and the rest are the wrapped optimizer's.
"""

from __future__ import annotations

import tensorflow as tf

from horovod.runtime.process_sets import global_process_set
from horovod.tensorflow.compression import Compression
from horovod.tensorflow.mpi_ops import Average, grouped_allreduce

__all__ = ["DistributedV1Optimizer"]


class DistributedV1Optimizer(tf.compat.v1.train.Optimizer):
    """Wraps ``optimizer``; gradients are reduced with ``op`` over ``process_set`` before they are applied."""

    def __init__(self, optimizer, name=None, use_locking=False, compression=Compression.none, op=Average,
                 process_set=global_process_set, **_):
        super().__init__(name=name or f"Distributed{type(optimizer).__name__}", use_locking=use_locking)
        self._optimizer, self._compression, self._op, self._process_set = optimizer, compression, op, process_set

    def compute_gradients(self, *args, **kwargs):
        """The wrapped optimizer's gradients, reduced over the ranks (``None`` gradients stay ``None``)."""
        pairs = self._optimizer.compute_gradients(*args, **kwargs)
        if not self._process_set.included():    # a rank outside the set keeps its own gradients, as in Horovod
            return pairs
        present = [i for i, (g, _) in enumerate(pairs) if g is not None]
        reduced = grouped_allreduce([pairs[i][0] for i in present], op=self._op, compression=self._compression,
                                    process_set=self._process_set) if present else []
        out = list(pairs)
        for i, g in zip(present, reduced):
            out[i] = (g, pairs[i][1])
        return out

    def apply_gradients(self, *args, **kwargs):
        """The wrapped optimizer's ``apply_gradients``."""
        return self._optimizer.apply_gradients(*args, **kwargs)

    def get_slot(self, *args, **kwargs):
        """The wrapped optimizer's slot."""
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        """The wrapped optimizer's slot names."""
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args, **kwargs):
        """The wrapped optimizer's variables."""
        return self._optimizer.variables(*args, **kwargs)
