"""``hvd.elastic`` for JAX: ``JaxState``, ``run`` and ``ElasticSampler`` (see :mod:`horovod.elastic`).

JAX values are immutable, so a training loop reassigns them (``state.params, state.opt_state = ...``); a
:class:`JaxState` commits copies of its pytrees, restores them after a failure and broadcasts rank 0's to every
worker of a new round. ``run`` is Horovod's reset-and-retry loop, which also recognises a collective that failed
inside a jitted function (JAX reports it as a ``JaxRuntimeError``) as the ``HorovodInternalError`` it was.

Shapes traced into a jitted function stay as traced: allreduces and broadcasts (and ``DistributedOptimizer``) are
valid for any number of workers, but a jitted allgather or reducescatter must be traced again after a reset that
changed the size (``jax.clear_caches()`` in a reset callback).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict

import jax
import numpy as np

from horovod.elastic.run import reset_horovod, run_fn
from horovod.elastic.sampler import ElasticIndexSampler
from horovod.elastic.state import ObjectState, State
from horovod.jax import _transforms
from horovod.jax.functions import broadcast_object, broadcast_parameters
from horovod.runtime import basics

ElasticSampler = ElasticIndexSampler


def _copy_tree(tree):
    """A copy of the pytree's containers (jax arrays are immutable and shared; numpy arrays are copied)."""
    return jax.tree_util.tree_map(lambda x: x.copy() if isinstance(x, np.ndarray) else x, tree)


class JaxState(ObjectState):
    """Elastic state of a JAX job: ``JaxState(params=params, opt_state=opt_state, epoch=0, sampler=sampler)``.

    ``params`` and ``opt_state`` (any pytrees) are saved as copies and synced with one grouped broadcast each;
    :class:`ElasticSampler` values keep their position (``state_dict``) and are reset to the new membership; other
    keyword arguments behave as in :class:`~horovod.elastic.ObjectState` (pickled, deep-copied).
    """

    def __init__(self, params: Any = None, opt_state: Any = None, **objects: Any):
        trees = {k: v for k, v in (("params", params), ("opt_state", opt_state)) if v is not None}
        samplers = {k: v for k, v in objects.items() if isinstance(v, ElasticIndexSampler)}
        plain = {k: v for k, v in objects.items() if k not in samplers}
        self._tree_names = tuple(trees)
        self._samplers: Dict[str, ElasticIndexSampler] = samplers
        self._saved_trees: Dict[str, Any] = {}
        self._saved_samplers: Dict[str, Dict[str, int]] = {}
        for key, value in {**trees, **samplers}.items():
            object.__setattr__(self, key, value)
        super().__init__(bcast_object=lambda obj: broadcast_object(obj, 0, name="elastic.state"),
                         get_rank=basics.rank, **plain)

    def save(self) -> None:
        """Commit copies of the pytrees, the samplers' positions and the other attributes."""
        self._saved_trees = {k: _copy_tree(getattr(self, k)) for k in self._tree_names}
        self._saved_samplers = {k: dict(s.state_dict()) for k, s in self._samplers.items()}
        super().save()

    def restore(self) -> None:
        """Go back to the last commit."""
        for key in self._tree_names:
            setattr(self, key, _copy_tree(self._saved_trees[key]))
        for key, sampler in self._samplers.items():
            sampler.load_state_dict(self._saved_samplers[key])
        super().restore()

    def sync(self) -> None:
        """Make every rank's committed state rank 0's: one grouped broadcast per pytree, samplers and other
        attributes as objects."""
        for key in self._tree_names:
            self._saved_trees[key] = broadcast_parameters(self._saved_trees[key], 0, name=f"elastic.{key}")
            setattr(self, key, _copy_tree(self._saved_trees[key]))
        if self._samplers:
            self._saved_samplers = broadcast_object(self._saved_samplers, 0, name="elastic.samplers")
            for key, sampler in self._samplers.items():
                sampler.load_state_dict(self._saved_samplers[key])
        super().sync()

    def reset(self) -> None:
        """Recompute the samplers' shards for the new membership."""
        for sampler in self._samplers.values():
            sampler.reset()


def _translating(func: Callable) -> Callable:
    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        try:
            return func(state, *args, **kwargs)
        except jax.errors.JaxRuntimeError as error:
            cause = _transforms.horovod_error_behind(error)
            if cause is None:
                raise
            raise cause from error
    return wrapper


def run(func: Callable) -> Callable:
    """``@hvd.elastic.run``: retry ``func(state, ...)`` through failures and membership changes (Horovod's loop,
    :func:`horovod.elastic.run_fn`), treating a collective that failed inside ``jax.jit`` like an eager one."""
    return run_fn(_translating(func), reset_horovod)


__all__ = ["JaxState", "ElasticSampler", "run", "State", "ObjectState"]
