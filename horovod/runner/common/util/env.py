"""``horovod.runner.common.util.env`` as Horovod has it: which variables a launcher passes on, and the rank and size
a process was started with."""

from __future__ import annotations

import re
from typing import Tuple

from horovod.common import config
from horovod.common.config import LOG_LEVELS
from horovod.runner.common.util import secret

__all__ = ["LOG_LEVEL_STR", "IGNORE_REGEXES", "KUBEFLOW_MPI_EXEC", "is_exportable", "get_env_rank_and_size",
           "is_kubeflow_mpi"]

LOG_LEVEL_STR = list(reversed(LOG_LEVELS))
# Variables a launcher never passes on to workers (regular expressions, as in Horovod).
IGNORE_REGEXES = {"BASH_FUNC_.*", "OLDPWD", ".*CUDA_VISIBLE_DEVICES", secret.HOROVOD_SECRET_KEY}
KUBEFLOW_MPI_EXEC = "/etc/mpi/kubexec.sh"


def is_exportable(name: str) -> bool:
    """Whether variable ``name`` may be passed on to workers."""
    return not any(re.match(pattern, name) for pattern in IGNORE_REGEXES)


def get_env_rank_and_size() -> Tuple[int, int]:
    """``(rank, size)`` from ``HOROVOD_RANK/SIZE``, else ``OMPI_COMM_WORLD_RANK/SIZE``, else ``PMI_RANK/SIZE``;
    ``(0, 1)`` when none is set.

    Raises:
        RuntimeError: only one of a pair is set.
    """
    for rank_var, size_var in (("HOROVOD_RANK", "HOROVOD_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                               ("PMI_RANK", "PMI_SIZE")):
        rank, size = config.environ_get(rank_var), config.environ_get(size_var)
        if rank is not None and size is not None:
            return int(rank), int(size)
        if rank is not None or size is not None:
            raise RuntimeError(f"Could not determine process rank and size: only one of {rank_var} and {size_var} "
                               f"found in environment")
    return 0, 1


def is_kubeflow_mpi() -> bool:
    """Whether Open MPI starts its remote processes with the Kubeflow MPI operator's ``kubexec.sh``."""
    return config.environ_get("OMPI_MCA_plm_rsh_agent") == KUBEFLOW_MPI_EXEC
