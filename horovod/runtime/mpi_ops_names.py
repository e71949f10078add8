"""The names Horovod's ``horovod.torch.mpi_ops`` and ``horovod.tensorflow.mpi_ops`` modules had besides their
collectives, for code that imports them from there: the basics (``init``, ``rank``, ``size``...), the op constants,
the process sets, Horovod's ``average``/``op`` rule and ``_basics``.

A binding's ``mpi_ops`` does ``from horovod.runtime.mpi_ops_names import *`` (and ``_basics``); every name is the
same object as the binding's own (:mod:`horovod.runtime.binding_api`). Horovod's ``_basics`` was its ``HorovodBasics``
object; here it is :mod:`horovod.runtime.basics`, which has the same functions and the private helpers Horovod's
tests call (``_basics._get_process_set_ids_and_ranks()``).
"""

from horovod.common.util import get_average_backwards_compatibility_fun, is_power_of_two
from horovod.runtime import basics as _basics  # noqa: F401 — Horovod's mpi_ops._basics
from horovod.runtime import collectives as _ops
from horovod.runtime.binding_api import *  # noqa: F401,F403 — init, rank, size, op constants, process sets
from horovod.runtime.binding_api import __all__ as _binding_names

__all__ = list(_binding_names) + ["handle_average_backwards_compatibility", "check_num_rank_power_of_2"]

# Horovod's rule: op and average together raise; average alone maps to Average/Sum with a DeprecationWarning.
handle_average_backwards_compatibility = get_average_backwards_compatibility_fun(_ops)


check_num_rank_power_of_2 = is_power_of_two   # Horovod's name in its bindings
