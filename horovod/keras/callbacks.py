"""Keras callbacks for distributed training; the same classes as :mod:`horovod.tensorflow.keras.callbacks`."""

from horovod.tensorflow.keras.callbacks import (BestModelCheckpoint, BroadcastGlobalVariablesCallback,
                                                LearningRateScheduleCallback, LearningRateWarmupCallback,
                                                MetricAverageCallback)

__all__ = ["BroadcastGlobalVariablesCallback", "MetricAverageCallback", "LearningRateScheduleCallback",
           "LearningRateWarmupCallback", "BestModelCheckpoint"]
