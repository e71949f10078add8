"""``DistributedOptimizer``: wraps a torch optimizer so that gradients are averaged over ranks before each step.

A hook on every parameter starts that parameter's allreduce as soon as autograd has accumulated its gradient
(after ``backward_passes_per_step`` backward passes), so communication overlaps the rest of backpropagation.
``step()`` waits for the allreduces (``synchronize()``), then runs the wrapped optimizer's update.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Dict, List, Optional, Tuple

import torch

from horovod.runtime import collectives as _c
from horovod.runtime.process_sets import ProcessSet, global_process_set
from horovod.torch import mpi_ops as _ops
from horovod.torch.compression import Compression

_EXTRA_BACKWARD = ("Gradients were computed more than backward_passes_per_step times before call to step(). "
                   "Increase backward_passes_per_step to accumulate gradients locally.")
_PENDING_ZERO_GRAD = ("optimizer.zero_grad() was called after loss.backward() but before optimizer.step() or "
                      "optimizer.synchronize(). This is prohibited as it can cause a race condition.")
_STEP_AFTER_SYNC = ("optimizer.step() called without optimizer.skip_synchronize() context after "
                    "optimizer.synchronize(). This can cause training slowdown. You may want to consider using "
                    "optimizer.skip_synchronize() context if you use optimizer.synchronize() in your code.")


def _parameter_names(param_groups, named_parameters) -> Dict[torch.Tensor, str]:
    if named_parameters is None:
        return {p: f"noname.{g}.{i}" for g, group in enumerate(param_groups) for i, p in enumerate(group["params"])}
    named_parameters = list(named_parameters)
    if any(not isinstance(item, tuple) for item in named_parameters):
        raise ValueError("named_parameters should be a sequence of tuples (name, parameter), usually produced by "
                         "model.named_parameters().")
    names = [name for name, _ in named_parameters]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"Parameter names in named_parameters must be unique. Found duplicates: "
                         f"{', '.join(duplicates)}")
    named_ids = {id(p) for _, p in named_parameters}
    unnamed = [id(p) for group in param_groups for p in group["params"] if id(p) not in named_ids]
    if unnamed:
        raise ValueError(f"named_parameters was specified, but one or more model parameters were not named. "
                         f"Python object ids: {', '.join(str(i) for i in unnamed)}")
    return {p: name for name, p in sorted(named_parameters, key=lambda item: item[0])}


def _make_groups(groups, params: List[torch.Tensor]) -> List[Tuple[torch.Tensor, ...]]:
    """Explicit groups as given; an integer n splits the parameters into n groups in order."""
    if groups is None or groups == 0:
        return []
    if isinstance(groups, list):
        seen = set()
        for group in groups:
            for p in group:
                if not isinstance(p, torch.Tensor):
                    raise ValueError("groups must consist of torch.Tensor.")
                if id(p) in seen:
                    raise ValueError("A parameter can only appear once in groups.")
                seen.add(id(p))
        wanted = {id(p) for p in params}
        return [tuple(p for p in group if id(p) in wanted) for group in groups if group]
    if not isinstance(groups, int) or groups < 0:
        raise ValueError("groups should be a non-negative integer or a list of list of torch.Tensor.")
    size, extra = divmod(len(params), groups)
    out, start = [], 0
    for k in range(groups):
        end = start + size + (1 if k < extra else 0)
        if end > start:
            out.append(tuple(params[start:end]))
        start = end
    return out


class _DistributedOptimizer:
    """Mixin placed before the wrapped optimizer's class; see :func:`DistributedOptimizer`."""

    def __init__(self, params, named_parameters, compression, backward_passes_per_step, op,
                 gradient_predivide_factor, groups, sparse_as_dense, process_set):
        super().__init__(params)
        self._compression = compression
        self._parameter_names = _parameter_names(self.param_groups, named_parameters)
        self.backward_passes_per_step = backward_passes_per_step
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set
        self._requires_update = [p for group in self.param_groups for p in group["params"] if p.requires_grad]
        self._allreduce_delay = {p: backward_passes_per_step for p in self._requires_update}
        self._groups = _make_groups(groups, self._requires_update)
        self._group_of = {p: group for group in self._groups for p in group}
        self._group_ready: Dict[Tuple, int] = {group: 0 for group in self._groups}
        self._handles: Dict[object, Tuple[Optional[object], object]] = {}
        self._synchronized = False
        self._should_synchronize = True
        self._hook_handles = []
        if process_set.included():
            for p in self._requires_update:
                self._hook_handles.append(p.register_post_accumulate_grad_hook(self._on_grad_ready))

    # -- hooks and allreduces ---------------------------------------------------------------------------------------

    def _scale_factors(self) -> Tuple[float, float]:
        if self.op == _c.Average:
            return 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        return 1.0, 1.0

    def _on_grad_ready(self, p: torch.Tensor) -> None:
        if self._handles.get(p, (None, None))[0] is not None or self._allreduce_delay[p] <= 0:
            raise AssertionError(_EXTRA_BACKWARD)
        self._allreduce_delay[p] -= 1
        if self._allreduce_delay[p] > 0:
            self._handles[p] = (None, None)
            return
        group = self._group_of.get(p)
        if group is None:
            self._handles[p] = self._allreduce_grad_async(p)
            return
        self._handles[p] = (None, None)
        self._group_ready[group] += 1
        if self._group_ready[group] == len(group):
            self._start_group(group)

    def _start_group(self, group: Tuple[torch.Tensor, ...]) -> None:
        for p in group:
            self._handles.pop(p, None)
        self._group_ready[group] = 0
        self._handles[group] = self._grouped_allreduce_grad_async(group)

    def _dense_grad(self, p: torch.Tensor) -> torch.Tensor:
        if p.grad is None:
            # Another rank may have a gradient for it (dynamic graphs): contribute zeros.
            p.grad = torch.zeros_like(p)
        elif p.grad.is_sparse and self.sparse_as_dense:
            p.grad = p.grad.to_dense()
        return p.grad

    def _allreduce_grad_async(self, p: torch.Tensor):
        grad = self._dense_grad(p)
        name = self._parameter_names.get(p)
        if grad.is_sparse:
            return _ops.sparse_allreduce_async(grad, name=f"sparse.{name}", op=self.op,
                                               process_set=self.process_set), None
        compressed, ctx = self._compression.compress(grad)
        pre, post = self._scale_factors()
        handle = _ops.allreduce_async_(compressed, name=name, op=self.op, prescale_factor=pre,
                                       postscale_factor=post, process_set=self.process_set)
        return handle, ctx

    def _grouped_allreduce_grad_async(self, group: Tuple[torch.Tensor, ...]):
        compressed = [self._compression.compress(self._dense_grad(p)) for p in group]
        pre, post = self._scale_factors()
        name = f"group.{self._parameter_names.get(group[0])}.{len(group)}"
        handle = _ops.grouped_allreduce_async_([t for t, _ in compressed], name=name, op=self.op,
                                               prescale_factor=pre, postscale_factor=post,
                                               process_set=self.process_set)
        return handle, [ctx for _, ctx in compressed]

    def _finish(self, key, handle, ctx) -> None:
        if isinstance(key, tuple):
            outputs = _ops.synchronize(handle)
            for p, output, c in zip(key, outputs, ctx):
                self._set_grad(p, output, c)
        elif callable(handle):
            key.grad = handle()
            self._allreduce_delay[key] = self.backward_passes_per_step
        else:
            self._set_grad(key, _ops.synchronize(handle), ctx)

    def _set_grad(self, p: torch.Tensor, output: torch.Tensor, ctx) -> None:
        self._allreduce_delay[p] = self.backward_passes_per_step
        result = self._compression.decompress(output, ctx)
        if result is not p.grad:
            with torch.no_grad():
                p.grad.copy_(result)

    # -- public API -------------------------------------------------------------------------------------------------

    def synchronize(self) -> None:
        """Wait for every gradient's allreduce (starting those not started yet) and write the averages into
        ``.grad``. Call it before gradient clipping; then step inside ``skip_synchronize()``."""
        if not self.process_set.included():
            self._synchronized = True
            return
        for group in self._groups:
            if group not in self._handles:
                self._start_group(group)
        for p in self._requires_update:
            if p in self._group_of:
                continue
            if self._handles.get(p, (None, None))[0] is None:
                self._handles[p] = self._allreduce_grad_async(p)
        for key, (handle, ctx) in list(self._handles.items()):
            self._finish(key, handle, ctx)
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
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step
        for group in self._group_ready:
            self._group_ready[group] = 0
        self._synchronized = False

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Change how many backward passes accumulate locally before gradients are allreduced."""
        if passes <= 0:
            raise ValueError("backward_passes_per_step must be > 0")
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes


def DistributedOptimizer(optimizer: torch.optim.Optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step: int = 1, op: int = _c.Average,
                         gradient_predivide_factor: float = 1.0, num_groups: int = 0, groups=None,
                         sparse_as_dense: bool = False, process_set: ProcessSet = global_process_set):
    """Wrap ``optimizer`` so that each step uses gradients reduced over the ranks of ``process_set``.

    The result is an instance of a subclass of the optimizer's class, sharing its parameter groups and state.

    Args:
        optimizer: the torch optimizer to wrap.
        named_parameters: ``model.named_parameters()``; names the allreduces (recommended).
        compression: ``hvd.Compression.none``, ``fp16`` or ``bf16`` for the gradients on the wire.
        backward_passes_per_step: backward passes accumulated locally before each allreduce.
        op: ``hvd.Average`` (default), ``hvd.Sum`` or ``hvd.Adasum``.
        gradient_predivide_factor: with Average, divide by this before the sum and by size/factor after.
        num_groups: deprecated; use ``groups``.
        groups: an int n (split the parameters into n fused groups) or a list of lists of parameters.
        sparse_as_dense: allreduce sparse gradients as dense tensors.
        process_set: the ranks that average their gradients.
    Raises:
        ValueError: ``gradient_predivide_factor`` with an op other than Average, ``backward_passes_per_step`` < 1,
            badly formed ``named_parameters`` or ``groups``.
    """
    if gradient_predivide_factor != 1.0 and op != _c.Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if backward_passes_per_step <= 0:
        raise ValueError("backward_passes_per_step must be > 0")
    if num_groups != 0:
        warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be removed in v0.23.0.",
                      DeprecationWarning)
        if groups is None:
            groups = num_groups
    base = optimizer.__class__
    cls = type(base.__name__, (_DistributedOptimizer, base), {"__module__": __name__})
    wrapped = cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step, op,
                  gradient_predivide_factor, groups, sparse_as_dense, process_set)
    wrapped.state.update(optimizer.state)
    return wrapped
