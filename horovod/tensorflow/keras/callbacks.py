"""Keras 3 callbacks for distributed training: start from the same weights, average metrics, warm up and schedule
the learning rate, keep the best model.

Learning-rate callbacks assign the optimizer's ``learning_rate`` variable, which a compiled train step reads at
every step. Horovod's momentum correction (scale the momentum by new_lr/old_lr for one step after a change) is done
by scaling the optimizer's momentum buffers by new_lr/old_lr once, which is the same update: Keras 3 keeps
``momentum`` as a Python float baked into the compiled step, so changing it would have no effect.
"""

from __future__ import annotations

from typing import Callable, Optional, Union

import keras
import numpy as np

from horovod.runtime import basics
from horovod.runtime import collectives as _c
from horovod.runtime.process_sets import global_process_set
from horovod.tensorflow.functions import broadcast_variables


def _optimizer_variables(optimizer):
    variables = optimizer.variables
    return list(variables() if callable(variables) else variables)


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Broadcast the model's and the optimizer's variables from ``root_rank`` before the first step (or, for a
    model built lazily by its first batch, after that batch), so every rank trains from the same state.

    Args:
        root_rank: the rank whose variables everyone receives.
        device: accepted for compatibility.
        local_variables: variables to leave alone (their values stay per rank).
    """

    def __init__(self, root_rank: int, device: str = "", local_variables=None, process_set=global_process_set):
        super().__init__()
        self.root_rank = root_rank
        self.device = device
        self.process_set = process_set
        self.local_variables = {id(v) for v in (local_variables or [])}
        self.broadcast_done = False

    def _broadcast(self) -> None:
        variables = list(self.model.variables)
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is not None:
            variables += _optimizer_variables(optimizer)
        variables = [v for v in variables if id(v) not in self.local_variables]
        broadcast_variables(variables, self.root_rank, process_set=self.process_set)
        self.broadcast_done = True

    def on_train_begin(self, logs=None):
        """Build the optimizer if needed and broadcast the model's and optimizer's variables from the root."""
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is not None and not optimizer.built and self.model.built:
            # Keras builds the optimizer on the first step otherwise: build it now (on the same variables) so that
            # the first step already starts from root_rank's weights and optimizer state.
            optimizer.build(self.model.trainable_variables)
        if not self.broadcast_done and (optimizer is None or optimizer.built):
            self._broadcast()

    def on_batch_end(self, batch, logs=None):
        """Broadcast after the first batch when the optimizer could not be built before it."""
        if not self.broadcast_done:
            self._broadcast()


class MetricAverageCallback(keras.callbacks.Callback):
    """Average the epoch's metrics over the ranks at the end of every epoch (place it before callbacks that read
    the metrics, such as ``ReduceLROnPlateau`` or checkpoints)."""

    def __init__(self, device: str = "", process_set=global_process_set):
        super().__init__()
        self.device = device
        self.process_set = process_set

    def _average(self, logs) -> None:
        if not logs:
            return
        keys = sorted(k for k, v in logs.items() if np.ndim(v) == 0 and np.issubdtype(np.asarray(v).dtype,
                                                                                     np.number))
        values = np.array([float(logs[k]) for k in keys], dtype=np.float64)
        averaged = _c.allreduce(values, name="MetricAverageCallback." + ".".join(keys), op=_c.Average,
                                process_set=self.process_set)
        for key, value in zip(keys, averaged.tolist()):
            logs[key] = value

    def on_epoch_end(self, epoch, logs=None):
        """Replace each numeric metric in ``logs`` by its average over the ranks."""
        self._average(logs)


def _learning_rate(optimizer) -> float:
    lr = optimizer.learning_rate
    return float(lr.numpy() if hasattr(lr, "numpy") else lr)


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Set the learning rate to ``initial_lr * multiplier(epoch)`` between ``start_epoch`` and ``end_epoch``.

    Args:
        initial_lr: the base learning rate (usually already scaled by ``hvd.size()``).
        multiplier: a constant, or a function of the (fractional when not ``staircase``) epoch.
        start_epoch, end_epoch: the epochs it applies to (``end_epoch`` excluded; None: to the end).
        staircase: change the rate at epoch starts only; else at every batch, with a fractional epoch.
        momentum_correction: rescale momentum buffers by new_lr/old_lr when the rate changes.
        steps_per_epoch: batches per epoch (default: what ``fit`` reports).
    """

    def __init__(self, initial_lr: float, multiplier: Union[float, Callable[[float], float]], start_epoch: int = 0,
                 end_epoch: Optional[int] = None, staircase: bool = True, momentum_correction: bool = True,
                 steps_per_epoch: Optional[int] = None):
        super().__init__()
        self.initial_lr = initial_lr
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch = None
        self.multiplier = multiplier if callable(multiplier) else (lambda epoch: multiplier)

    def _active(self, epoch: float) -> bool:
        return epoch >= self.start_epoch and (self.end_epoch is None or epoch < self.end_epoch)

    def _set_lr(self, epoch: float) -> None:
        optimizer = self.model.optimizer
        old = _learning_rate(optimizer)
        new = self.initial_lr * self.multiplier(epoch)
        optimizer.learning_rate.assign(new)
        if self.momentum_correction and old > 0 and new != old and getattr(optimizer, "momentum", 0):
            for buffer in getattr(optimizer, "momentums", None) or []:
                buffer.assign(buffer * (new / old))

    def on_train_begin(self, logs=None):
        """Read ``steps_per_epoch`` from ``fit`` when it was not given."""
        if self.steps_per_epoch is None:
            self.steps_per_epoch = self.params.get("steps") if self.params else None
        if not self.staircase and not self.steps_per_epoch:
            raise ValueError("Could not autodetect the number of steps per epoch. Please specify the "
                             "steps_per_epoch parameter to the LearningRateScheduleCallback")

    def on_epoch_begin(self, epoch, logs=None):
        """With ``staircase``, set the epoch's rate."""
        self.current_epoch = epoch
        if self.staircase and self._active(epoch):
            self._set_lr(epoch)

    def on_batch_begin(self, batch, logs=None):
        """Without ``staircase``, set the rate for the fractional epoch."""
        if self.staircase or self.current_epoch is None:
            return
        epoch = self.current_epoch + float(batch) / self.steps_per_epoch
        if self._active(epoch):
            self._set_lr(epoch)

    def on_epoch_end(self, epoch, logs=None):
        """Report the rate as ``logs['lr']``."""
        if logs is not None:
            logs["lr"] = _learning_rate(self.model.optimizer)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Ramp the learning rate from ``initial_lr / size`` to ``initial_lr`` over ``warmup_epochs`` (Goyal et al.),
    batch by batch.

    Args:
        initial_lr: the rate reached after the warmup (usually the single-rank rate times ``hvd.size()``).
        warmup_epochs: epochs the ramp lasts.
        momentum_correction: rescale momentum buffers by new_lr/old_lr when the rate changes.
        steps_per_epoch: batches per epoch (default: what ``fit`` reports).
        verbose: 1 prints a line when the warmup ends.
    """

    def __init__(self, initial_lr: float, warmup_epochs: int = 5, momentum_correction: bool = True,
                 steps_per_epoch: Optional[int] = None, verbose: int = 0):
        def multiplier(epoch: float) -> float:
            # Shifted by one batch so that the last batch of the warmup reaches the full rate.
            epoch += 1.0 / self.steps_per_epoch
            size = basics.size()
            return 1.0 / size * (epoch * (size - 1) / warmup_epochs + 1)

        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs, staircase=False,
                         momentum_correction=momentum_correction, steps_per_epoch=steps_per_epoch)
        self.warmup_epochs = warmup_epochs
        self.verbose = verbose

    def on_epoch_end(self, epoch, logs=None):
        """Report the rate; with ``verbose``, say when the warmup ends."""
        super().on_epoch_end(epoch, logs)
        if epoch == self.end_epoch - 1 and self.verbose > 0:
            print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to "
                  f"{_learning_rate(self.model.optimizer):g}.")


class BestModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """Save the model whenever ``monitor`` improves (``save_best_only``), to ``filepath``.

    Horovod leaves ``filepath`` to be set later (by an estimator); here it may also be given directly. Keras 3
    needs it to end in ``.keras`` (or ``.weights.h5`` with ``save_weights_only``).
    """

    def __init__(self, monitor: str = "val_loss", verbose: int = 0, save_weights_only: bool = False,
                 mode: str = "auto", save_freq="epoch", filepath: Optional[str] = None):
        placeholder = "best.weights.h5" if save_weights_only else "best.keras"
        super().__init__(filepath=filepath or placeholder, monitor=monitor, verbose=verbose, save_best_only=True,
                         save_weights_only=save_weights_only, mode=mode, save_freq=save_freq)
        if filepath is None:
            self.filepath = None

    def _save_model(self, *args, **kwargs):
        if self.filepath is None:
            raise ValueError("BestModelCheckpoint.filepath is not set; set it before training")
        return super()._save_model(*args, **kwargs)


__all__ = ["BroadcastGlobalVariablesCallback", "MetricAverageCallback", "LearningRateScheduleCallback",
           "LearningRateWarmupCallback", "BestModelCheckpoint"]
