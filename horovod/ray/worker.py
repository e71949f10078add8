"""The Ray actor every Horovod worker runs in (Horovod's ``horovod.ray.worker.BaseHorovodWorker``).

An actor learns its place in the job only as environment variables (``HOROVOD_RANK``, the rendezvous address, the
job secret...) set by the driver before anything runs there, exactly what a ``horovodrun`` worker inherits; then
``hvd.init()`` inside it meets the other workers through the rendezvous and moves tensors directly between them.
Calls run one at a time in submission order (the default concurrency group); the ``control`` group answers the
driver's liveness watch and stop while a call is busy. The class declares no concurrency group itself, so that
``ray.remote(BaseHorovodWorker)`` (Horovod's mixin pattern) makes a plain actor: :func:`remote_worker_cls` adds the
group, and the driver sends :meth:`~BaseHorovodWorker.watch` and :meth:`~BaseHorovodWorker.stop_watch` there with
:func:`control`.

When the environment it is given hides TensorFlow's INFO lines (``TF_CPP_MIN_LOG_LEVEL`` 1 or more, the launchers'
default), the actor's stderr goes through a filter process that keeps TensorFlow's start-up notes out of what Ray's log
relay carries to the driver (:mod:`horovod.runner.note_filter`): set up by :meth:`~BaseHorovodWorker.update_env_vars`,
which runs before the job's code (and so TensorFlow) does. It lives as long as the actor's process.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import threading
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import ray

from horovod.common import config
from horovod.ray.placement import node_hostname
from horovod.runner import note_filter
from horovod.runner.noise import hides_notes
from horovod.runner.run_task import TaskOutcome, capture

__all__ = ["BaseHorovodWorker", "remote_worker_cls", "control", "CONTROL_GROUP"]

CONTROL_GROUP = "control"


class BaseHorovodWorker:
    """One Horovod worker inside a Ray actor: environment, an optional executable object, and calls on it."""

    executable = None
    _notes: Optional[note_filter.NoteFilter] = None     # the filter of this actor's stderr, while one runs

    def __init__(self, world_rank: Optional[int] = None, world_size: Optional[int] = None):
        self._stopped = threading.Event()
        if world_rank is not None and world_size is not None:  # Horovod's signature; the driver's env wins later
            self.update_env_vars({"HOROVOD_RANK": world_rank, "HOROVOD_SIZE": world_size})

    def hostname(self) -> str:
        """The machine's host name (as Horovod's worker reports it)."""
        return socket.gethostname()

    def node_id(self) -> str:
        """The id of the Ray node this actor runs on."""
        return ray.get_runtime_context().get_node_id()

    def node_info(self) -> Tuple[str, str, int]:
        """``(node id, Horovod host name of the node, pid)`` of this actor."""
        node_id = ray.get_runtime_context().get_node_id()
        return node_id, node_hostname(ray.util.get_node_ip_address(), node_id), os.getpid()

    def get_gpu_ids(self) -> List[int]:
        """The CUDA device ids Ray gave this actor."""
        return [int(i) for i in ray.get_gpu_ids()]

    def update_env_vars(self, env_vars: Mapping[str, Any]) -> None:
        """Set variables in the actor's process (values converted to ``str``); then filter the actor's stderr if the
        environment now hides TensorFlow's INFO lines, or stop filtering if it no longer does (see the module doc)."""
        for name, value in env_vars.items():
            config.environ_set(str(name), str(value))
        hide = hides_notes(config.environ_snapshot()) and _in_actor()
        if hide and self._notes is None:
            self._notes = note_filter.start()
        elif not hide and self._notes is not None:
            self._notes.stop()
            self._notes = None

    def env_vars(self) -> Dict[str, str]:
        """The actor process's environment."""
        return config.environ_snapshot()

    def start_executable(self, executable_cls: Optional[type] = None, executable_args: Optional[Sequence] = None,
                         executable_kwargs: Optional[Dict[str, Any]] = None) -> None:
        """Build ``executable_cls(*executable_args, **executable_kwargs)`` here; :meth:`execute` passes it to
        functions (None without a class)."""
        if executable_cls is not None:
            self.executable = executable_cls(*(executable_args or ()), **(executable_kwargs or {}))

    def execute(self, func: Callable[[Any], Any]) -> Any:
        """``func(executable)``: the executable object (or None), its result returned to the driver."""
        return func(self.executable)

    def run_task(self, func: Callable, args: Sequence = (), kwargs: Optional[Dict[str, Any]] = None,
                 with_executable: bool = False) -> TaskOutcome:
        """Run a job's function to its end (an elastic worker's whole life) and report what it did; with
        ``with_executable`` the executable object is its first argument.

        ``SystemExit(0)`` (the elastic driver removed this worker's slot) is a clean end without a value. The outcome
        carries the worker's final rank when Horovod is still initialised, so the driver can order results.
        """
        args = (self.executable, *args) if with_executable else tuple(args)
        outcome = capture(-1, func, args, kwargs)
        if isinstance(outcome.error, SystemExit) and not outcome.error.code:
            outcome = TaskOutcome(-1)
        from horovod.runtime import basics   # the worker's side: only an actor that ran a job loads the engine
        rank = basics.rank() if basics.is_initialized() else -1
        return dataclasses.replace(outcome, rank=rank)

    def watch(self) -> int:
        """Return 0 once :meth:`stop_watch` is called; while the actor lives it does not return (the driver's view
        of the worker as a running process). Sent to the ``control`` group (:func:`control`)."""
        self._stopped.wait()
        return 0

    def stop_watch(self) -> None:
        """Let :meth:`watch` return: the driver is ending the job normally."""
        self._stopped.set()


def _in_actor() -> bool:
    """Whether this process is a Ray actor's (an instance made elsewhere, a driver's say, leaves stderr alone)."""
    return ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None


def remote_worker_cls(cls: type = BaseHorovodWorker):
    """``cls`` as a Ray actor class with the ``control`` concurrency group next to the default one."""
    return ray.remote(concurrency_groups={CONTROL_GROUP: 2})(cls)


def control(method):
    """An actor method of a :func:`remote_worker_cls` actor, sent to the ``control`` group:
    ``control(actor.watch).remote()`` runs while a call of the default group is busy."""
    return method.options(concurrency_group=CONTROL_GROUP)
