"""``horovod.common.util`` as Horovod has it: build queries, a temporary-environment context manager, small helpers.

Horovod answers its build queries (``mpi_built``, ``gloo_built``, ``nccl_built``...) by loading a compiled extension in
a forked child. This package has no compiled extension: the answers are facts of this build, the same ones
``hvd.mpi_built()`` and ``horovodrun --check-build`` give. A framework binding is *available* when both its module
here (``horovod.torch``) and its framework (``torch``) can be found; that is checked with ``find_spec``, which imports
neither. The ``verbose`` arguments are accepted for compatibility and print what was checked.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import warnings
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

from horovod.common import config

__all__ = ["EXTENSIONS", "FRAMEWORK_MODULES", "module_found", "extension_available", "check_extension",
           "gpu_available", "mpi_built", "gloo_built", "nccl_built", "ddl_built", "ccl_built", "env",
           "get_average_backwards_compatibility_fun", "num_rank_is_power_2", "is_power_of_two", "split_list", "is_iterable",
           "is_version_greater_equal_than"]

EXTENSIONS = ["tensorflow", "torch", "mxnet"]
# binding (as Horovod names its extensions) -> the framework it needs; None: this package has no such binding.
FRAMEWORK_MODULES: Dict[str, Optional[str]] = {
    "tensorflow": "tensorflow", "torch": "torch", "keras": "keras", "jax": "jax", "numpy": "numpy",
    "ray": "ray", "spark": "pyspark", "mxnet": None,
}


def _cache(func: Callable) -> Callable:
    """Remember ``func``'s result for each set of arguments, for the life of the process (Horovod's ``_cache``)."""
    return functools.lru_cache(maxsize=None)(func)


def module_found(name: Optional[str]) -> bool:
    """Whether module ``name`` can be imported, found without importing it (its parent packages are imported)."""
    if not name:
        return False
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _say(verbose: bool, text: str) -> None:
    if verbose:
        print(text, flush=True)


def extension_available(ext_base_name: str, verbose: bool = False) -> bool:
    """Whether the binding ``horovod.<ext_base_name>`` can be used here: it exists and its framework is installed."""
    framework = FRAMEWORK_MODULES.get(ext_base_name)
    available = module_found(f"horovod.{ext_base_name}") and module_found(framework)
    _say(verbose, f"Extension {ext_base_name} was{'' if available else ' NOT'} built.")
    return available


def check_extension(ext_name: str, ext_env_var: str, pkg_path: str, *args: str) -> None:
    """Raise ImportError unless binding ``ext_name`` (``horovod.torch``...) is usable here, as Horovod's does.

    ``pkg_path`` and ``args`` named Horovod's compiled library; there is none here, so only the binding and its
    framework are checked. ``ext_env_var`` appears in the message, as in Horovod's.
    """
    base = ext_name.split(".")[-1]
    if not extension_available(base):
        framework = FRAMEWORK_MODULES.get(base)
        needs = f"install {framework}" if framework else "this package has no such binding"
        raise ImportError(f"Extension {ext_name} is not available: {needs} (Horovod's {ext_env_var} selects it at "
                          f"build time; this package has nothing to build)")


def gpu_available(ext_base_name: str, verbose: bool = False) -> bool:
    """False: tensors are reduced on the CPU in this version (see docs/migrating.md)."""
    _say(verbose, f"Extension {ext_base_name} was NOT running with GPU.")
    return False


def mpi_built(verbose: bool = False) -> bool:
    """False: there is no MPI controller (``mpirun``, ``srun`` and mpi4py only start and place workers)."""
    _say(verbose, "Extension was NOT built with MPI.")
    return False


def gloo_built(verbose: bool = False) -> bool:
    """True: the TCP/shared-memory controller stands in for Gloo."""
    _say(verbose, "Extension was built with Gloo.")
    return True


def nccl_built(verbose: bool = False) -> int:
    """0: no NCCL (the NCCL version number in Horovod; 0 means none)."""
    _say(verbose, "Extension was NOT built with NCCL.")
    return 0


def ddl_built(verbose: bool = False) -> bool:
    """False: no IBM DDL."""
    _say(verbose, "Extension was NOT built with DDL.")
    return False


def ccl_built(verbose: bool = False) -> bool:
    """False: no oneCCL."""
    _say(verbose, "Extension was NOT built with CCL.")
    return False


@contextlib.contextmanager
def env(**kwargs: Optional[str]) -> Iterator[None]:
    """Set environment variables for the block and restore them after it; arguments that are None are ignored."""
    values = {k: v for k, v in kwargs.items() if v is not None}
    backup = {k: config.environ_get(k) for k in values}
    for name, value in values.items():
        config.environ_set(name, value)
    try:
        yield
    finally:
        for name, value in backup.items():
            config.environ_set(name, value)


def get_average_backwards_compatibility_fun(reduce_ops: Any) -> Callable[[Any, Optional[bool]], Any]:
    """Horovod's ``op``/``average`` rule for ``reduce_ops`` (anything with ``Average`` and ``Sum``).

    The returned ``impl(op, average)``: both given → ValueError; ``average`` alone → Average or Sum, with a
    DeprecationWarning; neither → Average.
    """
    def impl(op, average):
        if op is not None:
            if average is not None:
                raise ValueError("The op parameter supersedes average. Please provide only one of them.")
            return op
        if average is not None:
            warnings.warn("Parameter `average` has been replaced with `op` and will be removed in v0.21.0",
                          DeprecationWarning)
            return reduce_ops.Average if average else reduce_ops.Sum
        return reduce_ops.Average
    return impl


def is_power_of_two(n: int) -> bool:
    """Whether ``n`` is a power of two (Adasum's rank counts need one); the one copy of the rule."""
    return n > 0 and n & (n - 1) == 0


num_rank_is_power_2 = is_power_of_two   # Horovod's name


def split_list(items: Sequence[Any], n: int) -> List[Sequence[Any]]:
    """``items`` in ``n`` consecutive chunks whose lengths differ by at most one, the longer ones first."""
    size, extra = divmod(len(items), n)
    return [items[i * size + min(i, extra):(i + 1) * size + min(i + 1, extra)] for i in range(n)]


def is_iterable(value: Any) -> bool:
    """Whether ``iter(value)`` works."""
    try:
        iter(value)
    except TypeError:
        return False
    return True


def is_version_greater_equal_than(ver: str, target: str) -> bool:
    """Whether version ``ver`` (``"2.13.0"``) is at least ``target``, comparing the numeric release parts.

    Raises:
        ValueError: either is not of the form ``X.Y.Z...`` with integers.
    """
    def parts(text: str) -> List[int]:
        release = text.split("+")[0].split("-")[0].split(".")
        if not release or not all(p.isdigit() for p in release):
            raise ValueError(f"{text!r} is not a version of the form X.Y.Z")
        return [int(p) for p in release]
    return parts(ver) >= parts(target)
