"""The launcher's view of the rendezvous service; the server itself lives in :mod:`horovod.common.rendezvous_server`
because rank 0 of a job started by ``mpirun`` or ``srun`` serves it too, and workers never import the runner."""

from horovod.common.rendezvous_server import KVStore, RendezvousServer

__all__ = ["KVStore", "RendezvousServer"]
