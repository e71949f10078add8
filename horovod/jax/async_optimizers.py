"""Asynchronous training for JAX: the four modes on parameter pytrees, around any (jitted) update function.

The policy is :mod:`horovod.runtime.async_policy` and :mod:`horovod.runtime.gossip`, shared with torch and Keras.
JAX arrays are immutable, so each wrapper here takes a pytree, hands its leaves to the policy as numpy copies and
returns a new pytree of the same structure and dtypes. They run on the host, between jitted steps::

    local = hvd.LocalSGDOptimizer(period=8)
    for batch in data:
        params = local.before_step(params)
        grads = grad_fn(params, batch)
        if local.in_warmup():
            grads = local.average_gradients(grads)
        params, opt_state = update(params, grads, opt_state)      # jitted optax step, no communication
        params = local.after_step(params)

``hvd.StaleGradients(staleness=1)`` plays ``DistributedOptimizer(..., staleness=1)``: ``exchange(grads)`` submits
this step's gradients and returns the average from ``staleness`` steps ago (None for the first steps).
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from horovod.runtime import async_policy as _async
from horovod.runtime import gossip as _gossip
from horovod.runtime.process_sets import ProcessSet, global_process_set

__all__ = ["LocalSGDOptimizer", "OuterOptimizer", "GossipOptimizer", "StaleGradients"]


def _leaves(tree) -> Tuple[List[np.ndarray], Any]:
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return [np.array(leaf, copy=True) for leaf in leaves], treedef


def _tree(arrays: List[np.ndarray], treedef, like) -> Any:
    dtypes = [leaf.dtype for leaf in jax.tree_util.tree_leaves(like)]
    return jax.tree_util.tree_unflatten(treedef, [jnp.asarray(a, dtype=d) for a, d in zip(arrays, dtypes)])


def _on_tree(fn: Callable[[List[np.ndarray]], Any], tree) -> Any:
    arrays, treedef = _leaves(tree)
    fn(arrays)
    return _tree(arrays, treedef, tree)


class _Async:
    """What every JAX wrapper shares: ``before_step``/``after_step`` on pytrees."""

    def __init__(self, schedule: _async.Schedule):
        self.schedule = schedule

    @property
    def averaged(self) -> bool:
        """Whether the last step averaged (the ranks concerned now hold the same parameters; commit here)."""
        return self.schedule.averaged

    @property
    def step(self) -> int:
        """Steps taken (agreed by every rank of the set)."""
        return self.schedule.step

    def before_step(self, params):
        """Call before each local step; returns the parameters to step from."""
        return _on_tree(self.schedule.before_step, params)

    def after_step(self, params):
        """Call after each local step; returns the parameters, averaged when the schedule says so."""
        return _on_tree(self.schedule.after_step, params)

    def state_dict(self) -> dict:
        """The schedule's counters (plain data, for an elastic state or a checkpoint)."""
        return self.schedule.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`; anything in flight is discarded."""
        self.schedule.load_state_dict(state)


class LocalSGDOptimizer(_Async):
    """Post-local SGD on pytrees (:class:`horovod.runtime.async_policy.LocalSGD`): gradients averaged for
    ``warmup_steps`` steps, then local steps with the parameters averaged every ``period`` steps, asynchronously.
    """

    def __init__(self, period: int = 8, warmup_steps: int = 0, overlap_steps: Optional[int] = None,
                 process_set: ProcessSet = global_process_set, name: Optional[str] = None):
        super().__init__(_async.LocalSGD(period, warmup_steps, overlap_steps, process_set, name))

    def in_warmup(self) -> bool:
        """Whether the coming step averages gradients (:meth:`average_gradients`)."""
        return self.schedule.in_warmup()

    def average_gradients(self, grads):
        """The gradients averaged over the set (warm-up steps)."""
        return _on_tree(self.schedule.average_gradients, grads)

    def synchronize(self, params):
        """Apply the averaging in flight and average what was set aside, now (every rank, same step)."""
        return _on_tree(self.schedule.flush, params)


class OuterOptimizer(_Async):
    """DiLoCo-style outer steps on pytrees (:class:`horovod.runtime.async_policy.OuterSteps`): every ``period``
    inner steps the averaged parameter deltas (fp16/bf16 on the wire with ``compression``) move the anchor by
    Nesterov outer SGD, and every rank continues from it."""

    def __init__(self, period: int = 32, outer_lr: float = 0.7, outer_momentum: float = 0.9,
                 nesterov: bool = True, compression=None, process_set: ProcessSet = global_process_set,
                 name: Optional[str] = None):
        super().__init__(_async.OuterSteps(period, outer_lr, outer_momentum, nesterov, None, compression,
                                           process_set, name))

    def synchronize(self, params):
        """An outer step now (every rank, same step); returns the new anchor."""
        def outer(arrays):
            self.schedule.before_step(arrays)
            self.schedule.outer(arrays)
        return _on_tree(outer, params)


class GossipOptimizer(_Async):
    """Gossip on pytrees (:mod:`horovod.runtime.gossip`): after each step, average with this round's peer. Needs
    ``hvd.init(process_sets="dynamic")`` or the pairs registered at init."""

    def __init__(self, topology: str = "ring", every: int = 1, name: Optional[str] = None):
        super().__init__(_gossip.Gossip(topology, every, name))

    def synchronize(self, params):
        """The parameters averaged over every rank, now (every rank, same step)."""
        return _on_tree(self.schedule.average_all, params)


class StaleGradients(_Async):
    """Gradients applied ``staleness`` steps late (:class:`horovod.runtime.async_policy.StaleGradients`)."""

    def __init__(self, staleness: int = 1, compression=None, process_set: ProcessSet = global_process_set,
                 name: Optional[str] = None):
        super().__init__(_async.StaleGradients(staleness, compression, process_set, name))

    def exchange(self, grads):
        """Submit ``grads``; the averaged gradients of ``staleness`` steps ago (None for the first steps)."""
        arrays, treedef = _leaves(grads)
        self.schedule.before_step(arrays)
        averaged = self.schedule.exchange(arrays)
        return None if averaged is None else _tree(averaged, treedef, grads)
