"""Moving bytes between the ranks of a job: the contract (``base.Transport``), authenticated sockets (``tcp``),
shared-memory segments within a host (``shm``), and the control-message codec (``wire``).

Invariants: transports know ranks and bytes, never tensors; every call is bounded; control messages are primitives
decoded without classes, size-capped; every connection is authenticated with the job's secret.
"""

__all__: list = []
