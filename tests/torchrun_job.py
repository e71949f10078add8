"""A two-rank ``torchrun`` job for tests that look at it from outside while it runs.

The job's script waits for a ``go`` file in its working folder before it finishes, so the test can inspect the running
ranks (their listeners, torch's agent store); ``go`` is written whatever the inspection did, and the job's whole
process group is killed if it outlives its bound.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Callable, Mapping, Tuple, TypeVar

import pytest

__all__ = ["run_two_ranks"]

T = TypeVar("T")


def run_two_ranks(folder, script: str, root: str, extra_env: Mapping[str, str], inspect: Callable[[], T],
                  timeout: float = 120) -> Tuple[int, str, str, T]:
    """Run ``script`` as ``job.py`` in ``folder`` under ``torchrun --nproc-per-node 2`` (``root`` on PYTHONPATH, no
    launcher variables inherited, ``extra_env`` added), call ``inspect()`` while it runs, then let it finish.

    Returns:
        (exit status, stdout, stderr, what ``inspect`` returned).
    """
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    if not os.path.exists(torchrun):
        pytest.skip("torchrun is not installed")
    (folder / "job.py").write_text(script)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "OMPI_", "PMI_", "SLURM_"))},
           "PYTHONPATH": root, **extra_env}
    proc = subprocess.Popen([torchrun, "--nproc-per-node", "2", "job.py", str(folder)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=str(folder), start_new_session=True)
    try:
        try:
            seen = inspect()
        finally:
            (folder / "go").write_text("1")
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait(10)
    return proc.returncode, out, err, seen
