"""Collectives inside JAX transformations: ``jax.jit`` (host callbacks), ``jax.vmap`` and ``jax.grad``.

* **jit**: a traced collective is a ``jax.experimental.io_callback(..., ordered=True)``; the ordering effect makes
  it run once per call of the compiled function, in program order, and its name was fixed when it was traced
  (:mod:`horovod.jax._naming`). Output shapes must be static: an allgather then needs the same first dimension on
  every rank, an alltoall equal splits.
* **vmap**: each collective has a batching rule (``jax.custom_batching.custom_vmap``): one collective over the
  whole batch, with the batch axis moved out of the first dimension for the row-wise ops.
* **grad**: each collective has a ``jax.custom_vjp`` whose backward pass is Horovod's gradient of that collective
  (:mod:`horovod.runtime.collective_gradients`), written with these same differentiable ops.
"""

from __future__ import annotations

import functools
import itertools
import logging
from dataclasses import replace
from typing import Any, List, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_batching import custom_vmap
from jax.experimental import io_callback

from horovod.jax import _host
from horovod.jax._arrays import flatten, is_tracer, unflatten
from horovod.jax._job import job_if_initialized
from horovod.jax._naming import traced_name, tracing
from horovod.common.exceptions import HorovodError
from horovod.runtime import collective_gradients as _grads

_INT32 = np.dtype(np.int32)


def _recording(fn):
    """``fn`` for a host callback: a Horovod error it raises is remembered, since JAX hands the caller a
    ``JaxRuntimeError`` instead (see :func:`horovod_error_behind`); the job's state keeps it."""
    @functools.wraps(fn)
    def call(*args):
        try:
            return fn(*args)
        except HorovodError as error:
            state = job_if_initialized()
            if state is not None:
                state.last_error = error
            raise
    return call


class _QuietHorovodCallbackErrors(logging.Filter):
    """JAX logs every exception a host callback raises, with its traceback, before handing it to the caller. A
    Horovod error from a collective reaches the caller anyway (:func:`horovod_error_behind`), where an elastic run
    catches it and recovers: its log record would only put a traceback into a run that succeeded. Only records
    whose exception is a Horovod error are dropped; everything else JAX logs, and the user's own output, passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], HorovodError))


logging.getLogger("jax._src.callback").addFilter(_QuietHorovodCallbackErrors())


def horovod_error_behind(error: BaseException) -> Optional[HorovodError]:
    """The Horovod error (``HorovodInternalError``, ``TensorMismatchError``...) that made a jitted call fail with
    ``error``, as a new exception of its type, or None when ``error`` came from elsewhere."""
    state = job_if_initialized()
    cause = None if state is None else state.last_error
    if cause is None or str(cause) not in str(error):
        return None
    return type(cause)(*cause.args)


def _structs(spec: _host.Spec) -> List[jax.ShapeDtypeStruct]:
    dtypes = list(spec.dtypes) + ([_INT32] if spec.kind == "alltoall" else [])
    return [jax.ShapeDtypeStruct(s, d) for s, d in zip(_host.out_shapes(spec), dtypes)]


def _with_shapes(spec: _host.Spec, leaves: Sequence) -> _host.Spec:
    return replace(spec, shapes=tuple(tuple(x.shape) for x in leaves), traced=True)


def _callback(spec: _host.Spec, leaves: Sequence) -> List[jax.Array]:
    spec = _with_shapes(spec, leaves)
    return io_callback(_recording(functools.partial(_host.run, spec)), _structs(spec), list(leaves), ordered=True)


def _as_rows(x, batched: bool):
    """Batch axis out of the first (row) dimension: (B, n, ...) -> (n, B, ...); a batched scalar is one row."""
    if not batched:
        return x
    return jnp.moveaxis(x if x.ndim > 1 else x[:, None], 0, 1)


def _from_rows(y, batched: bool):
    return jnp.moveaxis(y, 1, 0) if batched else y


def _vmappable(spec: _host.Spec):
    """The traced collective as a function of its leaves, with a batching rule (one collective per vmap)."""
    @custom_vmap
    def call(*leaves):
        return _callback(spec, leaves)

    @call.def_vmap
    def rule(axis_size, in_batched, *leaves):
        batched = list(in_batched)
        if spec.kind not in _host.ROW_KINDS:
            return _vmappable(spec)(*leaves), batched
        outs = _vmappable(spec)(*[_as_rows(x, b) for x, b in zip(leaves, batched)])
        if spec.kind == "alltoall":
            return [_from_rows(outs[0], batched[0]), outs[1]], [batched[0], False]
        return [_from_rows(y, b) for y, b in zip(outs, batched)], batched
    return call


def _check_traceable(spec: _host.Spec) -> None:
    if spec.kind == "alltoall" and spec.splits is not None:
        raise ValueError("alltoall with explicit splits cannot run inside jax.jit (the received sizes are not known "
                         "when tracing): call it eagerly, or split evenly (splits=None)")


def execute(spec: _host.Spec, leaves: Sequence) -> List[jax.Array]:
    """Run the collective on ``leaves``: now when they are concrete, else when the traced program runs."""
    if tracing() or any(is_tracer(x) for x in leaves):
        _check_traceable(spec)
        return list(_vmappable(spec)(*leaves))
    return [jnp.asarray(y) for y in _host.run(spec, leaves)]


def execute_many(specs: Sequence[_host.Spec], leaves: Sequence) -> List[jax.Array]:
    """Run several collectives as one step (one host callback when traced): all are submitted before any is
    awaited, so the engine fuses them. ``leaves`` holds each spec's leaves in turn. Not differentiable."""
    if tracing() or any(is_tracer(x) for x in leaves):
        specs, start = list(specs), 0
        for k, spec in enumerate(specs):
            specs[k] = _with_shapes(spec, leaves[start:start + len(spec.shapes)])
            start += len(spec.shapes)
        structs = [s for spec in specs for s in _structs(spec)]
        return io_callback(_recording(functools.partial(_host.run_many, specs)), structs, list(leaves), ordered=True)
    return [jnp.asarray(y) for y in _host.run_many(specs, leaves)]


# -- gradients ------------------------------------------------------------------------------------------------------

@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def differentiable(spec: _host.Spec, leaves: List[Any]) -> List[jax.Array]:
    """:func:`execute`, with Horovod's gradient of the collective for ``jax.grad``."""
    return execute(spec, leaves)


def _fwd(spec: _host.Spec, leaves):
    outs = execute(spec, leaves)
    return outs, (outs[1] if spec.kind == "alltoall" else None)


def _float0(shape):
    return np.zeros(shape, dtype=jax.dtypes.float0)


def _bwd(spec: _host.Spec, received, cotangents):
    grads: List[Any] = [_float0(s) for s in spec.shapes]
    real = [i for i, d in enumerate(spec.dtypes) if jnp.issubdtype(d, jnp.inexact)]
    if not real:
        return (grads,)
    ps, base = spec.process_set, spec.name or "jax"
    if spec.kind == "allreduce":
        reduced = _grads.grouped_allreduce_grad(_gradient_ops(base), [cotangents[i] for i in real], spec.op,
                                                spec.prescale, spec.postscale, ps)
        for i, g in zip(real, reduced):
            grads[i] = g
    elif spec.kind == "alltoall":
        grads[0] = _grads.alltoall_grad(_gradient_ops(base), cotangents[0], received, ps)
    for i in real if spec.kind in ("allgather", "broadcast", "reducescatter") else ():
        ops = _gradient_ops(f"{base}.{i}", spec.shapes[i] if spec.kind == "reducescatter" else None)
        dy, like = cotangents[i], jax.ShapeDtypeStruct(spec.shapes[i], spec.dtypes[i])
        if spec.kind == "allgather":
            grads[i] = _grads.allgather_grad(ops, dy, like, ps)
        elif spec.kind == "broadcast":
            grads[i] = _grads.broadcast_grad(ops, dy, spec.root_rank, ps)
        else:
            grads[i] = _grads.reducescatter_grad(ops, [dy], spec.op, spec.prescale, spec.postscale, ps)[0]
    return (grads,)


differentiable.defvjp(_fwd, _bwd)


def _block(t, counts, index: int, like):
    """Block ``index`` of ``t`` split on its first dimension into blocks of ``counts`` rows, shaped like ``like``."""
    rows = like.shape[0] if len(like.shape) else 1
    start = jnp.sum(jnp.asarray(counts).reshape(-1)[:index])
    return jax.lax.dynamic_slice_in_dim(t, start, rows, axis=0).reshape(like.shape)


def _gradient_ops(base: str, forward_shape=None) -> _grads.GradientOps:
    """The JAX spelling of the primitives :mod:`horovod.runtime.collective_gradients` writes gradients in.

    The collectives are this module's differentiable ones, named after the forward op (``<name>.grad.<k>``), so
    every rank names them alike; an allgather of a reducescatter's gradient knows the forward rows
    (``forward_shape``), which a jitted gather needs when the rows do not divide evenly.
    """
    counter = itertools.count()

    def name() -> str:
        return f"{base}.grad.{next(counter)}"

    def allgather(t, ps):
        rows = (forward_shape[0] if forward_shape else 1,) if forward_shape is not None else None
        return collective("allgather", t, name(), process_set=ps, rows=rows)

    def alltoall(t, splits, ps):
        splits = None if splits is None or is_tracer(splits) else tuple(np.asarray(splits).tolist())
        out = collective("alltoall", t, name(), process_set=ps, splits=splits)
        return out[0] if isinstance(out, tuple) else out

    return _grads.GradientOps(
        grouped_allreduce=lambda ts, op, pre, post, ps: collective(
            "allreduce", list(ts), name(), op=op, prescale=pre, postscale=post, process_set=ps),
        allgather=allgather, alltoall=alltoall,
        scale=lambda t, factor: (t * factor).astype(t.dtype),
        zeros_like=jnp.zeros_like,
        row_count=lambda t: jnp.array([t.shape[0] if len(t.shape) else 1], dtype=jnp.int32),
        rows=_block)


# -- the entry points of the public functions -----------------------------------------------------------------------

def _leaves(tree):
    leaves, treedef = flatten(tree)
    leaves = [x if hasattr(x, "shape") and hasattr(x, "dtype") else jnp.asarray(x) for x in leaves]
    return leaves, treedef


def collective(kind: str, tree, name: Optional[str] = None, **options):
    """Run the collective ``kind`` over the leaves of ``tree`` (one op for an array, one group for a container)
    and return the outputs with ``tree``'s structure; see :class:`horovod.jax._host.Spec` for ``options``.

    alltoall returns ``(output, received_splits)`` when ``splits`` is given, else the output.
    """
    leaves, treedef = _leaves(tree)
    if not leaves:
        return tree
    traced = tracing() or any(is_tracer(x) for x in leaves)
    if name is None and traced:
        name = traced_name()
    grouped = not jax.tree_util.treedef_is_leaf(treedef)
    if kind == "alltoall" and grouped:
        raise ValueError("alltoall takes one array, not a pytree")
    spec = _host.make_spec(kind, leaves, name, grouped=grouped, **options)
    outs = differentiable(spec, leaves) if traced else execute(spec, leaves)
    if kind == "alltoall":
        return (outs[0], outs[1]) if spec.splits is not None else outs[0]
    return unflatten(treedef, outs)


class Handle:
    """A started collective (``*_async``); :func:`synchronize` returns its outputs. Inside ``jax.jit`` the handle
    holds a traced id, and both the start and the wait run in program order."""

    def __init__(self, spec: _host.Spec, treedef, token, traced: bool):
        self.spec, self.treedef, self.token, self.traced = spec, treedef, token, traced

    def done(self) -> bool:
        """Whether the result is ready (eager handles only).

        Raises:
            ValueError: a handle of traced code, which has no value to poll while tracing.
        """
        if self.traced:
            raise ValueError("poll() cannot look at a handle inside jax.jit; call synchronize()")
        return self.token.done()


def collective_async(kind: str, tree, name: Optional[str] = None, **options) -> Handle:
    """Start :func:`collective` and return a :class:`Handle` (not differentiable, not vmappable)."""
    leaves, treedef = _leaves(tree)
    traced = tracing() or any(is_tracer(x) for x in leaves)
    if name is None and traced:
        name = traced_name()
    spec = _host.make_spec(kind, leaves, name, grouped=not jax.tree_util.treedef_is_leaf(treedef), **options)
    if not traced:
        return Handle(spec, treedef, _host.submit(spec, leaves), False)
    _check_traceable(spec)
    spec = _with_shapes(spec, leaves)
    token = io_callback(_recording(functools.partial(_host.submit_pending, spec)), jax.ShapeDtypeStruct((), _INT32),
                        list(leaves), ordered=True)
    return Handle(spec, treedef, token, True)


def synchronize(handle: Handle):
    """Wait for ``handle`` and return the outputs (alltoall: ``(output, received_splits)`` with splits given)."""
    if handle.traced:
        outs = io_callback(_recording(_host.wait_pending), _structs(handle.spec), handle.token, ordered=True)
    else:
        outs = [jnp.asarray(y) for y in _host.finish(handle.spec, handle.token.result())]
    if handle.spec.kind == "alltoall":
        return (outs[0], outs[1]) if handle.spec.splits is not None else outs[0]
    return unflatten(handle.treedef, outs)


__all__ = ["collective", "collective_async", "synchronize", "Handle", "execute", "execute_many", "differentiable",
           "horovod_error_behind"]
