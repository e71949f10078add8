"""``hvd.elastic`` for PyTorch: ``run``, and what survives a reset: ``TorchState`` (``state``) and ``ElasticSampler``
(``sampler``); see :mod:`horovod.elastic`.

Importing it starts nothing. ``run`` resets with ``shutdown()`` then ``init()``, as Horovod does.
"""

from horovod.elastic.run import run, run_fn
from horovod.elastic.state import ObjectState, State
from horovod.torch.elastic.sampler import ElasticSampler
from horovod.torch.elastic.state import TorchState, get_handler_registry, set_handler_registry

__all__ = ["run", "run_fn", "State", "ObjectState", "TorchState", "ElasticSampler", "get_handler_registry",
           "set_handler_registry"]
