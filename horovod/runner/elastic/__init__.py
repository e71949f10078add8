"""The elastic driver: hosts come and go, workers fail, training goes on. It holds the pure decisions (``driver``),
the job that carries them out (``job``), the ``spawner``, host ``discovery`` and the ``registry`` of workers.

:mod:`.driver` decides (pure functions), :mod:`.job` observes and carries decisions out, :mod:`.spawner` starts
and stops workers (through the launch pipeline's backend and supervisor), :mod:`.discovery` finds hosts,
:mod:`.registry` tracks live workers. Driver and workers meet only through the rendezvous store (key names in
:mod:`horovod.common.elastic_records`).
"""

__all__ = ["api", "discovery", "driver", "job", "launch", "registry", "spawner"]
