"""``TorchState``: a model, an optimizer, samplers and any picklable attributes, committed and synced together."""

from __future__ import annotations

import copy
from typing import Any, Callable, Dict, Optional, Type

import torch

from horovod.runtime import basics
from horovod.elastic.state import ObjectState
from horovod.torch.elastic.sampler import ElasticSampler
from horovod.torch.functions import broadcast_object, broadcast_optimizer_state, broadcast_parameters


class StateHandler:
    """Saves, restores and syncs one value of a :class:`TorchState`."""

    def __init__(self, value: Any):
        self.value = value

    def save(self) -> None:
        raise NotImplementedError

    def restore(self) -> None:
        raise NotImplementedError

    def sync(self) -> None:
        raise NotImplementedError

    def reset(self) -> None:
        """Adapt to a new membership."""

    def set_value(self, value: Any) -> None:
        self.value = value
        self.save()


class ModelStateHandler(StateHandler):
    def save(self) -> None:
        self._saved = {k: v.detach().clone() for k, v in self.value.state_dict().items()}

    def restore(self) -> None:
        self.value.load_state_dict(self._saved)

    def sync(self) -> None:
        broadcast_parameters(self.value.state_dict(), root_rank=0, prefix="elastic.model.")
        self.save()


def _drop_pending_allreduces(optimizer) -> None:
    # A DistributedOptimizer interrupted by a failure still holds the failed allreduces; their step is undone.
    discard = getattr(optimizer, "_discard_pending", None)
    if discard is not None:
        discard()


class OptimizerStateHandler(StateHandler):
    def save(self) -> None:
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        _drop_pending_allreduces(self.value)
        self.value.load_state_dict(self._saved)

    def sync(self) -> None:
        broadcast_optimizer_state(self.value, root_rank=0)
        self.save()


class SamplerStateHandler(StateHandler):
    def save(self) -> None:
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(self._saved)

    def sync(self) -> None:
        self._saved = broadcast_object(self._saved, root_rank=0, name="elastic.sampler")
        self.value.load_state_dict(self._saved)

    def reset(self) -> None:
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
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self) -> None:
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self) -> None:
        order = sorted(self._handlers.values(), key=lambda h: not isinstance(h, ModelStateHandler))
        for handler in order:
            handler.sync()
        super().sync()

    def reset(self) -> None:
        for handler in self._handlers.values():
            handler.reset()


__all__ = ["TorchState", "StateHandler", "ModelStateHandler", "OptimizerStateHandler", "SamplerStateHandler",
           "get_handler_registry", "set_handler_registry"]
