"""The collective engine, one loop per process: ``engine``, ``negotiation/``, the pure ``coordinator`` and its ``decision``
records, ``validation``, ``fusion``, ``execution``, ``handles``, ``response_cache``, ``set_state`` and ``bootstrap``.

Invariants: every collective is negotiated by name and ranks may submit in any order; every rank runs the same
negotiations and collectives in the same order, so one connection per rank pair carries everything; every wait is
bounded or watches liveness, and a lost peer fails every pending handle with ``HorovodInternalError``. The core reads
no environment (settings come as a ``Config``) and imports only ``common``, ``transport`` and ``algorithms``.
"""

__all__: list = []
