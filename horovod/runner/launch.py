"""``horovod.runner.launch`` as Horovod has it: ``run_commandline()`` (what ``horovodrun`` runs), ``parse_args()``
and ``python -m horovod.runner.launch``.

The launch pipeline itself lives in :mod:`horovod.runner.pipeline`; its names are re-exported here because code
written against this package's earlier layout imports them from this module.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from horovod.runner.cli import main, make_parser
from horovod.runner.pipeline import (LAUNCHER_VARS, SLOT_VARS, LaunchConfig, NotAvailableYetError, job_env,
                                     launch_local, package_pythonpath, plan_launches, run_job, slot_env,
                                     without_launcher_vars, worker_env)
from horovod.runner.pipeline import __all__ as _pipeline_names

__all__ = ["run_commandline", "parse_args"] + list(_pipeline_names)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """``horovodrun``'s arguments (default: ``sys.argv[1:]``); a usage error exits with status 2."""
    return make_parser().parse_args(argv)


def run_commandline(argv: Optional[Sequence[str]] = None) -> None:
    """Run ``horovodrun`` with ``argv`` (default: ``sys.argv[1:]``), as Horovod's entry point does.

    Returns normally when every worker succeeded; otherwise exits with ``horovodrun``'s status
    (see :func:`horovod.runner.cli.main`).
    """
    status = main(argv)
    if status:
        sys.exit(status)


if __name__ == "__main__":
    run_commandline()
