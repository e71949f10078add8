"""``horovod.run(func, min_np=..., host_discovery_script=...)``: an elastic job running a Python function."""

from __future__ import annotations

import sys
from typing import Any, List, Mapping

from horovod.runner.elastic.launch import discovery_from_values, run_elastic_job, settings_from_values
from horovod.runner.network import parse_nics
from horovod.runner.outcomes import FunctionExchange, raise_for_outcomes
from horovod.runner.ssh import ssh_config
from horovod.runner.supervisor import JobResult

__all__ = ["run_elastic"]


def run_elastic(exchange: FunctionExchange, values: Mapping[str, Any], extra_env: Mapping[str, str] = ()
                ) -> List[Any]:
    """Run the function of ``exchange`` elastically; returns the values returned by the final round's workers.

    Args:
        exchange: the function and, after the job, the outcomes.
        values: the job's options by ``horovodrun`` destination (``np``, ``min_np``, ``max_np``, ``slots``,
            ``reset_limit``, ``blacklist_cooldown_range``, ``hosts``, ``hostfile``, ``host_discovery_script``,
            ``start_timeout``, ``elastic_timeout``, ssh options, ``python``).
        extra_env: variables for every worker (``PYTHONPATH``).

    Raises:
        BaseException: what the first failed worker of the final round raised (see ``horovod.run``).
        RuntimeError: the job stopped (every worker failed, reset limit, too few slots), with the reason.
    """
    settings = settings_from_values(values)
    command = (values.get("python") or sys.executable, "-m", "horovod.runner.elastic.run_task")
    code, message = run_elastic_job(
        command, settings, discovery_from_values(values), dict(extra_env),
        prefix_timestamp=bool(values.get("prefix_output_with_timestamp")), prepare_store=exchange.publish,
        finish_store=exchange.collect, ssh=ssh_config(values), nics=parse_nics(values.get("nic"), values.get("nics")))
    outcomes = exchange.outcomes
    if code != 0 and not any(o.failed for o in outcomes.values()):
        raise RuntimeError(message or f"the elastic job ended with status {code}")
    size = max(outcomes) + 1 if outcomes else 0
    return raise_for_outcomes(JobResult(()), outcomes, size)
