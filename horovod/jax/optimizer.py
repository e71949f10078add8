"""``DistributedOptimizer``: an optax ``GradientTransformation`` that averages gradients over the ranks first.

What is reduced, how it is scaled, which arguments are legal and how gradients are grouped is Horovod's gradient
policy, :mod:`horovod.runtime.gradient_policy`, the one the torch and TensorFlow bindings use; compression is
:mod:`horovod.jax.compression` (the shared cast rule). This module only maps a gradient pytree onto it: leaves are
named after their paths, and all reductions of a step are submitted together (one host callback inside
``jax.jit``), so the engine negotiates and fuses them as Horovod's background thread would.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp

try:
    import optax
except ImportError:  # pragma: no cover - the jax extra installs it; DistributedOptimizer says so when missing
    optax = None

from horovod.jax import _host
from horovod.jax import _transforms as _t
from horovod.jax._arrays import is_tracer
from horovod.jax._naming import tracing
from horovod.jax.compression import Compression
from horovod.runtime import gradient_policy as policy
from horovod.runtime.collectives import Average
from horovod.runtime.compression import compress_all, decompress_all
from horovod.runtime.process_sets import ProcessSet, global_process_set

_PATHS = "pytree paths (jax.tree_util.keystr(path, simple=True, separator='.'))"


def leaf_paths(tree) -> list:
    """The path of each leaf of ``tree`` as ``"layer.w"`` strings: the names of its reductions, and what explicit
    ``groups`` list."""
    return [jax.tree_util.keystr(path, simple=True, separator=".")
            for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


def allreduce_gradients(grads, op: int = Average, gradient_predivide_factor: float = 1.0,
                        compression=Compression.none, groups=None, name: Optional[str] = None,
                        process_set: ProcessSet = global_process_set):
    """Reduce a gradient pytree over ``process_set`` with Horovod's options; returns the same structure.

    Args:
        grads: the gradients (any pytree of floating-point arrays).
        op: ``hvd.Average`` (default), ``hvd.Sum`` or ``hvd.Adasum``.
        gradient_predivide_factor: with Average, divide by this before the sum and by size/factor after it.
        compression: ``hvd.Compression.none``, ``fp16`` or ``bf16`` on the wire.
        groups: None (each leaf its own reduction, fused by the engine), an int n (the leaves in order split into
            n groups) or a list of lists of leaf paths (see :func:`leaf_paths`), each fused as one group.
        name: prefix of the reductions' names (default ``"gradients"``).
        process_set: the ranks that reduce.
    Raises:
        ValueError: bad ``groups``, or a predivide factor with an op other than Average.
    """
    policy.check_optimizer_arguments(op, gradient_predivide_factor, groups=groups, what=_PATHS)
    if not policy.reduction_active(process_set):
        return grads
    leaves, treedef = jax.tree_util.tree_flatten(grads)
    if not leaves:
        return grads
    paths, base = leaf_paths(grads), name or "gradients"
    pre, post = policy.predivide_factors(op, gradient_predivide_factor)
    wire, ctxs = compress_all(compression, leaves)
    specs, order = [], []
    for members in policy.split_groups(groups, paths, key=str, member_check=lambda m: isinstance(m, str),
                                       what=_PATHS):
        label = paths[members[0]] if len(members) == 1 else f"group.{paths[members[0]]}.{len(members)}"
        specs.append(_host.make_spec("allreduce", [wire[i] for i in members], f"{base}.{label}",
                                     grouped=len(members) > 1, op=op, prescale=pre, postscale=post,
                                     process_set=process_set))
        order.extend(members)
    reduced = _t.execute_many(specs, [wire[i] for i in order])
    out = [None] * len(leaves)
    for i, value in zip(order, reduced):
        out[i] = value
    return jax.tree_util.tree_unflatten(treedef, decompress_all(compression, out, ctxs))


class DistributedState(NamedTuple):
    """The state of a :func:`DistributedOptimizer` that accumulates ``backward_passes_per_step`` passes."""
    count: Any       # passes accumulated since the last reduction (int32 scalar)
    accumulated: Any  # the local sum of those passes' gradients
    inner: Any       # the wrapped transformation's state


def DistributedOptimizer(optimizer, compression=Compression.none, backward_passes_per_step: int = 1,
                         op: int = Average, gradient_predivide_factor: float = 1.0, groups=None,
                         average_aggregated_gradients: bool = False, name: Optional[str] = None,
                         process_set: ProcessSet = global_process_set) -> "optax.GradientTransformationExtraArgs":
    """Wrap an optax transformation so that its ``update`` sees gradients reduced over ``process_set``.

    With ``backward_passes_per_step`` n > 1, gradients are summed locally over n calls of ``update`` (divided by n
    when ``average_aggregated_gradients``); calls 1..n-1 return zero updates and the n-th reduces the sum and
    applies the wrapped update, as the other bindings do. Works eagerly and inside ``jax.jit``.

    Args:
        optimizer: an ``optax.GradientTransformation`` (e.g. ``optax.adam(1e-3)``).
        compression, op, gradient_predivide_factor, groups, name, process_set: see :func:`allreduce_gradients`.
        backward_passes_per_step: gradient computations accumulated locally before each reduction.
        average_aggregated_gradients: divide the accumulated sum by ``backward_passes_per_step``.
    Raises:
        ValueError: ``backward_passes_per_step`` < 1, a predivide factor with an op other than Average, Adasum with
            ``average_aggregated_gradients``, or malformed ``groups``.
        ImportError: optax is not installed (the ``jax`` extra; the message says how to install it).
    """
    if optax is None:
        from horovod.common.extras import install_hint
        raise ImportError(f"hvd.DistributedOptimizer wraps an optax transformation: {install_hint('jax')}")
    groups = policy.check_optimizer_arguments(op, gradient_predivide_factor, backward_passes_per_step, groups,
                                              average_aggregated_gradients=average_aggregated_gradients, what=_PATHS)
    inner = optax.with_extra_args_support(optimizer)
    scale = policy.aggregation_scale(backward_passes_per_step, average_aggregated_gradients)

    def reduce(grads):
        return allreduce_gradients(grads, op, gradient_predivide_factor, compression, groups, name, process_set)

    if backward_passes_per_step == 1:
        def update(grads, state, params=None, **extra_args):
            return inner.update(reduce(grads), state, params, **extra_args)
        return optax.GradientTransformationExtraArgs(inner.init, update)
    return _accumulating(inner, reduce, backward_passes_per_step, scale)


def _accumulating(inner, reduce, passes: int, scale: float):
    """The transformation for ``backward_passes_per_step`` > 1: sum locally, reduce and update every n-th call."""
    def init(params):
        return DistributedState(jnp.zeros((), jnp.int32), jax.tree_util.tree_map(jnp.zeros_like, params),
                                inner.init(params))

    def update(grads, state, params=None, **extra_args):
        accumulated = jax.tree_util.tree_map(jnp.add, state.accumulated, grads)
        count = state.count + 1

        def apply(_):
            total = jax.tree_util.tree_map(lambda g: g * scale, accumulated) if scale != 1.0 else accumulated
            updates, inner_state = inner.update(reduce(total), state.inner, params, **extra_args)
            return updates, DistributedState(jnp.zeros_like(count), jax.tree_util.tree_map(jnp.zeros_like, grads),
                                             inner_state)

        def wait(_):
            return jax.tree_util.tree_map(jnp.zeros_like, grads), DistributedState(count, accumulated, state.inner)
        if tracing() or is_tracer(count):
            return jax.lax.cond(count >= passes, apply, wait, None)
        return apply(None) if int(count) >= passes else wait(None)   # eager: no retracing
    return optax.GradientTransformationExtraArgs(init, update)


__all__ = ["DistributedOptimizer", "DistributedState", "allreduce_gradients", "leaf_paths"]
