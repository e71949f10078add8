"""Elastic Keras training; the same names as :mod:`horovod.tensorflow.keras.elastic`."""

from horovod.tensorflow.keras.elastic import (CommitStateCallback, KerasState, UpdateBatchStateCallback,
                                              UpdateEpochStateCallback, run)

__all__ = ["KerasState", "CommitStateCallback", "UpdateBatchStateCallback", "UpdateEpochStateCallback", "run"]
