"""The elastic driver's loop: observe (discovery, worker exits, ready workers), :func:`decide`, carry it out.

Discovery, the spawner, the store and the clock are parameters, so the loop runs in unit tests with fakes. It wakes
on a worker's exit and on a change of the store (a worker ready for the next round) at once, otherwise every
``poll_interval`` seconds, and asks discovery about once a second.
"""

from __future__ import annotations

import random
import signal
import sys
import time
from typing import Callable, List, Optional, Tuple

from horovod.common import elastic_records as protocol
from horovod.runner.elastic.discovery import DISCOVER_HOSTS_FREQUENCY_SECS, HostDiscoveryError, hosts_of
from horovod.runner.elastic.driver import (Blacklist, DriverView, ElasticSettings, Kill, Publish, Spawn, Stop, Wait,
                                           decide, host_update, plan_assignment, slot_keys)
from horovod.runner.elastic.registry import WorkerRecord, WorkerRegistry
from horovod.runner.hosts import HostInfo
from horovod.runner.supervisor import WorkerExit


# How often the loop looks around when nothing wakes it (a store without change listeners, a spawner that cannot be
# woken: then a reset waits half of it on average between the last survivor's "ready" and the next assignment).
POLL_INTERVAL_SECONDS = 0.1


def _stderr_log(text: str) -> None:
    print(f"horovodrun elastic: {text}", file=sys.stderr, flush=True)


class ElasticJob:
    """Runs one elastic job to its end; :meth:`run` returns ``(exit_code, message)``.

    Args:
        settings: the job's knobs.
        discovery: has ``find_available_hosts_and_slots()``: ``[HostInfo]`` or ``{hostname: slots}``.
        spawner: has ``spawn(slot) -> pid``, ``send_signal(key, sig)``, ``exits(timeout) -> [(key, pid, code)]``,
            ``forget(key, pid)`` and ``close()`` (see :class:`~horovod.runner.elastic.spawner.ElasticSpawner`).
        store: the rendezvous store (``put/get/delete/keys``).
        clock, uniform: time source and U(0,1) source.
    """

    def __init__(self, settings: ElasticSettings, discovery, spawner, store,
                 clock: Callable[[], float] = time.monotonic, uniform: Callable[[], float] = random.random,
                 log: Callable[[str], None] = _stderr_log, poll_interval: float = POLL_INTERVAL_SECONDS,
                 discovery_interval: float = DISCOVER_HOSTS_FREQUENCY_SECS):
        self.settings = settings
        self.discovery = discovery
        self.spawner = spawner
        self.store = store
        self.clock = clock
        self.uniform = uniform
        self.log = log
        self.poll_interval = poll_interval
        self.discovery_interval = discovery_interval
        # A worker's "ready" (a put in the store) wakes the loop rather than waiting for its next poll.
        wake = getattr(spawner, "wake", None)
        self._store_listener = wake if wake is not None and hasattr(store, "on_change") else None
        if self._store_listener is not None:
            store.on_change(self._store_listener)
        self.registry = WorkerRegistry()
        self.blacklist = Blacklist(settings.cooldown_range)
        self.round = 0
        self.resets = 0
        self.version = 0
        self.current_hosts: Tuple[str, ...] = ()
        self.current_keys = frozenset()
        self.discovered: Optional[List[HostInfo]] = None
        self.succeeded = False
        self._stopping: set = set()     # workers sent SIGKILL whose exit has not arrived yet
        self.failures: List[WorkerExit] = []
        self.first_failure: Optional[WorkerExit] = None
        self.waiting_since: Optional[float] = None
        self._wait_said = float("-inf")   # when the wait for slots was last reported
        self.notified_plan = None
        self.interrupted_by: Optional[int] = None
        self._failed_at: Optional[float] = None
        self._next_discovery = float("-inf")
        self._last_discovery_error = None

    def interrupt(self, signum: int) -> None:
        """Stop the job at the next tick (safe in a signal handler)."""
        self.interrupted_by = signum

    # -- observe ---------------------------------------------------------------------------------------------------

    def _discover(self, now: float) -> Optional[Stop]:
        self._next_discovery = now + self.discovery_interval
        try:
            hosts = hosts_of(self.discovery.find_available_hosts_and_slots())
        except HostDiscoveryError as exc:
            if self.discovered is None:
                return Stop(1, f"host discovery failed: {exc}")
            if str(exc) != self._last_discovery_error:
                self.log(f"warning: host discovery failed, keeping the last known hosts: {exc}")
            self._last_discovery_error = str(exc)
            return None
        self._last_discovery_error = None
        if self.discovered is not None and [(h.hostname, h.slots) for h in hosts] != \
                [(h.hostname, h.slots) for h in self.discovered]:
            self.log(f"discovered hosts: {', '.join(f'{h.hostname}:{h.slots}' for h in hosts) or 'none'}")
        self.discovered = hosts
        return None

    def _on_exit(self, key: str, pid: int, code: int) -> None:
        self.spawner.forget(key, pid)
        record = self.registry.pop(key, pid)
        if record is None:
            return
        self.store.delete(protocol.READY_SCOPE, key)
        self.store.delete(protocol.ASSIGN_SCOPE, key)
        if record.expected_exit:
            return
        if record.in_round and code != 0:
            # Workers still connecting in this round give up on it at once instead of at their start timeout.
            self.store.put(protocol.NOTIFY_SCOPE, protocol.BROKEN_ROUND_KEY, str(self.round).encode())
        if code == 0:
            if not self.succeeded:
                self.log(f"worker {key} finished successfully; the job ends when the others finish")
            self.succeeded = True
            return
        exited = WorkerExit(record.rank if record.rank is not None else -1, key, code)
        if self.succeeded:
            self.log(f"worker {key} ended with {exited.describe()} after the job succeeded")
            return
        self._fail_host(record.hostname, f"worker {key} ended with {exited.describe()}", exited)

    def _fail_host(self, hostname: str, why: str, exited: WorkerExit) -> None:
        now = self.clock()
        if not self.failures:
            self._failed_at = now       # the recovery clock: from the first failure to the next round
        self.failures.append(exited)
        self.first_failure = self.first_failure or exited
        until = self.blacklist.add(hostname, now, self.uniform())
        when = "for good" if until == float("inf") else f"for {until - now:.1f}s"
        self.log(f"{why}; host {hostname} is blacklisted {when}")

    def _read_ready(self) -> None:
        for key in self.store.keys(protocol.READY_SCOPE):
            record = self.registry.get(key)
            if record is not None:
                record.ready = True

    def _available(self, now: float) -> Tuple[HostInfo, ...]:
        return tuple(h for h in self.discovered or () if not self.blacklist.blocked(h.hostname, now))

    def _notify_host_updates(self, available) -> None:
        records = list(self.registry)
        in_round = [r for r in records if r.in_round]
        if self.round == 0 or self.succeeded or self.failures or len(in_round) != len(self.current_keys) \
                or any(r.ready for r in in_round):
            return
        planned = plan_assignment(self.current_hosts, available, self.settings.max_np)
        flags = host_update(self.current_keys, planned)
        keys = slot_keys(planned)
        if flags and keys != self.notified_plan:
            self.version += 1
            self.notified_plan = keys
            self.store.put(protocol.NOTIFY_SCOPE, protocol.HOSTS_UPDATED_KEY,
                           protocol.encode_update(self.version, flags))
            self.log(f"hosts updated ({protocol.HostUpdateResult(flags).name}); workers re-form at their next commit")

    def view(self, now: float) -> DriverView:
        """What :func:`~horovod.runner.elastic.driver.decide` looks at, as observed now."""
        discovered = self.discovered or []
        return DriverView(now=now, round=self.round, resets=self.resets, workers=self.registry.views(),
                          available=self._available(now), current_hosts=self.current_hosts,
                          succeeded=self.succeeded, failures=tuple(self.failures),
                          first_failure=self.first_failure,
                          all_blacklisted=bool(discovered) and all(self.blacklist.permanent(h.hostname)
                                                                   for h in discovered),
                          waiting_since=self.waiting_since)

    # -- act -------------------------------------------------------------------------------------------------------

    def _spawn(self, action: Spawn, now: float) -> None:
        for slot in action.slots:
            key = protocol.slot_key(slot.hostname, slot.local_rank)
            try:
                pid = self.spawner.spawn(slot)
            except OSError as exc:
                self._fail_host(slot.hostname, f"cannot start worker {key}: {exc}", WorkerExit(-1, key, 127))
                continue
            self.registry.add(WorkerRecord(key, slot.hostname, slot.local_rank, pid, now))

    def _publish(self, action: Publish) -> None:
        self.round += 1
        if self.round > 1:
            self.resets += 1
        for slot in action.slots:
            key = protocol.slot_key(slot.hostname, slot.local_rank)
            record = self.registry.get(key)
            record.ready, record.in_round, record.rank = False, True, slot.rank
            self.store.delete(protocol.READY_SCOPE, key)
            self.store.put(protocol.ASSIGN_SCOPE, key, protocol.Assignment(
                self.round, slot.rank, slot.size, slot.local_rank, slot.local_size, slot.cross_rank,
                slot.cross_size, self.version).encode())
        for key in action.removed:
            self._tell(key, protocol.REMOVED)
        hosts: List[str] = []
        for slot in action.slots:
            if slot.hostname not in hosts:
                hosts.append(slot.hostname)
        self.current_hosts = tuple(hosts)
        self.current_keys = slot_keys(action.slots)
        self.failures = []
        self.notified_plan = None
        recovery = ""
        if self._failed_at is not None:
            recovery = f"; recovery: {self.clock() - self._failed_at:.2f} s after the failure"
            self._failed_at = None
        self.log(f"round {self.round}: {len(action.slots)} worker(s) on {', '.join(hosts)}"
                 + (f"; removed {', '.join(action.removed)}" if action.removed else "") + recovery)

    def _tell(self, key: str, answer: bytes) -> None:
        record = self.registry.get(key)
        if record is None:
            return
        record.expected_exit, record.ready, record.in_round = True, False, False
        self.store.delete(protocol.READY_SCOPE, key)
        self.store.put(protocol.ASSIGN_SCOPE, key, answer)

    def _finish(self, action: Stop) -> Tuple[int, str]:
        if action.exit_code == 0:
            for record in self.registry:
                if record.ready:
                    self._tell(record.key, protocol.ENDED)
            deadline = self.clock() + self.settings.start_timeout
            while len(self.registry) and self.clock() < deadline:
                for key, pid, code in self.spawner.exits(self.poll_interval):
                    self._on_exit(key, pid, code)
        elif action.message:
            self.log(action.message.rstrip("\n"))
        return action.exit_code, action.message

    def _note_wait(self, action, now: float) -> None:
        """Say when the job starts waiting for slots, then count down: what is there and how long is left, every
        tenth of the elastic timeout (1 s to 30 s apart)."""
        if not (isinstance(action, Wait) and action.for_slots):
            self.waiting_since = None
            return
        available = self._available(now)
        have = f"{sum(h.slots for h in available)} available"
        hosts = f" ({', '.join(f'{h.hostname}:{h.slots}' for h in available)})" if available else ""
        timeout, needed = self.settings.elastic_timeout, self.settings.min_np
        if self.waiting_since is None:
            self.waiting_since = self._wait_said = now
            self.log(f"waiting up to {timeout:g}s for {needed} slot(s); {have} now{hosts}")
        elif now - self._wait_said >= min(30.0, max(1.0, timeout / 10)):
            self._wait_said = now
            left = max(0.0, timeout - (now - self.waiting_since))
            self.log(f"still waiting for {needed} slot(s): {have}{hosts}; {left:.0f}s left of {timeout:g}s")

    def step(self) -> Optional[Tuple[int, str]]:
        """One observe-decide-act round; returns the job's ``(exit_code, message)`` when it has ended."""
        now = self.clock()
        if self.interrupted_by is not None:
            return 128 + self.interrupted_by, f"interrupted by signal {self.interrupted_by}"
        if now >= self._next_discovery:
            stop = self._discover(now)
            if stop is not None:
                return self._finish(stop)
        self._read_ready()
        self._notify_host_updates(self._available(now))
        action = decide(self.view(now), self.settings)
        self._note_wait(action, now)
        if isinstance(action, Stop):
            return self._finish(action)
        if isinstance(action, Spawn):
            self._spawn(action, now)
        elif isinstance(action, Kill):
            for key in action.keys:
                if key not in self._stopping:
                    self._stopping.add(key)
                    self.log(f"stopping worker {key}: {action.reason}")
                    self.spawner.send_signal(key, signal.SIGKILL)
        elif isinstance(action, Publish):
            self._publish(action)
        # A killed worker's exit wakes the wait when it arrives; only a spawn or a publish is acted on again at once.
        for key, pid, code in self.spawner.exits(self.poll_interval if isinstance(action, (Wait, Kill)) else 0.0):
            self._stopping.discard(key)
            self._on_exit(key, pid, code)
        return None

    def run(self) -> Tuple[int, str]:
        """Run the job to its end; every worker is stopped before this returns."""
        try:
            while True:
                result = self.step()
                if result is not None:
                    return result
        finally:
            if self._store_listener is not None:
                self.store.forget_listener(self._store_listener)
            self.spawner.close()


__all__ = ["ElasticJob"]
