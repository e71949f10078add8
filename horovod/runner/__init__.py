"""The launcher side of Horovod: ``horovodrun`` (``cli``), ``horovod.run`` (``api``), the launch pipeline and its
backends, the rendezvous service, the supervisor, ssh, and the elastic driver (``elastic/``).

Workers never import this package; they meet the launcher through the rendezvous service and ``HOROVOD_*``
environment variables only. Names are loaded on first use, so ``python -m horovod.runner.run_task`` imports only
what a worker needs.
"""

from typing import Any

__all__ = ["run", "WorkerFailedError", "NotAvailableYetError"]


def __getattr__(name: str) -> Any:
    if name in ("run", "WorkerFailedError"):
        from horovod.runner import api
        return getattr(api, name)
    if name == "NotAvailableYetError":
        from horovod.runner.pipeline import NotAvailableYetError
        return NotAvailableYetError
    raise AttributeError(f"module 'horovod.runner' has no attribute {name!r}")
