"""Workers as Ray actors: the launch pipeline's backend for Ray (``horovod.ray``).

Ray decides where each worker runs; the pipeline decides everything else the same way as for local, ssh and
``mpirun`` workers: :func:`horovod.runner.pipeline.plan_launches` gives each :class:`~.base.WorkerLaunch` its complete
environment (rendezvous address, job secret, ranks), and a :class:`~horovod.runner.supervisor.Supervisor` fails the
job fast and reaps it. This backend only finds the actor of each launch (``place``), sets the launch's environment in
it before anything else runs there, and starts the launch's work (``begin``) — for :class:`~horovod.ray.RayExecutor`
an actor that serves calls until stopped, for elastic jobs the job's function run to its end.

A worker's handle (:class:`ActorHandle`) reports the actor as a process: running while its work runs, exit status
0 or 1 from its work, ``-SIGKILL`` once the actor died (``ray.kill``, its node lost). Any signal to it kills the
actor with ``ray.kill`` (an actor cannot be asked to stop while a call blocks in a collective); nothing outlives it.
"""

from __future__ import annotations

import itertools
import signal
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence

import ray
import ray.exceptions

from horovod.runner.backends.base import WorkerHandle, WorkerLaunch, start_each

__all__ = ["RayBackend", "ActorHandle"]

_ids = itertools.count(1)


class ActorHandle:
    """A worker actor as the supervisor drives it (the :class:`~.base.WorkerHandle` members).

    Args:
        actor: the Ray actor.
        done: an object ref that resolves when the worker's work ends: its exit status (an int) or an object with
            a ``failed`` attribute (:class:`horovod.runner.run_task.TaskOutcome`), kept as :attr:`outcome`.
        pid: the actor process's pid where known, else a number unique in this driver.
    """

    stdout = None   # Ray forwards actors' output to the driver itself
    stderr = None

    def __init__(self, actor, done: "ray.ObjectRef", pid: Optional[int] = None):
        self.actor = actor
        self.done = done
        self.pid = pid if pid is not None else -next(_ids)
        self.outcome: Any = None
        self.error: Optional[BaseException] = None
        self._code: Optional[int] = None
        self._lock = threading.Lock()

    def poll(self) -> Optional[int]:
        """The exit status if the worker has ended, else None."""
        return self.wait(0)

    def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        """Block up to ``timeout`` seconds for the worker's end; its exit status, or None while it runs."""
        if self._code is not None:
            return self._code
        try:
            ready, _ = ray.wait([self.done], timeout=timeout)
        except Exception:  # noqa: BLE001 — Ray itself is gone (shut down): so is the actor
            ready = [self.done]
        if not ready:
            return None
        with self._lock:
            if self._code is None:
                self._code = self._resolve()
        return self._code

    def _resolve(self) -> int:
        try:
            result = ray.get(self.done)
        except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError,
                ray.exceptions.ObjectLostError) as exc:
            self.error = exc
            return -signal.SIGKILL
        except ray.exceptions.RayTaskError as exc:
            self.error = exc
            return 1
        except Exception as exc:  # noqa: BLE001 — Ray shut down under us
            self.error = exc
            return -signal.SIGKILL
        if isinstance(result, int):
            return result
        self.outcome = result
        return 1 if getattr(result, "failed", False) else 0

    def signal(self, sig: int) -> None:
        """Kill the actor (any signal: an actor blocked in a collective cannot stop by itself)."""
        try:
            ray.kill(self.actor, no_restart=True)
        except Exception:  # noqa: BLE001 — already dead, or Ray shut down
            pass

    def release(self) -> None:
        """Nothing to let go of: the actor handle goes with this object."""


class RayBackend:
    """Starts each planned worker in a Ray actor.

    Args:
        place: the actor of a launch (an existing one, or one it creates on the node of ``launch.hostname``).
        begin: starts the launch's work in the actor after its environment is set; returns the ref that resolves
            when that work ends (see :class:`ActorHandle`).
        pid_of: the actor process's pid, when it is cheap to know (None: a number unique in this driver).
        env_timeout: seconds to wait for an actor to take its environment (a new actor starts first).
    """

    name = "ray"

    def __init__(self, place: Callable[[WorkerLaunch], Any], begin: Callable[[Any, WorkerLaunch], "ray.ObjectRef"],
                 pid_of: Optional[Callable[[Any], Optional[int]]] = None, env_timeout: Optional[float] = None):
        self.place = place
        self.begin = begin
        self.pid_of = pid_of or (lambda actor: None)
        self.env_timeout = env_timeout
        self.handles: List[ActorHandle] = []   # every worker started, in order (an elastic job's too)

    def start(self, launches: Sequence[WorkerLaunch], grace_seconds: float) -> Dict[int, WorkerHandle]:
        """Set each launch's environment in its actor and begin its work; handles by rank.

        Raises:
            OSError: an actor died or did not take its environment within ``env_timeout`` (those begun are killed).
        """
        return start_each(launches, self._start_one)

    def _start_one(self, launch: WorkerLaunch) -> ActorHandle:
        actor = self.place(launch)
        configured = actor.update_env_vars.remote(dict(launch.env))
        if self.env_timeout is not None:
            try:
                ray.get(configured, timeout=self.env_timeout)
            except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError) as exc:
                ray.kill(actor, no_restart=True)
                raise OSError(f"the Ray actor of rank {launch.rank} on {launch.hostname} did not start: {exc}") \
                    from None
        handle = ActorHandle(actor, self.begin(actor, launch), self.pid_of(actor))
        self.handles.append(handle)
        return handle
