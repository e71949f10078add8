"""Reducing a list of gradients over the ranks: the one routine behind ``DistributedGradientTape`` and the Keras
``DistributedOptimizer``.

Every dense gradient of one step travels in a single op (one ``tf.numpy_function`` while tracing): it submits all
allreduces, then waits for all of them, so the engine negotiates and fuses them together as Horovod's background
thread would. ``groups`` become grouped allreduces; ``tf.IndexedSlices`` are gathered (Horovod's rule) unless
``sparse_as_dense``; ``None`` gradients stay ``None``.
"""

from __future__ import annotations

import warnings
from typing import List, Optional, Sequence

import tensorflow as tf

from horovod.runtime import basics
from horovod.runtime import collectives as _c
from horovod.runtime.process_sets import ProcessSet, global_process_set
from horovod.tensorflow import mpi_ops as _ops
from horovod.tensorflow._tensors import run_numpy, to_core
from horovod.tensorflow.compression import Compression


def check_arguments(op, gradient_predivide_factor, groups, num_groups=0):
    """Horovod's argument checks for the gradient reducers; returns ``groups`` (the deprecated ``num_groups``
    fills it when it is unset).

    Raises:
        ValueError: a predivide factor with an op other than Average, or malformed ``groups``.
    """
    if num_groups != 0:
        warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be removed in v0.23.0.",
                      DeprecationWarning, stacklevel=3)
        if groups is None:
            groups = num_groups
    if gradient_predivide_factor != 1.0 and op != _c.Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if groups is not None and not (isinstance(groups, list) or (isinstance(groups, int) and groups > 0)):
        raise ValueError("groups should be a non-negative integer or a list of list of tf.Variable.")
    return groups


def local_layer_list(local_layers) -> list:
    """``local_layers`` as a list of Keras layers (None, one layer, or a sequence of layers).

    Raises:
        ValueError: it holds something other than Keras layers.
    """
    import keras
    if local_layers is None:
        return []
    if isinstance(local_layers, keras.layers.Layer):
        return [local_layers]
    if not all(isinstance(layer, keras.layers.Layer) for layer in local_layers):
        raise ValueError("All local layers must be of keras.layers.Layer type.")
    return list(local_layers)


def _var_key(variable):
    return variable.ref() if hasattr(variable, "ref") else id(variable)


def _group_indices(groups, variables: Sequence) -> List[List[int]]:
    """Index lists of the fused groups: ``groups`` is an int n (split in order) or a list of lists of variables;
    a variable in no group is reduced on its own."""
    n = len(variables)
    if not groups:
        return [[i] for i in range(n)]
    if isinstance(groups, int):
        size, extra = divmod(n, groups)
        out, start = [], 0
        for k in range(groups):
            end = start + size + (1 if k < extra else 0)
            if end > start:
                out.append(list(range(start, end)))
            start = end
        return out
    position = {_var_key(v): i for i, v in enumerate(variables) if v is not None}
    seen, out = set(), []
    for group in groups:
        members = [position[_var_key(v)] for v in group if _var_key(v) in position]
        if members:
            out.append(members)
            seen.update(members)
    out.extend([i] for i in range(n) if i not in seen)
    return out


class GradientReducer:
    """Reduces gradients over ``process_set`` with Horovod's options (see ``DistributedGradientTape``)."""

    def __init__(self, name: str, compression=Compression.none, sparse_as_dense: bool = False,
                 op=_c.Average, gradient_predivide_factor: float = 1.0, groups=None,
                 process_set: ProcessSet = global_process_set):
        check_arguments(op, gradient_predivide_factor, groups)
        self.name = name
        self.compression = compression
        self.sparse_as_dense = sparse_as_dense
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.groups = groups
        self.process_set = process_set

    def active(self) -> bool:
        """Whether reducing does anything: more than one rank in the set, or an elastic job (whose size may grow)."""
        if not self.process_set.included():
            return False
        return (self.process_set.size() or 1) > 1 or bool(basics.context().config.elastic)

    def scale_factors(self):
        if self.op == _c.Average:
            return 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        return 1.0, 1.0

    def __call__(self, grads: Sequence, variables: Optional[Sequence] = None) -> List:
        """The reduced gradients, in order; ``variables`` (same length) names them and places them in groups."""
        grads = list(grads)
        variables = list(variables) if variables is not None else [None] * len(grads)
        if not self.active():
            return grads
        out = list(grads)
        pre, post = self.scale_factors()
        dense = []
        for i, grad in enumerate(grads):
            if grad is None:
                continue
            if isinstance(grad, tf.IndexedSlices):
                if not self.sparse_as_dense:
                    out[i] = _ops.allreduce(grad, op=self.op, prescale_factor=pre, postscale_factor=post,
                                            compression=self.compression, name=f"{self.name}.{i}.sparse",
                                            ignore_name_scope=True, process_set=self.process_set)
                    continue
                grad = tf.convert_to_tensor(grad)
            dense.append((i, grad))
        if dense:
            groups = _group_indices(self.groups, [variables[i] for i, _ in dense])
            compressed = [self.compression.compress(g) for _, g in dense]
            reduced = self._reduce([t for t, _ in compressed], groups, pre, post)
            for (i, _), r, (_, ctx) in zip(dense, reduced, compressed):
                out[i] = self.compression.decompress(r, ctx)
        return out

    def _reduce(self, tensors: List[tf.Tensor], groups: List[List[int]], pre: float, post: float):
        name, op, process_set = self.name, self.op, self.process_set

        def fn(*arrays):
            inputs = [to_core(a) for a in arrays]
            kwargs = dict(op=op, prescale_factor=pre, postscale_factor=post, process_set=process_set)
            pending = []
            for members in groups:
                if len(members) == 1:
                    i = members[0]
                    pending.append(([i], _c.allreduce_async(inputs[i][0], name=f"{name}.{i}", dtype=inputs[i][1],
                                                            **kwargs)))
                else:
                    handle = _c.grouped_allreduce_async([inputs[i][0] for i in members],
                                                        name=f"{name}.group{members[0]}",
                                                        dtypes=[inputs[i][1] for i in members], **kwargs)
                    pending.append((members, handle))
            results = [None] * len(arrays)
            for members, handle in pending:
                value = handle.result()
                for i, v in zip(members, value if len(members) > 1 else [value]):
                    results[i] = v
            return results
        return run_numpy(fn, tensors, [t.dtype for t in tensors], [t.shape for t in tensors],
                         "HorovodAllreduceGradients")


__all__ = ["GradientReducer", "check_arguments"]
