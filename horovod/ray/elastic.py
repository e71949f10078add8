"""Elastic Horovod on Ray: the runner's elastic driver, with Ray's view of the cluster as discovery and worker actors
as its workers.

:class:`RayHostDiscovery` reads the live nodes and their resources from Ray (``ray.nodes()``): a node offers as many
slots as its CPUs (and GPUs) hold workers. :class:`ElasticAdapter` runs one job: the runner's
:class:`~horovod.runner.elastic.job.ElasticJob` decides (:func:`horovod.runner.elastic.driver.decide`), its
:class:`~horovod.runner.elastic.spawner.ElasticSpawner` builds each worker's environment and hands it to a
:class:`~horovod.runner.backends.ray.RayBackend`, which starts an actor pinned to the slot's node running the job's
function. A worker actor that dies (``ray.kill``, its node lost) is seen as a worker killed by a signal: its node is
blacklisted (for ``cooldown_range`` seconds, else for good), the survivors restore their last commit and go on; a
node that joins is used at the workers' next commit, up to ``max_workers``.
"""

from __future__ import annotations

import dataclasses
import random
import sys
import time
import uuid
from typing import Any, Callable, Dict, List, Optional, Sequence

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from horovod.ray.placement import node_hostname
from horovod.ray.utils import driver_address, job_extra_env, settings_env
from horovod.ray.worker import remote_worker_cls
from horovod.runner.backends.base import WorkerLaunch
from horovod.runner.backends.ray import RayBackend
from horovod.runner.elastic.discovery import HostDiscovery
from horovod.runner.elastic.driver import ElasticSettings
from horovod.runner.elastic.job import ElasticJob
from horovod.runner.elastic.spawner import ElasticSpawner
from horovod.runner.output import OutputSink
from horovod.runner.rendezvous import RendezvousPool
from horovod.runner.supervisor import DEFAULT_GRACE_SECONDS, Supervisor

__all__ = ["RayHostDiscovery", "TestDiscovery", "ElasticAdapter", "ElasticRayExecutor", "ElasticRaySettings"]


def _log(text: str) -> None:
    print(f"horovod.ray elastic: {text}", file=sys.stderr, flush=True)


class RayHostDiscovery(HostDiscovery):
    """The live Ray nodes as hosts, each with as many slots as its resources hold workers.

    ``find_available_hosts_and_slots()`` returns Horovod's ``{hostname: slots}`` dict, so that a subclass written for
    Horovod (which filters ``super()``'s dict, as Horovod's Ray examples do) works unchanged.
    """

    def __init__(self, use_gpu: bool = False, cpus_per_slot: float = 1, gpus_per_slot: Optional[float] = 1):
        self.use_gpu = use_gpu
        self.cpus_per_slot = cpus_per_slot
        self.gpus_per_slot = gpus_per_slot or 1
        self.node_ids: Dict[str, str] = {}

    def find_available_hosts_and_slots(self) -> Dict[str, int]:
        """Every live node with room for at least one worker, in Ray's order: hostname -> slots."""
        hosts: Dict[str, int] = {}
        for node in ray.nodes():
            if not node.get("Alive"):
                continue
            resources = node.get("Resources", {})
            slots = int(resources.get("CPU", 0) // self.cpus_per_slot) if self.cpus_per_slot else 1 << 30
            if self.use_gpu:
                slots = min(slots, int(resources.get("GPU", 0) // self.gpus_per_slot))
            if slots > 0:
                name = node_hostname(node["NodeManagerAddress"], node["NodeID"])
                self.node_ids[name] = node["NodeID"]
                hosts[name] = slots
        return hosts


class TestDiscovery(RayHostDiscovery):
    """Ray's live nodes, of which some are held back on purpose: every ``change_frequency_s`` seconds one node is
    taken away or given back (at random between ``min_hosts`` and ``max_hosts`` hosts), so that an elastic job
    rescales while every node stays up (Horovod's test discovery for elastic Ray jobs).

    ``_graceful=False`` (Horovod: kill a node through Ray's autoscaler) is refused: it needs an autoscaler
    cluster's bootstrap config, and taking a host away from discovery already makes the job rescale.
    """

    __test__ = False    # (not a pytest test class, despite its name)

    def __init__(self, min_hosts: int, max_hosts: int, change_frequency_s: float, use_gpu: bool = False,
                 cpus_per_slot: float = 1, gpus_per_slot: Optional[float] = 1, verbose: bool = True,
                 _graceful: bool = True, *, seed: Optional[int] = None):
        if not _graceful:
            raise NotImplementedError("TestDiscovery(_graceful=False) kills Ray nodes through the autoscaler; "
                                      "horovod-py only holds hosts back (use _graceful=True)")
        super().__init__(use_gpu=use_gpu, cpus_per_slot=cpus_per_slot, gpus_per_slot=gpus_per_slot)
        self.min_hosts, self.max_hosts = min_hosts, max_hosts
        self.change_frequency_s = change_frequency_s
        self.verbose = verbose
        self.removed_hosts: set = set()
        self._last_change: Optional[float] = None
        self._random = random.Random(seed)

    def change_hosts(self, hosts: Dict[str, int]) -> None:
        """Take one host away or give one back (the nodes that left Ray are forgotten first)."""
        self.removed_hosts &= hosts.keys()
        current = len(hosts) - len(self.removed_hosts)
        if current <= self.min_hosts:
            self._give_back(hosts)
        elif current >= self.max_hosts:
            self._take_away(hosts)
        elif self._random.random() < 0.5:
            self._give_back(hosts)
        else:
            self._take_away(hosts)

    def _give_back(self, hosts: Dict[str, int]) -> None:
        held = sorted(self.removed_hosts & hosts.keys())
        if held:
            self.removed_hosts.discard(self._random.choice(held))

    def _take_away(self, hosts: Dict[str, int]) -> None:
        present = [h for h in hosts if h not in self.removed_hosts]
        if present:
            self.removed_hosts.add(self._random.choice(present))

    def find_available_hosts_and_slots(self) -> Dict[str, int]:
        """Ray's live nodes less the ones held back now."""
        now = time.monotonic()
        if self._last_change is None:
            self._last_change = now
        hosts = super().find_available_hosts_and_slots()
        if now - self._last_change >= self.change_frequency_s:
            self.change_hosts(hosts)
            self._last_change = now
        remaining = {name: slots for name, slots in hosts.items() if name not in self.removed_hosts}
        if self.verbose:
            _log(f"test discovery: {len(remaining)} of {len(hosts)} hosts: {remaining}")
        return remaining


class ElasticAdapter:
    """Carries out an elastic job's calls: each :meth:`run` is one elastic job, from start to its last worker."""

    # (Horovod's parameter order, so that positional calls written for Horovod bind alike)
    def __init__(self, settings, min_workers: int, max_workers: Optional[int] = None, use_gpu: bool = False,
                 cpus_per_worker: float = 1, gpus_per_worker: Optional[float] = None,
                 override_discovery: bool = True, reset_limit: Optional[int] = None,
                 cooldown_range: Optional[Sequence[float]] = None, elastic_timeout: float = 600,
                 grace_seconds: float = DEFAULT_GRACE_SECONDS):
        self.settings = settings
        start_timeout = float(getattr(settings, "timeout_s", 30))
        self.elastic = ElasticSettings(min_np=min_workers, max_np=max_workers, elastic_timeout=float(elastic_timeout),
                                       start_timeout=start_timeout, reset_limit=reset_limit,
                                       cooldown_range=tuple(cooldown_range) if cooldown_range else None)
        self.cpus_per_worker, self.use_gpu = cpus_per_worker, use_gpu
        self.gpus_per_worker = (gpus_per_worker or 1) if use_gpu else 0
        given = getattr(settings, "discovery", None)
        self.discovery = given if given is not None and not override_discovery else \
            RayHostDiscovery(use_gpu, cpus_per_worker, gpus_per_worker)
        self.grace_seconds = grace_seconds
        self.executable = (None, (), {})
        self.extra_env: Dict[str, str] = {}
        self.backend: Optional[RayBackend] = None
        self._job = uuid.uuid4().hex[:8]    # worker actors are named horovod-elastic-<job>-<host>-<slot>-<n>
        self._started = 0

    def start(self, executable_cls: Optional[type] = None, executable_args: Optional[Sequence] = None,
              executable_kwargs: Optional[Dict[str, Any]] = None,
              extra_env_vars: Optional[Dict[str, Any]] = None) -> None:
        """Remember what each worker builds and its extra variables; workers start with each :meth:`run`."""
        self.executable = (executable_cls, tuple(executable_args or ()), dict(executable_kwargs or {}))
        self.extra_env = job_extra_env(self.elastic.start_timeout, getattr(self.settings, "nics", None),
                                       extra_env_vars)
        self.extra_env.update({"HOROVOD_ELASTIC_TIMEOUT": repr(self.elastic.elastic_timeout),
                               "HOROVOD_START_TIMEOUT": repr(self.elastic.start_timeout)})

    def _place(self, launch: WorkerLaunch):
        node_id = getattr(self.discovery, "node_ids", {}).get(launch.hostname)
        if node_id is None:
            raise OSError(f"no live Ray node is named {launch.hostname}")
        self._started += 1
        return remote_worker_cls().options(
            num_cpus=self.cpus_per_worker, num_gpus=self.gpus_per_worker,
            name=f"horovod-elastic-{self._job}-{launch.hostname}-{launch.slot.local_rank}-{self._started}",
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote()

    def _begin(self, call: Callable, args: Sequence, kwargs: Dict[str, Any], with_executable: bool):
        cls, cls_args, cls_kwargs = self.executable

        def begin(actor, launch: WorkerLaunch):
            actor.start_executable.remote(cls, cls_args, cls_kwargs)
            return actor.run_task.remote(call, args, kwargs, with_executable)
        return begin

    def _run_job(self, begin) -> List[Any]:
        if not self.extra_env:
            self.start()
        pool = RendezvousPool()
        supervisor = Supervisor(OutputSink(0), self.grace_seconds, log=_log)
        self.backend = RayBackend(self._place, begin)
        try:
            spawner = ElasticSpawner((), self.backend, supervisor, lambda host: pool.serve(driver_address()),
                                     settings_env(), self.extra_env, self.grace_seconds)
            code, message = ElasticJob(self.elastic, self.discovery, spawner, pool.store, log=_log).run()
        finally:
            supervisor.close()
            pool.close()
        return _results(self.backend.handles, code, message)

    def run(self, fn: Callable, args: Optional[Sequence] = None, kwargs: Optional[Dict[str, Any]] = None,
            callbacks: Optional[List[Callable]] = None) -> List[Any]:
        """Run ``fn(*args, **kwargs)`` as an elastic job; the final workers' results by rank."""
        return self._run_job(self._begin(fn, tuple(args or ()), dict(kwargs or {}), False))

    def execute(self, fn: Callable[[Any], Any], callbacks: Optional[List[Callable]] = None) -> List[Any]:
        """Run ``fn(executable)`` as an elastic job; the final workers' results by rank."""
        return self._run_job(self._begin(fn, (), {}, True))

    def shutdown(self) -> None:
        """Nothing outlives a :meth:`run`: its actors and rendezvous are gone when it returns."""


def _results(handles, code: int, message: str) -> List[Any]:
    """The values of the workers that finished the job, by rank; or the job's failure, with a traceback."""
    if code != 0:
        failed = [h.outcome for h in handles if h.outcome is not None and h.outcome.failed]
        detail = f"\nThe first worker that raised did so with:\n{failed[0].traceback}" if failed else ""
        raise RuntimeError(f"the elastic Horovod job on Ray failed (exit code {code}): {message}{detail}")
    finished = sorted((h.outcome for h in handles if h.outcome is not None and not h.outcome.failed
                       and h.outcome.rank >= 0), key=lambda o: o.rank)
    return [o.value for o in finished]


@dataclasses.dataclass
class ElasticRaySettings:
    """The settings of an :class:`ElasticRayExecutor` (Horovod's ``ElasticSettings`` fields that apply on Ray)."""

    min_num_proc: int = 1
    max_num_proc: Optional[int] = None
    reset_limit: Optional[int] = None
    elastic_timeout: float = 600
    timeout_s: float = 30
    nics: Optional[Any] = None
    cooldown_range: Optional[Sequence[float]] = None
    verbose: int = 1
    discovery: Any = None


class ElasticRayExecutor:
    """Horovod's elastic executor for Ray (``horovod.ray.ElasticRayExecutor``): the whole cluster is its pool.

    Args:
        settings: from :meth:`create_settings`.
        use_gpu, cpus_per_slot, gpus_per_slot: resources of each worker actor.
        env_vars: variables set in every worker before it starts.
        override_discovery: discover from Ray (True), or use ``settings.discovery``.
    """

    @staticmethod
    def create_settings(min_num_proc: int = 1, max_num_proc: Optional[int] = None, reset_limit: Optional[int] = None,
                        elastic_timeout: float = 600, timeout_s: float = 30, ssh_identity_file: Optional[str] = None,
                        nics: Optional[Any] = None, min_np: Optional[int] = None, max_np: Optional[int] = None,
                        **kwargs) -> ElasticRaySettings:
        """Settings of an elastic job; ``ssh_identity_file`` is accepted and unused (Ray needs no ssh)."""
        known = {f.name for f in dataclasses.fields(ElasticRaySettings)}
        return ElasticRaySettings(min_np if min_np is not None else min_num_proc,
                                  max_np if max_np is not None else max_num_proc, reset_limit, elastic_timeout,
                                  timeout_s, nics, **{k: v for k, v in kwargs.items() if k in known})

    def __init__(self, settings: ElasticRaySettings, use_gpu: bool = False, cpus_per_slot: float = 1,
                 gpus_per_slot: Optional[float] = None, env_vars: Optional[Dict[str, Any]] = None,
                 override_discovery: bool = True):
        if gpus_per_slot and not use_gpu:
            raise ValueError("gpus_per_slot is set, but use_gpu is False; use_gpu must be True if gpus_per_slot is set")
        self.settings = settings
        self.env_vars = dict(env_vars or {})
        self.adapter = ElasticAdapter(settings, settings.min_num_proc, settings.max_num_proc, use_gpu=use_gpu,
                                      cpus_per_worker=cpus_per_slot, gpus_per_worker=gpus_per_slot,
                                      override_discovery=override_discovery, reset_limit=settings.reset_limit,
                                      cooldown_range=settings.cooldown_range,
                                      elastic_timeout=settings.elastic_timeout)

    def start(self) -> None:
        """Prepare the job (workers start with :meth:`run`)."""
        self.adapter.start(extra_env_vars=self.env_vars)

    def run(self, worker_fn: Callable[[], Any], callbacks: Optional[List[Callable]] = None) -> List[Any]:
        """Run ``worker_fn()`` (usually wrapped by ``hvd.elastic.run``) as an elastic job; the final workers'
        results by rank."""
        return self.adapter.run(worker_fn, callbacks=callbacks)
