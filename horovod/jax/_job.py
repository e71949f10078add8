"""The JAX binding's per-job state, held by the live context (:meth:`horovod.runtime.context.Context.binding`).

``init`` starts it afresh and ``shutdown`` drops it, so nothing of a broken elastic round (a parked handle, a trace's
counts, a host callback's error) reaches the next one.
"""

from __future__ import annotations

import threading
import weakref
from typing import Dict, Optional, Tuple

from horovod.runtime import context

__all__ = ["JaxJob", "job", "job_if_initialized"]


class JaxJob:
    """What the JAX binding holds between ``init`` and ``shutdown``."""

    def __init__(self):
        self.pending: Dict[int, Tuple[object, object]] = {}     # asynchronous ops in jax.jit: id -> (Spec, handle)
        self.lock = threading.Lock()                            # guards ``pending``
        # the outermost trace -> {call site: collectives it named}, for names agreed without submission order
        self.trace_counts: "weakref.WeakKeyDictionary[object, Dict[str, int]]" = weakref.WeakKeyDictionary()
        self.last_error: Optional[BaseException] = None        # the latest Horovod error a host callback raised


def job() -> JaxJob:
    """This job's JAX state.

    Raises:
        ValueError: Horovod is not initialized.
    """
    return context.current().binding("jax", JaxJob)


def job_if_initialized() -> Optional[JaxJob]:
    """This job's JAX state, or None between jobs."""
    ctx = context.get()
    return None if ctx is None else ctx.binding("jax", JaxJob)
