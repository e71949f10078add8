"""The elastic driver: hosts come and go, workers fail, training goes on.

:mod:`.driver` decides (pure functions), :mod:`.job` observes and carries decisions out, :mod:`.spawner` starts
and stops workers (through the launch pipeline's backend and supervisor), :mod:`.discovery` finds hosts,
:mod:`.registry` tracks live workers. Driver and workers meet only through the rendezvous store (key names in
:mod:`horovod.common.elastic_records`).
"""

__all__ = ["api", "discovery", "driver", "job", "launch", "registry", "spawner"]
