"""Elastic Keras training: ``KerasState`` and the callbacks that commit it and keep its epoch and batch current."""

from __future__ import annotations

import keras

from horovod.tensorflow.elastic import TensorFlowKerasState, run


class KerasState(TensorFlowKerasState):
    """Elastic state of a Keras model, its optimizer and picklable attributes (``epoch=0, batch=0``...)."""

    def __init__(self, model, optimizer=None, **kwargs):
        super().__init__(model, optimizer=optimizer, **kwargs)


class CommitStateCallback(keras.callbacks.Callback):
    """Commit ``state`` every ``batches_per_commit`` batches and at every epoch end (a commit also checks, on every
    rank at once, whether hosts were added or removed)."""

    def __init__(self, state, batches_per_commit: int = 1):
        super().__init__()
        self.state = state
        self.batches_per_commit = batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_train_begin(self, logs=None):
        """Start counting batches to the next commit."""
        self.batches_remaining = self.batches_per_commit

    def on_batch_end(self, batch, logs=None):
        """Commit every ``batches_per_commit`` batches."""
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.state.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch, logs=None):
        """Commit at the end of every epoch."""
        self.state.commit()


class UpdateBatchStateCallback(keras.callbacks.Callback):
    """Keep ``state.batch`` at the last finished batch, and after a reset run only the rest of the epoch."""

    def __init__(self, state):
        super().__init__()
        self.state = state
        self.steps_per_epoch = None

    def on_train_begin(self, logs=None):
        """Forget the epoch length of an earlier ``fit``."""
        self.steps_per_epoch = None

    def on_epoch_begin(self, epoch, logs=None):
        """After a reset, run only the batches the epoch has left."""
        if self.params.get("steps"):
            if self.steps_per_epoch is None:
                self.steps_per_epoch = self.params.get("steps")
            self.params["steps"] = self.steps_per_epoch - self.state.batch

    def on_batch_end(self, batch, logs=None):
        """Record the finished batch in ``state.batch``."""
        self.state.batch = batch

    def on_epoch_end(self, epoch, logs=None):
        """Start the next epoch at batch 0."""
        self.state.batch = 0


class UpdateEpochStateCallback(keras.callbacks.Callback):
    """Keep ``state.epoch`` at the number of finished epochs, counted across resets (``fit`` then runs
    ``epochs=total - state.epoch``, as in Horovod's examples)."""

    def __init__(self, state):
        super().__init__()
        self.state = state
        self.initial_epoch = state.epoch

    def on_train_begin(self, logs=None):
        """Remember the epochs finished before this ``fit``."""
        self.initial_epoch = self.state.epoch

    def on_epoch_end(self, epoch, logs=None):
        """Record the finished epoch in ``state.epoch``."""
        self.state.epoch = self.initial_epoch + epoch + 1


__all__ = ["KerasState", "CommitStateCallback", "UpdateBatchStateCallback", "UpdateEpochStateCallback", "run"]
