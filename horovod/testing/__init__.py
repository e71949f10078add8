"""Test helpers shared by the project's three test tiers: ``spawn_ranks`` (``spawn``), ``fixtures`` (a ``horovodrun``
under test), an in-memory transport and network-namespace hosts (``netns``).

``spawn_ranks(fn, world_size)`` runs a function on real worker processes and returns the results by rank.
"""

from horovod.testing.spawn import SpawnError, SpawnTimeout, spawn_ranks

__all__ = ["spawn_ranks", "SpawnError", "SpawnTimeout"]
