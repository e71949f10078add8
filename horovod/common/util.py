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
import os
import re
import sys
import warnings
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

from horovod.common import config

__all__ = ["EXTENSIONS", "FRAMEWORK_MODULES", "module_found", "extension_available", "check_extension",
           "gpu_available", "torch_cuda_version", "mpi_built", "gloo_built", "nccl_built", "ddl_built", "ccl_built", "env",
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


def _package_file(package: str, name: str) -> Optional[str]:
    """The text of ``name`` inside installed ``package``, found without importing it (None when absent)."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        with open(os.path.join(list(spec.submodule_search_locations)[0], name)) as f:
            return f.read()
    except OSError:
        return None


def torch_cuda_version() -> Optional[str]:
    """The CUDA version the installed torch was built with ("13.0"), or None for a CPU build or no torch: read
    from torch's own version file, so asking imports no framework."""
    loaded = sys.modules.get("torch")
    if loaded is not None and hasattr(loaded, "version"):
        return loaded.version.cuda
    text = _package_file("torch", "version.py") or ""
    found = re.search(r"^cuda(?:\s*:[^=]+)?\s*=\s*['\"]([^'\"]+)['\"]", text, re.MULTILINE)
    return found.group(1) if found else None


def _nccl_version_code() -> int:
    """NCCL's version as Horovod reports it (major * 10000 + minor * 100 + patch; 0: none), from the NCCL that a
    CUDA torch carries (its wheel, or torch itself once imported)."""
    if torch_cuda_version() is None:
        return 0
    loaded = sys.modules.get("torch")
    if loaded is not None:
        try:
            version = loaded.cuda.nccl.version()
            return version[0] * 10000 + version[1] * 100 + version[2]
        except Exception:     # a CUDA torch without NCCL: none
            return 0
    import importlib.metadata     # (here: it costs a start-up 10-20 ms of CPU, email and zipfile included)
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if name.startswith("nvidia-nccl-cu"):
            parts = [int(p) for p in re.findall(r"\d+", dist.version)[:3]] + [0, 0, 0]
            return parts[0] * 10000 + parts[1] * 100 + parts[2]
    return 0


def gpu_available(ext_base_name: str, verbose: bool = False) -> bool:
    """Whether binding ``ext_base_name``'s collectives can run on GPUs here: torch built with CUDA (its device plane
    serves torch, and JAX through DLPack); TensorFlow and JAX stage GPU tensors through the host, so theirs is
    whether their own GPU build is installed."""
    import importlib.metadata
    if ext_base_name in ("torch", "jax"):
        found = torch_cuda_version() is not None if ext_base_name == "torch" else any(
            (d.metadata["Name"] or "").lower().startswith("jax-cuda") for d in importlib.metadata.distributions())
    elif ext_base_name in ("tensorflow", "keras"):
        found = module_found("tensorflow") and not _distribution_installed("tensorflow-cpu")
    else:
        found = False
    _say(verbose, f"Extension {ext_base_name} was{'' if found else ' NOT'} running with GPU.")
    return found


def _distribution_installed(name: str) -> bool:
    import importlib.metadata
    try:
        importlib.metadata.version(name)
        return True
    except importlib.metadata.PackageNotFoundError:
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
    """The NCCL version under the device plane (a CUDA torch's), as Horovod's number; 0 means none."""
    code = _nccl_version_code()
    _say(verbose, f"Extension was{'' if code else ' NOT'} built with NCCL.")
    return code


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


def check_adasum_ranks(n: int) -> None:
    """Adasum's rule on its rank count, the one copy: the front door checks it when an allreduce is asked for, the
    algorithm where it runs.

    Raises:
        NotImplementedError: ``n`` is not a power of two (Horovod's CPU Adasum refuses it with this exception).
    """
    if not is_power_of_two(n):
        raise NotImplementedError(f"Adasum needs a power-of-two number of ranks, not {n}")


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
