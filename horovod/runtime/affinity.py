"""``HOROVOD_THREAD_AFFINITY`` / ``horovodrun --thread-affinity``: pin each rank's threads to its cores.

The value lists one entry per local rank, comma-separated, as in Horovod: local rank ``i`` takes entry ``i``. An entry
is a core id (``3``) or, beyond Horovod, a range of cores (``0-3``). With fewer entries than local ranks nothing is
pinned and an error is logged, as Horovod does.

Horovod pins only its C++ background thread. Here the engine's thread shares the interpreter with the training
loop, so pinning it alone buys nothing: every thread of the rank is pinned (those running when ``hvd.init()`` is
called; threads started later inherit the mask from the thread that starts them). Linux only; elsewhere a warning
says the setting is ignored.
"""

from __future__ import annotations

import logging
import os
from typing import FrozenSet, List, Optional

from horovod.common.exceptions import HorovodConfigError

__all__ = ["parse_affinity", "cores_for", "pin_process", "apply_thread_affinity"]

log = logging.getLogger("horovod.affinity")


def parse_affinity(text: str) -> List[FrozenSet[int]]:
    """The cores of each local rank's entry in ``text`` (``"0,1,2-3"`` → ``[{0}, {1}, {2, 3}]``).

    Raises:
        HorovodConfigError: an entry is not a core id or a range ``a-b`` with ``0 <= a <= b``.
    """
    entries = []
    for entry in text.split(","):
        low, sep, high = entry.strip().partition("-")
        try:
            first, last = int(low), int(high if sep else low)
        except ValueError:
            raise HorovodConfigError(f"HOROVOD_THREAD_AFFINITY={text!r}: {entry.strip()!r} is not a core id or a "
                                     f"range a-b; give one entry per local rank, e.g. 0,1,2,3") from None
        if first < 0 or last < first:
            raise HorovodConfigError(f"HOROVOD_THREAD_AFFINITY={text!r}: {entry.strip()!r} is not a valid core id "
                                     f"or range")
        entries.append(frozenset(range(first, last + 1)))
    return entries


def cores_for(text: str, local_rank: int, local_size: int) -> Optional[FrozenSet[int]]:
    """The cores of ``local_rank``, or None (logged) when ``text`` has fewer entries than ``local_size``.

    Raises:
        HorovodConfigError: ``text`` does not parse.
    """
    entries = parse_affinity(text)
    if len(entries) < local_size:
        log.error("Expected %d core ids but got %d. HOROVOD_THREAD_AFFINITY=%s; threads are not pinned",
                  local_size, len(entries), text)
        return None
    return entries[local_rank]


def pin_process(cores: FrozenSet[int]) -> List[int]:
    """Pin every thread of this process to ``cores``; returns the thread ids pinned.

    Raises:
        HorovodConfigError: a core is not available to this process.
    """
    allowed = os.sched_getaffinity(0)
    if not cores <= allowed:
        raise HorovodConfigError(f"HOROVOD_THREAD_AFFINITY names cores {sorted(cores - allowed)} that this process "
                                 f"may not use; available: {sorted(allowed)}")
    pinned = []
    for tid in sorted(int(t) for t in os.listdir("/proc/self/task")):
        try:
            os.sched_setaffinity(tid, cores)
            pinned.append(tid)
        except ProcessLookupError:
            pass  # the thread ended meanwhile
    return pinned


def apply_thread_affinity(text: Optional[str], local_rank: int, local_size: int) -> Optional[FrozenSet[int]]:
    """Pin this rank's threads as ``text`` (``HOROVOD_THREAD_AFFINITY``) says; returns the cores, or None.

    Raises:
        HorovodConfigError: ``text`` does not parse or names cores this process may not use.
    """
    if not text:
        return None
    if not hasattr(os, "sched_setaffinity") or not os.path.isdir("/proc/self/task"):
        log.warning("HOROVOD_THREAD_AFFINITY is ignored: this platform has no sched_setaffinity")
        return None
    cores = cores_for(text, local_rank, local_size)
    if cores is None:
        return None
    pinned = pin_process(cores)
    log.info("Background thread affinity: local rank %d pinned to cores %s (%d threads)", local_rank,
             ",".join(map(str, sorted(cores))), len(pinned))
    return cores
