"""Keras callbacks for distributed training; the same classes as :mod:`horovod.tensorflow.keras.callbacks`."""

from horovod.tensorflow.keras.callbacks import *  # noqa: F401,F403
from horovod.tensorflow.keras.callbacks import __all__  # noqa: F401
