"""``DistributedOptimizer``: wraps a torch optimizer so that gradients are averaged over ranks before each step.

A hook on every parameter starts that parameter's allreduce as soon as autograd has accumulated its gradient
(after ``backward_passes_per_step`` backward passes), so communication overlaps the rest of backpropagation.
``step()`` waits for the allreduces (``synchronize()``), then runs the wrapped optimizer's update.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Dict, Optional, Tuple

import torch

from horovod.runtime import collectives as _c
from horovod.runtime import gradient_policy as _policy
from horovod.runtime.compression import compress_all
from horovod.runtime.process_sets import ProcessSet, global_process_set
from horovod.torch import async_optimizers as _async
from horovod.torch import async_ops as _ops
from horovod.torch.adasum_optimizer import DistributedAdasumOptimizer
from horovod.torch.compression import Compression

__all__ = ["DistributedOptimizer"]

_PENDING_ZERO_GRAD = ("optimizer.zero_grad() was called after loss.backward() but before optimizer.step() or "
                      "optimizer.synchronize(). This is prohibited as it can cause a race condition.")
_STEP_AFTER_SYNC = ("optimizer.step() called without optimizer.skip_synchronize() context after "
                    "optimizer.synchronize(). This can cause training slowdown. You may want to consider using "
                    "optimizer.skip_synchronize() context if you use optimizer.synchronize() in your code.")


_NOT_STARTED = (None, None, None)


class _DistributedOptimizer(_policy.BackwardPasses):
    """Mixin placed before the wrapped optimizer's class; see :func:`DistributedOptimizer`."""

    def __init__(self, params, named_parameters, compression, backward_passes_per_step, op,
                 gradient_predivide_factor, groups, sparse_as_dense, process_set):
        super().__init__(params)
        self._compression = compression
        self._parameter_names = _policy.parameter_names([g["params"] for g in self.param_groups], named_parameters)
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set
        self._requires_update = [p for group in self.param_groups for p in group["params"] if p.requires_grad]
        self._passes = _policy.PassCounter(map(id, self._requires_update), backward_passes_per_step)
        self._groups = [tuple(self._requires_update[i] for i in members) for members in _policy.split_groups(
            groups, self._requires_update, member_check=lambda p: isinstance(p, torch.Tensor),
            what="torch.Tensor") if len(members) > 1]
        # Keyed by id(parameter) and group index, not by tensor: a tensor's __hash__ is a Python call, and these maps
        # are used several times per gradient per step.
        self._group_of = {id(p): index for index, group in enumerate(self._groups) for p in group}
        self._group_ready = [0] * len(self._groups)
        # id(parameter), or -1 - group index -> (the parameter or group, handle or None, compression context)
        self._handles: Dict[int, Tuple[object, Optional[object], object]] = {}
        self._synchronized = False
        self._should_synchronize = True
        self._hook_handles = []
        if process_set.included():
            for p in self._requires_update:
                self._hook_handles.append(p.register_post_accumulate_grad_hook(self._on_grad_ready))

    # -- hooks and allreduces ---------------------------------------------------------------------------------------

    def _on_grad_ready(self, p: torch.Tensor) -> None:
        key = id(p)
        if not self._passes.count(key):
            self._handles[key] = (p, None, None)
            return
        index = self._group_of.get(key)
        if index is None:
            self._handles[key] = (p, *self._allreduce_grad_async(p))
            return
        self._handles[key] = (p, None, None)
        self._group_ready[index] += 1
        if self._group_ready[index] == len(self._groups[index]):
            self._start_group(index)

    def _start_group(self, index: int) -> None:
        group = self._groups[index]
        for p in group:
            self._handles.pop(id(p), None)
        self._group_ready[index] = 0
        self._handles[-1 - index] = (group, *self._grouped_allreduce_grad_async(group))

    def _dense_grad(self, p: torch.Tensor) -> torch.Tensor:
        if p.grad is None:
            # Another rank may have a gradient for it (dynamic graphs): contribute zeros.
            p.grad = torch.zeros_like(p)
        elif p.grad.is_sparse and self.sparse_as_dense:
            return p.grad.to_dense()    # p.grad stays sparse: the dense average goes back to sparse (_set_grad)
        return p.grad

    def _allreduce_grad_async(self, p: torch.Tensor):
        grad = self._dense_grad(p)
        name = self._parameter_names.get(id(p))
        if grad.is_sparse:
            return _ops.sparse_allreduce_async(grad, name=f"sparse.{name}", op=self.op,
                                               process_set=self.process_set), None
        compressed, ctx = self._compression.compress(grad)
        pre, post = _policy.predivide_factors(self.op, self.gradient_predivide_factor)
        handle = _ops.allreduce_async_(compressed, name=name, op=self.op, prescale_factor=pre,
                                       postscale_factor=post, process_set=self.process_set)
        return handle, ctx

    def _grouped_allreduce_grad_async(self, group: Tuple[torch.Tensor, ...]):
        compressed, ctxs = compress_all(self._compression, [self._dense_grad(p) for p in group])
        pre, post = _policy.predivide_factors(self.op, self.gradient_predivide_factor)
        name = f"group.{self._parameter_names.get(id(group[0]))}.{len(group)}"
        handle = _ops.grouped_allreduce_async_(compressed, name=name, op=self.op, prescale_factor=pre,
                                               postscale_factor=post, process_set=self.process_set)
        return handle, ctxs

    def _finish(self, target, handle, ctx) -> None:
        if isinstance(target, tuple):
            outputs = _ops.synchronize(handle)
            for p, output, c in zip(target, outputs, ctx):
                self._set_grad(p, output, c)
        elif callable(handle):
            target.grad = handle()
            self._passes.reset(id(target))
        else:
            self._set_grad(target, _ops.synchronize(handle), ctx)

    def _set_grad(self, p: torch.Tensor, output: torch.Tensor, ctx) -> None:
        self._passes.reset(id(p))
        result = self._compression.decompress(output, ctx)
        if p.grad.is_sparse:    # sparse_as_dense: the update gets a sparse gradient again, as in Horovod
            p.grad = result.to_sparse()
        elif result is not p.grad:
            with torch.no_grad():
                p.grad.copy_(result)

    # -- public API -------------------------------------------------------------------------------------------------

    def synchronize(self) -> None:
        """Wait for every gradient's allreduce (starting those not started yet) and write the averages into
        ``.grad``. Call it before gradient clipping; then step inside ``skip_synchronize()``."""
        if not self.process_set.included():
            self._synchronized = True
            return
        handles = self._handles
        for index in range(len(self._groups)):
            if -1 - index not in handles:
                self._start_group(index)
        group_of = self._group_of
        for p in self._requires_update:
            key = id(p)
            if key not in group_of and handles.get(key, _NOT_STARTED)[1] is None:
                handles[key] = (p, *self._allreduce_grad_async(p))
        for target, handle, ctx in list(handles.values()):
            self._finish(target, handle, ctx)
        self._handles.clear()
        self._synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Within this context ``step()`` does not synchronize (because ``synchronize()`` was called already)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        """Synchronize the gradients (unless inside ``skip_synchronize()``), then update the parameters."""
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn(_STEP_AFTER_SYNC)
            self.synchronize()
        self._synchronized = False
        return super().step(closure)

    def _local_step(self, closure=None):
        """The wrapped optimizer's own step, without communication."""
        return super().step(closure)

    def zero_grad(self, *args, **kwargs):
        """Clear gradients. Raises AssertionError while gradient allreduces are pending."""
        if self._handles:
            raise AssertionError(_PENDING_ZERO_GRAD)
        return super().zero_grad(*args, **kwargs)

    def _discard_pending(self) -> None:
        """Forget the allreduces of an interrupted step (elastic restore undoes that step); no communication."""
        self._handles.clear()
        self._passes.reset()
        self._group_ready = [0] * len(self._groups)
        self._synchronized = False


def DistributedOptimizer(optimizer: torch.optim.Optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step: int = 1, op: int = _c.Average,
                         gradient_predivide_factor: float = 1.0, num_groups: int = 0, groups=None,
                         sparse_as_dense: bool = False, process_set: ProcessSet = global_process_set,
                         staleness: int = 0):
    """Wrap ``optimizer`` so that each step uses gradients reduced over the ranks of ``process_set``.

    The result is an instance of a subclass of the optimizer's class, sharing its parameter groups and state.

    Args:
        optimizer: the torch optimizer to wrap.
        named_parameters: ``model.named_parameters()``; names the allreduces (recommended).
        compression: ``hvd.Compression.none``, ``fp16`` or ``bf16`` for the gradients on the wire.
        backward_passes_per_step: backward passes accumulated locally before each allreduce.
        op: ``hvd.Average`` (default), ``hvd.Sum`` or ``hvd.Adasum`` (on more than one rank: Horovod's delta-based
            Adasum optimizer, :mod:`horovod.torch.adasum_optimizer`; global process set only).
        gradient_predivide_factor: with Average, divide by this before the sum and by size/factor after.
        num_groups: deprecated; use ``groups``.
        groups: an int n (split the parameters into n fused groups) or a list of lists of parameters.
        sparse_as_dense: allreduce sparse gradients as dense tensors.
        process_set: the ranks that average their gradients.
        staleness: s > 0 applies the gradients averaged s steps earlier, so their allreduce overlaps the next
            steps (docs/async.md; compression and named_parameters only).
    Raises:
        ValueError: ``gradient_predivide_factor`` with an op other than Average, ``backward_passes_per_step`` < 1,
            badly formed ``named_parameters`` or ``groups``.
        NotImplementedError: Adasum with a process set other than the global one.
    """
    if staleness:
        return _async.stale_optimizer(optimizer, named_parameters, compression, staleness, op, process_set, {
            k for k, v in [("backward_passes_per_step", backward_passes_per_step != 1), ("groups", groups),
                           ("gradient_predivide_factor", gradient_predivide_factor != 1.0), ("num_groups", num_groups),
                           ("sparse_as_dense", sparse_as_dense)] if v})
    groups = _policy.check_optimizer_arguments(op, gradient_predivide_factor, backward_passes_per_step, groups,
                                               num_groups, what="torch.Tensor")
    if op == _c.Adasum and _policy.set_size(global_process_set) > 1:     # Horovod's delta-based Adasum optimizer
        if process_set.process_set_id != 0:
            raise NotImplementedError("Adasum does not support non-global process sets yet.")
        return DistributedAdasumOptimizer(optimizer, named_parameters, compression, backward_passes_per_step)
    base = optimizer.__class__
    cls = type(base.__name__, (_DistributedOptimizer, base), {"__module__": __name__})
    wrapped = cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step, op,
                  gradient_predivide_factor, groups, sparse_as_dense, process_set)
    wrapped.state.update(optimizer.state)
    return wrapped
