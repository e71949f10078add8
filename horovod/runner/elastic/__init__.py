"""The elastic driver: hosts come and go, workers fail, training goes on.

:mod:`.driver` decides (pure functions), :mod:`.job` observes and carries decisions out, :mod:`.executor` starts
and stops worker processes, :mod:`.discovery` finds hosts, :mod:`.registry` tracks live workers. Driver and workers
meet only through the rendezvous store (key names in :mod:`horovod.elastic.protocol`).
"""
