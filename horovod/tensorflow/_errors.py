"""Horovod's errors as the TensorFlow classes Horovod's TensorFlow users catch.

Horovod's TF kernels fail with a ``tf.errors.OpError``: ranks that disagree on a tensor give
``FailedPreconditionError``, bad arguments (alltoall's splits) ``InvalidArgumentError``. The core raises
:class:`~horovod.common.exceptions.TensorMismatchError` and ``ValueError``; this binding re-raises them as classes
that are both, with the core's message, so ``except hvd.TensorMismatchError`` and
``except tf.errors.FailedPreconditionError`` both work.
"""

from __future__ import annotations

import tensorflow as tf

from horovod.common.exceptions import TensorMismatchError

__all__ = ["TensorMismatchOpError", "InvalidArgumentValueError", "SparseNotImplementedError", "as_tf_error"]


class TensorMismatchOpError(TensorMismatchError, tf.errors.FailedPreconditionError):
    """Ranks disagree on a tensor: a :class:`TensorMismatchError` and a ``tf.errors.FailedPreconditionError``."""

    def __init__(self, message: str):
        tf.errors.FailedPreconditionError.__init__(self, None, None, message)
        self.args = (message,)

    def __str__(self) -> str:
        return self.message

    def __reduce__(self):
        return type(self), (self.message,)


class InvalidArgumentValueError(ValueError, tf.errors.InvalidArgumentError):
    """A bad argument found by the core: a ``ValueError`` and a ``tf.errors.InvalidArgumentError``."""

    def __init__(self, message: str):
        tf.errors.InvalidArgumentError.__init__(self, None, None, message)
        self.args = (message,)

    def __str__(self) -> str:
        return self.message

    def __reduce__(self):
        return type(self), (self.message,)


class SparseNotImplementedError(NotImplementedError, ValueError):
    """An op or scaling Horovod does not do on ``tf.IndexedSlices``: Horovod's ``NotImplementedError``, and the
    ``ValueError`` the shared policy raises elsewhere."""


def as_tf_error(error: BaseException) -> BaseException:
    """``error`` as the TensorFlow class Horovod raises for it (the same object when there is none)."""
    if isinstance(error, tf.errors.OpError):
        return error
    if isinstance(error, TensorMismatchError):
        return TensorMismatchOpError(str(error))
    if type(error) is ValueError:
        return InvalidArgumentValueError(str(error))
    return error
