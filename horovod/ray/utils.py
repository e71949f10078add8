"""What every Ray job of Horovod's needs from the driver: the settings it passes on, and where workers reach it."""

from __future__ import annotations

from typing import Any, Dict, Iterable, Mapping, Optional, Union

import ray

from horovod.common import config
from horovod.runner.noise import QUIET_DEFAULTS

__all__ = ["settings_env", "job_extra_env", "driver_address"]


def settings_env() -> Dict[str, str]:
    """The driver's own ``HOROVOD_*`` settings (``HOROVOD_FUSION_THRESHOLD``...), for every worker: a Ray actor does not
    inherit the driver's environment. The launcher's per-worker variables are replaced by
    :func:`horovod.runner.pipeline.worker_env`; ``HOROVOD_ELASTIC`` is the job's to decide. The driver's
    ``TF_CPP_MIN_LOG_LEVEL``, if set, goes too: the launchers' quiet default yields to it, as under ``horovodrun``
    (:func:`horovod.runner.noise.quiet_defaults`)."""
    return {k: v for k, v in config.environ_snapshot().items()
            if (k in config.SETTINGS_BY_ENV and k != "HOROVOD_ELASTIC") or k in QUIET_DEFAULTS}


def job_extra_env(timeout_s: Optional[float], nics: Optional[Union[str, Iterable[str]]],
                  extra: Optional[Mapping[str, Any]]) -> Dict[str, str]:
    """Variables for every worker of a job: the start timeout, the data-plane interfaces and the caller's own."""
    env: Dict[str, str] = {}
    if timeout_s is not None:
        env["HOROVOD_START_TIMEOUT"] = repr(float(timeout_s))
    if nics:
        env["HOROVOD_GLOO_IFACE"] = nics if isinstance(nics, str) else ",".join(sorted(nics))
    env.update({str(k): str(v) for k, v in (extra or {}).items()})
    return env


def driver_address() -> str:
    """The address of the driver's Ray node: where every worker of the cluster reaches the rendezvous."""
    return ray.util.get_node_ip_address()
