"""Tier unit: -H and hostfile parsing, slot assignment, local-host detection."""

import socket

import pytest

from horovod.runner.hosts import (HostInfo, SlotInfo, get_host_assignments, is_local_host, parse_hostfile,
                                  parse_hostfile_text, parse_hosts, resolve_hosts)

pytestmark = pytest.mark.unit


def test_parse_hosts():
    assert parse_hosts("host-1:2, host.2:4,h_3:1") == [HostInfo("host-1", 2), HostInfo("host.2", 4),
                                                        HostInfo("h_3", 1)]


@pytest.mark.parametrize("text, message", [
    ("", "empty"),
    ("host1", "expected hostname:slots"),
    ("host1:two", "expected hostname:slots"),
    ("host1:2,", "invalid host entry ''"),
    ("ho st:2", "expected hostname:slots"),
    ("host1:0", "at least 1 slot"),
    ("a:1,a:2", "listed twice"),
])
def test_parse_hosts_rejects(text, message):
    with pytest.raises(ValueError, match=message):
        parse_hosts(text)


def test_parse_hostfile(tmp_path):
    path = tmp_path / "hostfile"
    path.write_text("# cluster\n\nnode1 slots=4\n  node2   slots=2  # comment\nnode3\n")
    assert parse_hostfile(str(path)) == [HostInfo("node1", 4), HostInfo("node2", 2), HostInfo("node3", 1)]


@pytest.mark.parametrize("text, message", [
    ("node1 slots=x\n", "line 1.*slots=N"),
    ("node1\nnode2 slots=2 extra\n", "line 2"),
    ("node1 cores=2\n", "slots=N"),
    ("node1 slots=0\n", "at least 1 slot"),
    ("# nothing\n\n", "names no host"),
    ("node1\nnode1 slots=2\n", "listed twice"),
])
def test_parse_hostfile_rejects(text, message):
    with pytest.raises(ValueError, match=message):
        parse_hostfile_text(text)


def test_missing_hostfile(tmp_path):
    with pytest.raises(ValueError, match="cannot read hostfile"):
        parse_hostfile(str(tmp_path / "nope"))


def test_resolve_hosts_default_and_exclusive(tmp_path):
    assert resolve_hosts(3) == [HostInfo("localhost", 3)]
    with pytest.raises(ValueError, match="not both"):
        resolve_hosts(2, "a:1", str(tmp_path / "f"))


def test_assignment_single_host():
    slots = get_host_assignments([HostInfo("localhost", 4)], 3)
    assert slots == [SlotInfo("localhost", r, r, 0, 3, 3, 1) for r in range(3)]


def test_assignment_fills_hosts_in_order():
    slots = get_host_assignments([HostInfo("a", 2), HostInfo("b", 3), HostInfo("c", 2)], 6)
    got = [(s.hostname, s.rank, s.local_rank, s.local_size, s.cross_rank, s.cross_size) for s in slots]
    assert got == [("a", 0, 0, 2, 0, 3), ("a", 1, 1, 2, 0, 2),
                   ("b", 2, 0, 3, 1, 3), ("b", 3, 1, 3, 1, 2), ("b", 4, 2, 3, 0, 1),
                   ("c", 5, 0, 1, 2, 3)]
    assert all(s.size == 6 for s in slots)


def test_assignment_invariants_hold_for_any_layout():
    for layout in ([1], [3, 1, 2], [2, 2, 2], [5, 1]):
        hosts = [HostInfo(f"h{i}", n) for i, n in enumerate(layout)]
        for np_ in range(1, sum(layout) + 1):
            slots = get_host_assignments(hosts, np_)
            assert [s.rank for s in slots] == list(range(np_))
            for s in slots:
                same_host = [t for t in slots if t.hostname == s.hostname]
                same_local = [t for t in slots if t.local_rank == s.local_rank]
                assert s.local_size == len(same_host) and s.cross_size == len(same_local)
                assert sorted(t.local_rank for t in same_host) == list(range(len(same_host)))
                assert sorted(t.cross_rank for t in same_local) == list(range(len(same_local)))


def test_assignment_rejects_too_many_processes():
    with pytest.raises(ValueError, match=r"more processes \(5\) than there are available slots \(3\)"):
        get_host_assignments([HostInfo("a", 1), HostInfo("b", 2)], 5)
    with pytest.raises(ValueError, match="at least 1"):
        get_host_assignments([HostInfo("a", 1)], 0)


def test_is_local_host():
    assert is_local_host("localhost")
    assert is_local_host("127.0.1.1")
    assert is_local_host(socket.gethostname())
    assert not is_local_host("no-such-host.invalid")
