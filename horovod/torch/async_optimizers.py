"""Asynchronous training for torch: ``LocalSGDOptimizer``, ``OuterOptimizer``, ``GossipOptimizer`` and the
stale-gradient ``DistributedOptimizer(..., staleness=s)``.

The policy (what is averaged, when, the corrections, the gossip schedule) is :mod:`horovod.runtime.async_policy`
and :mod:`horovod.runtime.gossip`, shared with Keras and JAX. This module hands the parameters (and gradients) over
as numpy views of the CPU tensors, so the policy's in-place averaging is the tensors' own. Each wrapper is an
instance of a subclass of the wrapped optimizer's class sharing its parameter groups and state, as
``DistributedOptimizer`` is, so learning-rate schedulers, ``state_dict`` and elastic ``TorchState`` work unchanged;
``state_dict()`` also carries the schedule's counter (key ``"hvd_async"``).
"""

from __future__ import annotations

from typing import Callable, List, Optional

import numpy as np
import torch

from horovod.runtime import async_policy as _async
from horovod.runtime import collectives as _c
from horovod.runtime import gossip as _gossip
from horovod.runtime import gradient_policy as _policy
from horovod.runtime.process_sets import ProcessSet, global_process_set
from horovod.torch.compression import Compression

__all__ = ["LocalSGDOptimizer", "OuterOptimizer", "GossipOptimizer", "stale_optimizer"]


def _view(tensor: torch.Tensor, what: str) -> np.ndarray:
    t = tensor.detach()
    if t.device.type != "cpu" or not t.is_contiguous() or not t.is_floating_point() or t.dtype == torch.bfloat16:
        raise ValueError(f"asynchronous optimizers average contiguous float16/32/64 CPU tensors; {what} is "
                         f"{t.dtype} on {t.device}{'' if t.is_contiguous() else ', not contiguous'}")
    return t.numpy()


class _AsyncOptimizer:
    """Mixin placed before the wrapped optimizer's class: the step between the schedule's two calls."""

    def __init__(self, params, schedule: _async.Schedule, named_parameters, state_buffers: bool = False):
        super().__init__(params)
        _policy.parameter_names([g["params"] for g in self.param_groups], named_parameters)   # checks the names
        self._hvd_schedule = schedule
        self._hvd_params = [p for group in self.param_groups for p in group["params"]]
        self._hvd_state_buffers = state_buffers

    @property
    def averaged(self) -> bool:
        """Whether the last step averaged: the ranks concerned now hold the same parameters (commit here)."""
        return self._hvd_schedule.averaged

    def _hvd_arrays(self) -> List[np.ndarray]:
        arrays = [_view(p, "a parameter") for p in self._hvd_params]
        if self._hvd_state_buffers:
            arrays += [_view(v, f"optimizer state {k!r}") for p in self._hvd_params
                       for k, v in sorted(self.state.get(p, {}).items())
                       if isinstance(v, torch.Tensor) and v.is_floating_point() and v.dim() > 0]
        return arrays

    def _hvd_local_step(self, closure) -> Optional[float]:
        return super().step(closure)

    def _local_step(self, closure=None):
        """The wrapped optimizer's own step, without the schedule (``broadcast_optimizer_state`` creates state
        with it on one rank alone)."""
        return super().step(closure)

    def step(self, closure=None):
        """Run the schedule's hooks around the wrapped optimizer's own step (no communication but the schedule's)."""
        self._hvd_schedule.before_step(self._hvd_arrays())
        loss = self._hvd_local_step(closure)
        self._hvd_schedule.after_step(self._hvd_arrays())
        return loss

    def _discard_pending(self) -> None:
        """Forget what is in flight (elastic restore undoes the interrupted steps); no communication."""
        self._hvd_schedule.discard()

    def state_dict(self):
        """The wrapped optimizer's state dict, with the schedule's counter under ``"hvd_async"``."""
        state = super().state_dict()
        state["hvd_async"] = self._hvd_schedule.state_dict()
        return state

    def load_state_dict(self, state_dict) -> None:
        """Load a state dict from :meth:`state_dict` (or from the plain optimizer)."""
        state_dict = dict(state_dict)
        schedule = state_dict.pop("hvd_async", None)
        super().load_state_dict(state_dict)
        if schedule is not None:
            self._hvd_schedule.load_state_dict(schedule)


class _LocalSGD(_AsyncOptimizer):
    def _hvd_local_step(self, closure):
        if self._hvd_schedule.in_warmup():
            grads = []
            for p in self._hvd_params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)    # another rank may have one
                grads.append(_view(p.grad, "a gradient"))
            self._hvd_schedule.average_gradients(grads)
        return super()._hvd_local_step(closure)

    def synchronize(self) -> None:
        """Apply the averaging in flight and average what was set aside, now: every rank then holds the same
        parameters (call it on every rank at the same step, e.g. before evaluating or saving)."""
        self._hvd_schedule.flush(self._hvd_arrays())


class _Outer(_AsyncOptimizer):
    def synchronize(self) -> None:
        """Take an outer step now (every rank, same step): afterwards every rank holds the new anchor."""
        arrays = self._hvd_arrays()
        self._hvd_schedule.before_step(arrays)
        self._hvd_schedule.outer(arrays)


class _Gossip(_AsyncOptimizer):
    def synchronize(self) -> None:
        """Average the parameters over every rank, now (every rank, same step; e.g. before evaluating)."""
        self._hvd_schedule.average_all(self._hvd_arrays())


class _Stale(_AsyncOptimizer):
    def step(self, closure=None):
        """Submit this step's gradients, then update with the averaged gradients of ``staleness`` steps ago (the
        first ``staleness`` steps only submit)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        grads = []
        for p in self._hvd_params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(_view(p.grad, "a gradient"))
        self._hvd_schedule.before_step(grads)
        averaged = self._hvd_schedule.exchange(grads)
        if averaged is not None:
            for g, a in zip(grads, averaged):
                g[...] = a
            super()._hvd_local_step(None)
        return loss

    def synchronize(self) -> None:
        """Apply every averaged gradient still in flight, oldest first (the end of training)."""
        for p in self._hvd_params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        grads = [_view(p.grad, "a gradient") for p in self._hvd_params]
        for averaged in self._hvd_schedule.drain():
            for g, a in zip(grads, averaged):
                g[...] = a
            super()._hvd_local_step(None)


def _wrap(mixin: type, optimizer: torch.optim.Optimizer, schedule, named_parameters, state_buffers=False):
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ValueError(f"expected a torch.optim.Optimizer, not {type(optimizer).__name__}")
    base = optimizer.__class__
    cls = type(base.__name__, (mixin, base), {"__module__": __name__})
    wrapped = cls(optimizer.param_groups, schedule, named_parameters, state_buffers)
    wrapped.state.update(optimizer.state)
    return wrapped


def LocalSGDOptimizer(optimizer: torch.optim.Optimizer, named_parameters=None, period: int = 8,
                      warmup_steps: int = 0, overlap_steps: Optional[int] = None, average_state: bool = False,
                      process_set: ProcessSet = global_process_set, name: Optional[str] = None):
    """Post-local SGD: average gradients for ``warmup_steps`` steps, then step locally and average the parameters
    every ``period`` steps, asynchronously (see :class:`horovod.runtime.async_policy.LocalSGD`).

    Args:
        optimizer: the torch optimizer to wrap (broadcast the parameters first, as for ``DistributedOptimizer``).
        named_parameters: ``model.named_parameters()`` (checked; optional).
        period: local steps between averagings.
        warmup_steps: synchronous gradient-averaging steps first.
        overlap_steps: steps the averaging runs behind before it is applied (0: synchronous; below ``period``).
        average_state: average the optimizer's floating-point state (momentum buffers) with the parameters.
        process_set: the ranks that average.
        name: the reductions' names (needed only to tell two such optimizers apart reliably).
    Returns:
        An instance of a subclass of the optimizer's class; ``.averaged`` says the last step averaged,
        ``.synchronize()`` averages everything now.
    Raises:
        ValueError: a count out of range, or non-float/non-CPU parameters.
    """
    schedule = _async.LocalSGD(period, warmup_steps, overlap_steps, process_set, name)
    return _wrap(_LocalSGD, optimizer, schedule, named_parameters, average_state)


def _torch_outer_step(factory: Callable) -> Callable:
    """An outer step by a torch optimizer made by ``factory(params)`` over persistent copies of the anchor."""
    made: dict = {}

    def outer_step(anchor: List[np.ndarray], grads: List[np.ndarray]) -> None:
        if "optimizer" not in made:
            made["params"] = [torch.from_numpy(np.array(a)) for a in anchor]
            made["optimizer"] = factory(made["params"])
        for t, a, g in zip(made["params"], anchor, grads):
            t.copy_(torch.from_numpy(a))
            t.grad = torch.from_numpy(np.ascontiguousarray(g, dtype=a.dtype))
        made["optimizer"].step()
        for t, a in zip(made["params"], anchor):
            a[...] = t.numpy()
    return outer_step


def OuterOptimizer(inner_optimizer: torch.optim.Optimizer, named_parameters=None, period: int = 32,
                   outer_lr: float = 0.7, outer_momentum: float = 0.9, nesterov: bool = True,
                   outer_optimizer_factory: Optional[Callable] = None, compression=Compression.none,
                   process_set: ProcessSet = global_process_set, name: Optional[str] = None):
    """DiLoCo-style training: ``period`` local inner steps, then the ranks average their parameter deltas and an
    outer optimizer (SGD with Nesterov momentum by default) applies them (see
    :class:`horovod.runtime.async_policy.OuterSteps`).

    Args:
        inner_optimizer: the torch optimizer of the inner steps.
        named_parameters: ``model.named_parameters()`` (checked; optional).
        period: inner steps per outer step.
        outer_lr, outer_momentum, nesterov: the default outer optimizer.
        outer_optimizer_factory: instead, ``f(list of tensors) -> torch.optim.Optimizer`` for the outer step.
        compression: ``hvd.Compression.none``, ``fp16`` or ``bf16`` for the deltas on the wire.
        process_set: the ranks that average.
        name: the reductions' names.
    Returns:
        An instance of a subclass of the inner optimizer's class; ``.synchronize()`` takes an outer step now.
    """
    outer_step = _torch_outer_step(outer_optimizer_factory) if outer_optimizer_factory is not None else None
    schedule = _async.OuterSteps(period, outer_lr, outer_momentum, nesterov, outer_step, compression,
                                 process_set, name)
    return _wrap(_Outer, inner_optimizer, schedule, named_parameters)


def GossipOptimizer(optimizer: torch.optim.Optimizer, named_parameters=None, topology: str = "ring",
                    every: int = 1, name: Optional[str] = None):
    """Decentralized training: after each local step a rank averages its parameters with one peer of a schedule
    every rank derives alike (see :mod:`horovod.runtime.gossip`). Needs dynamic process sets
    (``hvd.init(process_sets="dynamic")``) or the pairs registered at init (``hvd.gossip_process_sets``).

    Args:
        optimizer: the torch optimizer to wrap.
        named_parameters: ``model.named_parameters()`` (checked; optional).
        topology: ``"ring"`` or ``"exponential"``.
        every: local steps between exchanges.
        name: the reductions' names.
    Returns:
        An instance of a subclass of the optimizer's class; ``.synchronize()`` averages over every rank now.
    """
    return _wrap(_Gossip, optimizer, _gossip.Gossip(topology, every, name), named_parameters)


def stale_optimizer(optimizer: torch.optim.Optimizer, named_parameters, compression, staleness: int, op,
                    process_set: ProcessSet, unsupported: dict):
    """``DistributedOptimizer(..., staleness=s)``: each step applies the gradients averaged ``s`` steps earlier.

    Raises:
        ValueError: an option the stale path does not have (``unsupported`` holds those that differ from their
            defaults), or an op other than Average.
    """
    if op != _c.Average:
        raise ValueError("staleness supports only op=hvd.Average")
    if unsupported:
        raise ValueError(f"staleness does not support {', '.join(sorted(unsupported))}")
    schedule = _async.StaleGradients(staleness, compression, process_set)
    return _wrap(_Stale, optimizer, schedule, named_parameters)
