"""A static Horovod job on Ray: a fixed set of worker actors, placed once, serving calls until shut down.

:meth:`StaticAdapter.start` places the actors (:mod:`horovod.ray.strategy`), learns which Ray node each landed on,
numbers them node by node (:func:`horovod.ray.placement.static_slots`), serves the job's rendezvous on the driver's
node and hands every actor its environment through the launch pipeline (:func:`horovod.runner.pipeline.plan_launches`,
:class:`horovod.runner.backends.ray.RayBackend`). A :class:`~horovod.runner.supervisor.Supervisor` watches the actors
in a thread: the first that dies makes it kill the others (fail fast), and the next call raises Horovod's failure
message. A function that raises on some rank while others stay blocked (in a collective with it) stops the job
after the grace period, for the same reason.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import ray
import ray.exceptions

from horovod.common import config
from horovod.ray.placement import static_slots
from horovod.ray.strategy import BaseStrategy, ColocatedStrategy, PGStrategy
from horovod.ray.utils import driver_address, job_extra_env, settings_env
from horovod.ray.worker import control
from horovod.runner.backends.ray import RayBackend
from horovod.runner.pipeline import LaunchConfig, plan_launches
from horovod.runner.output import OutputSink
from horovod.runner.rendezvous import RendezvousPool
from horovod.runner.supervisor import DEFAULT_GRACE_SECONDS, JobResult, Supervisor, failure_message

__all__ = ["StaticAdapter"]

logger = logging.getLogger("horovod.ray")


def _apply(fn: Callable, args: Sequence, kwargs: Dict[str, Any], _executable: Any) -> Any:
    return fn(*args, **kwargs)


class StaticAdapter:
    """Carries out :class:`~horovod.ray.RayExecutor`'s calls for a static job (arguments as the executor's)."""

    def __init__(self, settings, num_workers: Optional[int] = None, num_hosts: Optional[int] = None,
                 num_workers_per_host: int = 1, cpus_per_worker: float = 1, use_gpu: bool = False,
                 gpus_per_worker: Optional[float] = None, use_current_placement_group: bool = True,
                 grace_seconds: float = DEFAULT_GRACE_SECONDS):
        if num_workers is None and num_hosts is None:
            raise ValueError("RayExecutor needs num_workers, or num_hosts and num_workers_per_host")
        if num_workers is not None and num_hosts is not None:
            raise ValueError("RayExecutor takes num_workers or num_hosts (with num_workers_per_host), not both")
        self.settings = settings
        self.num_workers, self.num_hosts, self.num_workers_per_host = num_workers, num_hosts, num_workers_per_host
        self.cpus_per_worker, self.use_gpu, self.gpus_per_worker = cpus_per_worker, use_gpu, gpus_per_worker
        self.use_current_placement_group = use_current_placement_group
        self.grace_seconds = grace_seconds
        self.workers: List[Any] = []
        self.slots: list = []
        self.strategy: Optional[BaseStrategy] = None
        self._pool: Optional[RendezvousPool] = None
        self._supervisor: Optional[Supervisor] = None
        self._thread: Optional[threading.Thread] = None
        self._result: Optional[JobResult] = None
        self._failed: Optional[str] = None

    def _create_strategy(self) -> BaseStrategy:
        common = dict(settings=self.settings, use_gpu=self.use_gpu, cpus_per_worker=self.cpus_per_worker,
                      gpus_per_worker=self.gpus_per_worker)
        if self.num_workers is not None:
            return PGStrategy(num_workers=self.num_workers,
                              force_create_placement_group=not self.use_current_placement_group, **common)
        return ColocatedStrategy(num_hosts=self.num_hosts, num_workers_per_host=self.num_workers_per_host, **common)

    def start(self, executable_cls: Optional[type] = None, executable_args: Optional[Sequence] = None,
              executable_kwargs: Optional[Dict[str, Any]] = None,
              extra_env_vars: Optional[Dict[str, Any]] = None) -> None:
        """Place the actors, give each its environment, build the executables; everything is undone on failure."""
        try:
            self._start(extra_env_vars)
            self._gather([w.start_executable.remote(executable_cls, executable_args, executable_kwargs)
                          for w in self.workers])
        except BaseException:
            self.shutdown()
            raise

    def _start(self, extra_env_vars: Optional[Dict[str, Any]]) -> None:
        self.strategy = self._create_strategy()
        actors = self.strategy.create_workers()
        timeout = float(getattr(self.settings, "timeout_s", 30))
        infos = ray.get([a.node_info.remote() for a in actors], timeout=timeout)
        order, self.slots = static_slots([host for _, host, _ in infos])
        self.workers = [actors[i] for i in order]
        pids = {id(actors[i]): infos[i][2] for i in order}
        self._pool = RendezvousPool()
        extra = job_extra_env(timeout, getattr(self.settings, "nics", None), extra_env_vars)
        launches = plan_launches(LaunchConfig((), tuple(self.slots), extra_env=extra),
                                 self._pool.serve(driver_address()), base_env=settings_env())
        config.report_variables(launches[0].env)  # once here; the actors leave it to the driver
        if self.use_gpu:
            launches = _share_node_gpus(launches, self.workers)
        backend = RayBackend(place=lambda launch: self.workers[launch.rank],
                             begin=lambda actor, launch: control(actor.watch).remote(), pid_of=lambda a: pids[id(a)])
        self._supervisor = Supervisor(OutputSink(len(self.slots)), self.grace_seconds,
                                      log=lambda text: logger.warning("%s", text))
        for rank, handle in backend.start(launches, self.grace_seconds).items():
            self._supervisor.add(rank, self.slots[rank].hostname, handle)
        self._thread = threading.Thread(target=self._supervise, name="horovod-ray-supervisor", daemon=True)
        self._thread.start()

    def _supervise(self) -> None:
        self._result = self._supervisor.wait()
        if self._result.first_failure is not None and self._failed is None:
            self._failed = failure_message(self._result.first_failure)

    @property
    def pids(self) -> List[int]:
        """The worker actors' process ids, by rank."""
        return list(self._supervisor.pids) if self._supervisor is not None else []

    # -- calls ---------------------------------------------------------------------------------------------------

    def _check(self) -> None:
        if self._failed is not None:
            raise RuntimeError(f"{self._failed}The job's workers are stopped; call shutdown() and start() again.")
        if not self.workers:
            raise RuntimeError("the executor has no workers: call start() first")

    def _gather(self, refs: List["ray.ObjectRef"]) -> List[Any]:
        """The calls' results by rank; the first exception is raised as soon as it arrives (see the module doc)."""
        rank_of = {ref: rank for rank, ref in enumerate(refs)}
        pending, first, deadline = list(refs), None, None
        while pending:
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, pending = ray.wait(pending, num_returns=1, timeout=timeout)
            if not ready:
                break
            try:
                ray.get(ready[0])
            except ray.exceptions.RayActorError as exc:
                raise self._lost(exc) from exc
            except ray.exceptions.RayTaskError as exc:
                if first is None:
                    first, deadline = (rank_of[ready[0]], exc), time.monotonic() + self.grace_seconds
        if first is not None:
            rank, exc = first
            if pending:
                self._stop_job(f"rank {rank} raised while rank(s) {sorted(rank_of[r] for r in pending)} did not "
                               f"return within {self.grace_seconds:g} s (blocked in a collective with it?)")
            exc.add_note(f"(raised by the function on rank {rank} of {len(refs)})")
            raise exc
        return ray.get(refs)

    def _lost(self, exc: BaseException) -> RuntimeError:
        if self._thread is not None:
            self._thread.join(timeout=2 * self.grace_seconds + 5)
        self._failed = self._failed or f"a worker actor of the job died: {exc}\n"
        return RuntimeError(f"{self._failed}The job's workers are stopped; call shutdown() and start() again.")

    def _stop_job(self, why: str) -> None:
        logger.warning("horovod.ray: stopping the job: %s", why)
        self._failed = f"the job was stopped: {why}\n"
        for worker in self.workers:
            ray.kill(worker, no_restart=True)

    def execute(self, fn: Callable[[Any], Any], callbacks: Optional[List[Callable]] = None) -> List[Any]:
        """``fn(executable)`` on every worker; results by rank."""
        self._check()
        return self._gather([w.execute.remote(fn) for w in self.workers])

    def run(self, fn: Callable, args: Optional[Sequence] = None, kwargs: Optional[Dict[str, Any]] = None,
            callbacks: Optional[List[Callable]] = None) -> List[Any]:
        """``fn(*args, **kwargs)`` on every worker; results by rank."""
        return self._gather(self.run_remote(fn, args, kwargs))

    def run_remote(self, fn: Callable, args: Optional[Sequence] = None,
                   kwargs: Optional[Dict[str, Any]] = None) -> List["ray.ObjectRef"]:
        """Submit ``fn(*args, **kwargs)`` to every worker; object refs by rank."""
        self._check()
        call = functools.partial(_apply, fn, tuple(args or ()), dict(kwargs or {}))
        return [w.execute.remote(call) for w in self.workers]

    def execute_single(self, fn: Callable[[Any], Any]) -> Any:
        """``fn(executable)`` on rank 0 only."""
        self._check()
        return self._gather([self.workers[0].execute.remote(fn)])[0]

    def shutdown(self) -> None:
        """Stop every worker actor (none is left behind), remove the placement group, stop the rendezvous."""
        for worker in self.workers:
            try:
                control(worker.stop_watch).remote()
            except Exception:  # noqa: BLE001 — a dead actor
                pass
        if self._thread is not None:
            self._thread.join(timeout=self.grace_seconds)
        if self._supervisor is not None:
            self._supervisor.close()
        if self.strategy is not None:
            self.strategy.shutdown()
        if self._pool is not None:
            self._pool.close()
        self.workers, self._supervisor, self._thread, self._pool, self.strategy = [], None, None, None, None


def _share_node_gpus(launches, workers):
    """Each worker sees every GPU Ray gave the job's workers on its node (``CUDA_VISIBLE_DEVICES``), as Horovod
    does, so that workers of a node can reach each other's devices."""
    gpu_ids = ray.get([w.get_gpu_ids.remote() for w in workers])
    per_host: Dict[str, List[int]] = {}
    for launch in launches:
        per_host.setdefault(launch.hostname, []).extend(gpu_ids[launch.rank])
    visible = {host: ",".join(str(i) for i in sorted(ids)) for host, ids in per_host.items()}
    return [dataclasses.replace(launch, env={**launch.env, "CUDA_VISIBLE_DEVICES": visible[launch.hostname]})
            for launch in launches]
