"""JAX arrays <-> the numpy buffers the engine works on, and pytrees <-> flat lists of leaves.

A CPU ``jax.Array`` is read through ``np.asarray`` (zero-copy where JAX allows; the engine only reads its inputs).
bfloat16, which numpy lacks, travels as its raw ``uint16`` words with ``dtype="bfloat16"``, as in the torch binding.
Results come back as jax arrays of the input's dtype.
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from horovod.common.types import dtype_name

_BF16 = np.dtype(jnp.bfloat16)


def core_dtype(dtype) -> Optional[str]:
    """The dtype name to hand the engine for arrays of ``dtype``: ``"bfloat16"``, or None when numpy's own name is
    right.

    Raises:
        ValueError: a dtype the engine cannot reduce or move (complex, uint32, 8-bit floats...).
    """
    dtype = np.dtype(dtype)
    if dtype == _BF16:
        return "bfloat16"
    dtype_name(np.empty(0, dtype))   # raises ValueError naming the supported types
    return None


def to_core(array) -> Tuple[np.ndarray, Optional[str]]:
    """A host array the engine can take for ``array`` (a jax or numpy array), and the dtype name to give with it."""
    host = np.asarray(array)
    if host.dtype == _BF16:
        return host.view(np.uint16), "bfloat16"
    return host, core_dtype(host.dtype)


def from_core(array: np.ndarray, dtype) -> np.ndarray:
    """The engine's result viewed in ``dtype`` again (bfloat16 from its words)."""
    dtype = np.dtype(dtype)
    if dtype == _BF16:
        return np.asarray(array).view(_BF16)
    return np.asarray(array, dtype=dtype)


def to_jax(array: np.ndarray, dtype) -> jax.Array:
    """A jax array holding the engine's result, in ``dtype``."""
    return jnp.asarray(from_core(array, dtype))


def flatten(tree) -> Tuple[List[Any], Any]:
    """``(leaves, treedef)`` of a pytree (None leaves are dropped, as ``jax.tree`` does)."""
    return jax.tree_util.tree_flatten(tree)


def unflatten(treedef, leaves) -> Any:
    """The pytree ``treedef`` with ``leaves``."""
    return jax.tree_util.tree_unflatten(treedef, list(leaves))


def is_tracer(x) -> bool:
    """Whether ``x`` is an abstract value of a JAX transformation (jit, grad, vmap)."""
    return isinstance(x, jax.core.Tracer)


__all__ = ["core_dtype", "to_core", "from_core", "to_jax", "flatten", "unflatten", "is_tracer"]
