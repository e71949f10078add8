"""The elastic driver's pure decisions and its loop with a fake spawner and clock (tier: unit)."""

import math

import pytest

from horovod.common import elastic_records as protocol
from horovod.common.elastic_records import Assignment, HostUpdateResult
from horovod.runner.elastic.discovery import FixedHosts, HostDiscoveryError, hosts_of, parse_discovery_output
from horovod.runner.elastic.driver import (Blacklist, DriverView, ElasticSettings, Kill, Publish, Spawn, Stop, Wait,
                                           WorkerView, cooldown_delay, decide, host_update, plan_assignment,
                                           slot_keys)
from horovod.runner.elastic.job import ElasticJob
from horovod.runner.hosts import HostInfo
from horovod.runner.supervisor import WorkerExit
from horovod.runner.rendezvous import KVStore

pytestmark = pytest.mark.unit
A, B, C = HostInfo("a", 2), HostInfo("b", 1), HostInfo("c", 2)


def worker(key, ready=True, in_round=True, started=0.0):
    host, _, slot = key.partition(":")
    return WorkerView(key, host, int(slot), ready, in_round, started)


def view(**kw):
    base = dict(now=100.0, round=1, resets=0, workers=(), available=(A, B), current_hosts=("a", "b"))
    base.update(kw)
    return DriverView(**base)


def test_plan_keeps_surviving_hosts_first_and_caps_at_max_np():
    slots = plan_assignment(["b", "a"], [A, C, B], None)
    assert [(s.hostname, s.local_rank, s.rank) for s in slots] == \
        [("b", 0, 0), ("a", 0, 1), ("a", 1, 2), ("c", 0, 3), ("c", 1, 4)]
    assert [s.cross_rank for s in slots] == [0, 1, 0, 2, 1]
    assert len(plan_assignment(["b", "a"], [A, C, B], 2)) == 2
    assert plan_assignment([], [], None) == []


def test_host_update_flags():
    current = frozenset({"a:0", "a:1", "b:0"})
    assert host_update(current, plan_assignment(["a", "b"], [A, B], None)) == HostUpdateResult.no_update
    assert host_update(current, plan_assignment(["a", "b"], [A, B, C], None)) == HostUpdateResult.added
    assert host_update(current, plan_assignment(["a", "b"], [A], None)) == HostUpdateResult.removed
    assert host_update(current, plan_assignment(["a", "b"], [A, C], None)) == HostUpdateResult.mixed


def test_cooldown_delay_doubles_within_range():
    assert cooldown_delay((2, 100), 0, 0.0) == 2
    assert cooldown_delay((2, 100), 3, 0.5) == 17
    assert cooldown_delay((2, 10), 5, 0.0) == 10
    bl = Blacklist((1, 2))
    assert bl.add("a", 10.0, 0.5) == 11.5 and bl.blocked("a", 11.0) and not bl.blocked("a", 11.6)
    assert not bl.permanent("a")
    forever = Blacklist()
    assert forever.add("a", 0.0, 0.3) == math.inf and forever.permanent("a") and forever.blocked("a", 1e9)


def test_settings_are_checked():
    with pytest.raises(ValueError, match="max-np"):
        ElasticSettings(min_np=3, max_np=2)
    with pytest.raises(ValueError, match="cooldown"):
        ElasticSettings(min_np=1, cooldown_range=(0, 5))


S = ElasticSettings(min_np=2, max_np=None, elastic_timeout=10, start_timeout=5, reset_limit=2)


def test_round_in_progress_waits():
    assert decide(view(workers=(worker("a:0", ready=False), worker("a:1"))), S) == Wait()


def test_all_ready_publishes_survivors_first_and_removes_the_rest():
    workers = (worker("b:0"), worker("a:0"), worker("a:1"), worker("c:0", in_round=False))
    action = decide(view(workers=workers, current_hosts=("b", "a"), available=(A, B)), S)
    assert isinstance(action, Publish)
    assert [(s.hostname, s.local_rank, s.rank) for s in action.slots] == [("b", 0, 0), ("a", 0, 1), ("a", 1, 2)]
    assert action.removed == ("c:0",)


def test_new_slots_get_workers_then_wait_for_them():
    workers = (worker("a:0"), worker("a:1"))
    action = decide(view(workers=workers, current_hosts=("a",), available=(A, C)), S)
    assert isinstance(action, Spawn) and slot_keys(action.slots) == {"c:0", "c:1"}
    starting = workers + (worker("c:0", ready=False, in_round=False, started=99.0),
                          worker("c:1", ready=False, in_round=False, started=99.0))
    assert decide(view(workers=starting, current_hosts=("a",), available=(A, C)), S) == Wait()
    late = decide(view(now=200.0, workers=starting, current_hosts=("a",), available=(A, C)), S)
    assert isinstance(late, Kill) and late.keys == ("c:0", "c:1")


def test_end_rules():
    failure = WorkerExit(1, "a:0", -9)
    assert decide(view(succeeded=True, workers=(worker("a:1", ready=False),)), S) == Wait()
    assert decide(view(succeeded=True, workers=(worker("a:1"),)), S) == Stop(0)
    stop = decide(view(failures=(failure,)), S)
    assert stop.exit_code == 1 and "every worker" in stop.message and "a:0" in stop.message
    stop = decide(view(resets=2, workers=(worker("a:0"), worker("a:1"))), S)
    assert stop == Stop(1, "Horovod was shutdown because number of resets during elastic job exceeded limit: 2")
    stop = decide(view(workers=(worker("a:0"),), available=(), all_blacklisted=True, first_failure=failure), S)
    assert "blacklisted" in stop.message and "a:0" in stop.message
    stop = decide(view(workers=(worker("b:0", in_round=False),), current_hosts=("a",), available=(B, C)), S)
    assert "no worker of the previous round" in stop.message


def test_too_few_slots_wait_up_to_the_elastic_timeout():
    workers = (worker("b:0"),)
    assert decide(view(workers=workers, available=(B,)), S) == Wait(for_slots=True)
    assert decide(view(workers=workers, available=(B,), waiting_since=95.0), S) == Wait(for_slots=True)
    stop = decide(view(workers=workers, available=(B,), waiting_since=90.0), S)
    assert stop.exit_code == 1 and "Timed out waiting for minimum number of slots" in stop.message


def test_discovery_output_parsing():
    assert parse_discovery_output("a\n\nb:3\n a \n", 2) == [HostInfo("a", 2), HostInfo("b", 3)]
    for bad in ("a:x", "a:0", ":2"):
        with pytest.raises(HostDiscoveryError):
            parse_discovery_output(bad, 1)


def test_assignment_record_round_trip():
    record = Assignment(3, 1, 4, 1, 2, 0, 2, 7)
    assert Assignment.decode(record.encode()) == record
    assert protocol.decode_answer(protocol.REMOVED) == protocol.REMOVED
    with pytest.raises(ValueError):
        Assignment.decode(b"1,5,4,0,1,0,1,0")


class FakeSpawner:
    def __init__(self):
        self.live, self.events, self.started, self.next_pid = {}, [], [], 100

    def spawn(self, slot):
        self.next_pid += 1
        key = f"{slot.hostname}:{slot.local_rank}"
        self.live[key] = self.next_pid
        self.started.append(key)
        return self.next_pid

    def send_signal(self, key, sig):
        self.exit(key, -sig)

    def exit(self, key, code):
        self.events.append((key, self.live.pop(key), code))

    def exits(self, timeout):
        events, self.events = self.events, []
        return events

    def forget(self, key, pid):
        pass

    def close(self):
        self.closed = True


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        self.now += 0.1
        return self.now


def make_job(hosts, settings):
    store, spawner = KVStore(), FakeSpawner()
    job = ElasticJob(settings, FixedHosts(hosts), spawner, store, clock=Clock(), uniform=lambda: 0.0,
                     log=lambda text: None)
    return job, store, spawner


def ready(store, *keys):
    for key in keys:
        store.delete(protocol.ASSIGN_SCOPE, key)
        store.put(protocol.READY_SCOPE, key, b"0")


def test_job_loop_failure_then_new_round_with_the_survivor_as_rank_0():
    job, store, spawner = make_job([HostInfo("a", 1), HostInfo("b", 1)], ElasticSettings(min_np=1))
    assert job.step() is None and spawner.started == ["a:0", "b:0"]
    ready(store, "a:0", "b:0")
    assert job.step() is None and job.round == 1
    first = {k: Assignment.decode(store.get(protocol.ASSIGN_SCOPE, k)) for k in ("a:0", "b:0")}
    assert (first["a:0"].rank, first["b:0"].rank, first["a:0"].size) == (0, 1, 2)
    spawner.exit("a:0", -9)                     # rank 0 dies
    job.step()
    assert job.blacklist.permanent("a")
    ready(store, "b:0")                         # the survivor re-initialises
    assert job.step() is None and job.round == 2 and job.resets == 1
    again = Assignment.decode(store.get(protocol.ASSIGN_SCOPE, "b:0"))
    assert (again.round, again.rank, again.size) == (2, 0, 1)
    spawner.exit("b:0", 0)
    job.step()                                  # sees the exit
    assert job.step() == (0, "")


def test_job_loop_first_discovery_failure_fails_the_job():
    class Broken:
        def find_available_hosts_and_slots(self):
            raise HostDiscoveryError("script exited with status 3")
    job = ElasticJob(ElasticSettings(min_np=1), Broken(), FakeSpawner(), KVStore(), log=lambda text: None)
    code, message = job.run()
    assert code == 1 and "host discovery failed" in message


def test_a_worker_ready_in_the_store_wakes_the_loop_and_the_listener_goes_with_the_job():
    # The loop waits on the spawner's exits; a worker's "ready" (a put in the store) makes that wait return at once
    # rather than after the poll interval, and a finished job leaves no listener on the store.
    class WakeableSpawner(FakeSpawner):
        wakes = 0

        def wake(self):
            self.wakes += 1

    store, spawner = KVStore(), WakeableSpawner()
    job = ElasticJob(ElasticSettings(min_np=1), FixedHosts([HostInfo("a", 1)]), spawner, store, clock=Clock(),
                     uniform=lambda: 0.0, log=lambda text: None)
    assert job.step() is None and spawner.started == ["a:0"]
    before = spawner.wakes
    ready(store, "a:0")
    assert spawner.wakes > before
    spawner.exit("a:0", 0)
    assert job.run() == (0, "")
    after = spawner.wakes
    store.put(protocol.READY_SCOPE, "a:0", b"0")
    assert spawner.wakes == after


def test_a_supervisor_woken_returns_from_its_wait_with_no_exit():
    from horovod.runner.supervisor import Supervisor
    supervisor = Supervisor(sink=None)
    supervisor.wake()
    assert supervisor.exits(timeout=60.0) == []      # returns at once: a wake is not an exit
    assert supervisor.exits(timeout=0.0) == []


def test_a_late_worker_is_killed_once_and_the_loop_waits_for_its_exit_instead_of_spinning():
    # A worker past the start timeout is sent SIGKILL once; until its exit arrives each step waits the poll
    # interval (an exit wakes it), and the stop is logged once, not once per step.
    class SlowDeath(FakeSpawner):
        def __init__(self):
            super().__init__()
            self.signals, self.timeouts = [], []

        def send_signal(self, key, sig):
            self.signals.append((key, sig))     # the exit arrives later

        def exits(self, timeout):
            self.timeouts.append(timeout)
            return super().exits(timeout)

    store, spawner, lines = KVStore(), SlowDeath(), []
    settings = ElasticSettings(min_np=1, start_timeout=1)
    job = ElasticJob(settings, FixedHosts([HostInfo("a", 1), HostInfo("b", 1)]), spawner, store, clock=Clock(),
                     uniform=lambda: 0.0, log=lines.append)
    assert job.step() is None and spawner.started == ["a:0", "b:0"]
    ready(store, "a:0")
    for _ in range(30):
        job.step()
    assert spawner.signals == [("b:0", 9)]
    assert [line for line in lines if line.startswith("stopping worker")] == \
        ["stopping worker b:0: not ready within the start timeout (1s)"]
    assert all(timeout == job.poll_interval for timeout in spawner.timeouts[1:])
    spawner.exit("b:0", -9)
    job.step()
    assert "b:0" not in job._stopping


def test_horovods_dict_discovery_is_read_as_hosts_in_its_order():
    """A discovery written for Horovod returns {hostname: slots}; ours return HostInfo lists: the job reads both."""
    assert hosts_of({"b": 2, "a": 1}) == [HostInfo("b", 2), HostInfo("a", 1)]
    assert hosts_of([HostInfo("a", 3)]) == [HostInfo("a", 3)]
    for bad in ({"a": 0}, {"a": "2"}, {"": 1}, ["a"], None):
        with pytest.raises(HostDiscoveryError):
            hosts_of(bad)


def test_job_with_a_horovod_style_dict_discovery_spawns_its_hosts():
    class DictHosts:
        def find_available_hosts_and_slots(self):
            return {"a": 1, "b": 2}
    spawner = FakeSpawner()
    job = ElasticJob(ElasticSettings(min_np=1), DictHosts(), spawner, KVStore(), clock=Clock(), uniform=lambda: 0.0,
                     log=lambda text: None)
    assert job.step() is None and spawner.started == ["a:0", "b:0", "b:1"]


def test_a_failed_elastic_job_whose_launcher_ran_out_of_descriptors_says_so(monkeypatch, capsys):
    """The elastic launcher's store ran short (``RendezvousPool.exhausted``: the descriptor message) and the job
    failed: the returned message and stderr name it, not only the launcher's log (issue 48)."""
    import sys
    from horovod.runner.elastic.launch import run_elastic_job
    from horovod.runner.rendezvous import RendezvousPool
    said = "out of file descriptors (limit 1024): raise it with ulimit -n"
    monkeypatch.setattr(RendezvousPool, "exhausted", property(lambda self: said))
    code, message = run_elastic_job([sys.executable, "-c", "import sys; sys.exit(3)"],
                                    ElasticSettings(min_np=1, max_np=1, start_timeout=30.0),
                                    FixedHosts([HostInfo("localhost", 1)]), {})
    assert code != 0 and f"The launcher could not serve: {said}." in message
    assert f"horovodrun: The launcher could not serve: {said}." in capsys.readouterr().err
