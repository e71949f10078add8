"""The names Horovod's ``horovod.torch.mpi_ops`` and ``horovod.tensorflow.mpi_ops`` modules had besides their
collectives, for code that imports them from there: the basics (``init``, ``rank``, ``size``...), the op constants,
the process sets, Horovod's ``average``/``op`` rule and ``_basics``.

A binding's ``mpi_ops`` imports these names (and ``_basics``) from here by name; every name is the same object as
the binding's own (:mod:`horovod.runtime.binding_api`). Horovod's ``_basics`` was its ``HorovodBasics`` object; here
it is :mod:`horovod.runtime.basics`, which has the same functions and the private helpers Horovod's tests call
(``_basics._get_process_set_ids_and_ranks()``).
"""

from horovod.common.util import get_average_backwards_compatibility_fun, is_power_of_two
from horovod.runtime import basics as _basics  # noqa: F401 — Horovod's mpi_ops._basics
from horovod.runtime import collectives as _ops
from horovod.runtime.binding_api import (Adasum, Average, HorovodInternalError, HostsUpdatedInterrupt, Max, Min,
                                         ProcessSet, Product, Sum, TensorMismatchError, add_process_set, ccl_built,
                                         cross_rank, cross_size, cuda_built, ddl_built, global_process_set, gloo_built,
                                         gloo_enabled, init, is_homogeneous, is_initialized, local_rank, local_size,
                                         mpi_built, mpi_enabled, mpi_threads_supported, nccl_built, rank,
                                         remove_process_set, rocm_built, shutdown, size, start_timeline, stop_timeline)
from horovod.runtime.binding_api import __all__ as _binding_names

__all__ = list(_binding_names) + ["handle_average_backwards_compatibility", "check_num_rank_power_of_2"]

# Horovod's rule: op and average together raise; average alone maps to Average/Sum with a DeprecationWarning.
handle_average_backwards_compatibility = get_average_backwards_compatibility_fun(_ops)


check_num_rank_power_of_2 = is_power_of_two   # Horovod's name in its bindings
