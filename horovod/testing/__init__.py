"""Test helpers shared by the project's three test tiers: ``spawn_ranks`` (``spawn``), ``fixtures`` (a ``horovodrun``
under test), an in-memory transport and network-namespace hosts (``netns``).

``spawn_ranks(fn, world_size)`` runs a function on real worker processes and returns the results by rank.
"""

__all__ = ["spawn_ranks", "SpawnError", "SpawnTimeout"]


def __getattr__(name: str):
    # Every spawned rank (`python -m horovod.testing._worker`) imports this package first; the launching side
    # (horovod.testing.spawn and the runner's launch machinery it imports, about 0.05 CPU-s) loads on first use
    # instead, in the test's process only.
    if name in __all__:
        from horovod.testing import spawn
        return getattr(spawn, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
