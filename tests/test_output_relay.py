"""Workers' output through the launcher.

* Output that cannot be written never kills a job (issue 19): ``horovodrun ... | head -n 3``, a closed stdout.
* Memory stays bounded whatever a rank writes (issue 29, item 6): a line without end is passed on in prefixed pieces,
  a progress bar redrawn with carriage returns shows as it is drawn, locally and over a host channel.
"""

import io
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from horovod.runner import mux
from horovod.runner.output import PIECE_CHARS, OutputSink, PieceSplitter


@pytest.mark.unit
def test_a_closed_reader_drops_output_with_one_warning():
    read, write = os.pipe()
    os.close(read)
    target = os.fdopen(write, "w")
    warnings = io.StringIO()
    sink = OutputSink(2, stdout=target, stderr=warnings)
    for i in range(100):
        sink.write(0, "stdout", f"line {i}")     # EPIPE: dropped from the first failure on, no exception
    sink.write(1, "stderr", "still here")
    text = warnings.getvalue()
    assert text.count("can no longer be written") == 1, text
    assert "[1]<stderr>:still here" in text
    target.close()


SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    import horovod.numpy as hvd
    hvd.init()
    for step in range(300):
        print(f"step {step} " + "x" * 200, flush=True)
        hvd.allreduce(np.ones(4), name=f"s{step % 4}")
    with open(sys.argv[1] + f".{hvd.rank()}", "w") as handle:
        handle.write("finished")
    hvd.shutdown()
""")


@pytest.mark.cli
def test_horovodrun_piped_into_head_finishes_the_job(tmp_path):
    (tmp_path / "job.py").write_text(SCRIPT)
    done = str(tmp_path / "done")
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    command = (f"{sys.executable} -m horovod.runner -np 2 {sys.executable} {tmp_path / 'job.py'} {done} "
               f"| head -n 3; echo \"status=${{PIPESTATUS[0]}}\" >&2")
    proc = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=120, env=env,
                          cwd=str(tmp_path))
    assert len(proc.stdout.splitlines()) == 3, proc.stdout
    assert "status=0" in proc.stderr, proc.stderr[-3000:]
    for rank in (0, 1):
        assert open(f"{done}.{rank}").read() == "finished"


@pytest.mark.cli
def test_horovodrun_with_stdout_closed_finishes_the_job(tmp_path):
    (tmp_path / "job.py").write_text(SCRIPT)
    done = str(tmp_path / "done")
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    proc = subprocess.run(["bash", "-c", f"exec 1>&-; exec {sys.executable} -m horovod.runner -np 2 "
                           f"{sys.executable} {tmp_path / 'job.py'} {done}"], stderr=subprocess.PIPE, text=True,
                          timeout=120, env=env, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):
        assert open(f"{done}.{rank}").read() == "finished"


# -- bounded memory, pieces, progress bars (issue 29, item 6) ------------------------------------------------------


@pytest.mark.unit
def test_pieces_are_lines_carriage_return_segments_and_bounded_parts_of_long_lines():
    splitter = PieceSplitter(limit=5)
    assert splitter.feed(b"ab\ncd\r") == [("ab", "\n")]            # a final "\r" waits: "\r\n" is one line end
    assert splitter.feed(b"\nxy\r12") == [("cd", "\r\n"), ("xy", "\r")]
    assert splitter.feed(b"3456789") == [("12345", "")]            # past the bound: a piece of the line
    assert splitter.feed(b"\xc3") == []                            # half a character waits for the other half
    assert splitter.feed(b"\xa9\r") == []
    assert splitter.finish() == [("6789\u00e9", "\r")]
    assert splitter.finish() == []


@pytest.mark.unit
def test_a_splitter_holds_at_most_its_bound_whatever_it_is_fed():
    splitter = PieceSplitter()
    total = 0
    for _ in range(64):
        pieces = splitter.feed(b"y" * 50_000)
        assert all(len(text) <= PIECE_CHARS and end == "" for text, end in pieces)
        total += sum(len(text) for text, _ in pieces)
        assert len(splitter._partial) <= PIECE_CHARS
    total += sum(len(text) for text, _ in splitter.finish())
    assert total == 64 * 50_000


@pytest.mark.unit
def test_the_sink_keeps_carriage_returns_and_the_rank_files_get_the_output_exactly(tmp_path):
    out = io.StringIO()
    sink = OutputSink(1, stdout=out, stderr=io.StringIO(), output_dir=str(tmp_path))
    for text, end in [("", "\r"), ("10%", "\r"), ("100%", "\n"), ("abc", ""), ("def", "\r\n"), ("tail", "")]:
        sink.write(0, "stdout", text, end)
    sink.close()
    assert out.getvalue() == ("[0]<stdout>:\r[0]<stdout>:10%\r[0]<stdout>:100%\n[0]<stdout>:abc\n"
                              "[0]<stdout>:def\n[0]<stdout>:tail\n")
    with open(tmp_path / "rank.0" / "stdout", newline="") as handle:
        assert handle.read() == "\r10%\r100%\nabcdef\r\ntail"


FRAMES = textwrap.dedent("""
    import struct, sys
    out = sys.stdout.buffer
    def frame(kind, payload):
        out.write(struct.pack("!iBI", 0, kind, len(payload)) + payload)
    frame(1, b"\\rstep 1\\rstep 2\\r")
    for _ in range(4):
        frame(1, b"z" * 65536)
    frame(1, b"\\n")
    frame(3, b"0")
    out.flush()
""")


@pytest.mark.ranks
def test_a_host_channel_relays_pieces_not_whole_lines():
    from horovod.runner.backends.host_channel import HostChannel
    proc = subprocess.Popen([sys.executable, "-c", FRAMES], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    got = []
    try:
        channel = HostChannel(proc, [0])
        channel.attach(0, lambda stream, text, end: got.append((stream, text, end)))
        assert channel.wait(0, timeout=20) == 0
    finally:
        proc.kill()
        proc.wait()
    assert got[:3] == [("stdout", "", "\r"), ("stdout", "step 1", "\r"), ("stdout", "step 2", "\r")]
    long_pieces = got[3:]
    assert all(len(text) <= PIECE_CHARS for _, text, _ in long_pieces)
    assert sum(text.count("z") for _, text, _ in long_pieces) == 4 * 65536
    assert long_pieces[-1][2] == "\n"
    assert mux.MAX_CHUNK == 65536


@pytest.mark.unit
def test_releasing_a_hosts_workers_again_closes_its_channel_once(monkeypatch):
    # The supervisor releases each worker when it reaps and again when it closes: at 16 hosts x 8 a timer per
    # repeated release put 128 more threads in horovodrun for five seconds.
    from horovod.runner.backends import host_channel
    timers = []

    class CountedTimer(host_channel.threading.Timer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            timers.append(self)
    monkeypatch.setattr(host_channel.threading, "Timer", CountedTimer)
    proc = subprocess.Popen([sys.executable, "-c", "import sys, time; sys.stdin.read(); time.sleep(30)"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        channel = host_channel.HostChannel(proc, [0, 1, 2])
        for _ in range(3):
            for rank in (0, 1, 2):
                channel.release(rank)
        assert proc.stdin.closed and len(timers) == 1
    finally:
        for timer in timers:
            timer.cancel()
        proc.kill()
        proc.wait()


NO_NEWLINE = textwrap.dedent("""
    import os, sys, time
    chunk = b"x" * (1 << 20)
    for _ in range(int(sys.argv[2])):
        sys.stdout.buffer.write(chunk)
    sys.stdout.buffer.write(b"\\nDONE\\n")
    sys.stdout.flush()
    while not os.path.exists(sys.argv[1]):     # stay alive until the test has read the launcher's peak memory
        time.sleep(0.02)
""")


def _vm_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field} for {pid}")


def _launch(tmp_path, *args):
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    return subprocess.Popen([sys.executable, "-m", "horovod.runner", "-np", "1", *args], cwd=str(tmp_path),
                            env=env, stdout=subprocess.PIPE, stderr=open(tmp_path / "launcher.err", "wb"),
                            start_new_session=True)


def _read_until(proc, marker: bytes, deadline: float, on_data=None) -> bytes:
    """Read the launcher's output until ``marker`` appears (what was read: only its last part if ``on_data``
    consumes it), failing at ``deadline``."""
    import select
    seen = b""
    while marker not in seen:
        assert time.monotonic() < deadline, f"no {marker!r} in time; last output {seen[-300:]!r}"
        ready, _, _ = select.select([proc.stdout], [], [], 0.2)
        if not ready:
            continue
        data = os.read(proc.stdout.fileno(), 1 << 20)
        assert data, f"the launcher's output ended before {marker!r}; last output {seen[-300:]!r}"
        if on_data is not None:
            on_data(data)
            seen = seen[-64:] + data
        else:
            seen += data
    return seen


def _stop(proc) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@pytest.mark.serial
@pytest.mark.cli
def test_a_rank_writing_200_mib_without_a_newline_keeps_the_launcher_small(tmp_path):
    (tmp_path / "flood.py").write_text(NO_NEWLINE)
    mib = 200
    proc = _launch(tmp_path, sys.executable, "flood.py", str(tmp_path / "go"), str(mib))
    counted = [0, 0]        # x bytes, prefixed pieces

    def count(data: bytes) -> None:
        counted[0] += data.count(b"x")
        counted[1] += data.count(b"[0]<stdout>:")

    try:
        started = time.monotonic()
        _read_until(proc, b"[0]<stdout>:DONE\n", started + 60, on_data=count)
        peak = _vm_kib(proc.pid, "VmHWM") / 1024
        (tmp_path / "go").touch()
        rest = proc.communicate(timeout=30)[0]
        print(f"{mib} MiB relayed in {time.monotonic() - started:.1f} s in {counted[1]} pieces; launcher peak RSS "
              f"{peak:.0f} MiB")
    finally:
        _stop(proc)
    assert proc.returncode == 0, (tmp_path / "launcher.err").read_text()[-2000:]
    assert counted[0] + rest.count(b"x") == mib << 20          # every byte arrived
    assert counted[1] >= (mib << 20) // PIECE_CHARS              # in pieces, each with the prefix
    assert peak < 100, f"horovodrun's peak RSS was {peak:.0f} MiB relaying one {mib} MiB line"


PROGRESS = textwrap.dedent("""
    import os, sys, time
    i = 0
    while not os.path.exists(sys.argv[1]):
        sys.stdout.write(f"\\rprogress {i}")
        sys.stdout.flush()
        i += 1
        time.sleep(0.02)
    sys.stdout.write("\\rprogress done\\n")
""")


@pytest.mark.timed
@pytest.mark.cli
def test_a_progress_bar_redrawn_with_carriage_returns_shows_while_the_rank_runs(tmp_path):
    (tmp_path / "bar.py").write_text(PROGRESS)
    proc = _launch(tmp_path, sys.executable, "bar.py", str(tmp_path / "go"))
    try:
        seen = _read_until(proc, b"[0]<stdout>:progress 20\r", time.monotonic() + 30)
        assert proc.poll() is None          # the rank still runs: it stops once "go" exists
        (tmp_path / "go").touch()
        out = seen + proc.communicate(timeout=30)[0]
    finally:
        _stop(proc)
    assert proc.returncode == 0, (tmp_path / "launcher.err").read_text()[-2000:]
    assert b"[0]<stdout>:progress 0\r[0]<stdout>:progress 1\r" in out
    assert out.endswith(b"[0]<stdout>:progress done\n")
