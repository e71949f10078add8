"""matplotlib for the benchmarks' figures, or the reason there are none.

A figure is the last thing a benchmark makes, after minutes of measuring: without matplotlib the run still writes
its tables and says which figure it skipped and why (the scripts used to skip figures without a word, or crash).
"""

from __future__ import annotations

import sys
from typing import Any, Optional, Tuple

NO_MATPLOTLIB = "matplotlib is not installed (pip install matplotlib)"


def pyplot() -> Tuple[Optional[Any], Optional[str]]:
    """``(matplotlib.pyplot on the Agg backend, None)``, or ``(None, why)`` when matplotlib cannot be imported."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None, NO_MATPLOTLIB
    return plt, None


def say_skipped(path: str, why: str) -> str:
    """Print, on standard error, that the figure ``path`` was not drawn and why; returns ``why``."""
    print(f"figure {path} skipped: {why}", file=sys.stderr, flush=True)
    return why
