"""Who started this process: ``torchrun``, ``mpirun`` (Open MPI, or MPICH/Intel MPI through PMI), Slurm's ``srun``,
or torch's ``env://`` variables set by hand, read from the variables each starter sets (:func:`detect`).

Pure: a mapping of variables in, an :class:`ExternalSlot` out. The launcher (``horovod.run(use_mpi=True)``'s
worker task) and the worker's front door (:mod:`horovod.runtime.launch_env`) both ask it.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Optional

from horovod.common.exceptions import HorovodConfigError

__all__ = ["ExternalSlot", "detect", "env_int", "TORCHRUN", "TORCH_STYLE", "MPI_STARTERS"]

TORCHRUN = "torchrun"
TORCH_STYLE = "RANK/WORLD_SIZE/MASTER_ADDR (torch env:// style)"
MPI_STARTERS = ("mpirun (Open MPI)", "mpirun (PMI)", "srun (Slurm)")

# Slurm's batch step (the sbatch script itself) and its other pseudo-steps have ids at the top of the 32-bit range;
# only a task step (srun) starts the job's workers.
_SLURM_PSEUDO_STEPS = 0xFFFFFFF0


@dataclasses.dataclass(frozen=True)
class ExternalSlot:
    """What the starter tells a worker: who started it, its rank, the job's size, its node and the job's id."""

    starter: str
    rank: int
    size: int
    node: Optional[str] = None
    job_id: str = ""


def env_int(env: Mapping[str, str], name: str) -> int:
    """The integer in variable ``name`` of ``env``.

    Raises:
        HorovodConfigError: it does not parse.
    """
    try:
        return int(env[name].strip())
    except ValueError:
        raise HorovodConfigError(f"{name}={env[name]!r} is not an integer") from None


def detect(env: Mapping[str, str]) -> Optional[ExternalSlot]:
    """The slot given by ``mpirun`` or ``srun`` variables in ``env``, or None if neither started this process.

    ``torchrun``'s ``RANK``/``WORLD_SIZE`` (with ``TORCHELASTIC_RUN_ID``) come first: torchrun's children inherit
    the variables of whatever started torchrun. Then Open MPI's ``OMPI_COMM_WORLD_RANK``/``SIZE`` win over PMI's
    ``PMI_RANK``/``PMI_SIZE``, which win over Slurm's ``SLURM_PROCID`` and ``SLURM_STEP_NUM_TASKS`` (or
    ``SLURM_NTASKS``), so ``mpirun`` inside a Slurm allocation is seen as ``mpirun``. Slurm counts only inside a task
    step (``SLURM_STEP_ID`` set and not the batch script). Last, ``RANK``/``WORLD_SIZE`` with
    ``MASTER_ADDR``/``MASTER_PORT`` set by hand (torch's env:// convention).

    Raises:
        HorovodConfigError: a variable does not parse, or the rank is outside the size.
    """
    slot = None
    if "TORCHELASTIC_RUN_ID" in env and "RANK" in env and "WORLD_SIZE" in env:
        slot = ExternalSlot(TORCHRUN, env_int(env, "RANK"), env_int(env, "WORLD_SIZE"),
                            job_id=f"{env['TORCHELASTIC_RUN_ID']}.{env.get('TORCHELASTIC_RESTART_COUNT', '0')}")
    elif "OMPI_COMM_WORLD_RANK" in env and "OMPI_COMM_WORLD_SIZE" in env:
        slot = ExternalSlot("mpirun (Open MPI)", env_int(env, "OMPI_COMM_WORLD_RANK"),
                            env_int(env, "OMPI_COMM_WORLD_SIZE"), job_id=env.get("OMPI_MCA_ess_base_jobid", env.get("OMPI_MCA_orte_hnp_uri", "")))
    elif "PMI_RANK" in env and "PMI_SIZE" in env:
        slot = ExternalSlot("mpirun (PMI)", env_int(env, "PMI_RANK"), env_int(env, "PMI_SIZE"),
                            job_id=env.get("PMI_KVSNAME", env.get("PMI_ID", "")))
    elif "SLURM_PROCID" in env and _slurm_task_step(env):
        tasks = "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in env else "SLURM_NTASKS"
        if tasks not in env:
            raise HorovodConfigError("SLURM_PROCID is set but neither SLURM_STEP_NUM_TASKS nor SLURM_NTASKS is")
        node = env.get("SLURMD_NODENAME") or (f"slurm-node-{env['SLURM_NODEID']}" if "SLURM_NODEID" in env else None)
        slot = ExternalSlot("srun (Slurm)", env_int(env, "SLURM_PROCID"), env_int(env, tasks), node,
                            job_id=f"{env.get('SLURM_JOB_ID', '')}.{env.get('SLURM_STEP_ID', '')}")
    elif all(name in env for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")):
        slot = ExternalSlot(TORCH_STYLE, env_int(env, "RANK"), env_int(env, "WORLD_SIZE"),
                            job_id=f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}")
    if slot is not None and not 0 <= slot.rank < slot.size:
        raise HorovodConfigError(f"{slot.starter} gave rank {slot.rank} outside 0..{slot.size - 1}")
    return slot


def _slurm_task_step(env: Mapping[str, str]) -> bool:
    step = env.get("SLURM_STEP_ID", env.get("SLURM_STEPID"))
    if step is None:
        return False
    try:
        return int(step) < _SLURM_PSEUDO_STEPS
    except ValueError:
        return False  # "batch", "extern", "interactive"
