"""Horovod's collectives on TensorFlow tensors, eagerly and inside ``tf.function``, with their gradients.

Each op converts its tensors to numpy (:func:`horovod.tensorflow._tensors.run_numpy`), calls the one implementation
in :mod:`horovod.runtime.collectives`, and converts back. Gradients are registered with ``tf.custom_gradient`` as
Horovod defines them: allreduce → allreduce of the gradient with the same op and scales; allgather → averaged
allreduce, then this rank's rows; broadcast → averaged allreduce, zero off the root; alltoall → alltoall back with the
received splits; reducescatter → allgather (scaled like the forward op).

Names: a given ``name`` is prefixed with the current name scope unless ``ignore_name_scope``. Unnamed tensors are
numbered in call order when executing eagerly (as the core does), and named after the input tensor's graph name
while tracing, as Horovod does: the same program builds the same graph, so the names agree across ranks even when one
rank traces a function again (a different last-batch shape) and another does not.
"""

from __future__ import annotations

import re
from typing import List, Optional, Sequence

import numpy as np
import tensorflow as tf

from horovod.runtime import basics
from horovod.runtime import collectives as _c
from horovod.runtime.process_sets import ProcessSet, global_process_set
from horovod.tensorflow._tensors import check_dtype, run_numpy, to_core
from horovod.tensorflow.compression import Compression

Average, Sum, Adasum, Min, Max, Product = _c.Average, _c.Sum, _c.Adasum, _c.Min, _c.Max, _c.Product


def _executing_eagerly() -> bool:
    """True when TensorFlow runs ops immediately (not tracing a graph)."""
    return tf.executing_eagerly()


def _normalize_name(name: str) -> str:
    return re.sub("[^a-zA-Z0-9_]", "_", name)


def _op_name(name: Optional[str], tensor, ignore_name_scope: bool) -> Optional[str]:
    """The name this rank gives the core, which adds the op prefix (None: numbered in call order)."""
    if name is None:
        if tf.executing_eagerly() or not hasattr(tensor, "name"):
            return None
        return _normalize_name(tensor.name)
    scope = "" if ignore_name_scope else tf.get_current_name_scope()
    return f"{scope.rstrip('/')}/{name}" if scope else name


def _group_name(name: Optional[str], tensors: Sequence, ignore_name_scope: bool) -> Optional[str]:
    if name is None and not tf.executing_eagerly() and tensors and hasattr(tensors[0], "name"):
        return _normalize_name(f"{tensors[0].name}_{tensors[-1].name}")
    return _op_name(name, None, ignore_name_scope)


def _is_float(dtype: tf.DType) -> bool:
    return dtype.is_floating


def _with_gradient(forward, grad_fn, tensors: Sequence[tf.Tensor]):
    """``forward(*tensors)`` with ``grad_fn(*dys) -> input grads`` registered, for floating-point inputs."""
    if not all(_is_float(t.dtype) for t in tensors):
        return forward(*tensors)

    @tf.custom_gradient
    def op(*xs):
        def grad(*dys):
            return grad_fn(*dys)
        return forward(*xs), grad
    return op(*tensors)


def _inputs(tensors) -> List[tf.Tensor]:
    out = [tf.convert_to_tensor(t) for t in tensors]
    for t in out:
        check_dtype(t.dtype)
    return out


# -- allreduce ------------------------------------------------------------------------------------------------------

def _allreduce_raw(tensors: List[tf.Tensor], names: Optional[str], op, prescale_factor, postscale_factor,
                   process_set, grouped: bool) -> List[tf.Tensor]:
    def fn(*arrays):
        inputs = [to_core(a) for a in arrays]
        kwargs = dict(op=op, prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                      process_set=process_set)
        if grouped:
            return _c.grouped_allreduce_async([a for a, _ in inputs], name=names, dtypes=[d for _, d in inputs],
                                              **kwargs).result()
        array, dtype = inputs[0]
        return [_c.allreduce_async(array, name=names, dtype=dtype, **kwargs).result()]
    return run_numpy(fn, tensors, [t.dtype for t in tensors], [t.shape for t in tensors], "HorovodAllreduce")


def _allreduce(tensor, name=None, op=Sum, prescale_factor=1.0, postscale_factor=1.0, ignore_name_scope=False,
               process_set=global_process_set):
    """Differentiable allreduce of a dense tensor, without compression."""
    tensor = _inputs([tensor])[0]
    full = _op_name(name, tensor, ignore_name_scope)

    def forward(x):
        return _allreduce_raw([x], full, op, prescale_factor, postscale_factor, process_set, False)[0]

    def grad(dy):
        return _allreduce(dy, op=op, prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                          ignore_name_scope=ignore_name_scope, process_set=process_set)
    return _with_gradient(forward, grad, [tensor])


def _grouped_allreduce(tensors, name=None, op=Sum, prescale_factor=1.0, postscale_factor=1.0,
                       ignore_name_scope=False, process_set=global_process_set):
    tensors = _inputs(tensors)
    if not tensors:
        return []
    full = _group_name(name, tensors, ignore_name_scope)

    def forward(*xs):
        return _allreduce_raw(list(xs), full, op, prescale_factor, postscale_factor, process_set, True)

    def grad(*dys):
        return _grouped_allreduce(list(dys), op=op, prescale_factor=prescale_factor,
                                  postscale_factor=postscale_factor, ignore_name_scope=ignore_name_scope,
                                  process_set=process_set)
    return list(_with_gradient(forward, grad, tensors))


def _sparse_allreduce(slices: tf.IndexedSlices, name, op, prescale_factor, postscale_factor, compression,
                      ignore_name_scope, process_set) -> tf.IndexedSlices:
    """Horovod's rule for IndexedSlices: gather every rank's values and indices; Average divides by the size."""
    if op == Adasum:
        raise NotImplementedError("The Adasum reduction does not currently support sparse tensors. As a "
                                  "workaround please pass sparse_as_dense=True to DistributedOptimizer")
    if op not in (Average, Sum):
        raise ValueError(f"IndexedSlices can only be reduced with hvd.Average or hvd.Sum, not {op!r}")
    values, ctx = compression.compress(slices.values)
    values = allgather(values, name=f"{name}.values" if name else None, ignore_name_scope=ignore_name_scope,
                       process_set=process_set)
    values = compression.decompress(values, ctx)
    indices = allgather(slices.indices, name=f"{name}.indices" if name else None,
                        ignore_name_scope=ignore_name_scope, process_set=process_set)
    scale = prescale_factor * postscale_factor / (_set_size(process_set) if op == Average else 1)
    if scale != 1.0:
        values = values * tf.cast(scale, values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=slices.dense_shape)


def allreduce(tensor, average=None, device_dense="", device_sparse="", compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, name=None, process_set=global_process_set,
              ignore_name_scope=False):
    """Reduce ``tensor`` over the ranks of ``process_set`` (differentiable; eager or inside ``tf.function``).

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
    op = _c.resolve_op(op, average)
    if isinstance(tensor, tf.IndexedSlices):
        return _sparse_allreduce(tensor, name, op, prescale_factor, postscale_factor, compression,
                                 ignore_name_scope, process_set)
    tensor = tf.convert_to_tensor(tensor)
    compressed, ctx = compression.compress(tensor)
    reduced = _allreduce(compressed, name=name, op=op, prescale_factor=prescale_factor,
                         postscale_factor=postscale_factor, ignore_name_scope=ignore_name_scope,
                         process_set=process_set)
    return compression.decompress(reduced, ctx)


def grouped_allreduce(tensors, average=None, device_dense="", device_sparse="", compression=Compression.none,
                      op=None, prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set,
                      ignore_name_scope=False, name=None):
    """Allreduce a list of tensors as one group, negotiated and fused together (differentiable); see
    :func:`allreduce`. ``tf.IndexedSlices`` entries are reduced separately by Horovod's gather rule."""
    op = _c.resolve_op(op, average)
    tensors = list(tensors)
    dense = [i for i, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
    out = list(tensors)
    for i, t in enumerate(tensors):
        if i not in dense:
            out[i] = _sparse_allreduce(t, f"{name}.{i}" if name else None, op, prescale_factor,
                                       postscale_factor, compression, ignore_name_scope, process_set)
    compressed = [compression.compress(tf.convert_to_tensor(tensors[i])) for i in dense]
    reduced = _grouped_allreduce([t for t, _ in compressed], name=name, op=op, prescale_factor=prescale_factor,
                                 postscale_factor=postscale_factor, ignore_name_scope=ignore_name_scope,
                                 process_set=process_set)
    for i, r, (_, ctx) in zip(dense, reduced, compressed):
        out[i] = compression.decompress(r, ctx)
    return out


# -- allgather ------------------------------------------------------------------------------------------------------

def _set_size(process_set: ProcessSet) -> int:
    size = process_set.size()
    if size is None:
        raise ValueError(f"{process_set} is not registered (or Horovod is not initialized)")
    return size


def _set_rank(process_set: ProcessSet) -> int:
    rank = process_set.rank()
    if rank is None:
        raise ValueError(f"this rank is not a member of {process_set}")
    return rank


def _gathered_shape(shape: tf.TensorShape) -> tf.TensorShape:
    return tf.TensorShape([None]).concatenate(shape[1:]) if shape.rank else tf.TensorShape([None])


def _allgather_raw(tensors: List[tf.Tensor], name, process_set, grouped: bool) -> List[tf.Tensor]:
    def fn(*arrays):
        inputs = [to_core(a) for a in arrays]
        if grouped:
            return _c.grouped_allgather_async([a for a, _ in inputs], name=name, process_set=process_set,
                                              dtypes=[d for _, d in inputs]).result()
        return [_c.allgather_async(inputs[0][0], name=name, process_set=process_set,
                                   dtype=inputs[0][1]).result()]
    return run_numpy(fn, tensors, [t.dtype for t in tensors], [_gathered_shape(t.shape) for t in tensors],
                     "HorovodAllgather")


def _own_rows(grad: tf.Tensor, x: tf.Tensor, ignore_name_scope, process_set) -> tf.Tensor:
    """This rank's rows of an allgather's (averaged) gradient."""
    rows = tf.reshape(tf.shape(x, out_type=tf.int64)[0] if x.shape.rank else tf.constant(1, tf.int64), [1])
    all_rows = allgather(rows, ignore_name_scope=ignore_name_scope, process_set=process_set)
    me = _set_rank(process_set)
    offset = tf.reduce_sum(all_rows[:me])
    own = grad[offset:offset + all_rows[me]]
    return own if x.shape.rank else tf.reshape(own, [])


def allgather(tensor, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Concatenate every rank's ``tensor`` on the first dimension, which may differ between ranks
    (differentiable: the gradient is the averaged allreduce of the output's gradient, sliced to this rank's rows)."""
    tensor = _inputs([tensor])[0]
    full = _op_name(name, tensor, ignore_name_scope)

    def forward(x):
        return _allgather_raw([x], full, process_set, False)[0]

    def grad(dy):
        reduced = _allreduce(dy, op=Average, ignore_name_scope=ignore_name_scope, process_set=process_set)
        return _own_rows(reduced, tensor, ignore_name_scope, process_set)
    return _with_gradient(forward, grad, [tensor])


def grouped_allgather(tensors, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Allgather a list of tensors as one group (differentiable); see :func:`allgather`."""
    tensors = _inputs(tensors)
    if not tensors:
        return []
    full = _group_name(name, tensors, ignore_name_scope)

    def forward(*xs):
        return _allgather_raw(list(xs), full, process_set, True)

    def grad(*dys):
        return [_own_rows(_allreduce(dy, op=Average, ignore_name_scope=ignore_name_scope, process_set=process_set),
                          x, ignore_name_scope, process_set) for dy, x in zip(dys, tensors)]
    return list(_with_gradient(forward, grad, tensors))


# -- broadcast ------------------------------------------------------------------------------------------------------

def _broadcast_raw(tensors: List[tf.Tensor], root_rank, name, process_set) -> List[tf.Tensor]:
    base = name

    def fn(*arrays):
        prefix = base or _c._auto_name("broadcast_group") if len(arrays) > 1 else base
        handles = []
        for i, a in enumerate(arrays):
            array, dtype = to_core(a)
            each = f"{prefix}.{i}" if len(arrays) > 1 else prefix
            handles.append(_c.broadcast_async(array, root_rank, name=each, process_set=process_set, dtype=dtype))
        return [h.result() for h in handles]
    return run_numpy(fn, tensors, [t.dtype for t in tensors], [t.shape for t in tensors], "HorovodBroadcast")


def broadcast(tensor, root_rank, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Return global rank ``root_rank``'s ``tensor`` on every rank of the set (differentiable: the gradient is the
    averaged allreduce of the output's gradient on the root and zero elsewhere).

    Raises:
        ValueError: ``root_rank`` is not in the set. TensorMismatchError: ranks disagree on shape, dtype or root.
    """
    tensor = _inputs([tensor])[0]
    full = _op_name(name, tensor, ignore_name_scope)

    def forward(x):
        return _broadcast_raw([x], root_rank, full, process_set)[0]

    def grad(dy):
        reduced = _allreduce(dy, op=Average, ignore_name_scope=ignore_name_scope, process_set=process_set)
        return reduced if basics.rank() == root_rank else reduced * 0
    return _with_gradient(forward, grad, [tensor])


def broadcast_(variables, root_rank, name=None, process_set=global_process_set):
    """Overwrite ``variables`` in place with ``root_rank``'s values (one op for the whole list).

    Returns:
        The variables' new values, as tensors.
    """
    variables = list(variables)
    if not variables:
        return []
    values = _broadcast_raw([tf.convert_to_tensor(v) for v in variables], root_rank,
                            _op_name(name, None, False) if name else
                            (None if tf.executing_eagerly() else _normalize_name(
                                f"broadcast_inplace_{variables[0].name}_{len(variables)}")), process_set)
    return [v.assign(value) for v, value in zip(variables, values)]


# -- alltoall -------------------------------------------------------------------------------------------------------

def _alltoall_raw(tensor, splits, name, process_set):
    def fn(array, split_array):
        array, dtype = to_core(array)
        use = None if split_array.size == 0 else split_array
        output, received = _c.alltoall_async(array, use, name=name, process_set=process_set, dtype=dtype).result()
        return [output, np.asarray(received, dtype=np.int32)]
    size = _set_size(process_set)
    return run_numpy(fn, [tensor, splits], [tensor.dtype, tf.int32], [_gathered_shape(tensor.shape), [size]],
                     "HorovodAlltoall")


def alltoall(tensor, splits=None, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Send rows ``splits[i]`` of ``tensor`` to rank i of the set (equal parts when None) and gather what the
    others send (differentiable). Returns the output, or ``(output, received_splits)`` when ``splits`` is given.

    Raises:
        ValueError: no ``splits`` and the first dimension does not divide by the set's size, or bad ``splits``.
    """
    tensor = _inputs([tensor])[0]
    split_tensor = tf.cast(tf.convert_to_tensor(splits if splits is not None else [], dtype=tf.int32
                                                if splits is None else None), tf.int32)
    full = _op_name(name, tensor, ignore_name_scope)
    received_box = []

    def forward(x):
        output, received = _alltoall_raw(x, split_tensor, full, process_set)
        received_box.append(received)
        return output

    def grad(dy):
        back, _ = alltoall(dy, splits=received_box[0], ignore_name_scope=ignore_name_scope, process_set=process_set)
        return back
    output = _with_gradient(forward, grad, [tensor])
    return output if splits is None else (output, received_box[0])


# -- reducescatter --------------------------------------------------------------------------------------------------

def _reducescatter_raw(tensors, name, op, prescale_factor, postscale_factor, process_set, grouped):
    def fn(*arrays):
        inputs = [to_core(a) for a in arrays]
        kwargs = dict(op=op, process_set=process_set, prescale_factor=prescale_factor,
                      postscale_factor=postscale_factor)
        if grouped:
            return _c.grouped_reducescatter_async([a for a, _ in inputs], name=name,
                                                  dtypes=[d for _, d in inputs], **kwargs).result()
        return [_c.reducescatter_async(inputs[0][0], name=name, dtype=inputs[0][1], **kwargs).result()]
    return run_numpy(fn, tensors, [t.dtype for t in tensors], [_gathered_shape(t.shape) for t in tensors],
                     "HorovodReducescatter")


def _reducescatter_grad(dys, op, prescale_factor, postscale_factor, ignore_name_scope, process_set):
    scale = prescale_factor * postscale_factor / (_set_size(process_set) if op == Average else 1)
    grads = [allgather(dy, ignore_name_scope=ignore_name_scope, process_set=process_set) for dy in dys]
    return [g if scale == 1.0 else g * tf.cast(scale, g.dtype) for g in grads]


def reducescatter(tensor, device_dense="", compression=Compression.none, op=Average, name=None,
                  process_set=global_process_set, ignore_name_scope=False, prescale_factor=1.0,
                  postscale_factor=1.0):
    """Reduce ``tensor`` over the set and return this rank's slice of the first dimension; ranks below
    ``dim0 % size`` get one extra row (differentiable: the gradient is the allgather of the output's gradient).

    Raises:
        ValueError: ``op`` other than ``hvd.Sum`` or ``hvd.Average``.
    """
    if op not in (Sum, Average):
        raise ValueError(f"reducescatter supports only hvd.Sum and hvd.Average, not {op!r}")
    tensor = _inputs([tensor])[0]
    compressed, ctx = compression.compress(tensor)
    full = _op_name(name, compressed, ignore_name_scope)

    def forward(x):
        return _reducescatter_raw([x], full, op, prescale_factor, postscale_factor, process_set, False)[0]

    def grad(dy):
        return _reducescatter_grad([dy], op, prescale_factor, postscale_factor, ignore_name_scope, process_set)[0]
    return compression.decompress(_with_gradient(forward, grad, [compressed]), ctx)


def grouped_reducescatter(tensors, device_dense="", compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0, name=None,
                          ignore_name_scope=False):
    """Reducescatter a list of tensors as one group (differentiable); see :func:`reducescatter`."""
    if op not in (Sum, Average):
        raise ValueError(f"reducescatter supports only hvd.Sum and hvd.Average, not {op!r}")
    compressed = [compression.compress(t) for t in _inputs(tensors)]
    inputs = [t for t, _ in compressed]
    if not inputs:
        return []
    full = _group_name(name, inputs, ignore_name_scope)

    def forward(*xs):
        return _reducescatter_raw(list(xs), full, op, prescale_factor, postscale_factor, process_set, True)

    def grad(*dys):
        return _reducescatter_grad(dys, op, prescale_factor, postscale_factor, ignore_name_scope, process_set)
    outputs = _with_gradient(forward, grad, inputs)
    return [compression.decompress(o, ctx) for o, (_, ctx) in zip(outputs, compressed)]


# -- synchronisation and queries ------------------------------------------------------------------------------------

def join():
    """Declare that this rank has no more data; returns (as a tensor) the last rank to join. Meanwhile this rank
    contributes zeros to the others' allreduces."""
    return run_numpy(lambda: [np.int32(_c.join())], [], [tf.int32], [[]], "HorovodJoin")[0]


def barrier(process_set=global_process_set):
    """Block until every rank of the set reaches the barrier."""
    if tf.executing_eagerly():
        _c.barrier(process_set=process_set)
        return None
    return run_numpy(lambda: [np.int32(_c.barrier(process_set=process_set) or 0)], [], [tf.int32], [[]],
                     "HorovodBarrier")[0]


def _int_op(value_fn, name):
    return run_numpy(lambda: [np.int32(value_fn())], [], [tf.int32], [[]], name or "HorovodQuery")[0]


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
