"""``SyncBatchNormalization``: Keras 3 batch normalization whose batch statistics cover every rank's batch.

In training, each rank's per-channel element count, sum and sum of squares are summed over the process set with one
differentiable allreduce, so the mean and variance (and their gradients) are those of the concatenated global batch;
ranks may hold batches of different sizes. In inference, or on one rank, it is the plain layer.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from horovod.runtime import collectives as _c
from horovod.runtime.process_sets import global_process_set
from horovod.tensorflow.mpi_ops import allreduce


@keras.saving.register_keras_serializable(package="Horovod")
class SyncBatchNormalization(keras.layers.BatchNormalization):
    """A drop-in for ``keras.layers.BatchNormalization`` that normalizes over the union of all ranks' batches.

    Args:
        fused: accepted for compatibility with Horovod (must be False or None).
        process_set: the ranks whose batches are normalized together (not serialized: the global set on reload).
        **kwargs: as for ``keras.layers.BatchNormalization``.
    Raises:
        ValueError: ``fused=True``.
    """

    def __init__(self, fused=False, process_set=global_process_set, **kwargs):
        if fused:
            raise ValueError("SyncBatchNormalization does not support fused=True.")
        super().__init__(**kwargs)
        self.process_set = process_set

    def _moments(self, inputs, mask):
        if (self.process_set.size() or 1) == 1:
            return super()._moments(inputs, mask)
        axes = list(self._reduction_axes)
        x = tf.convert_to_tensor(inputs)
        if mask is None:
            shape = tf.shape(x)
            count = tf.cast(tf.reduce_prod(tf.gather(shape, axes)), x.dtype)
            total = tf.reduce_sum(x, axes)
            squares = tf.reduce_sum(tf.square(x), axes)
            count = tf.ones_like(total) * count
        else:
            weights = tf.cast(tf.broadcast_to(tf.expand_dims(mask, -1), tf.shape(x)), x.dtype)
            count = tf.reduce_sum(weights, axes)
            total = tf.reduce_sum(x * weights, axes)
            squares = tf.reduce_sum(tf.square(x) * weights, axes)
        channels = tf.shape(total)[0]
        packed = allreduce(tf.concat([count, total, squares], 0), op=_c.Sum, process_set=self.process_set)
        count, total, squares = packed[:channels], packed[channels:2 * channels], packed[2 * channels:]
        count = tf.maximum(count, 1.0)
        mean = total / count
        variance = tf.maximum(squares / count - tf.square(mean), 0.0)
        return mean, variance


__all__ = ["SyncBatchNormalization"]
