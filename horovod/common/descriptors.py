"""Open-file limits: raised where the kernel lets us, and named in every error that running out of them causes.

Every process of a job that listens (the launcher's rendezvous store, each rank's data port and Unix socket) can be
handed more connections than its soft limit of open files allows by anyone who can dial it: at the common soft
limit of 1,024 a thousand idle connections are enough. So each such process raises its soft limit to the hard one
(the kernel lets any process do that), keeps a reserve below it for its own files and pipes, and when it still
runs out says so in words that name descriptors, the limits and the fix -- never "the workers did not register".
"""

from __future__ import annotations

import resource
from typing import Tuple

__all__ = ["raise_descriptor_limit", "limits", "reserve", "exhausted_message"]

_CEILING = 1 << 20      # what "unlimited" is raised to: the kernel's usual nr_open


def limits() -> Tuple[int, int]:
    """The soft and hard open-file limits in force (an infinite hard limit as :data:`_CEILING`)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = _CEILING
    if soft == resource.RLIM_INFINITY:
        soft = hard
    return soft, hard


def raise_descriptor_limit() -> int:
    """Raise this process's soft open-file limit to its hard limit; returns the soft limit in force.

    A rank holds a socket per peer it talks to; the launcher's store a socket per worker registering at once, and
    per stranger holding a connection. Neither should stop at a default meant for interactive shells.
    """
    soft, hard = limits()
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
            return hard
        except (OSError, ValueError):
            pass
    return soft


def reserve(soft: int) -> int:
    """Descriptors a listener leaves the rest of its process (pipes to workers, log files, threads' sockets): an
    eighth of the limit, at least 64."""
    return max(64, soft // 8)


def exhausted_message(who: str, what: str) -> str:
    """The error for ``who`` (``"the launcher's rendezvous store"``, ``"rank 3"``) that could not ``what``."""
    soft, hard = limits()
    return (f"{who} cannot {what}: it ran out of file descriptors (its limit is {soft} open files, hard limit "
            f"{hard}); something holds that many connections or files open. Raise the limit before starting the "
            f"job (ulimit -n, or LimitNOFILE= for a systemd service; the hard limit needs root: "
            f"/etc/security/limits.conf)")
