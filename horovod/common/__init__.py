"""The ground floor: settings (``config``, the only reader of ``os.environ``), ``types``, ``exceptions``, what launcher
and workers share (``wire``, ``elastic_records``, ``failure_records``, ``starters``), the rendezvous store and helpers.

Invariants: nothing here imports a higher floor (:mod:`horovod.tools.floors`), but for Horovod's public paths of the
front door (``basics``, ``process_sets``, ``collectives``, ``compression``, ``topology``, ``launch_env``, ``elastic``):
small files that re-export :mod:`horovod.runtime`'s objects under Horovod's names, imported by nothing in the package.
"""
