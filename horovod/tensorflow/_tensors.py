"""TensorFlow <-> numpy for the TensorFlow binding, and the one place that runs core code eagerly or in a graph.

:func:`run_async` runs a collective in two halves: a submit that hands the arrays to the engine and returns at once,
and a finish that waits for the result. Executing eagerly it converts with ``.numpy()`` and ``tf.convert_to_tensor``
and runs both. While tracing (``tf.function``, Keras ``fit``, a TF1 graph) the submit is a stateful
``tf.numpy_function`` that never blocks, and the finish runs inside ``IteratorGetNext`` of a one-op dataset: an
asynchronous TensorFlow kernel with a thread of its own, so no collective ever holds a thread of TensorFlow's
inter-op pool while it waits for other ranks (``docs/tensorflow.md`` says why that cannot deadlock).
:func:`run_numpy` runs a plain function: one ``tf.numpy_function`` when it never blocks (the query ops), else on a
worker thread of the job, waited for the same way. bfloat16 travels to the core as its ``uint16`` bit pattern with
``dtype="bfloat16"``. An eager tensor on a GPU goes as a :class:`~horovod.common.device.DeviceTensor` that the front
door stages through host memory (``@host`` in its device name, ``HOST_STAGED`` in the timeline) and puts back on its
GPU; inside a graph, ``tf.numpy_function`` hands the op host arrays itself.
"""

from __future__ import annotations

import collections
import queue
import threading
from concurrent.futures import Future
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import gen_dataset_ops as _dataset_ops

from horovod.common.device import DeviceTensor
from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt
from horovod.common.types import dtype_name
from horovod.runtime import context
from horovod.tensorflow._errors import as_tf_error


def _keep_autograph_out() -> None:
    """Tell AutoGraph to call this package's functions as they are written (TensorFlow's own config rule for
    Keras and numpy): converted, every function a traced ``tf.function`` calls into here, and the closures they hand
    ``tf.numpy_function``, would run AutoGraph's rewrite of the engine's Python at every step. A gradient
    reduction's wait then drove the engine's loop through converted code: VGG16's 38 M gradients took 2-17 s a step
    at 2 ranks instead of 0.3 s. Nothing here needs conversion (graph control flow is written with ``tf.cond``)."""
    try:
        from tensorflow.python.autograph.core import config as autograph_config
    except ImportError:      # a TensorFlow without this module converts as it likes; correct, only slower
        return
    rules = tuple(autograph_config.CONVERSION_RULES)
    if not any(isinstance(r, autograph_config.DoNotConvert) and r.matches("horovod") for r in rules):
        autograph_config.CONVERSION_RULES = (autograph_config.DoNotConvert("horovod"),) + rules


_keep_autograph_out()

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


class _Workers:
    """Daemon threads that run blocking functions for graph ops (:func:`run_numpy`): a new thread whenever none is
    idle, so any number of functions can block at once; a thread idle for ``idle_s`` seconds ends."""

    def __init__(self, idle_s: float = 10.0):
        self._lock = threading.Lock()
        self._tasks: "queue.SimpleQueue" = queue.SimpleQueue()
        self._idle = 0           # threads waiting for a task, less the tasks queued for them
        self._idle_s = idle_s

    def submit(self, fn: Callable, *args) -> Future:
        """Run ``fn(*args)`` on an idle thread or a new one; its future."""
        future: Future = Future()
        with self._lock:
            start = self._idle == 0
            if not start:
                self._idle -= 1
            self._tasks.put((future, fn, args))
        if start:
            threading.Thread(target=self._loop, name="horovod-tf-blocking", daemon=True).start()
        return future

    def _loop(self) -> None:
        while True:
            try:
                future, fn, args = self._tasks.get(timeout=self._idle_s)
            except queue.Empty:
                with self._lock:
                    if self._tasks.empty():
                        self._idle -= 1
                        return
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as error:  # noqa: BLE001 — handed to the op that waits for it
                future.set_exception(error)
            del future, fn, args
            with self._lock:
                self._idle += 1


class _Job:
    """The TensorFlow binding's per-job state (:meth:`horovod.runtime.context.Context.binding`)."""

    def __init__(self):
        # Written by the TensorFlow thread that ran the op, read by the caller's thread: a plain shared cell.
        self.graph_error: Optional[BaseException] = None
        self.workers = _Workers()


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


def _guarded(fn: Callable, *args):
    """``fn(*args)``, keeping a Horovod error for elastic training before TensorFlow wraps it, and raising the
    others as the TensorFlow classes Horovod's users catch (:func:`as_tf_error`)."""
    try:
        return fn(*args)
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


# The waiter's dataset runs exactly one element per GetNext, when the op asks: nothing may run ahead of it.
_WAIT_OPTIONS = tf.data.Options()
_WAIT_OPTIONS.autotune.enabled = False
_WAIT_OPTIONS.experimental_optimization.apply_default_optimizations = False
_WAIT_OPTIONS.experimental_optimization.inject_prefetch = False
_WAIT_OPTIONS.experimental_warm_start = False


class _Waiter:
    """The completion half of one graph op: the op's submissions, and the ``IteratorGetNext`` that waits for the
    latest one.

    ``IteratorGetNext`` is an asynchronous TensorFlow kernel with a thread of its own: the wait happens there (in
    the dataset's ``numpy_function``), never on a thread of TensorFlow's inter-op pool. Tracing a ``tf.function``
    the op's iterator is made eagerly (``init_scope``) and captured. In a TF1 graph every op would add a dataset
    function and a one-shot iterator's factory to the graph's library, which a session copies on each run (Horovod's
    in-place broadcast test, 144 runs, took 136 s that way): there the ops of a graph share one wait function per
    output signature (:class:`_GraphWaits`) and each run makes a fresh iterator of the op's id.
    """

    def __init__(self, touts: List[tf.DType], name: str):
        self.pending: collections.deque = collections.deque()
        self.touts = touts
        self.name = name
        self._graph_waits: Optional[_GraphWaits] = None
        with tf.init_scope():    # out of control flow and dependencies; eager when tracing a tf.function
            if tf.executing_eagerly():
                dataset = tf.data.Dataset.from_tensors(np.int64(0)).repeat().map(
                    lambda i: tf.numpy_function(self._wait, [i], touts, stateful=True, name=f"{name}Wait"))
                self.iterator = iter(dataset.with_options(_WAIT_OPTIONS))
                self.order = [self.iterator._iterator_resource]  # noqa: SLF001 — orders the op's halves
            else:
                self._graph_waits = _GraphWaits.of(tf.compat.v1.get_default_graph())
                self.op_id = self._graph_waits.register(self)
                self.order = []

    def _wait(self, _=None):
        # The op's GetNext runs after its submission (a control dependency), so the latest entry is this run's;
        # older ones are left by runs that TensorFlow aborted after the submission (another op failed).
        try:
            finish = self.pending.pop()
        except IndexError:
            raise HorovodInternalError(f"{self.name}: nothing submitted to wait for") from None
        self.pending.clear()
        return finish()

    def outputs(self) -> List[tf.Tensor]:
        if self._graph_waits is None:
            return tf.nest.flatten(self.iterator.get_next())
        return self._graph_waits.outputs(self.op_id, self.touts, self.name)


class _GraphWaits:
    """A TF1 graph's wait functions, one per output signature, and the waiters of its ops by id (kept on the graph,
    so they live exactly as long as the ops that call them).

    Each run of an op makes an anonymous iterator over ``map(wait, [op id])`` (no library function of its own) and
    takes its one element; the map is a plain ``MapDataset``, with no optimisation, prefetch or autotune around it.
    """

    def __init__(self):
        self.waiters: List[_Waiter] = []     # by op id
        self._functions: dict = {}

    @classmethod
    def of(cls, graph) -> "_GraphWaits":
        waits = getattr(graph, "_horovod_graph_waits", None)
        if waits is None:
            waits = graph._horovod_graph_waits = cls()  # noqa: SLF001 — dies with the graph
        return waits

    def register(self, waiter: _Waiter) -> int:
        self.waiters.append(waiter)
        return len(self.waiters) - 1

    def _dispatch(self, op_id):
        return self.waiters[int(op_id)]._wait()  # noqa: SLF001

    def _function(self, touts: List[tf.DType]):
        key = tuple(touts)
        if key not in self._functions:
            @tf.function(input_signature=[tf.TensorSpec([], tf.int64)], autograph=False)
            def wait(op_id):
                return tf.numpy_function(self._dispatch, [op_id], touts, stateful=True, name="HorovodWait")
            self._functions[key] = wait.get_concrete_function()
        return self._functions[key]

    def outputs(self, op_id: int, touts: List[tf.DType], name: str) -> List[tf.Tensor]:
        shapes = [tf.TensorShape(None)] * len(touts)
        dataset = _dataset_ops.tensor_dataset([tf.constant(np.int64(op_id))], output_shapes=[[]])
        dataset = _dataset_ops.map_dataset(dataset, [], f=self._function(touts), output_types=touts,
                                           output_shapes=shapes)
        iterator = _dataset_ops.anonymous_iterator_v3(output_types=touts, output_shapes=shapes)
        with tf.control_dependencies([_dataset_ops.make_iterator(dataset, iterator)]):
            return list(_dataset_ops.iterator_get_next(iterator, output_types=touts, output_shapes=shapes,
                                                       name=f"{name}Wait"))


def run_async(submit: Callable[..., Callable[[], Sequence[np.ndarray]]], inputs: Sequence, touts: Sequence[tf.DType],
              shapes: Sequence, name: str = "Horovod") -> List[tf.Tensor]:
    """Run a collective in two halves, eagerly or as graph ops; returns tensors of ``touts``.

    ``submit(*arrays)`` hands the work to the engine and returns at once a ``finish(timeout)`` that waits and
    returns one array per ``touts`` entry. Eagerly: both, one after the other. In a graph: ``submit`` is a stateful
    ``tf.numpy_function`` that returns at once (so ``tf.function``'s automatic control dependencies chain the
    submissions in program order, never behind a wait), and ``finish`` runs in the ``GetNext`` of a
    :class:`_Waiter`'s iterator, an asynchronous kernel that holds no inter-op thread while it waits. However few
    inter-op threads TensorFlow has, and in whatever order ranks run their independent collectives, every
    collective is submitted; waits happen elsewhere; none can block another (``docs/tensorflow.md``).

    Args:
        submit: takes TensorFlow's numpy view of each input (bfloat16 as ``ml_dtypes``); must not block; returns
            ``finish(timeout)`` (a handle's ``result``: None waits as long as it takes, and may run the engine's
            loop on the waiting thread).
        inputs: tensors (or values convertible to tensors).
        touts: the output dtypes.
        shapes: the static output shapes (``None`` entries for dimensions known only at run time).
        name: the graph ops' name.
    """
    touts = list(touts)

    def finish(done: Callable[..., Sequence[np.ndarray]], timeout: Optional[float]) -> List[np.ndarray]:
        return [from_core(o, t) for o, t in zip(_guarded(done, timeout), touts)]

    if tf.executing_eagerly():
        arrays = [_eager_input(t) for t in inputs]
        return [tf.convert_to_tensor(o) for o in finish(_guarded(submit, *arrays), None)]
    waiter = _Waiter(touts, name)

    def submit_op(*arrays):
        done = _guarded(submit, *arrays[len(waiter.order):])
        # A timeout, however long, makes the handle wait for the engine thread instead of running the engine's
        # loop on this thread: several waits in flight would otherwise take turns at the loop.
        waiter.pending.append(lambda: finish(done, threading.TIMEOUT_MAX))
        return np.int64(0)

    # In a tf.function, the iterator's handle as an input: automatic control dependencies order this op after the
    # previous use of the same iterator only (its last wait), not after every other stateful op (Horovod's ops are
    # not stateful).
    token = tf.numpy_function(submit_op, [*waiter.order, *inputs], tf.int64, stateful=True, name=name)
    with tf.control_dependencies([token]):
        outputs = waiter.outputs()
    for output, shape in zip(outputs, shapes):
        output.set_shape(shape)
    return outputs


def run_numpy(fn: Callable[..., Sequence[np.ndarray]], inputs: Sequence, touts: Sequence[tf.DType],
              shapes: Sequence, name: str = "Horovod", blocking: bool = True) -> List[tf.Tensor]:
    """Run ``fn(*arrays) -> arrays`` on ``inputs``, eagerly or in a graph; returns tensors of ``touts``.

    A ``blocking`` function (one that waits for other ranks) runs in a graph on a thread of the job's own
    (:class:`_Workers`, grown whenever none is idle) and is waited for like a collective (:func:`run_async`);
    a function that never waits is one ``tf.numpy_function``.

    Args:
        fn: takes TensorFlow's numpy view of each input (bfloat16 as ``ml_dtypes``), returns one array per
            ``touts`` entry.
        inputs: tensors (or values convertible to tensors).
        touts: the output dtypes.
        shapes: the static output shapes (``None`` entries for dimensions known only at run time).
        name: the graph op's name.
        blocking: whether ``fn`` may wait for other ranks.
    """
    if blocking and not tf.executing_eagerly():
        def submit(*arrays):
            job = _job()
            if job is None:
                raise ValueError("Horovod has not been initialized; use hvd.init().")
            return job.workers.submit(fn, *arrays).result
        return run_async(submit, inputs, touts, shapes, name)
    touts = list(touts)

    def call(*arrays):
        return [from_core(o, t) for o, t in zip(_guarded(fn, *arrays), touts)]

    if tf.executing_eagerly():
        arrays = [_eager_input(t) for t in inputs]
        return [tf.convert_to_tensor(o) for o in call(*arrays)]
    outputs = tf.numpy_function(call, list(inputs), touts, stateful=True, name=name)
    if not isinstance(outputs, (list, tuple)):
        outputs = [outputs]
    for output, shape in zip(outputs, shapes):
        output.set_shape(shape)
    return list(outputs)


__all__ = ["check_dtype", "to_core", "from_core", "run_async", "run_numpy", "executing_eagerly", "TF_OPS"]


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
