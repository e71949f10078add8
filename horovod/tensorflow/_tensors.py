"""TensorFlow <-> numpy for the TensorFlow binding, and the one place that runs core code eagerly or in a graph.

:func:`run_numpy` calls a function on numpy arrays. Executing eagerly it converts with ``.numpy()`` and
``tf.convert_to_tensor``; while tracing (``tf.function``, Keras ``fit``) it becomes one stateful
``tf.numpy_function`` op, so ``tf.function``'s automatic control dependencies run Horovod ops in program order on
every rank (a blocking collective never waits behind another rank's different op). bfloat16 travels to the core as
its ``uint16`` bit pattern with ``dtype="bfloat16"``. An eager tensor on a GPU goes as a
:class:`~horovod.common.device.DeviceTensor` that the front door stages through host memory (``@host`` in its device
name, ``HOST_STAGED`` in the timeline) and puts back on its GPU; inside a graph, ``tf.numpy_function`` hands the op
host arrays itself.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from horovod.common.device import DeviceTensor
from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt
from horovod.common.types import dtype_name
from horovod.runtime import context
from horovod.tensorflow._errors import as_tf_error

_SUPPORTED = (tf.uint8, tf.int8, tf.uint16, tf.int16, tf.int32, tf.int64, tf.float16, tf.bfloat16, tf.float32,
              tf.float64, tf.bool)


def check_dtype(dtype: tf.DType, what: str = "tensor") -> tf.DType:
    """Raises ValueError for a dtype the core cannot carry (strings, complex, resources)."""
    if dtype.base_dtype not in _SUPPORTED:
        raise ValueError(f"{what} has dtype {dtype.name}, which Horovod cannot reduce or move; supported: "
                         f"{', '.join(d.name for d in _SUPPORTED)}")
    return dtype.base_dtype


def to_core(array) -> Tuple[Any, Optional[str]]:
    """A numpy array from TensorFlow as the core takes it: ``(array, dtype name or None)``; a GPU tensor's
    :class:`DeviceTensor` as it is."""
    if type(array) is DeviceTensor:
        return array, array.dtype
    array = np.asarray(array)
    if array.dtype == tf.bfloat16.as_numpy_dtype:
        return np.ascontiguousarray(array).view(np.uint16), "bfloat16"
    return array, None


def from_core(array, dtype: tf.DType):
    """A result array from the core as TensorFlow's numpy type for ``dtype``; a device result as its tensor."""
    if type(array) is DeviceTensor:
        return array.data
    array = np.asarray(array)
    if dtype == tf.bfloat16:
        return array.view(tf.bfloat16.as_numpy_dtype)
    return array.astype(dtype.as_numpy_dtype, copy=False)


class _Job:
    """The TensorFlow binding's per-job state (:meth:`horovod.runtime.context.Context.binding`)."""

    def __init__(self):
        # Written by the TensorFlow thread that ran the op, read by the caller's thread: a plain shared cell.
        self.graph_error: Optional[BaseException] = None


def _job() -> Optional[_Job]:
    ctx = context.get()
    return None if ctx is None else ctx.binding("tensorflow", _Job)


def take_graph_error() -> Optional[BaseException]:
    """The Horovod error behind the last ``tf.errors.OpError`` raised by a graph op of this binding in this job
    (then cleared); None between jobs.

    Inside a graph TensorFlow turns a Python exception into an ``OpError``; elastic training needs the original
    :class:`HorovodInternalError` / :class:`HostsUpdatedInterrupt` to decide between restoring and keeping state.
    """
    job = _job()
    if job is None:
        return None
    error, job.graph_error = job.graph_error, None
    return error


def executing_eagerly() -> bool:
    """Whether TensorFlow runs ops eagerly here (else a graph is being traced)."""
    return tf.executing_eagerly()


def run_numpy(fn: Callable[..., Sequence[np.ndarray]], inputs: Sequence, touts: Sequence[tf.DType],
              shapes: Sequence, name: str = "Horovod") -> List[tf.Tensor]:
    """Run ``fn(*arrays) -> arrays`` on ``inputs``, eagerly or as one graph op; returns tensors of ``touts``.

    Args:
        fn: takes TensorFlow's numpy view of each input (bfloat16 as ``ml_dtypes``), returns one array per
            ``touts`` entry; it may block on collectives.
        inputs: tensors (or values convertible to tensors).
        touts: the output dtypes.
        shapes: the static output shapes (``None`` entries for dimensions known only at run time).
        name: the graph op's name.
    """
    touts = list(touts)

    def call(*arrays):
        """``fn`` on the arrays, keeping a Horovod error for elastic training before TensorFlow wraps it."""
        try:
            outputs = fn(*arrays)
        except (HorovodInternalError, HostsUpdatedInterrupt) as error:
            job = _job()
            if job is not None:
                job.graph_error = error   # TensorFlow re-raises it as an OpError; see take_graph_error
            raise
        except Exception as error:  # noqa: BLE001 — re-raised as the TensorFlow class Horovod's users catch
            converted = as_tf_error(error)
            if converted is error:
                raise
            raise converted.with_traceback(error.__traceback__) from None
        return [from_core(o, t) for o, t in zip(outputs, touts)]

    if tf.executing_eagerly():
        arrays = [_eager_input(t) for t in inputs]
        return [tf.convert_to_tensor(o) for o in call(*arrays)]
    outputs = tf.numpy_function(call, list(inputs), touts, stateful=True, name=name)
    if not isinstance(outputs, (list, tuple)):
        outputs = [outputs]
    for output, shape in zip(outputs, shapes):
        output.set_shape(shape)
    return list(outputs)


__all__ = ["check_dtype", "to_core", "from_core", "run_numpy", "executing_eagerly", "TF_OPS"]


def _gpu_index(tensor) -> Optional[int]:
    """The GPU an eager tensor lives on (TensorFlow names it ``.../device:GPU:1``), or None."""
    device = getattr(tensor, "device", "") or ""
    marker = device.rfind("GPU:")
    return int(device[marker + 4:]) if marker >= 0 else None


def _eager_input(tensor):
    """What an eager op hands the core: a host tensor's numpy view, a GPU tensor's :class:`DeviceTensor` (which
    the front door stages through host memory: TensorFlow has no device plane here)."""
    index = _gpu_index(tensor)
    if index is None:
        return tensor.numpy() if hasattr(tensor, "numpy") else np.asarray(tensor)
    name = "bfloat16" if tensor.dtype == tf.bfloat16 else dtype_name(np.empty(0, tensor.dtype.as_numpy_dtype))
    return DeviceTensor(tensor, f"cuda:{index}", name, tuple(tensor.shape), None, TF_OPS)


class _TfOps:
    """The host-staged path for TensorFlow tensors (:class:`horovod.common.device.DeviceOps`)."""

    def to_host(self, tensor: DeviceTensor) -> np.ndarray:
        """A host copy (``numpy()`` waits for the tensor)."""
        return to_core(tensor.data.numpy())[0]

    def to_device(self, array: np.ndarray, like: DeviceTensor, out: Optional[DeviceTensor] = None) -> DeviceTensor:
        """``array`` as a tensor on ``like``'s device (tensors are immutable: ``out`` is never written)."""
        with tf.device(like.data.device):
            placed = tf.identity(tf.convert_to_tensor(from_core(array, like.data.dtype)))
        return DeviceTensor(placed, like.device, like.dtype, tuple(placed.shape), None, self)


TF_OPS = _TfOps()
