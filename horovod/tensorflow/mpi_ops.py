"""Horovod's collectives on TensorFlow tensors, eagerly and inside ``tf.function``, with their gradients.

Each op converts its tensors to numpy (:func:`horovod.tensorflow._tensors.run_async`), calls the one implementation
in :mod:`horovod.runtime.collectives`, and converts back. The gradients, registered with ``tf.custom_gradient``, are
Horovod's as written once in :mod:`horovod.runtime.collective_gradients`; the argument and scaling rules come from
:mod:`horovod.runtime.gradient_policy`. This module spells them in TensorFlow.

Names: a given ``name`` is prefixed with the current name scope unless ``ignore_name_scope``. Unnamed tensors are
numbered in call order when executing eagerly (as the core does), and named after the input tensor's graph name
while tracing, as Horovod does: the same program builds the same graph, so the names agree across ranks even when one
rank traces a function again (a different last-batch shape) and another does not.
"""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from horovod.runtime import collective_gradients as _grads
from horovod.runtime import collectives as _c
from horovod.runtime import gradient_policy as _policy
from horovod.runtime.compression import compress_all, decompress_all
# Horovod's names here too (init, rank, size, ...); the op constants and process sets are set below.
from horovod.runtime.mpi_ops_names import (HorovodInternalError, HostsUpdatedInterrupt, TensorMismatchError,
                                           add_process_set, ccl_built, check_num_rank_power_of_2, cross_rank,
                                           cross_size, cuda_built, ddl_built, gloo_built, gloo_enabled,
                                           handle_average_backwards_compatibility, init, is_homogeneous, is_initialized,
                                           local_rank, local_size, mpi_built, mpi_enabled, mpi_threads_supported,
                                           nccl_built, rank, remove_process_set, rocm_built, shutdown, size,
                                           start_timeline, stop_timeline)
from horovod.runtime.mpi_ops_names import _basics  # noqa: F401 — Horovod's mpi_ops._basics
from horovod.runtime.process_sets import ProcessSet, global_process_set
from horovod.common.exceptions import UnsupportedOperationError
from horovod.tensorflow._errors import SparseNotImplementedError, as_tf_error
from horovod.tensorflow._op_inputs import (_check_set, _executing_eagerly, _gathered_shape, _inputs,  # noqa: F401
                                           _normalize_name, _op_name)
from horovod.tensorflow._tensors import run_async, to_core
from horovod.tensorflow.compression import Compression
from horovod.tensorflow.queries import (barrier, join, local_rank_op, local_size_op, process_set_included_op,
                                        rank_op, size_op)

Average, Sum, Adasum, Min, Max, Product = _c.Average, _c.Sum, _c.Adasum, _c.Min, _c.Max, _c.Product

__all__ = ["Average", "Sum", "Adasum", "Min", "Max", "Product", "allreduce", "grouped_allreduce", "allgather",
           "grouped_allgather", "broadcast", "broadcast_", "alltoall", "reducescatter", "grouped_reducescatter",
           "join", "barrier", "size_op", "local_size_op", "rank_op", "local_rank_op", "process_set_included_op"]


def _with_gradient(forward: Callable, grad_fn: Callable, tensors: Sequence[tf.Tensor]) -> List[tf.Tensor]:
    """``forward(*tensors) -> list`` with ``grad_fn(*dys) -> input grads`` registered, for floating-point inputs."""
    if not all(t.dtype.is_floating for t in tensors):
        return list(forward(*tensors))

    @tf.custom_gradient
    def op(*xs):
        def grad(*dys):
            return grad_fn(*dys)
        return forward(*xs), grad
    return list(op(*tensors))


def _core(single_async, grouped_async, grouped: bool, name: Optional[str], **kwargs) -> Callable:
    """A submit function (:func:`run_async`) starting one core collective (grouped or not) on its arrays."""
    def submit(*arrays):
        inputs = [to_core(a) for a in arrays]
        if grouped:
            handle = grouped_async([a for a, _ in inputs], name=name, dtypes=[d for _, d in inputs], **kwargs)
            return handle.result
        handle = single_async(inputs[0][0], name=name, dtype=inputs[0][1], **kwargs)
        return lambda timeout=None: [handle.result(timeout)]
    return submit


# -- allreduce ------------------------------------------------------------------------------------------------------

def _allreduce(tensors, grouped: bool, name=None, op=Sum, prescale_factor=1.0, postscale_factor=1.0,
               ignore_name_scope=False, process_set=global_process_set) -> List[tf.Tensor]:
    """Differentiable allreduce of dense tensors (grouped: one fused group), without compression."""
    _check_set(process_set)
    tensors = _inputs(tensors)
    if not tensors:
        return []
    fn = _core(_c.allreduce_async, _c.grouped_allreduce_async, grouped, _op_name(name, tensors, ignore_name_scope),
               op=op, prescale_factor=prescale_factor, postscale_factor=postscale_factor, process_set=process_set)

    def forward(*xs):
        return run_async(fn, xs, [t.dtype for t in xs], [t.shape for t in xs], "HorovodAllreduce")

    def grad(*dys):
        return _grads.grouped_allreduce_grad(_OPS, dys, op, prescale_factor, postscale_factor, process_set)
    return _with_gradient(forward, grad, tensors)


def _sparse_allreduce(slices: tf.IndexedSlices, name, op, prescale_factor, postscale_factor, compression,
                      ignore_name_scope, process_set) -> tf.IndexedSlices:
    """Horovod's rule for IndexedSlices: gather every rank's values and indices, scaled like the reduction."""
    try:
        _policy.check_sparse_op(op)
    except (ValueError, NotImplementedError) as error:
        raise SparseNotImplementedError(str(error)) from None
    if prescale_factor != 1.0 or postscale_factor != 1.0:
        raise SparseNotImplementedError("prescale_factor and postscale_factor are not supported with "
                                        "tf.IndexedSlices (Horovod's rule)")
    values, ctx = compression.compress(slices.values)
    values = allgather(values, name=f"{name}.values" if name else None, ignore_name_scope=ignore_name_scope,
                       process_set=process_set)
    values = compression.decompress(values, ctx)
    indices = allgather(slices.indices, name=f"{name}.indices" if name else None,
                        ignore_name_scope=ignore_name_scope, process_set=process_set)
    size = _policy.set_size(process_set)
    if op == Average and not values.dtype.is_floating:
        values = tf.math.truediv(values, tf.cast(size, values.dtype))   # Horovod's division: integers become float
    elif op == Average and size != 1:
        values = values * tf.cast(_policy.reduction_scale(op, size, 1.0, 1.0), values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=slices.dense_shape)


def allreduce(tensor, average=None, device_dense="", device_sparse="", compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, name=None, process_set=global_process_set,
              ignore_name_scope=False):
    """Reduce ``tensor`` over the ranks of ``process_set`` (differentiable: the gradient is the same allreduce of
    the output's gradient; eager or inside ``tf.function``).

    Args:
        tensor: a ``tf.Tensor``, ``tf.Variable`` or ``tf.IndexedSlices`` (gathered, not summed: Horovod's rule).
        average: deprecated; use ``op``.
        device_dense, device_sparse: accepted for compatibility; every op runs on the CPU.
        compression: ``hvd.Compression.none``, ``fp16`` or ``bf16`` on the wire.
        op: ``hvd.Average`` (default), ``Sum``, ``Min``, ``Max``, ``Product`` or ``Adasum``.
        prescale_factor, postscale_factor: multiply the input before and the result after the reduction.
        name: a name unique among pending collectives; prefixed with the name scope unless ``ignore_name_scope``.
        process_set: the ranks taking part.
    Returns:
        A tensor of the same shape and dtype (``tf.IndexedSlices`` for ``tf.IndexedSlices``).
    Raises:
        ValueError: ``op`` and ``average`` both given, an unsupported dtype, or an op the dtype cannot take.
        TensorMismatchError: ranks disagree on shape, dtype or op.
    """
    return _reduce_list([tensor], False, average, compression, op, prescale_factor, postscale_factor, name,
                        process_set, ignore_name_scope)[0]


def grouped_allreduce(tensors, average=None, device_dense="", device_sparse="", compression=Compression.none,
                      op=None, prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set,
                      ignore_name_scope=False, name=None):
    """Allreduce a list of tensors as one group, negotiated and fused together (differentiable); see
    :func:`allreduce`. ``tf.IndexedSlices`` entries are reduced separately by Horovod's gather rule."""
    return _reduce_list(list(tensors), True, average, compression, op, prescale_factor, postscale_factor, name,
                        process_set, ignore_name_scope)


def _reduce_list(tensors, grouped, average, compression, op, prescale_factor, postscale_factor, name, process_set,
                 ignore_name_scope) -> list:
    op = _policy.resolve_op(op, average)
    prescale_factor, postscale_factor = _policy.check_scale_factors(prescale_factor, postscale_factor)
    out = list(tensors)
    dense = [i for i, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
    for i in sorted(set(range(len(tensors))) - set(dense)):
        sparse_name = f"{name}.{i}" if name and grouped else name
        out[i] = _sparse_allreduce(tensors[i], sparse_name, op, prescale_factor, postscale_factor, compression,
                                   ignore_name_scope, process_set)
    compressed, ctxs = compress_all(compression, [tf.convert_to_tensor(tensors[i]) for i in dense])
    reduced = _allreduce(compressed, grouped, name, op, prescale_factor, postscale_factor, ignore_name_scope,
                         process_set)
    for i, r in zip(dense, decompress_all(compression, reduced, ctxs)):
        out[i] = r
    return out


# -- allgather ------------------------------------------------------------------------------------------------------

def _allgather(tensors, grouped: bool, name, ignore_name_scope, process_set) -> List[tf.Tensor]:
    _check_set(process_set)
    tensors = _inputs(tensors)
    if not tensors:
        return []
    fn = _core(_c.allgather_async, _c.grouped_allgather_async, grouped, _op_name(name, tensors, ignore_name_scope),
               process_set=process_set)

    def forward(*xs):
        return run_async(fn, xs, [t.dtype for t in xs], [_gathered_shape(t.shape) for t in xs], "HorovodAllgather")

    def grad(*dys):
        return [_grads.allgather_grad(_OPS, dy, x, process_set) for dy, x in zip(dys, tensors)]
    return _with_gradient(forward, grad, tensors)


def allgather(tensor, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Concatenate every rank's ``tensor`` on the first dimension, which may differ between ranks
    (differentiable: the gradient is the averaged allreduce of the output's gradient, sliced to this rank's rows)."""
    return _allgather([tensor], False, name, ignore_name_scope, process_set)[0]


def grouped_allgather(tensors, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Allgather a list of tensors as one group (differentiable); see :func:`allgather`."""
    return _allgather(list(tensors), True, name, ignore_name_scope, process_set)


# -- broadcast ------------------------------------------------------------------------------------------------------

def _broadcast_raw(tensors: List[tf.Tensor], root_rank, name, process_set) -> List[tf.Tensor]:
    _check_set(process_set)
    def fn(*arrays):
        prefix = name or _c._auto_name("broadcast_group") if len(arrays) > 1 else name
        handles = []
        for i, a in enumerate(arrays):
            array, dtype = to_core(a)
            each = f"{prefix}.{i}" if len(arrays) > 1 else prefix
            handles.append(_c.broadcast_async(array, root_rank, name=each, process_set=process_set, dtype=dtype))
        return lambda timeout=None: [h.result(timeout) for h in handles]
    return run_async(fn, tensors, [t.dtype for t in tensors], [t.shape for t in tensors], "HorovodBroadcast")


def broadcast(tensor, root_rank, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Return global rank ``root_rank``'s ``tensor`` on every rank of the set (differentiable: the gradient is the
    averaged allreduce of the output's gradient on the root and zero elsewhere).

    Raises:
        ValueError: ``root_rank`` is not in the set. TensorMismatchError: ranks disagree on shape, dtype or root.
    """
    tensors = _inputs([tensor])
    full = _op_name(name, tensors, ignore_name_scope)

    def forward(x):
        return _broadcast_raw([x], root_rank, full, process_set)

    def grad(dy):
        return _grads.broadcast_grad(_OPS, dy, root_rank, process_set)
    return _with_gradient(forward, grad, tensors)[0]


def broadcast_(variables, root_rank, name=None, process_set=global_process_set):
    """Overwrite ``variables`` in place with ``root_rank``'s values (one op for the whole list).

    Returns:
        The variables' new values, as tensors.
    """
    variables = list(variables)
    if not variables:
        return []
    if name:
        full = _op_name(name, (), False)
    else:
        full = None if tf.executing_eagerly() else _normalize_name(
            f"broadcast_inplace_{variables[0].name}_{len(variables)}")
    values = _broadcast_raw([tf.convert_to_tensor(v) for v in variables], root_rank, full, process_set)
    return [v.assign(value) for v, value in zip(variables, values)]


# -- alltoall -------------------------------------------------------------------------------------------------------

def _alltoall_raw(tensor, splits, name, process_set):
    _check_set(process_set)
    def fn(array, split_array):
        array, dtype = to_core(array)
        use = None if split_array.size == 0 else split_array
        handle = _c.alltoall_async(array, use, name=name, process_set=process_set, dtype=dtype)

        def finish(timeout=None):
            output, received = handle.result(timeout)
            return [output, np.asarray(received, dtype=np.int32)]
        return finish
    size = _policy.set_size(process_set)
    return run_async(fn, [tensor, splits], [tensor.dtype, tf.int32], [_gathered_shape(tensor.shape), [size]],
                     "HorovodAlltoall")


def alltoall(tensor, splits=None, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Send rows ``splits[i]`` of ``tensor`` to rank i of the set (equal parts when None) and gather what the
    others send (differentiable: the gradient travels back with the received splits). Returns the output, or
    ``(output, received_splits)`` when ``splits`` is given.

    Raises:
        ValueError: no ``splits`` and the first dimension does not divide by the set's size, or bad ``splits``.
    """
    tensors = _inputs([tensor])
    split_tensor = tf.cast(tf.convert_to_tensor(splits if splits is not None else [], dtype=tf.int32
                                                if splits is None else None), tf.int32)
    full = _op_name(name, tensors, ignore_name_scope)
    received_box = []

    def forward(x):
        output, received = _alltoall_raw(x, split_tensor, full, process_set)
        received_box.append(received)
        return [output]

    def grad(dy):
        return _grads.alltoall_grad(_OPS, dy, received_box[0], process_set)
    output = _with_gradient(forward, grad, tensors)[0]
    return output if splits is None else (output, received_box[0])


# -- reducescatter --------------------------------------------------------------------------------------------------

def _reducescatter(tensors, grouped, compression, op, name, process_set, ignore_name_scope, prescale_factor,
                   postscale_factor) -> List[tf.Tensor]:
    _check_set(process_set)
    tensors = _inputs(tensors)
    try:    # 0-d tensors and ops other than Sum/Average, before anything is submitted
        _policy.check_reducescatter_op(op, [t.shape.rank for t in tensors if t.shape.rank is not None])
    except UnsupportedOperationError as error:
        raise as_tf_error(error) from None
    prescale_factor, postscale_factor = _policy.check_scale_factors(prescale_factor, postscale_factor)
    compressed, ctxs = compress_all(compression, tensors)
    if not compressed:
        return []
    fn = _core(_c.reducescatter_async, _c.grouped_reducescatter_async, grouped,
               _op_name(name, compressed, ignore_name_scope), op=op, process_set=process_set,
               prescale_factor=prescale_factor, postscale_factor=postscale_factor)

    def forward(*xs):
        return run_async(fn, xs, [t.dtype for t in xs], [_gathered_shape(t.shape) for t in xs],
                         "HorovodReducescatter")

    def grad(*dys):
        return _grads.reducescatter_grad(_OPS, dys, op, prescale_factor, postscale_factor, process_set)
    return decompress_all(compression, _with_gradient(forward, grad, compressed), ctxs)


def reducescatter(tensor, device_dense="", compression=Compression.none, op=Average, name=None,
                  process_set=global_process_set, ignore_name_scope=False, prescale_factor=1.0,
                  postscale_factor=1.0):
    """Reduce ``tensor`` over the set and return this rank's slice of the first dimension; ranks below
    ``dim0 % size`` get one extra row (differentiable: the gradient is the allgather of the output's gradient,
    scaled like the reduction).

    Raises:
        ValueError: ``op`` other than ``hvd.Sum`` or ``hvd.Average``.
    """
    return _reducescatter([tensor], False, compression, op, name, process_set, ignore_name_scope, prescale_factor,
                          postscale_factor)[0]


def grouped_reducescatter(tensors, device_dense="", compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0, name=None,
                          ignore_name_scope=False):
    """Reducescatter a list of tensors as one group (differentiable); see :func:`reducescatter`."""
    return _reducescatter(list(tensors), True, compression, op, name, process_set, ignore_name_scope,
                          prescale_factor, postscale_factor)


# -- the gradient rules' primitives in TensorFlow -------------------------------------------------------------------

def _rows(tensor, counts, index, like):
    offset = tf.reduce_sum(counts[:index])
    own = tensor[offset:offset + counts[index]]
    return own if like.shape.rank else tf.reshape(own, [])


def _row_count(x):
    return tf.reshape(tf.shape(x, out_type=tf.int64)[0] if x.shape.rank else tf.constant(1, tf.int64), [1])


_OPS = _grads.GradientOps(
    grouped_allreduce=lambda ts, op, pre, post, ps: _allreduce(ts, len(ts) > 1, None, op, pre, post, False, ps),
    allgather=lambda t, ps: allgather(t, process_set=ps),
    alltoall=lambda t, splits, ps: alltoall(t, splits=splits, process_set=ps)[0],
    scale=lambda t, factor: t * tf.cast(factor, t.dtype),
    zeros_like=lambda t: t * tf.zeros([], t.dtype),   # Horovod's product: the allreduce stays in the graph
    row_count=_row_count,
    rows=_rows,
)
