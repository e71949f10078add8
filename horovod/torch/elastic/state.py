"""``TorchState``: a model, an optimizer, samplers and any picklable attributes, committed and synced together."""

from __future__ import annotations

import abc
import copy
from typing import Any, Callable, Dict, Optional, Type

import torch

from horovod.runtime import basics
from horovod.elastic.state import ObjectState
from horovod.torch.elastic.sampler import ElasticSampler
from horovod.torch.functions import broadcast_object, broadcast_optimizer_state, broadcast_parameters


class StateHandler(abc.ABC):
    """Saves, restores and syncs one value of a :class:`TorchState` (a model, an optimizer, a sampler)."""

    def __init__(self, value: Any):
        self.value = value

    @abc.abstractmethod
    def save(self) -> None:
        """Keep a copy of the value's state, to restore after a failure."""

    @abc.abstractmethod
    def restore(self) -> None:
        """Load the copy :meth:`save` kept back into the value."""

    @abc.abstractmethod
    def sync(self) -> None:
        """Make the value equal to rank 0's on every rank, and save it."""

    def reset(self) -> None:
        """Adapt to a new membership."""

    def set_value(self, value: Any) -> None:
        """Handle ``value`` instead (an attribute of the state was assigned), saving it at once."""
        self.value = value
        self.save()


class ModelStateHandler(StateHandler):
    """A ``torch.nn.Module``: its ``state_dict`` is copied, and synced by :func:`broadcast_parameters`."""

    def save(self) -> None:
        """Copy every tensor of the state dict."""
        self._saved = {k: v.detach().clone() for k, v in self.value.state_dict().items()}

    def restore(self) -> None:
        """Load the copied state dict."""
        self.value.load_state_dict(self._saved)

    def sync(self) -> None:
        """Broadcast rank 0's parameters and buffers, then save."""
        broadcast_parameters(self.value.state_dict(), root_rank=0, prefix="elastic.model.")
        self.save()


def _drop_pending_allreduces(optimizer) -> None:
    # A DistributedOptimizer interrupted by a failure still holds the failed allreduces; their step is undone.
    discard = getattr(optimizer, "_discard_pending", None)
    if discard is not None:
        discard()


class OptimizerStateHandler(StateHandler):
    """A ``torch.optim.Optimizer``: its ``state_dict`` is deep-copied, and synced by
    :func:`broadcast_optimizer_state`."""

    def save(self) -> None:
        """Deep-copy the optimizer's state dict."""
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        """Forget allreduces of the interrupted step, then load the copied state dict."""
        _drop_pending_allreduces(self.value)
        self.value.load_state_dict(self._saved)

    def sync(self) -> None:
        """Broadcast rank 0's optimizer state, then save."""
        broadcast_optimizer_state(self.value, root_rank=0)
        self.save()


class SamplerStateHandler(StateHandler):
    """An :class:`ElasticSampler`: the indices already processed, re-split over the ranks on a new membership."""

    def save(self) -> None:
        """Deep-copy the sampler's state dict."""
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        """Load the copied state dict."""
        self.value.load_state_dict(self._saved)

    def sync(self) -> None:
        """Take rank 0's saved sampler state on every rank."""
        self._saved = broadcast_object(self._saved, root_rank=0, name="elastic.sampler")
        self.value.load_state_dict(self._saved)

    def reset(self) -> None:
        """Re-split the remaining indices over the new set of ranks."""
        self.value.reset()


_handlers: Dict[Type, Callable[[Any], StateHandler]] = {
    torch.nn.Module: ModelStateHandler,
    torch.optim.Optimizer: OptimizerStateHandler,
    ElasticSampler: SamplerStateHandler,
}


def get_handler_registry() -> Dict[Type, Callable[[Any], StateHandler]]:
    """The value type → handler factory table used by :class:`TorchState`."""
    return _handlers


def set_handler_registry(registry: Dict[Type, Callable[[Any], StateHandler]]) -> None:
    """Replace the value type → handler factory table (to handle more kinds of values)."""
    global _handlers
    _handlers = registry


def _handler_for(value: Any) -> Optional[StateHandler]:
    for kind, factory in _handlers.items():
        if isinstance(value, kind):
            return factory(value)
    return None


class TorchState(ObjectState):
    """Elastic state of a PyTorch job: ``TorchState(model, optimizer, epoch=0, batch=0, sampler=...)``.

    Modules, optimizers and :class:`ElasticSampler` values are saved as copies of their ``state_dict`` and synced
    with ``broadcast_parameters``/``broadcast_optimizer_state``/``broadcast_object``; the model first, so the
    optimizer's state is created for the right parameters. Other attributes behave as in :class:`ObjectState`.
    Assigning a new module/optimizer/sampler to an attribute replaces the handled value.
    """

    def __init__(self, model: Optional[torch.nn.Module] = None, optimizer: Optional[torch.optim.Optimizer] = None,
                 **kwargs: Any):
        values = dict(kwargs)
        if model is not None:
            values["model"] = model
        if optimizer is not None:
            values["optimizer"] = optimizer
        handlers, plain = {}, {}
        for name, value in values.items():
            handler = _handler_for(value)
            if handler is None:
                plain[name] = value
            else:
                handlers[name] = handler
        object.__setattr__(self, "_handlers", handlers)
        for handler in handlers.values():
            handler.save()
        super().__init__(bcast_object=lambda obj: broadcast_object(obj, 0, name="elastic.state"),
                         get_rank=basics.rank, **plain)

    def __getattr__(self, name: str) -> Any:
        handlers = self.__dict__.get("_handlers", {})
        if name in handlers:
            return handlers[name].value
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        handlers = self.__dict__.get("_handlers", {})
        if name in handlers:
            handlers[name].set_value(value)
        else:
            object.__setattr__(self, name, value)

    def save(self) -> None:
        """Save every handled value and the plain attributes."""
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self) -> None:
        """Restore every handled value and the plain attributes."""
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self) -> None:
        """Sync from rank 0: the model first (so the optimizer's state is made for its parameters), then the rest."""
        order = sorted(self._handlers.values(), key=lambda h: not isinstance(h, ModelStateHandler))
        for handler in order:
            handler.sync()
        super().sync()

    def reset(self) -> None:
        """Let every handled value adapt to the new membership (samplers re-split their indices)."""
        for handler in self._handlers.values():
            handler.reset()


__all__ = ["TorchState", "StateHandler", "ModelStateHandler", "OptimizerStateHandler", "SamplerStateHandler",
           "get_handler_registry", "set_handler_registry"]
