"""``horovodrun --check-build``: which frameworks, controllers and tensor operations this installation offers."""

from __future__ import annotations

import importlib.util
from typing import Callable, Optional, Sequence, Tuple

# (label, importable module) — found with find_spec so that checking never imports a heavy framework.
_FRAMEWORKS = (("TensorFlow", "tensorflow"), ("PyTorch", "torch"), ("JAX", "jax"), ("MXNet", None))
_CONTROLLERS = (("MPI", False), ("Gloo (TCP)", True))
_OPERATIONS = (("NCCL", False), ("DDL", False), ("CCL", False), ("MPI", False), ("Gloo (TCP)", True),
               ("Shared memory", True))


def _importable(module: Optional[str]) -> bool:
    if module is None:
        return False
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _block(title: str, rows: Sequence[Tuple[str, bool]]) -> str:
    return f"Available {title}:\n" + "\n".join(f"    [{'X' if ok else ' '}] {name}" for name, ok in rows)


def check_build_text(version: str, importable: Callable[[Optional[str]], bool] = _importable) -> str:
    """The ``--check-build`` report, in Horovod's layout.

    Args:
        version: the package version to show.
        importable: tells whether a module can be imported (a parameter for tests).
    """
    frameworks = [(name, importable(module)) for name, module in _FRAMEWORKS]
    return "\n\n".join([f"Horovod v{version}:", _block("Frameworks", frameworks),
                        _block("Controllers", _CONTROLLERS), _block("Tensor Operations", _OPERATIONS)]) + "\n"


__all__ = ["check_build_text"]
