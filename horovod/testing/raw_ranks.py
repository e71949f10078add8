"""Ranks started by hand, each with an environment of its own, outside any launcher: what a test uses when the
launcher's fail-fast would hide the behaviour under test (the survivors of a rank that dies report on their own)."""

from __future__ import annotations

import subprocess
import sys
from typing import Callable, Dict, List, Tuple

__all__ = ["run_raw_ranks"]


def run_raw_ranks(script, size: int, env_of_rank: Callable[[int], Dict[str, str]],
                  timeout: float = 60) -> Tuple[List[int], List[str]]:
    """Start ``size`` ranks of ``script`` meeting at a rendezvous served here; returns (return codes, outputs).
    Every rank still running at ``timeout`` is killed."""
    from horovod.common.config import environ_snapshot
    from horovod.common.rendezvous_client import make_secret
    from horovod.runner.launch import package_pythonpath
    from horovod.runner.rendezvous import RendezvousServer
    secret = make_secret()
    with RendezvousServer(secret, host="127.0.0.1") as server:
        procs = []
        try:
            for rank in range(size):
                env = dict(environ_snapshot(), **package_pythonpath(), HOROVOD_RANK=str(rank), HOROVOD_SIZE=str(size),
                           HOROVOD_GLOO_RENDEZVOUS_ADDR="127.0.0.1", HOROVOD_GLOO_RENDEZVOUS_PORT=str(server.port),
                           HOROVOD_SECRET_KEY=secret.hex(), **env_of_rank(rank))
                procs.append(subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE,
                                              stderr=subprocess.STDOUT, text=True))
            outputs = [p.communicate(timeout=timeout)[0] for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
    return [p.returncode for p in procs], outputs
