"""Backends: what starts a job's planned workers (see :mod:`.base` for the contract).

* :mod:`.local`: processes of this machine;
* :mod:`.ssh`: local hosts' workers as processes, other hosts' through ssh and the remote bootstrap;
* :mod:`.mpirun`: one Open MPI ``mpirun`` that starts every rank (``horovodrun --mpi``).

Workers under ``srun`` or a user's own ``mpirun`` need no backend: they find their rank and the rendezvous from
their environment (``horovod.runtime.launch_env``). Ray and Spark backends live with those integrations and
implement :class:`.base.Backend`.
"""

__all__ = ["base", "local", "ssh", "mpirun"]
