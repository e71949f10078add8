"""Broadcasting a model's parameters and an optimizer's state from one rank, and object collectives."""

from __future__ import annotations

from typing import Any, List, Optional

import torch

from horovod.runtime import collectives as _c
from horovod.runtime.process_sets import ProcessSet, global_process_set
from horovod.torch import async_ops as _ops

__all__ = ["broadcast_parameters", "broadcast_optimizer_state", "broadcast_object", "allgather_object"]


def broadcast_parameters(params, root_rank: int, prefix: Optional[str] = None,
                         process_set: ProcessSet = global_process_set) -> None:
    """Overwrite tensors in place with ``root_rank``'s values, e.g. ``model.state_dict()`` before training.

    Args:
        params: a dict of name -> tensor (broadcast in sorted name order), or a list of tensors or of
            ``(name, tensor)`` pairs, in the same order on every rank.
        root_rank: the global rank whose values everyone receives.
        prefix: prepended to every name (keeps several broadcasts apart).
    Raises:
        ValueError: ``params`` is of another type.
    """
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, (list, tuple)) or hasattr(params, "__iter__"):
        items = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise ValueError(f"broadcast_parameters expects a dict or a list of tensors, not {type(params).__name__}")
    handles = []
    for name, tensor in items:
        if tensor is None:
            continue
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"broadcast_parameters: {name!r} is a {type(tensor).__name__}, not a tensor")
        full = f"{prefix}{name}" if prefix and name is not None else name
        handles.append(_ops.broadcast_async_(tensor, root_rank, name=full, process_set=process_set))
    for handle in handles:
        _ops.synchronize(handle)


def _create_state(optimizer: torch.optim.Optimizer) -> None:
    """Give a fresh optimizer its state by one step on zero gradients, as Horovod does: every parameter that
    requires a gradient is left with a zero ``.grad`` (the step's input), its values as they were."""
    saved = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad:
                saved.append((p, p.detach().clone()))
                p.grad = torch.zeros_like(p)
                if isinstance(optimizer, torch.optim.SparseAdam):
                    p.grad = p.grad.to_sparse()
    step = getattr(optimizer, "_local_step", optimizer.step)  # a DistributedOptimizer must not allreduce here
    step()
    with torch.no_grad():
        for p, data in saved:
            p.copy_(data)


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int, model=None,
                              process_set: ProcessSet = global_process_set) -> None:
    """Make every rank's optimizer state (tensors, step counts, learning rates and other options) equal to
    ``root_rank``'s. A fresh optimizer first gets its state created, as in Horovod: one local step on zero
    gradients, after which every parameter that requires a gradient has a zero ``.grad`` (a gradient it had
    before is replaced, as there); unlike Horovod, the parameters keep their values even with weight decay.

    The root's layout decides: a rank whose state lacks an entry the root has (a parameter that had no gradient
    there, state created lazily, a rank that joined later) gets it, and entries the root lacks are dropped, so the
    ranks never wait on tensors the others do not send.

    Raises:
        ValueError: ``torch.optim.LBFGS``, whose state cannot be broadcast.
    """
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    if not optimizer.state_dict()["state"]:
        _create_state(optimizer)
    params = [group["params"] for group in optimizer.param_groups]
    layout = {"groups": [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups],
              "state": {(g, i, key): _describe(value) for g, group in enumerate(params) for i, p in enumerate(group)
                        for key, value in optimizer.state.get(p, {}).items()}}
    layout = _c.broadcast_object(layout, root_rank, name="optimizer_state.layout", process_set=process_set)
    for group, options in zip(optimizer.param_groups, layout["groups"]):
        group.update(options)
    tensors = _match_layout(optimizer, params, layout["state"])
    handles = [_ops.broadcast_async_(tensor, root_rank, name=f"optimizer_state.{g}.{i}.{key}",
                                     process_set=process_set) for (g, i, key), tensor in sorted(tensors.items())]
    for handle in handles:
        _ops.synchronize(handle)


def _describe(value):
    """A state entry as the root announces it: a tensor's shape, dtype and whether it lives on the host or with its
    parameter (Adam keeps its step count on the CPU beside CUDA moments), or any other value itself."""
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), str(value.dtype).replace("torch.", ""),
                "cpu" if value.device.type == "cpu" else "param")
    return ("value", value)


def _match_layout(optimizer, params, state_layout):
    """Give the local state exactly the root's entries; return the tensors to receive, by (group, index, key)."""
    tensors = {}
    wanted = {}
    for (g, i, key), spec in state_layout.items():
        wanted.setdefault(params[g][i], {})[key] = spec
    for p in list(optimizer.state):
        if p not in wanted:
            del optimizer.state[p]
    for g, group in enumerate(params):
        for i, p in enumerate(group):
            if p not in wanted:
                continue
            state = optimizer.state[p]
            for key in [k for k in state if k not in wanted[p]]:
                del state[key]
            for key, spec in wanted[p].items():
                if spec[0] == "value":
                    state[key] = spec[1]
                    continue
                shape, dtype = spec[1], getattr(torch, spec[2])
                device = torch.device("cpu") if spec[3] == "cpu" else p.device
                current = state.get(key)
                if not (isinstance(current, torch.Tensor) and tuple(current.shape) == shape and current.dtype == dtype
                        and current.device == device):
                    state[key] = torch.zeros(shape, dtype=dtype, device=device)
                tensors[(g, i, key)] = state[key]
    return tensors


def broadcast_object(obj: Any, root_rank: int = 0, name: Optional[str] = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    """Return ``root_rank``'s ``obj`` (any cloudpicklable object) on every rank of the set."""
    return _c.broadcast_object(obj, root_rank, name=name, process_set=process_set)


def allgather_object(obj: Any, name: Optional[str] = None,
                     process_set: ProcessSet = global_process_set) -> List[Any]:
    """Return every rank's ``obj`` (any cloudpicklable object), ordered by rank."""
    return _c.allgather_object(obj, name=name, process_set=process_set)
