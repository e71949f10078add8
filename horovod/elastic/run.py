"""The reset-and-retry loop of elastic training (``hvd.elastic.run``)."""

from __future__ import annotations

import functools
from typing import Callable

from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt
from horovod.runtime import basics


def run_fn(func: Callable, reset: Callable[[], None]) -> Callable:
    """Wrap ``func(state, *args, **kwargs)`` so that it survives failures and membership changes.

    Before each attempt the state is synced from rank 0 (skipped after a removal-only host update, where every
    rank's state is the one just committed). A failed collective (:class:`HorovodInternalError`) restores the last
    commit; a host update (:class:`HostsUpdatedInterrupt`) keeps the state as committed. Either way ``reset()``
    re-initialises Horovod with the driver's new membership and the state's reset callbacks run.

    Args:
        func: the training function; its first argument is a :class:`~horovod.elastic.state.State`.
        reset: re-initialises Horovod (shutdown, then init).
    """
    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        skip_sync = False
        while True:
            try:
                if not skip_sync:
                    state.sync()
                return func(state, *args, **kwargs)
            except HorovodInternalError:
                state.restore()
                skip_sync = False
            except HostsUpdatedInterrupt as exc:
                skip_sync = exc.skip_sync
            reset()
            state.on_reset()
    return wrapper


def reset_horovod() -> None:
    """Shut Horovod down and initialise it again. A round that breaks before it starts (a peer of the new round died
    while connecting) is followed by the driver's next one inside ``init`` itself (the one copy of that retry)."""
    basics.shutdown()
    basics.init()


def run(func: Callable) -> Callable:
    """``@hvd.elastic.run``: :func:`run_fn` with Horovod's own reset (any binding)."""
    return run_fn(func, reset_horovod)


__all__ = ["run_fn", "run", "reset_horovod"]
