"""Training state that survives a reset: commit it, restore it after a failure, sync it to new workers.

A :class:`State` lives in every worker. ``commit()`` saves a copy (the point training resumes from after a failure)
and then checks, on every rank at the same point, whether the driver changed the job's hosts. ``restore()`` goes
back to the last commit; ``sync()`` makes every rank's state equal to rank 0's, which the driver always gives to a
worker of the previous round, so new workers receive the state of a survivor.

Saved copies are deep copies: a list mutated after a commit must not change the committed value, or ranks would
disagree after a reset.
"""

from __future__ import annotations

import copy
import queue
from typing import Any, Callable, Dict, Iterable, List

from horovod.common.exceptions import HostsUpdatedInterrupt
from horovod.common.elastic_records import HostUpdateResult
from horovod.runtime.elastic_worker import poll_host_update


class State:
    """Base of every elastic state: host-update checks and reset callbacks; subclasses save, restore and sync.

    Args:
        bcast_object: ``f(obj) -> obj`` broadcasting a picklable object from rank 0.
        get_rank: ``f() -> int``, this worker's rank.
    """

    def __init__(self, bcast_object: Callable[[Any], Any], get_rank: Callable[[], int]):
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._host_messages: "queue.Queue" = queue.Queue()
        self._last_updated_timestamp = 0
        self._reset_callbacks: List[Callable[[], None]] = []

    def register_reset_callbacks(self, callbacks: Iterable[Callable[[], None]]) -> None:
        """Call each of ``callbacks`` after every reset (e.g. to scale the learning rate with the new size)."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        """Called by ``hvd.elastic.run`` after Horovod was re-initialised with the new membership."""
        self._host_messages = queue.Queue()
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def on_hosts_updated(self, timestamp: int, update_res: int) -> None:
        """Record a host update (rank 0 hears of them from the driver)."""
        self._host_messages.put((timestamp, update_res))

    def commit(self) -> None:
        """Save the state, then raise :class:`HostsUpdatedInterrupt` on every rank if the hosts changed.

        Raises:
            HostsUpdatedInterrupt: hosts were added or removed since this round began.
            HorovodInternalError: a peer failed during the check.
        """
        self.save()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Agree with every rank on whether the hosts changed; raise :class:`HostsUpdatedInterrupt` if they did.

        Rank 0 asks the rendezvous (one bounded request) and broadcasts what it learnt, so every rank raises at the
        same commit.
        """
        if self._rank() == 0:
            update = poll_host_update()
            if update is not None and update[0] > self._last_updated_timestamp:
                self.on_hosts_updated(*update)
        prev_timestamp = last_timestamp = self._last_updated_timestamp
        all_update = HostUpdateResult.no_update
        while not self._host_messages.empty():
            timestamp, update_res = self._host_messages.get()
            if timestamp > last_timestamp:
                last_timestamp = timestamp
                all_update |= update_res
        prev_timestamp, last_timestamp, all_update = self._bcast_object(
            (prev_timestamp, last_timestamp, int(all_update)))
        self._last_updated_timestamp = last_timestamp
        if last_timestamp > prev_timestamp:
            raise HostsUpdatedInterrupt(all_update == HostUpdateResult.removed)

    def save(self) -> None:
        """Save a copy of the state (the point to restore after a failure)."""
        raise NotImplementedError

    def restore(self) -> None:
        """Go back to the last saved copy."""
        raise NotImplementedError

    def sync(self) -> None:
        """Make every rank's state equal to rank 0's."""
        raise NotImplementedError

    def reset(self) -> None:
        """Adapt to the new membership (called after re-initialisation); nothing by default."""


class ObjectState(State):
    """A state of picklable attributes: ``ObjectState(bcast_object, get_rank, epoch=0, batch=0)``.

    The keyword arguments become attributes; ``save`` deep-copies them, ``restore`` sets them back, ``sync``
    broadcasts rank 0's saved values.
    """

    def __init__(self, bcast_object: Callable[[Any], Any], get_rank: Callable[[], int], **kwargs: Any):
        self._saved_state: Dict[str, Any] = kwargs
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)
        self.save()

    def save(self) -> None:
        """Keep a deep copy of every attribute given at construction (the commit point)."""
        self._saved_state = {attr: copy.deepcopy(getattr(self, attr)) for attr in self._saved_state}

    def restore(self) -> None:
        """Set the attributes back to their last saved values."""
        self._set_attrs()

    def sync(self) -> None:
        """Take rank 0's saved values (a broadcast) and set the attributes to them."""
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self) -> None:
        for attr, value in self._saved_state.items():
            setattr(self, attr, copy.deepcopy(value))


__all__ = ["State", "ObjectState"]
