"""Ops that read Horovod's state when they run, not when they are traced, and the synchronisation ops.

Inside ``tf.function`` a Python ``hvd.size()`` is frozen into the graph at trace time; ``size_op()`` and its siblings
are read each time the graph runs, which an elastic job (whose size changes) needs. ``join`` and ``barrier`` wait
for the other ranks like the collectives, on a thread of their own, never on one of TensorFlow's inter-op threads;
like Horovod's ops they are ordered by their data and control dependencies only.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from horovod.runtime import basics
from horovod.runtime import collectives as _c
from horovod.runtime.process_sets import global_process_set
from horovod.tensorflow._tensors import run_numpy

__all__ = ["join", "barrier", "size_op", "local_size_op", "rank_op", "local_rank_op", "process_set_included_op"]


def _int_op(value_fn, name, blocking=False):
    return run_numpy(lambda: [np.int32(value_fn())], [], [tf.int32], [[]], name or "HorovodQuery", blocking)[0]


def join():
    """Declare that this rank has no more data; returns (as a tensor) the last rank to join. Meanwhile this rank
    contributes zeros to the others' allreduces."""
    return _int_op(_c.join, "HorovodJoin", blocking=True)


def barrier(process_set=global_process_set):
    """Block until every rank of the set reaches the barrier (an op when tracing, None when eager)."""
    if tf.executing_eagerly():
        _c.barrier(process_set=process_set)
        return None
    return _int_op(lambda: _c.barrier(process_set=process_set) or 0, "HorovodBarrier", blocking=True)


def size_op(process_set_id=0, name=None):
    """The number of ranks in process set ``process_set_id``, read when the op runs (not when it is traced)."""
    return _int_op(lambda: basics._process_set_size(process_set_id), name)


def local_size_op(name=None):
    """The number of ranks on this host, read when the op runs."""
    return _int_op(basics.local_size, name)


def rank_op(name=None):
    """This process's rank, read when the op runs."""
    return _int_op(basics.rank, name)


def local_rank_op(name=None):
    """This process's rank on its host, read when the op runs."""
    return _int_op(basics.local_rank, name)


def process_set_included_op(process_set_id=0, name=None):
    """1 when this rank belongs to process set ``process_set_id``, else 0, read when the op runs."""
    return _int_op(lambda: 1 if basics._process_set_rank(process_set_id) >= 0 else 0, name)
