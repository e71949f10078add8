"""Horovod's delta-based Adasum optimizer: what ``DistributedOptimizer(op=hvd.Adasum)`` returns on more than one rank.

Each rank first applies the wrapped optimizer to its own gradient, one parameter at a time, as soon as autograd has
accumulated that parameter's gradient (after ``backward_passes_per_step`` passes); the parameter's change, the
*delta*, is then combined over ranks with an Adasum allreduce, and ``step()`` sets every parameter to its value
before the local update plus the combined delta::

    start = p;  p = wrapped_step(p, p.grad);  p = start + adasum_over_ranks(p - start)

Adasum therefore combines optimizer updates (e.g. Adam's), not raw gradients, exactly as Horovod's
``_DistributedAdasumOptimizer`` does. Adasum needs the global process set and a power-of-two number of ranks.
"""

from __future__ import annotations

import contextlib
from typing import Dict, Optional, Tuple

import torch

from horovod.runtime import collectives as _c
from horovod.runtime import gradient_policy as _policy
from horovod.torch import async_ops as _ops
from horovod.torch.compression import Compression

__all__ = ["DistributedAdasumOptimizer"]

_PENDING_ZERO_GRAD = ("optimizer.zero_grad() was called after loss.backward() but before optimizer.step() or "
                      "optimizer.synchronize(). This is prohibited as it can cause a race condition.")


class _DistributedAdasumOptimizer(_policy.BackwardPasses):
    """Mixin placed before the wrapped optimizer's class; see :func:`DistributedAdasumOptimizer`."""

    def __init__(self, params, named_parameters, compression, backward_passes_per_step):
        super().__init__(params)
        self._compression = compression
        self._parameter_names = _policy.parameter_names([g["params"] for g in self.param_groups], named_parameters)
        self._requires_update = [p for group in self.param_groups for p in group["params"] if p.requires_grad]
        self._passes = _policy.PassCounter(map(id, self._requires_update), backward_passes_per_step)
        self._starts = {p: torch.zeros_like(p, requires_grad=False) for p in self._requires_update}
        self._handles: Dict[torch.Tensor, Tuple[Optional[int], object]] = {}
        self._hook_handles = []
        for p in self._requires_update:
            if p.grad is None:      # Horovod starts every gradient at zero, so a parameter unused in a pass steps too
                p.grad = torch.zeros_like(p)
            self._hook_handles.append(p.register_post_accumulate_grad_hook(self._on_grad_ready))

    def _on_grad_ready(self, p: torch.Tensor) -> None:
        self._handles[p] = self._reduce_delta_async(p) if self._passes.count(id(p)) else (None, None)

    def _reduce_delta_async(self, p: torch.Tensor):
        """Step the wrapped optimizer on ``p`` alone, turn ``p`` into its delta, start the delta's Adasum."""
        start = self._starts[p]
        with torch.no_grad():
            start.copy_(p)
        stashed = [group["params"] for group in self.param_groups]
        for group, params in zip(self.param_groups, stashed):
            group["params"] = [p] if any(p is q for q in params) else []
        try:
            super().step()
        finally:
            for group, params in zip(self.param_groups, stashed):
                group["params"] = params
        with torch.no_grad():
            p.sub_(start)
        compressed, ctx = self._compression.compress(p.detach())
        handle = _ops.allreduce_async_(compressed, name=self._parameter_names.get(id(p)), op=_c.Adasum)
        return handle, ctx

    def step(self, closure=None):
        """Start the deltas not started yet (a local step on each), wait for their Adasum, and set every parameter
        to its starting value plus the combined delta. Returns the closure's loss, if a closure is given."""
        loss = closure() if closure is not None else None
        for p in self._requires_update:
            if self._handles.get(p, (None, None))[0] is None:
                self._handles[p] = self._reduce_delta_async(p)
        for p, (handle, ctx) in list(self._handles.items()):
            delta = self._compression.decompress(_ops.synchronize(handle), ctx)
            start = self._starts[p]
            with torch.no_grad():
                start.add_(delta)
                p.copy_(start)
            self._passes.reset(id(p))
        self._handles.clear()
        return loss

    def synchronize(self) -> None:
        """Nothing to do: the deltas are reduced in ``step()`` (as in Horovod)."""

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Not supported with Adasum (raises AssertionError, as Horovod)."""
        raise AssertionError("Skipping synchronization is not supported when using Adasum optimizer.")
        yield  # pragma: no cover

    def zero_grad(self, *args, **kwargs):
        """Clear gradients. Raises AssertionError while deltas are being reduced."""
        if self._handles:
            raise AssertionError(_PENDING_ZERO_GRAD)
        return super().zero_grad(*args, **kwargs)

    def _local_step(self, closure=None):
        """The wrapped optimizer's own step on every parameter, without communication."""
        return super().step(closure)

    def _discard_pending(self) -> None:
        """Forget the reductions of an interrupted step (elastic restore undoes that step); no communication."""
        self._handles.clear()
        self._passes.reset()


def DistributedAdasumOptimizer(optimizer: torch.optim.Optimizer, named_parameters=None,
                               compression=Compression.none, backward_passes_per_step: int = 1):
    """Wrap ``optimizer`` in Horovod's delta-based Adasum optimizer (see the module's docstring).

    ``DistributedOptimizer(op=hvd.Adasum)`` returns this on more than one rank. The result is an instance of a
    subclass of the optimizer's class, sharing its parameter groups and state.

    Raises:
        ValueError: ``backward_passes_per_step`` < 1, or badly formed ``named_parameters``.
    """
    base = optimizer.__class__
    cls = type(base.__name__, (_DistributedAdasumOptimizer, base), {"__module__": __name__})
    wrapped = cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step)
    wrapped.state.update(optimizer.state)
    return wrapped
