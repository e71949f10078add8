"""``import horovod.keras as hvd``: Horovod's standalone-Keras API, which with Keras 3 is the same as
:mod:`horovod.tensorflow.keras` (Keras 3 on the TensorFlow backend), except that ``allreduce`` averages by default
as Horovod's ``horovod.keras`` did."""

from typing import Optional

from horovod.tensorflow.keras import *  # noqa: F401,F403  (the same API)
from horovod.tensorflow.keras import __all__ as _tf_keras_all
from horovod.tensorflow.keras import allreduce as _allreduce
from horovod.tensorflow.keras import Compression, global_process_set
from horovod.keras import callbacks, elastic  # noqa: F401


def allreduce(value, name: Optional[str] = None, average=True, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, op=None, compression=Compression.none,
              process_set=global_process_set):
    """Reduce a value over the ranks and return a numpy value (averaged unless ``average=False`` or ``op``)."""
    if op is not None:
        average = None
    return _allreduce(value, name=name, average=average, prescale_factor=prescale_factor,
                      postscale_factor=postscale_factor, op=op, compression=compression, process_set=process_set)


__all__ = list(_tf_keras_all)
