"""``horovodrun --check-build``: which frameworks, integrations, controllers and tensor operations this installation
really offers.

A framework or integration is marked only when this package's module for it and the third-party package it needs
are both present (``horovod.torch`` and ``torch``; ``horovod.ray`` and ``ray``), found with ``find_spec`` so that
checking imports no framework. The controller and operation rows are the build facts of
:mod:`horovod.common.util`, the same answers ``hvd.mpi_built()`` and ``hvd.nccl_built()`` give.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence, Tuple

from horovod.common import util

__all__ = ["FRAMEWORKS", "INTEGRATIONS", "check_build_text", "binding_available"]

# (label, binding under horovod., third-party module); a None binding is never available here.
FRAMEWORKS = (("TensorFlow", "tensorflow", "tensorflow"), ("PyTorch", "torch", "torch"), ("MXNet", None, "mxnet"),
              ("JAX", "jax", "jax"))
INTEGRATIONS = (("Ray", "ray", "ray"), ("Spark", "spark", "pyspark"))


def binding_available(binding: Optional[str], module: Optional[str],
                      found: Callable[[Optional[str]], bool] = util.module_found) -> bool:
    """Whether ``horovod.<binding>`` and ``module`` can both be imported (``found`` tells for one module)."""
    return binding is not None and found(f"horovod.{binding}") and found(module)


def _block(title: str, rows: Sequence[Tuple[str, bool]]) -> str:
    return f"Available {title}:\n" + "\n".join(f"    [{'X' if ok else ' '}] {name}" for name, ok in rows)


def check_build_text(version: str, found: Callable[[Optional[str]], bool] = util.module_found) -> str:
    """The ``--check-build`` report, in Horovod's layout (plus JAX and the integrations).

    Args:
        version: the package version to show.
        found: tells whether a module can be imported (a parameter for tests).
    """
    frameworks = [(name, binding_available(b, m, found)) for name, b, m in FRAMEWORKS]
    integrations = [(name, binding_available(b, m, found)) for name, b, m in INTEGRATIONS]
    gloo = util.gloo_built()
    controllers = [("MPI", util.mpi_built()), ("Gloo (TCP)", gloo)]
    operations = [("NCCL", bool(util.nccl_built())), ("DDL", util.ddl_built()), ("CCL", util.ccl_built()),
                  ("MPI", util.mpi_built()), ("Gloo (TCP)", gloo), ("Shared memory", gloo)]
    return "\n\n".join([f"Horovod v{version}:", _block("Frameworks", frameworks),
                        _block("Integrations", integrations), _block("Controllers", controllers),
                        _block("Tensor Operations", operations)]) + "\n"
