"""Another local user against a running job (issue 29, items 1-3; tiers ranks).

A second account, created for these tests (``useradd``) and removed after them (``userdel``), runs the attacker's
processes with nothing but an ordinary user's rights; root only, skipped otherwise. Each test failed before its fix:

* **every listener crowded** — 200 idle connections held on each rank's TCP port and abstract Unix socket, reopened
  as soon as they are closed, while the second rank starts 5 s late: past 64 pending handshakes the newcomer was
  closed and the real peer did not dial again (``could not connect to its peers: connection closed by peer``). The job must start within 6 s of the
  first rank's ``init``, over the Unix sockets (one host) and over TCP (two host names).
* **the Unix listener** — another user dialling a rank's abstract Unix socket was sent the handshake's hello; now
  ``SO_PEERCRED`` refuses it before a byte.
* **the rendezvous store crowded** — 200 idle connections on the store, reopened as soon as they are closed: each
  job start took ~10 s longer and some failed at the start timeout. It must start within 1 s of an unattacked start.
* **shared-memory names** — the attacker watches ``/dev/shm`` with inotify and, from every name it sees, creates
  every name it can derive (numbers raised, the tag set to other process sets'): segments named
  ``<prefix>-<rank>-<generation>`` made the job fail with ``File exists`` when a buffer grew. With keyed names it
  guesses nothing the job uses, and the job finishes with correct results.

``HVD_SOAK_TRIALS=5`` (``make soak``) runs five trials of each timed test; one runs by default.
"""

import io
import os
import pwd
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import pytest

from horovod.runner.hosts import HostInfo, get_host_assignments
from horovod.runner.launch import LaunchConfig, launch_local, package_pythonpath
from horovod.runner.rendezvous import rendezvous_service
from horovod.testing import spawn_ranks

pytestmark = [pytest.mark.ranks, pytest.mark.serial]

TRIALS = int(os.environ.get("HVD_SOAK_TRIALS", "1"))
CROWD = 200          # idle connections per listener
LATE = 5.0           # seconds the second rank starts after the first
SHM_DIR = "/dev/shm"

# The attacker's programs: the standard library only, run by the second user's interpreter.
CROWD_ATTACKER = textwrap.dedent(r'''
    import errno, os, resource, selectors, socket, sys, time
    count = int(sys.argv[1])
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    sel = selectors.DefaultSelector()
    targets, retries, lines = {}, [], b""

    def say(*words):
        sys.stdout.write(" ".join(map(str, words)) + "\n")
        sys.stdout.flush()

    def dial(name):
        target = targets[name]
        sock = socket.socket(target["family"], socket.SOCK_STREAM)
        sock.setblocking(False)
        err = sock.connect_ex(target["address"])
        target["dialled"] += 1
        if err == 0:
            connected(name, sock, register=True)
        elif err == errno.EINPROGRESS:
            sel.register(sock, selectors.EVENT_WRITE, name)
        else:               # the backlog is full, or the listener is gone: again in a moment
            sock.close()
            retries.append((time.monotonic() + 0.005, name))

    def connected(name, sock, register):
        target = targets[name]
        if register:
            sel.register(sock, selectors.EVENT_READ, name)
        else:
            sel.modify(sock, selectors.EVENT_READ, name)
        target["open"] += 1
        target["most"] = max(target["most"], target["open"])
        for mark in (64, count):   # a full handshake window (64 pending), and the whole crowd at once
            if target["open"] == mark and mark not in target["held"]:
                target["held"].add(mark)
                say("held", name, mark, repr(time.time()))

    def closed(name, sock, was_open):
        sel.unregister(sock)
        sock.close()
        target = targets[name]
        target["cut"] += 1
        if target["cut"] == 1:
            say("cut", name, repr(time.time()))
        if was_open:
            target["open"] -= 1
        dial(name)          # reopened as soon as it is closed

    sel.register(0, selectors.EVENT_READ, None)
    running = True
    while running:
        now = time.monotonic()
        due = [r for r in retries if r[0] <= now]
        retries[:] = [r for r in retries if r[0] > now]
        for _, name in due:
            dial(name)
        timeout = max(0.0, min(r[0] for r in retries) - now) if retries else 0.1
        for key, events in sel.select(min(timeout, 0.1)):
            name = key.data
            if name is None:
                data = os.read(0, 4096)
                if not data:
                    running = False
                    break
                lines += data
                while b"\n" in lines:
                    line, lines = lines.split(b"\n", 1)
                    kind, *where = line.decode().split()
                    if kind == "tcp":
                        family, address = socket.AF_INET, (where[0], int(where[1]))
                    else:
                        family, address = socket.AF_UNIX, "\0" + where[0]
                    key_name = kind + ":" + ":".join(where)
                    targets[key_name] = dict(family=family, address=address, open=0, most=0, held=set(),
                                             dialled=0, cut=0)
                    for _ in range(count):
                        dial(key_name)
                continue
            sock = key.fileobj
            if events & selectors.EVENT_WRITE:
                if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                    connected(name, sock, register=False)
                else:
                    closed(name, sock, was_open=False)
                continue
            try:
                data = sock.recv(4096)      # a hello: read and ignored, the connection stays idle
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                closed(name, sock, was_open=True)
    for name, target in targets.items():
        say("stats", name, target["dialled"], target["cut"], target["most"])
''')

SHM_ATTACKER = textwrap.dedent(r'''
    import ctypes, itertools, os, re, select, struct, sys
    IN_CREATE, IN_MOVED_TO = 0x100, 0x80
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    if fd < 0 or libc.inotify_add_watch(fd, sys.argv[1].encode(), IN_CREATE | IN_MOVED_TO) < 0:
        raise OSError(ctypes.get_errno(), "inotify")
    mine = set()

    def say(*words):
        sys.stdout.write(" ".join(map(str, words)) + "\n")
        sys.stdout.flush()

    def variants(field):
        """What a field of a name might be in another name: numbers raised, tags with other numbers."""
        if field.isdigit():
            return [field] + [str(int(field) + d) for d in (1, 2, 3)]
        if re.fullmatch(r"[0-9a-f]{8,}", field):
            return [field, format(int(field, 16) + 1, "0%dx" % len(field))]
        runs = list(re.finditer(r"\d+", field))
        out = {field}
        for run in runs:
            for n in range(8):
                out.add(field[:run.start()] + str(n) + field[run.end():])
        return sorted(out)

    def guesses(name):
        fields = name.split("-")
        for combo in itertools.product(*(variants(f) for f in fields)):
            guess = "-".join(combo)
            if guess != name:
                yield guess

    say("watching")
    buffered = b""
    running = True
    while running:
        ready, _, _ = select.select([fd, 0], [], [])
        if 0 in ready:
            data = os.read(0, 4096)
            if not data:
                running = False
        if fd not in ready:
            continue
        data = os.read(fd, 1 << 16)
        offset = 0
        while offset < len(data):
            wd, mask, cookie, length = struct.unpack_from("iIII", data, offset)
            name = data[offset + 16:offset + 16 + length].rstrip(b"\0").decode(errors="replace")
            offset += 16 + length
            if not name.startswith("hvdpy-") or name in mine:
                continue
            made = 0
            for guess in guesses(name):
                if guess in mine:
                    continue
                try:
                    os.close(os.open(os.path.join(sys.argv[1], guess), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
                except OSError:
                    continue
                mine.add(guess)
                made += 1
            say("reacted", name, made)
    for guess in mine:
        try:
            os.unlink(os.path.join(sys.argv[1], guess))
        except OSError:
            pass
    say("created", len(mine))
''')


class Stranger:
    """The second local user: runs attacker programs as itself and ends them (by pid) when the test does."""

    def __init__(self, name: str, python: str):
        entry = pwd.getpwnam(name)
        self.name, self.uid, self.gid, self.python = name, entry.pw_uid, entry.pw_gid, python
        self.procs = []

    def start(self, program: str, *args: str) -> "Attack":
        proc = subprocess.Popen([self.python, "-I", "-c", program, *args], user=self.uid, group=self.gid,
                                extra_groups=[], cwd="/", stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env={"PATH": "/usr/bin:/bin"},
                                start_new_session=True)
        self.procs.append(proc)
        return Attack(proc)

    def end_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


class Attack:
    """One attacker process: its output lines as they come, commands on its standard input."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.lines = []
        self.changed = threading.Condition()
        self.err = ""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self.changed:
                self.lines.append(line.split())
                self.changed.notify_all()
        with self.changed:
            self.lines.append(["eof"])
            self.changed.notify_all()

    def tell(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def wait_for(self, predicate, timeout: float):
        """The first line ``predicate`` accepts, within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while True:
                for words in self.lines:
                    if predicate(words):
                        return words
                left = deadline - time.monotonic()
                assert left > 0 and ["eof"] not in self.lines, (
                    f"the attacker did not say it in {timeout:g} s: {self.lines[-5:]} {self.proc.stderr.read()}"
                    if self.proc.poll() is not None else f"the attacker did not say it in {timeout:g} s")
                self.changed.wait(left)

    def stop(self, timeout: float = 10.0):
        """End the attacker (the end of its input) and return every line it said."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self._reader.join(10)
        self.err = self.proc.stderr.read()
        return list(self.lines)


@pytest.fixture(scope="module")
def stranger():
    if os.geteuid() != 0:
        pytest.skip("needs root: these tests create a second local user (useradd) to attack the job as")
    useradd, userdel = shutil.which("useradd"), shutil.which("userdel")
    if useradd is None or userdel is None:
        pytest.skip("useradd/userdel not installed: no second local user to attack the job as")
    python = next((p for p in ("/usr/bin/python3", "/usr/local/bin/python3") if os.access(p, os.X_OK)), None)
    if python is None:
        pytest.skip("no system python3 the second user may run (/usr/bin/python3)")
    name = f"hvdx{uuid.uuid4().hex[:12]}"
    nologin = shutil.which("nologin") or "/usr/sbin/nologin"
    made = subprocess.run([useradd, "--system", "--no-create-home", "--shell", nologin, name],
                          capture_output=True, text=True, timeout=60)
    if made.returncode != 0:
        pytest.skip(f"useradd {name} failed: {made.stderr.strip()}")
    user = None
    try:
        user = Stranger(name, python)
        check = subprocess.run([python, "-I", "-c", "import os; print(os.getuid())"], user=user.uid,
                               group=user.gid, extra_groups=[], cwd="/", capture_output=True, text=True, timeout=30)
        if check.returncode != 0 or check.stdout.strip() != str(user.uid):
            pytest.skip(f"{python} does not run as the second user: {check.stderr.strip()}")
        yield user
    finally:
        if user is not None:
            user.end_all()
            for entry in os.scandir(SHM_DIR) if os.path.isdir(SHM_DIR) else ():
                try:
                    if entry.stat(follow_symlinks=False).st_uid == user.uid:
                        os.unlink(entry.path)
                except OSError:
                    pass
        subprocess.run([userdel, name], capture_output=True, timeout=60)


def _started(out: str):
    """Each rank's ``STARTED rank first-init done`` line: {rank: (first rank's init, first result)}."""
    found = re.findall(r"STARTED (\d+) (\S+) (\S+)", out)
    return {int(rank): (float(begun), float(done)) for rank, begun, done in found}


# -- item 1: every listener crowded while the second rank starts late ----------------------------------------------

LATE_PEER = textwrap.dedent(f"""
    import time
    import numpy as np
    import horovod.numpy as hvd
    from horovod.common.config import load_config
    from horovod.runner.run_task import client_from_env
    rank, client = load_config().rank, client_from_env()
    if rank == 0:
        begun = time.time()
        client.put("test", "begun", repr(begun).encode())
    else:
        begun = float(client.get("test", "begun", timeout=60))
        time.sleep(max(0.0, begun + {LATE!r} - time.time()))   # the scenario: this rank starts late
    hvd.init()
    total = hvd.allreduce(np.full(3, rank + 1.0), op=hvd.Sum)
    assert total.tolist() == [3.0, 3.0, 3.0], total
    print("STARTED", rank, repr(begun), repr(time.time()), flush=True)
    hvd.shutdown()
""")


def _crowd_each_listener(server, attack, stop, told, size=2):
    """Point the attacker at each rank's TCP port and Unix socket as soon as the rank publishes them."""
    while not stop.is_set() and len(told) < size:
        for rank in range(size):
            record = server.store.get("job.mesh.1", str(rank))
            if record is None or rank in told:
                continue
            fields = record.decode().split(" ")      # address, host, settings, Unix socket name, cores
            host, port = fields[0].rsplit(":", 1)
            unix_name = fields[3] if len(fields) > 3 else "-"
            attack.tell(f"tcp {host} {port}")
            if unix_name != "-":
                attack.tell(f"unix {unix_name}")
            told[rank] = (host, int(port), unix_name)
        stop.wait(0.01)


# The ranks on one host dial each other's abstract Unix sockets; on two host names (both this machine) their TCP ports.
PATHS = {"unix": [HostInfo("localhost", 2)], "tcp": [HostInfo("localhost", 1), HostInfo("127.0.0.1", 1)]}


@pytest.mark.parametrize("trial", range(1, TRIALS + 1))
@pytest.mark.parametrize("path", sorted(PATHS))
def test_a_crowd_on_every_listener_does_not_keep_a_late_rank_out(stranger, tmp_path, path, trial):
    script = tmp_path / "late_peer.py"
    script.write_text(LATE_PEER)
    launch = LaunchConfig((sys.executable, str(script)), tuple(get_host_assignments(PATHS[path], 2)),
                          extra_env=package_pythonpath())
    out, err = io.StringIO(), io.StringIO()
    attack = stranger.start(CROWD_ATTACKER, str(CROWD))
    stop, told, result = threading.Event(), {}, {}
    try:
        with rendezvous_service() as (server, rendezvous):
            pointer = threading.Thread(target=_crowd_each_listener, args=(server, attack, stop, told), daemon=True)
            pointer.start()
            job = threading.Thread(target=lambda: result.update(r=launch_local(launch, rendezvous, out, err,
                                                                               timeout=60)))
            job.start()
            job.join(70)
            stop.set()
            pointer.join(5)
    finally:
        stop.set()
        lines = attack.stop()
    assert not job.is_alive(), "the job did not end within 70 s"
    assert result["r"].ok, err.getvalue()[-3000:]
    started = _started(out.getvalue())
    assert sorted(started) == [0, 1], out.getvalue()
    begun = started[0][0]
    took = max(done for _, done in started.values()) - begun
    # The crowd really was there before rank 1 began: a full handshake window (64 held at once) on the listener
    # rank 1 dials (TCP evicts the oldest past 64, so the crowd may not hold all 200 at once; the Unix listener
    # refuses the other user at once, and the crowd dials again as fast as it can).
    host, port, unix_name = told[0]
    target = f"unix:{unix_name}" if path == "unix" else f"tcp:{host}:{port}"
    held = [words for words in lines if words[:3] == ["held", target, "64"]]
    assert held and float(held[0][3]) < begun + LATE, f"the crowd was not in place before rank 1 began: {lines}"
    stats = {words[1]: tuple(map(int, words[2:5])) for words in lines if words[0] == "stats"}
    print(f"trial {trial} ({path}): job start {took:.2f} s after the first rank's init (second rank {LATE:g} s "
          f"late); attacker dials, cuts, most held per listener: {stats}")
    assert took <= LATE + 1.0, f"the job started {took:.2f} s after its first rank's init with every listener " \
                               f"crowded (at most {LATE + 1.0:g})"


# -- item 1, mid-job: a connection opened on demand while every listener is crowded ---------------------------------

ON_DEMAND = textwrap.dedent("""
    import time
    import numpy as np
    import horovod.numpy as hvd
    from horovod.runner.run_task import client_from_env
    from horovod.runtime.basics import context
    client = client_from_env()
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    hvd.broadcast(np.ones(3), root_rank=0)          # star negotiation, a binomial tree (0-2, 0-1, 2-3): not 1-3
    client.put("test", f"ready.{rank}", " ".join(map(str, sorted(context().engine.transport._socks))).encode())
    client.get("test", "go", timeout=60)
    begun = time.time()
    got, _ = hvd.alltoall(np.full(size, float(rank)), name="everyone")   # needs every pair: 1-3 opens now
    assert got.tolist() == [float(r) for r in range(size)], got
    print("STARTED", rank, repr(begun), repr(time.time()), flush=True)
    hvd.shutdown()
""")

# Ranks 1 and 3 on different host names: the connection opened mid-job is TCP; on one host it is a Unix socket.
ON_DEMAND_PATHS = {"unix": [HostInfo("localhost", 4)], "tcp": [HostInfo("localhost", 2), HostInfo("127.0.0.1", 2)]}


@pytest.mark.parametrize("path", sorted(ON_DEMAND_PATHS))
def test_a_connection_opened_mid_job_gets_in_while_every_listener_is_crowded(stranger, tmp_path, path):
    script = tmp_path / "on_demand.py"
    script.write_text(ON_DEMAND)
    hosts = get_host_assignments(ON_DEMAND_PATHS[path], 4)
    launch = LaunchConfig((sys.executable, str(script)), tuple(hosts), extra_env={
        **package_pythonpath(), "HOROVOD_NEGOTIATION": "star", "HOROVOD_SHM_DISABLE": "1"})
    out, err = io.StringIO(), io.StringIO()
    attack = stranger.start(CROWD_ATTACKER, str(CROWD))
    stop, told, result = threading.Event(), {}, {}
    try:
        with rendezvous_service() as (server, rendezvous):
            pointer = threading.Thread(target=_crowd_each_listener, args=(server, attack, stop, told, 4),
                                       daemon=True)
            pointer.start()
            job = threading.Thread(target=lambda: result.update(r=launch_local(launch, rendezvous, out, err,
                                                                               timeout=60)))
            job.start()
            deadline = time.monotonic() + 60
            while not all(server.store.get("test", f"ready.{r}") is not None for r in range(4)):
                assert job.is_alive() and time.monotonic() < deadline, err.getvalue()[-3000:]
                time.sleep(0.02)
            ready = {r: server.store.get("test", f"ready.{r}").decode().split() for r in range(4)}
            pointer.join(10)
            for rank in (1, 3):     # either end may dial: both listeners full before the pair connects
                host, port, unix_name = told[rank]
                target = f"unix:{unix_name}" if path == "unix" else f"tcp:{host}:{port}"
                attack.wait_for(lambda words: words[:3] == ["held", target, "64"], 20)
            go = time.time()
            server.store.put("test", "go", b"1")
            job.join(70)
            stop.set()
    finally:
        stop.set()
        attack.stop()
    assert not job.is_alive(), "the job did not end within 70 s"
    assert "3" not in ready[1] and "1" not in ready[3], f"ranks 1 and 3 were connected before the alltoall: {ready}"
    assert result["r"].ok, err.getvalue()[-3000:]
    started = _started(out.getvalue())
    assert sorted(started) == [0, 1, 2, 3], out.getvalue()
    took = max(done for _, done in started.values()) - go
    print(f"{path}: the alltoall that opened ranks 1-3's connection under the crowd took {took:.2f} s")
    assert took <= 3.0, f"an alltoall needing a new connection took {took:.2f} s with every listener crowded"


# -- item 2: the rendezvous store crowded ------------------------------------------------------------------------

QUICK = textwrap.dedent("""
    import time
    import numpy as np
    import horovod.numpy as hvd
    hvd.init()
    total = hvd.allreduce(np.full(3, hvd.rank() + 1.0), op=hvd.Sum)
    assert total.tolist() == [3.0, 3.0, 3.0], total
    print("STARTED", hvd.rank(), 0, repr(time.time()), flush=True)
    hvd.shutdown()
""")


def _timed_start(script, attack=None):
    """Seconds from the launch to both ranks' first result; ``attack`` crowds the store before the launch."""
    launch = LaunchConfig((sys.executable, str(script)), tuple(get_host_assignments([HostInfo("localhost", 2)], 2)),
                          extra_env=package_pythonpath())
    out, err = io.StringIO(), io.StringIO()
    with rendezvous_service() as (server, rendezvous):
        if attack is not None:
            attack.tell(f"tcp {rendezvous.addr} {rendezvous.port}")
            where = f"tcp:{rendezvous.addr}:{rendezvous.port}"
            held = attack.wait_for(lambda words: words[:3] == ["held", where, str(CROWD)], 20)
            # The scenario, not a synchronisation: a crowd older than the store's grace for young connections
            # (1 s), so that each worker's connection makes the store close the oldest stranger, which comes back.
            time.sleep(max(0.0, float(held[3]) + 1.5 - time.time()))
        begun = time.time()
        result = launch_local(launch, rendezvous, out, err, timeout=60)
    assert result.ok, err.getvalue()[-3000:]
    started = _started(out.getvalue())
    assert sorted(started) == [0, 1], out.getvalue()
    return max(done for _, done in started.values()) - begun


@pytest.mark.parametrize("trial", range(1, TRIALS + 1))
def test_a_crowd_on_the_rendezvous_store_does_not_delay_the_start(stranger, tmp_path, trial):
    script = tmp_path / "quick.py"
    script.write_text(QUICK)
    _timed_start(script)        # warm: the first start of a session reads the package from disk
    quiet = _timed_start(script)
    attack = stranger.start(CROWD_ATTACKER, str(CROWD))
    try:
        crowded = _timed_start(script, attack)
    finally:
        lines = attack.stop()
    stats = [words for words in lines if words[0] == "stats"]
    print(f"trial {trial}: job start {quiet:.2f} s unattacked, {crowded:.2f} s with {CROWD} idle connections "
          f"on the store (attacker dials/cuts/most held {stats})")
    assert crowded <= quiet + 1.0, f"the job started in {crowded:.2f} s with a crowd on the rendezvous store, " \
                                   f"{quiet:.2f} s without"


# -- item 1: the Unix listener asks who is calling ---------------------------------------------------------------

PEEK = textwrap.dedent(r'''
    import socket, sys
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect("\0" + sys.argv[1])
    got = b""
    try:
        while len(got) < int(sys.argv[2]):     # enough for a hello, or the end of the connection
            chunk = sock.recv(4096)
            if not chunk:
                break
            got += chunk
    except OSError:
        pass
    print(len(got))
''')


def test_the_unix_listener_refuses_another_user_before_a_byte(stranger):
    from horovod.common import wire
    from horovod.transport.reactor import Reactor
    enough = str(wire.HELLO_SIZE)
    name = f"hvdpy-test-{uuid.uuid4().hex}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\0" + name)
    listener.listen(16)
    reactor = Reactor(0, 2, os.urandom(32), 1, lambda peer: False, lambda peer, exc: exc, lambda peer, sock: None)
    reactor.start()
    reactor.listen_on(listener)
    try:
        # Another user hears nothing, not even the hello (SO_PEERCRED); this user gets the hello and a deadline.
        stranger_heard = stranger.start(PEEK, name, enough).stop(timeout=20)
        same_user = subprocess.run([sys.executable, "-I", "-c", PEEK, name, enough], capture_output=True, text=True,
                                   timeout=30)
    finally:
        reactor.stop()
        reactor.join(10)
        listener.close()
    assert stranger_heard[0] == ["0"], stranger_heard
    assert int(same_user.stdout) == wire.HELLO_SIZE, same_user.stderr


# -- item 3: shared-memory names -----------------------------------------------------------------------------------

def _grows_and_adds_a_set(reacted_file):
    import time
    import numpy as np
    import horovod.numpy as hvd

    def attacker_saw(names):
        # The attacker had its chance at every name so far before the job goes on (a real one has all the time
        # between two steps).
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with open(reacted_file) as handle:
                    if int(handle.read() or 0) >= names:
                        return
            except (OSError, ValueError):
                pass
            time.sleep(0.01)
        raise AssertionError(f"the attacker did not see {names} segment names in 20 s")

    hvd.init(process_sets="dynamic")
    rank, size = hvd.rank(), hvd.size()
    small = hvd.allreduce(np.full(8192, rank + 1.0), op=hvd.Sum)     # 64 KiB: the first segments (1 MiB)
    attacker_saw(size)
    big = hvd.allreduce(np.full(1 << 21, rank + 1.0, dtype=np.float32), op=hvd.Sum)   # 8 MiB: segments grow
    attacker_saw(2 * size)
    pair = hvd.add_process_set([0, 1])      # a second set: its own segments, named for the first time now
    in_set = hvd.allreduce(np.full(8192, rank + 1.0), op=hvd.Sum, process_set=pair) if rank < 2 else None
    hvd.allreduce(np.ones(1), op=hvd.Sum)   # nobody shuts down while the pair still works
    hvd.shutdown()
    whole = size * (size + 1) / 2
    return (bool((small == whole).all()), bool((big == whole).all()),
            in_set is None or bool((in_set == 3.0).all()))


def _count_reactions(attack, reacted_file, stop):
    """Tell the ranks how many segment names the attacker has reacted to (atomically, as a file)."""
    seen = -1
    while not stop.is_set():
        with attack.changed:
            count = sum(1 for words in attack.lines if words[0] == "reacted")
            if count == seen:
                attack.changed.wait(0.1)
                continue
        seen = count
        with open(reacted_file + ".tmp", "w") as handle:
            handle.write(str(count))
        os.rename(reacted_file + ".tmp", reacted_file)


def test_segment_names_cannot_be_derived_from_the_ones_seen(stranger, tmp_path):
    if not (os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK)):
        pytest.skip("no writable /dev/shm")
    attack = stranger.start(SHM_ATTACKER, SHM_DIR)
    attack.wait_for(lambda words: words == ["watching"], 20)
    reacted_file = str(tmp_path / "reacted")
    stop = threading.Event()
    counter = threading.Thread(target=_count_reactions, args=(attack, reacted_file, stop), daemon=True)
    counter.start()
    try:
        results = spawn_ranks(_grows_and_adds_a_set, 3, timeout=60, args=(reacted_file,),
                              env={"HOROVOD_SHM_MIN_BYTES": "0"})
    finally:
        stop.set()
        counter.join(5)
        lines = attack.stop()
    reactions = [words for words in lines if words[0] == "reacted"]
    print(f"the attacker saw {len(reactions)} names and created {[w for w in lines if w[0] == 'created']} files")
    assert len(reactions) >= 8, f"the attacker saw too few segment names: {lines}"
    assert results == [(True, True, True)] * 3
