"""Collective algorithms on flat numpy buffers over a transport: which one runs (``allreduce``, ``collectives``), the
ring and exchange over connections, shared memory within a host, hierarchical, Adasum, and the reductions.

Invariants: no framework is imported here and no tensor's meaning is known, only buffers, dtypes and reduce ops; every
rank of a group runs the same algorithm over the same sizes (choices read only what every rank agrees on); every rank
gets the same bits; large buffers move as memoryviews and reduce with numpy ufuncs into preallocated buffers.
"""

__all__: list = []
