"""Elastic Keras training; the same names as :mod:`horovod.tensorflow.keras.elastic`."""

from horovod.tensorflow.keras.elastic import *  # noqa: F401,F403
from horovod.tensorflow.keras.elastic import __all__  # noqa: F401
