"""Keras 3 on Spark: :class:`KerasEstimator` trains on a DataFrame with Horovod and returns a :class:`KerasModel`
(a Spark ML Transformer). See ``docs/spark.md``."""

from horovod.spark.common.store import Store
from horovod.spark.keras.estimator import KerasEstimator, KerasModel

__all__ = ["KerasEstimator", "KerasModel", "Store"]
