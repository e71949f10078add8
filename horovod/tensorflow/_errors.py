"""Horovod's errors as the TensorFlow classes Horovod's TensorFlow users catch.

Horovod's TF kernels fail with a ``tf.errors.OpError``: ranks that disagree on a tensor give
``FailedPreconditionError``, bad arguments (alltoall's splits) ``InvalidArgumentError``. The core raises
:class:`~horovod.common.exceptions.TensorMismatchError` and ``ValueError``; this binding re-raises them as classes
that are both, with the core's message, so ``except hvd.TensorMismatchError`` and
``except tf.errors.FailedPreconditionError`` both work.
"""

from __future__ import annotations

import tensorflow as tf

from horovod.common.exceptions import TensorMismatchError, UnsupportedOperationError

__all__ = ["TensorMismatchOpError", "InvalidArgumentValueError", "UnsupportedOperationOpError", "SparseNotImplementedError",
           "as_tf_error"]


class _OpErrorMixin:
    """An ``OpError`` made from a message, or as TensorFlow makes one (``node_def, op, message[, payloads]``: a
    session re-raises a graph op's error that way, autograph a tracing error); its ``str`` is the message."""

    _tf_class = tf.errors.OpError

    def __init__(self, node_def, op=None, message=None, *args):
        if op is None and message is None:      # made from a message
            node_def, message = None, node_def
        self._tf_class.__init__(self, node_def, op, message, *args)
        self.args = (message,)

    def __str__(self) -> str:
        return self.message

    def __reduce__(self):
        return type(self), (self.message,)


class TensorMismatchOpError(_OpErrorMixin, TensorMismatchError, tf.errors.FailedPreconditionError):
    """Ranks disagree on a tensor: a :class:`TensorMismatchError` and a ``tf.errors.FailedPreconditionError``."""

    _tf_class = tf.errors.FailedPreconditionError


class InvalidArgumentValueError(_OpErrorMixin, ValueError, tf.errors.InvalidArgumentError):
    """A bad argument found by the core: a ``ValueError`` and a ``tf.errors.InvalidArgumentError``."""

    _tf_class = tf.errors.InvalidArgumentError


class UnsupportedOperationOpError(_OpErrorMixin, UnsupportedOperationError, tf.errors.InvalidArgumentError):
    """A collective the core refuses (a 0-d reducescatter, or one with an op other than Sum/Average): the shared
    rule's :class:`UnsupportedOperationError` (a ``RuntimeError``) and the ``tf.errors.InvalidArgumentError`` of
    Horovod's TensorFlow kernels."""

    _tf_class = tf.errors.InvalidArgumentError


class SparseNotImplementedError(NotImplementedError, ValueError):
    """An op or scaling Horovod does not do on ``tf.IndexedSlices``: Horovod's ``NotImplementedError``, and the
    ``ValueError`` the shared policy raises elsewhere."""


# -- graph ops -------------------------------------------------------------------------------------------------------
# A Python exception in a tf.numpy_function reaches the caller as the TensorFlow error of its status code, and the
# py_func kernel knows only ValueError/TypeError (InvalidArgument), NotImplementedError (Unimplemented),
# StopIteration and MemoryError: a mismatch would surface from a graph as UnknownError, whose message carries our
# exception's class and text. TensorFlow makes that error by calling UnknownError(node_def, op, message) (in C++ for
# a session, in Python for a tf.function), so UnknownError's __new__ returns a TensorMismatchOpError, with the same
# message, when that message names one; every other UnknownError is made as before.
_MISMATCH_MARKER = f"{TensorMismatchOpError.__module__}.{TensorMismatchOpError.__qualname__}: "
_unknown_error_new = tf.errors.UnknownError.__new__


def _new_unknown_error(cls, *args, **kwargs):
    if cls is tf.errors.UnknownError:
        if len(args) >= 3 and isinstance(args[2], str) and _MISMATCH_MARKER in args[2]:
            return TensorMismatchOpError(args[0], args[1], args[2])
        if len(args) == 1 and isinstance(args[0], TensorMismatchOpError):
            return args[0]      # raised as UnknownError(made) by TensorFlow's C++: the one made above
    return _unknown_error_new(cls, *args, **kwargs)


if not getattr(tf.errors.UnknownError, "_horovod_mismatch", False):     # (once per process, whatever reloads)
    tf.errors.UnknownError.__new__ = staticmethod(_new_unknown_error)
    tf.errors.UnknownError._horovod_mismatch = True


def as_tf_error(error: BaseException) -> BaseException:
    """``error`` as the TensorFlow class Horovod raises for it (the same object when there is none)."""
    if isinstance(error, tf.errors.OpError):
        return error
    if isinstance(error, TensorMismatchError):
        return TensorMismatchOpError(str(error))
    if type(error) is ValueError:
        return InvalidArgumentValueError(str(error))
    if type(error) is UnsupportedOperationError:
        return UnsupportedOperationOpError(str(error))
    return error
