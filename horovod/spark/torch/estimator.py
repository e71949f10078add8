"""``TorchEstimator`` and ``TorchModel``: PyTorch training on a Spark DataFrame with Horovod, as Spark ML stages."""

from __future__ import annotations

from typing import Callable, List

import cloudpickle
import numpy as np
import torch

from horovod.spark.common.estimator import HorovodEstimator, HorovodModel, _as_list
from horovod.spark.common.params import declare
from horovod.spark.torch import remote

__all__ = ["TorchEstimator", "TorchModel"]


class TorchModel(HorovodModel):
    """A trained PyTorch model as a Spark ML Transformer (see :class:`~horovod.spark.common.estimator.HorovodModel`).

    ``transform(df)`` runs the model in evaluation mode on the feature columns and adds ``<label>__output``.
    """

    def model_to_bytes(self) -> bytes:
        """The whole module, cloudpickled (its class travels along when it was defined in a script)."""
        return cloudpickle.dumps(self.model)

    @staticmethod
    def model_from_bytes(data: bytes):
        """The module from :meth:`model_to_bytes`' bytes."""
        return cloudpickle.loads(data)

    @classmethod
    def predictor(cls, data: bytes) -> Callable[[List[np.ndarray]], List[np.ndarray]]:
        """Outputs of the model for a batch of inputs, computed without gradients."""
        model = cls.model_from_bytes(data)
        model.eval()

        def predict(inputs: List[np.ndarray]) -> List[np.ndarray]:
            with torch.no_grad():
                out = model(*[torch.from_numpy(np.ascontiguousarray(x)) for x in inputs])
            return [o.numpy() for o in (out if isinstance(out, (tuple, list)) else [out])]

        return predict


class TorchEstimator(HorovodEstimator):
    """Trains a ``torch.nn.Module`` on ``num_proc`` Horovod ranks; ``fit(df)`` returns a :class:`TorchModel`.

    Parameters (keywords, or ``set<Name>``): ``num_proc``, ``model`` (the module), ``optimizer`` (built on the
    module's parameters), ``loss`` (``loss(output, label)`` per label column), ``metrics`` (callables
    ``metric(output, label)`` on the first output), ``store``, ``feature_cols``, ``label_cols``, ``input_shapes``,
    ``validation``, ``callbacks`` (``callback(epoch, metrics)`` on every rank after each epoch), ``batch_size``,
    ``val_batch_size``, ``epochs``, ``verbose``, ``shuffle_buffer_size``, ``partitions_per_process``,
    ``train_steps_per_epoch``, ``run_id``, ``random_seed``, ``start_timeout``, ``backend`` (a
    :class:`~horovod.spark.common.backend.SparkBackend`, instead of ``num_proc``), ``inmemory_cache_all``,
    ``backward_passes_per_step`` (batches whose gradients accumulate before each allreduce and step). Integer label
    columns become int64 tensors (for ``cross_entropy``), others float32.
    """

    model_class = TorchModel

    def _trainer(self):
        return remote.train

    def _train_payload(self) -> bytes:
        losses = _as_list(self.getLoss())
        if not losses:
            raise ValueError("TorchEstimator needs a loss")
        labels = _as_list(self.getLabelCols())
        losses = losses * len(labels) if len(losses) == 1 else losses
        optimizer = self.getOptimizer()
        if optimizer is None:
            raise ValueError("TorchEstimator needs an optimizer built on the model's parameters")
        # One pickle: the optimizer keeps pointing at the model's own parameters on the ranks.
        return cloudpickle.dumps((self.getModel(), optimizer, losses, _as_list(self.getMetrics()),
                                  _as_list(self.getCallbacks())))


declare(TorchEstimator, (("backward_passes_per_step", "batches whose gradients accumulate locally before each "
                          "allreduce and optimizer step (each loss divided by it)", 1),))
