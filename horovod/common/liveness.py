"""How fast a lost peer is noticed: the keepalive probe interval that follows from ``HOROVOD_LIVENESS_TIMEOUT``.

The transport sets its sockets' keepalive from it (:func:`horovod.transport.mesh.watch_liveness`), and the launcher
gives the survivors of a lost worker this long to notice and end by themselves.
"""

from __future__ import annotations

__all__ = ["probe_interval"]


def probe_interval(liveness: float) -> float:
    """Seconds between keepalive probes for a liveness timeout of ``liveness`` seconds: the ranks that lose one peer
    each learn of it within this much of each other."""
    return float(max(1, int(liveness / 10)))
