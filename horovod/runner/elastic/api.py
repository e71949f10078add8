"""``horovod.run(func, min_np=..., host_discovery_script=...)``: an elastic job running a Python function."""

from __future__ import annotations

import sys
from typing import Any, Dict, List, Mapping, Optional, Sequence

import cloudpickle

from horovod.runner.elastic.launch import discovery_from_values, run_elastic_job, settings_from_values
from horovod.runner.processes import JobResult
from horovod.runner.run_task import FUNC_KEY, FUNC_SCOPE, RESULT_SCOPE


def run_elastic(func, args: Sequence = (), kwargs: Optional[Dict[str, Any]] = None, *, np: Optional[int] = None,
                min_np: Optional[int] = None, max_np: Optional[int] = None, slots: Optional[int] = None,
                reset_limit: Optional[int] = None, cooldown_range=None, hosts: Optional[str] = None,
                hostfile: Optional[str] = None, host_discovery_script: Optional[str] = None,
                start_timeout: Optional[float] = None, elastic_timeout: Optional[float] = None,
                executable: Optional[str] = None, extra_env: Mapping[str, str] = (),
                prefix_output_with_timestamp: bool = False) -> List[Any]:
    """Run ``func`` elastically; returns the values returned by the final round's workers, by rank.

    Raises:
        BaseException: what the first failed worker of the final round raised (see ``horovod.run``).
        RuntimeError: the job stopped (every worker failed, reset limit, too few slots), with the reason.
    """
    from horovod.runner.api import _load_outcome, raise_for_outcomes
    values = dict(np=np, min_np=min_np, max_np=max_np, slots=slots, reset_limit=reset_limit,
                  blacklist_cooldown_range=cooldown_range, hosts=hosts, hostfile=hostfile,
                  host_discovery_script=host_discovery_script, start_timeout=start_timeout,
                  elastic_timeout=elastic_timeout)
    settings = settings_from_values(values)
    payload = cloudpickle.dumps((func, tuple(args), dict(kwargs or {})))
    outcomes = {}

    def collect(store) -> None:
        for key in store.keys(RESULT_SCOPE):
            outcomes[int(key)] = _load_outcome(int(key), store.get(RESULT_SCOPE, key))

    code, message = run_elastic_job(
        (executable or sys.executable, "-m", "horovod.runner.elastic.run_task"), settings,
        discovery_from_values(values), dict(extra_env), prefix_timestamp=prefix_output_with_timestamp,
        prepare_store=lambda store: store.put(FUNC_SCOPE, FUNC_KEY, payload), finish_store=collect)
    if code != 0 and not any(o.failed for o in outcomes.values()):
        raise RuntimeError(message or f"the elastic job ended with status {code}")
    size = max(outcomes) + 1 if outcomes else 0
    return raise_for_outcomes(JobResult(()), outcomes, size)


__all__ = ["run_elastic"]
