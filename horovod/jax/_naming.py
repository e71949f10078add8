"""Names of collectives submitted from inside JAX transformations, the same on every rank.

Eagerly, an unnamed collective is numbered in submission order, as in Horovod. A traced one (inside ``jax.jit``,
``jax.grad``, ``jax.vmap``) runs later, on XLA's thread, possibly interleaved with eager ones, so submission order is
no name: it is named when traced, after its **call site** (the file and line of the first caller outside Horovod and
JAX) and how many collectives that site already issued in the same trace. Every rank traces the same program alike,
so the names agree without any rank depending on another's order, and a compiled function submits the same names at
every call, which keeps the engine's response cache warm.
"""

from __future__ import annotations

import os
import sys
from typing import Tuple

from horovod.jax._job import job

try:    # the current trace: public API offers no handle on it; without it, names are per site only
    from jax._src import core as _jax_core
except ImportError:  # pragma: no cover - a JAX that moved its internals
    _jax_core = None

_SKIP_DIRS = tuple(os.path.dirname(os.path.abspath(m.__file__)) + os.sep
                   for m in (sys.modules["jax"], sys.modules["horovod"]) if getattr(m, "__file__", None))
_SKIP_FILES = ("functools.py", "contextlib.py")


def _current_trace():
    if _jax_core is None:
        return None
    try:
        return _jax_core.trace_ctx.trace
    except AttributeError:  # pragma: no cover
        return None


def tracing() -> bool:
    """Whether a JAX transformation is tracing right now (so a collective must run when the program runs)."""
    trace = _current_trace()
    return trace is not None and type(trace).__name__ != "EvalTrace"


def _outermost_trace(trace):
    while True:
        parent = getattr(trace, "parent_trace", None)
        if parent is None or type(parent).__name__ == "EvalTrace":
            return trace
        trace = parent


def call_site() -> Tuple[str, int]:
    """``(file name, line)`` of the innermost caller outside Horovod, JAX and functools."""
    frame = sys._getframe(1)
    while frame is not None:
        path = frame.f_code.co_filename
        if not path.startswith(_SKIP_DIRS) and not path.endswith(_SKIP_FILES):
            return os.path.basename(path), frame.f_lineno
        frame = frame.f_back
    return "unknown", 0


def traced_name() -> str:
    """A name for a collective being traced: ``jit.<file>:<line>.<k>``, k counting that site in this trace."""
    file, line = call_site()
    site = f"{file}:{line}"
    trace = _current_trace()
    if trace is None:
        return f"jit.{site}"
    counts = job().trace_counts.setdefault(_outermost_trace(trace), {})     # (the job's: see horovod.jax._job)
    k = counts.get(site, 0)
    counts[site] = k + 1
    return f"jit.{site}.{k}"


__all__ = ["tracing", "call_site", "traced_name"]
