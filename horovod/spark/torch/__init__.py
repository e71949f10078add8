"""PyTorch on Spark: :class:`TorchEstimator` trains on a DataFrame with Horovod and returns a :class:`TorchModel`
(a Spark ML Transformer). See ``docs/spark.md``."""

from horovod.spark.common.store import Store
from horovod.spark.torch.estimator import TorchEstimator, TorchModel

__all__ = ["TorchEstimator", "TorchModel", "Store"]
