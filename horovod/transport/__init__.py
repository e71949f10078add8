"""Moving bytes between the ranks of a job: the contract (``base.Transport``), authenticated sockets (``tcp``, ``mesh``,
``reactor``: the I/O thread, ``duplex``, ``patience``) and shared-memory segments within a host (``shm``).

Invariants: transports know ranks and bytes, never tensors; every call is bounded; control messages are primitives
decoded without classes, size-capped; every connection is authenticated with the job's secret.
"""

__all__: list = []
