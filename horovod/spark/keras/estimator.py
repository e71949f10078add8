"""``KerasEstimator`` and ``KerasModel``: Keras 3 training on a Spark DataFrame with Horovod, as Spark ML stages."""

from __future__ import annotations

from typing import Callable, List

import cloudpickle
import keras
import numpy as np

from horovod.spark.common.estimator import HorovodEstimator, HorovodModel, _as_list
from horovod.spark.common.params import declare
from horovod.spark.keras import remote

__all__ = ["KerasEstimator", "KerasModel"]


class KerasModel(HorovodModel):
    """A trained Keras model as a Spark ML Transformer (see :class:`~horovod.spark.common.estimator.HorovodModel`).

    ``transform(df)`` runs the model in inference mode on the feature columns and adds ``<label>__output``.
    """

    def model_to_bytes(self) -> bytes:
        """The model as a ``.keras`` file's bytes."""
        return remote.model_to_bytes(self.model)

    @staticmethod
    def model_from_bytes(data: bytes):
        """The model from :meth:`model_to_bytes`' bytes."""
        return remote.model_from_bytes(data)

    @classmethod
    def predictor(cls, data: bytes) -> Callable[[List[np.ndarray]], List[np.ndarray]]:
        """Outputs of the model for a batch of inputs."""
        model = remote.model_from_bytes(data, compile=False)

        def predict(inputs: List[np.ndarray]) -> List[np.ndarray]:
            out = model(inputs[0] if len(inputs) == 1 else inputs, training=False)
            return [np.asarray(o) for o in (out if isinstance(out, (tuple, list)) else [out])]

        return predict


class KerasEstimator(HorovodEstimator):
    """Trains a Keras model on ``num_proc`` Horovod ranks with ``model.fit``; ``fit(df)`` returns a
    :class:`KerasModel`.

    Parameters (keywords, or ``set<Name>``): ``num_proc``, ``model``, ``optimizer`` (a Keras optimizer; its config
    travels), ``loss`` and ``metrics`` (as for ``model.compile``), ``custom_objects`` (to load the model on the
    ranks), ``store``, ``feature_cols``, ``label_cols``, ``input_shapes``, ``validation``, ``callbacks`` (Keras
    callbacks, run on every rank), ``batch_size``, ``val_batch_size``, ``epochs``, ``verbose``,
    ``shuffle_buffer_size``, ``partitions_per_process``, ``train_steps_per_epoch``, ``validation_steps_per_epoch``,
    ``run_id``, ``random_seed``, ``start_timeout``, ``backend`` (a
    :class:`~horovod.spark.common.backend.SparkBackend`, instead of ``num_proc``), ``inmemory_cache_all``.
    Without ``input_shapes`` each feature column takes the shape of the model's input of that position (as in
    Horovod). A ``keras.callbacks.TensorBoard`` among the callbacks runs on rank 0 only and writes to the run's
    logs folder in the store when the store is local. ``getHistory()`` is Keras' ``History.history``.
    """

    model_class = KerasModel

    def _input_shapes(self):
        shapes = super()._input_shapes()
        if shapes is not None:
            return shapes
        inputs = getattr(self.getModel(), "inputs", None) or []
        return [[-1 if d is None else int(d) for d in tuple(i.shape)] for i in inputs] or None

    def _trainer(self):
        return remote.train

    def _train_payload(self) -> bytes:
        if self.getOptimizer() is None or self.getLoss() is None:
            raise ValueError("KerasEstimator needs an optimizer and a loss")
        return cloudpickle.dumps({"model": remote.model_to_bytes(self.getModel()),
                                  "optimizer": keras.optimizers.serialize(self.getOptimizer()),
                                  "loss": self.getLoss(), "metrics": _as_list(self.getMetrics()),
                                  "callbacks": _as_list(self.getCallbacks()),
                                  "custom_objects": self.getCustomObjects()})


declare(KerasEstimator, (("custom_objects", "objects Keras needs to load the model (custom layers, losses)", None),))
