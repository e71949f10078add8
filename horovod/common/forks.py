"""Whether this process is a fork of the one that may own the job's connections (a data-loader worker, say).

A forked child shares its parent's sockets and engine state; it must neither use them nor shut them down. Importing
this module registers the one ``os.register_at_fork`` hook that notices.
"""

from __future__ import annotations

import os

__all__ = ["FORKED", "forked"]

FORKED = [False]   # a list, so a check in a hot path reads ``FORKED[0]`` without a call


def _after_fork_in_child() -> None:
    FORKED[0] = True


os.register_at_fork(after_in_child=_after_fork_in_child)


def forked() -> bool:
    """Whether this process was forked from the one that may own the job's connections (they are not its own)."""
    return FORKED[0]
