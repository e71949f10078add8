"""Backends: what starts a job's planned workers (:mod:`.base`: the contract), one module for each way: local
processes, ssh, ``mpirun``, Ray actors and Spark tasks.

* :mod:`.local`: processes of this machine;
* :mod:`.ssh`: local hosts' workers as processes, other hosts' through ssh and the remote bootstrap;
* :mod:`.mpirun`: one Open MPI ``mpirun`` that starts every rank (``horovodrun --mpi``);
* :mod:`.ray`: one Ray actor per rank, placed by a placement group (``horovod.ray``);
* :mod:`.spark`: one Spark task per rank in a barrier stage (``horovod.spark``).

Workers under ``srun`` or a user's own ``mpirun`` need no backend: they find their rank and the rendezvous from
their environment (``horovod.runtime.launch_env``). The Ray and Spark backends import their frameworks, so nothing
here imports them: ``horovod.ray`` and ``horovod.spark`` do.
"""

__all__ = ["base", "local", "ssh", "mpirun", "ray", "spark"]
