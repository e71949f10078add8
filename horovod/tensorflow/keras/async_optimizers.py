"""Asynchronous training for Keras 3: ``LocalSGDOptimizer``, ``OuterOptimizer``, ``GossipOptimizer`` and the
stale-gradient ``DistributedOptimizer(..., staleness=s)``.

The policy is :mod:`horovod.runtime.async_policy` and :mod:`horovod.runtime.gossip`, the one torch and JAX use.
Each wrapper is a fresh instance of a subclass of the optimizer's class made from its config (as
``DistributedOptimizer`` is); its ``apply`` (which ``apply_gradients`` and ``model.fit`` call) hands the variables'
values to the policy in one numpy op before the update and one after it (``tf.numpy_function`` inside a traced
step), and assigns back what the policy returns.
"""

from __future__ import annotations

from typing import Dict, List, Optional

import keras
import numpy as np
import tensorflow as tf

from horovod.runtime import async_policy as _async
from horovod.runtime import collectives as _c
from horovod.runtime import gossip as _gossip
from horovod.runtime.process_sets import ProcessSet, global_process_set
from horovod.tensorflow._tensors import run_numpy
from horovod.tensorflow.compression import Compression

__all__ = ["LocalSGDOptimizer", "OuterOptimizer", "GossipOptimizer", "stale_optimizer"]


def _values(fn, variables, extra=()) -> List[tf.Tensor]:
    """Run ``fn(list of arrays)`` (changing them in place) on the variables' values and ``extra`` tensors; the
    arrays come back as tensors."""
    inputs = [tf.convert_to_tensor(v) for v in variables] + [tf.convert_to_tensor(t) for t in extra]

    def call(*arrays):
        arrays = [np.array(a, copy=True) for a in arrays]
        fn(arrays)
        return arrays
    return run_numpy(call, inputs, [t.dtype for t in inputs], [t.shape for t in inputs], name="HorovodAsync")


class _AsyncOptimizer:
    """Mixin placed before the wrapped optimizer's class."""

    _hvd_schedule: Optional[_async.Schedule] = None

    @property
    def averaged(self) -> bool:
        """Whether the last step averaged (eagerly: the ranks concerned hold the same weights; commit here)."""
        return bool(self._hvd_schedule.averaged)

    def _hvd_variables(self, trainable_variables) -> list:
        if trainable_variables is None:
            return list(self._trainable_variables)
        variables = list(trainable_variables)
        if not self.built:
            with keras.name_scope(self.name, caller=self):
                self.build(variables)
            self.built = True
        return variables

    def _hvd_before(self, variables, grads) -> list:
        """The schedule's ``before_step`` (and warm-up averaging) on the weights and gradients."""
        schedule = self._hvd_schedule

        def before(arrays):
            params, gs = arrays[:len(variables)], arrays[len(variables):]
            schedule.before_step(params)
            if getattr(schedule, "in_warmup", lambda: False)():
                schedule.average_gradients(gs)
        out = _values(before, variables, grads)
        for v, value in zip(variables, out[:len(variables)]):
            v.assign(value)
        return out[len(variables):]

    def _hvd_after(self, variables) -> None:
        for v, value in zip(variables, _values(self._hvd_schedule.after_step, variables)):
            v.assign(value)

    def apply(self, grads, trainable_variables=None):
        """Run the schedule around the wrapped optimizer's own update of ``trainable_variables``."""
        variables = self._hvd_variables(trainable_variables)
        grads = [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g) for g, v in zip(grads, variables)]
        grads = self._hvd_before(variables, grads)
        result = super().apply(grads, trainable_variables)
        self._hvd_after(variables)
        return result

    def synchronize(self) -> None:
        """Eagerly make the ranks' weights agree now (between steps on every rank; see each optimizer)."""
        variables = list(self._trainable_variables)
        arrays = [np.array(v.numpy(), copy=True) for v in variables]
        self._hvd_sync(arrays)
        for v, a in zip(variables, arrays):
            v.assign(a)


class _LocalSGD(_AsyncOptimizer):
    def _hvd_sync(self, arrays):
        self._hvd_schedule.flush(arrays)


class _Outer(_AsyncOptimizer):
    def _hvd_sync(self, arrays):
        self._hvd_schedule.before_step(arrays)
        self._hvd_schedule.outer(arrays)


class _Gossip(_AsyncOptimizer):
    def _hvd_sync(self, arrays):
        self._hvd_schedule.average_all(arrays)


class _Stale(_AsyncOptimizer):
    def apply(self, grads, trainable_variables=None):
        """Submit this step's gradients; apply those averaged ``staleness`` steps ago (the first steps only count
        the iteration)."""
        variables = self._hvd_variables(trainable_variables)
        grads = [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g) for g, v in zip(grads, variables)]
        schedule = self._hvd_schedule

        def exchange(*arrays):
            schedule.before_step(arrays)
            averaged = schedule.exchange(arrays)
            ready = averaged is not None
            return [np.array(ready)] + (averaged if ready else [np.zeros_like(a) for a in arrays])
        out = run_numpy(exchange, grads, [tf.bool] + [g.dtype for g in grads], [()] + [g.shape for g in grads],
                        name="HorovodStale")
        base_apply = super(_AsyncOptimizer, self).apply

        def apply_now():
            base_apply(out[1:], trainable_variables)
            return tf.constant(True)

        def count_only():
            self._iterations.assign_add(1)
            return tf.constant(False)
        return tf.cond(out[0], apply_now, count_only)

    def _hvd_sync(self, arrays):
        raise NotImplementedError("a stale-gradient optimizer's ranks always agree; nothing to synchronize")


_CLASSES: Dict[tuple, type] = {}


def _wrap(mixin: type, optimizer, schedule: _async.Schedule):
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise ValueError(f"expected a keras.optimizers.Optimizer, not {type(optimizer).__name__}")
    base = type(optimizer)
    cls = _CLASSES.get((mixin, base))
    if cls is None:
        cls = _CLASSES[(mixin, base)] = type(base.__name__, (mixin, base), {"__module__": base.__module__})
    wrapped = cls.from_config(optimizer.get_config())
    wrapped._hvd_schedule = schedule
    return wrapped


def LocalSGDOptimizer(optimizer, period: int = 8, warmup_steps: int = 0, overlap_steps: Optional[int] = None,
                      process_set: ProcessSet = global_process_set, name: Optional[str] = None):
    """Post-local SGD for Keras: gradients averaged for ``warmup_steps`` steps, then local steps with the weights
    averaged every ``period`` steps, asynchronously (:class:`horovod.runtime.async_policy.LocalSGD`).

    Returns:
        The wrapped optimizer; ``.averaged``, and ``.synchronize()`` (eager) averages everything now.
    """
    return _wrap(_LocalSGD, optimizer, _async.LocalSGD(period, warmup_steps, overlap_steps, process_set, name))


def OuterOptimizer(inner_optimizer, period: int = 32, outer_lr: float = 0.7, outer_momentum: float = 0.9,
                   nesterov: bool = True, compression=Compression.none,
                   process_set: ProcessSet = global_process_set, name: Optional[str] = None):
    """DiLoCo-style training for Keras: ``period`` local steps, then the averaged weight deltas (optionally fp16
    or bf16 on the wire) move the shared anchor by Nesterov outer SGD (:class:`~horovod.runtime.async_policy.
    OuterSteps`).

    Returns:
        The wrapped inner optimizer; ``.synchronize()`` (eager) takes an outer step now.
    """
    schedule = _async.OuterSteps(period, outer_lr, outer_momentum, nesterov, None, compression, process_set, name)
    return _wrap(_Outer, inner_optimizer, schedule)


def GossipOptimizer(optimizer, topology: str = "ring", every: int = 1, name: Optional[str] = None):
    """Gossip for Keras: after each step a rank averages its weights with this round's peer
    (:mod:`horovod.runtime.gossip`); needs ``hvd.init(process_sets="dynamic")`` or the pairs registered at init.

    Returns:
        The wrapped optimizer; ``.synchronize()`` (eager) averages over every rank now.
    """
    return _wrap(_Gossip, optimizer, _gossip.Gossip(topology, every, name))


def stale_optimizer(optimizer, compression, staleness: int, op, process_set: ProcessSet, unsupported):
    """``DistributedOptimizer(..., staleness=s)`` for Keras: each step applies the gradients averaged ``s`` steps
    earlier.

    Raises:
        ValueError: an op other than Average, or options the stale path does not have (``unsupported``).
    """
    if op != _c.Average:
        raise ValueError("staleness supports only op=hvd.Average")
    if unsupported:
        raise ValueError(f"staleness does not support {', '.join(sorted(unsupported))}")
    return _wrap(_Stale, optimizer, _async.StaleGradients(staleness, compression, process_set))
