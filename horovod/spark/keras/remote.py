"""What every rank of a ``KerasEstimator.fit`` runs: ``model.fit`` on its shard with ``horovod.tensorflow.keras``.

The model travels as a ``.keras`` file's bytes, the optimizer as its Keras config (wrapped in Horovod's
``DistributedOptimizer`` on each rank). Rank 0's initial weights are broadcast, metrics are averaged over the ranks
(``MetricAverageCallback``) and rank 0 writes a checkpoint to the store after every epoch. Rank 0 returns the Keras
history, the trained model's bytes and the outputs' shapes; the others return None.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
import warnings
from typing import Any, Dict, Iterator, List, Optional, Tuple

import cloudpickle
import numpy as np

import keras

import horovod.tensorflow.keras as hvd
from horovod.spark.common.data import ShardReader, feature_arrays
from horovod.spark.common.estimator import dataset_steps

__all__ = ["train", "model_to_bytes", "model_from_bytes"]


def model_to_bytes(model) -> bytes:
    """The model as the bytes of a ``.keras`` file."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "model.keras")
        model.save(path)
        with open(path, "rb") as handle:
            return handle.read()


def model_from_bytes(data: bytes, custom_objects: Optional[Dict[str, Any]] = None, compile: bool = True):
    """A model from :func:`model_to_bytes`' bytes."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "model.keras")
        with open(path, "wb") as handle:
            handle.write(data)
        return keras.models.load_model(path, custom_objects=custom_objects, compile=compile)


def _arrays(batch: Dict[str, np.ndarray], spec: Dict[str, Any]) -> Tuple[List[np.ndarray], List[np.ndarray]]:
    return feature_arrays(batch, spec), [batch[c] for c in spec["label_cols"]]


def _feed(reader: ShardReader, steps: int, spec: Dict[str, Any]) -> Iterator[tuple]:
    for batch in reader.batches(steps):
        inputs, labels = _arrays(batch, spec)
        yield (inputs[0] if len(inputs) == 1 else tuple(inputs)), (labels[0] if len(labels) == 1 else tuple(labels))


class _StoreCheckpoint(keras.callbacks.Callback):
    """Rank 0 writes the model to the store's checkpoint after each epoch."""

    def __init__(self, spec: Dict[str, Any]):
        super().__init__()
        self.spec = spec

    def on_epoch_end(self, epoch, logs=None):
        if hvd.rank() == 0:
            store = self.spec["store"]
            store.write(store.get_checkpoint_path(self.spec["run_id"]), model_to_bytes(self.model))


def _user_callbacks(callbacks: List[Any], spec: Dict[str, Any]) -> List[Any]:
    """The user's callbacks for this rank: a TensorBoard callback runs on rank 0 only (every rank writing the same
    event files would clash), into the run's logs folder when the store is a local one (as Horovod does); without
    the ``tensorboard`` package (which tensorflow-cpu no longer brings) it is left out with a warning, since Keras
    would fail at its first summary."""
    from horovod.spark.common.store import LocalStore
    kept = []
    for callback in callbacks:
        if isinstance(callback, keras.callbacks.TensorBoard):
            if hvd.rank() != 0:
                continue
            if importlib.util.find_spec("tensorboard") is None:
                warnings.warn("KerasEstimator: the tensorboard package is not installed; the TensorBoard callback "
                              "is left out (pip install tensorboard to keep it)")
                continue
            store = spec["store"]
            if isinstance(store, LocalStore):
                callback.log_dir = store.get_logs_path(spec["run_id"])
        kept.append(callback)
    return kept


def train(spec: Dict[str, Any]):
    """Train on this rank (see the module docstring); ``spec`` is the estimator's parameters plus ``info`` and
    ``payload``."""
    hvd.init()
    keras.utils.set_random_seed(int(spec["random_seed"]) + hvd.rank())
    payload = cloudpickle.loads(spec["payload"])
    model = model_from_bytes(payload["model"], payload["custom_objects"], compile=False)
    optimizer = hvd.DistributedOptimizer(keras.optimizers.deserialize(payload["optimizer"]))
    model.compile(optimizer=optimizer, loss=payload["loss"], metrics=payload["metrics"])
    info, size, batch_size = spec["info"], hvd.size(), int(spec["batch_size"])
    columns = list(spec["feature_cols"]) + list(spec["label_cols"])
    cache = bool(spec["inmemory_cache_all"])
    reader = ShardReader(spec["store"], info.train_path, columns, hvd.rank(), size, batch_size,
                         seed=int(spec["random_seed"]), shuffle_buffer_size=spec["shuffle_buffer_size"], cache=cache)
    steps, epochs = dataset_steps(info, size, batch_size, spec["train_steps_per_epoch"]), int(spec["epochs"])
    fit_args: Dict[str, Any] = {}
    if info.val_path:
        val_batch = int(spec["val_batch_size"] or batch_size)
        val_steps = int(spec["validation_steps_per_epoch"] or max(1, info.val_rows // (size * val_batch)))
        val_reader = ShardReader(spec["store"], info.val_path, columns, hvd.rank(), size, val_batch, shuffle=False,
                                 cache=cache)
        fit_args = dict(validation_data=_feed(val_reader, val_steps * epochs, spec), validation_steps=val_steps)
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback(),
                 *_user_callbacks(payload["callbacks"], spec), _StoreCheckpoint(spec)]
    history = model.fit(_feed(reader, steps * epochs, spec), steps_per_epoch=steps, epochs=epochs,
                        callbacks=callbacks, verbose=2 if spec["verbose"] and hvd.rank() == 0 else 0, **fit_args)
    if hvd.rank() != 0:
        return None
    shapes = [list(o.shape[1:]) for o in (model.outputs or [])]
    values = {k: [float(v) for v in vs] for k, vs in history.history.items()}
    return values, model_to_bytes(model), shapes
