"""Test helpers shared by the project's three test tiers (see :mod:`horovod.testing.fixtures`).

``spawn_ranks(fn, world_size)`` runs a function on real worker processes and returns the results by rank.
"""

from horovod.testing.spawn import SpawnError, SpawnTimeout, spawn_ranks

__all__ = ["spawn_ranks", "SpawnError", "SpawnTimeout"]
