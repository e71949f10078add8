"""Issue 18, items 4, 5 and 8: Horovod's switches do what they say, jobs started by mpirun/torchrun work as they are,
and a failed job names its root cause (tiers unit, ranks and cli)."""

import logging
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

import horovod
from horovod.common.failure_records import FailureRecord, finished_record
from horovod.runner.cli import configure_launcher_logging, main, make_parser
from horovod.runner.diagnosis import diagnose, summary
from horovod.runner.supervisor import JobResult, WorkerExit
from horovod.runtime.affinity import cores_for, parse_affinity
from horovod.testing.fixtures import run_horovodrun

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable

# Every flag of Horovod 0.28.1's horovodrun, with a value where it takes one.
HOROVOD_FLAGS = [
    ["-v"], ["--version"], ["-cb"], ["--check-build"], ["--disable-cache"], ["--start-timeout", "30"],
    ["--network-interfaces", "lo"], ["--network-interface", "lo"], ["--output-filename", "out"], ["--verbose"],
    ["--config-file", "c.yaml"], ["-p", "22"], ["--ssh-port", "22"], ["-i", "k"], ["--ssh-identity-file", "k"],
    ["--fusion-threshold-mb", "32"], ["--cycle-time-ms", "5"], ["--cache-capacity", "512"],
    ["--hierarchical-allreduce"], ["--no-hierarchical-allreduce"], ["--hierarchical-allgather"],
    ["--no-hierarchical-allgather"], ["--autotune"], ["--no-autotune"], ["--autotune-log-file", "a.csv"],
    ["--autotune-warmup-samples", "2"], ["--autotune-steps-per-sample", "5"],
    ["--autotune-bayes-opt-max-samples", "10"], ["--autotune-gaussian-process-noise", "0.5"],
    ["--min-np", "1"], ["--min-num-proc", "1"], ["--max-np", "2"], ["--max-num-proc", "2"],
    ["--slots-per-host", "2"], ["--elastic-timeout", "60"], ["--reset-limit", "3"],
    ["--blacklist-cooldown-range", "10", "100"], ["--timeline-filename", "t.json"], ["--timeline-mark-cycles"],
    ["--no-timeline-mark-cycles"], ["--no-stall-check"], ["--stall-check"],
    ["--stall-check-warning-time-seconds", "30"], ["--stall-check-shutdown-time-seconds", "60"],
    ["--mpi-threads-disable"], ["--no-mpi-threads-disable"], ["--mpi-args=--oversubscribe"], ["--tcp"],
    ["--binding-args=--bind-to none"], ["--num-nccl-streams", "2"], ["--thread-affinity", "0"],
    ["--gloo-timeout-seconds", "60"], ["--log-level", "DEBUG"], ["--log-with-timestamp"],
    ["--log-without-timestamp"], ["-prefix-timestamp"], ["--prefix-output-with-timestamp"],
    ["--log-hide-timestamp"], ["--no-log-hide-timestamp"], ["-H", "localhost:2"], ["--hosts", "localhost:2"],
    ["-hostfile", "h"], ["--hostfile", "h"], ["--host-discovery-script", "d.sh"], ["--gloo"], ["--mpi"], ["--jsrun"],
]


@pytest.mark.unit
@pytest.mark.parametrize("flag", HOROVOD_FLAGS, ids=lambda f: f[0])
def test_every_horovodrun_flag_of_horovod_parses(flag):
    args = make_parser().parse_args(["-np", "2", *flag, "python", "train.py"])
    assert args.command == ["python", "train.py"]


@pytest.mark.unit
def test_stall_check_and_timestamp_spellings():
    parse = lambda *a: vars(make_parser().parse_args([*a, "-np", "1", "x"]))  # noqa: E731
    assert parse("--stall-check")["no_stall_check"] is False and parse("--no-stall-check")["no_stall_check"]
    assert parse("--log-hide-timestamp")["log_without_timestamp"] is True
    assert parse("--log-with-timestamp")["log_without_timestamp"] is False
    assert parse("--no-log-hide-timestamp")["log_without_timestamp"] is False


@pytest.mark.unit
def test_help_states_units_and_real_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "fusion buffer size in MiB" in text and "default: 128 MiB" in text
    assert "default: 10 ms when not given" in text


@pytest.mark.unit
@pytest.mark.parametrize("argv, expected", [
    (["-np", "2", "--fusion-treshold-mb", "4", "python", "x.py"], "did you mean --fusion-threshold-mb?"),
    (["-np", "2", "--log-level", "debugg", "python", "x.py"], "did you mean DEBUG?"),
    (["-np", "2", "--mpi-args=x", "python", "x.py"], "--mpi-args needs --mpi"),
    (["--nproc-per-node", "2", "train.py"], "did you mean -np? -np N is the total number of processes"),
    (["--nproc_per_node=2", "train.py"], "did you mean -np?"),
    (["-np", "2", "--nnodes", "2", "train.py"], "did you mean -H? -H host1:N,host2:N or --hostfile FILE"),
    (["-np", "2", "--master-port", "29500", "train.py"], "horovodrun needs no --master-port: it runs its own"),
])
def test_usage_error_is_one_line_with_a_suggestion(argv, expected, capsys):
    with pytest.raises(SystemExit) as exit_info:
        status = main(argv)
        raise SystemExit(status)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("horovodrun: error:") and expected in err, err
    assert "usage:" not in err


@pytest.mark.unit
def test_log_level_drives_the_horovod_loggers(monkeypatch):
    logger = logging.getLogger("horovod")
    before = (logger.level, list(logger.handlers), logger.propagate)
    try:
        configure_launcher_logging({"log_level": "DEBUG", "log_without_timestamp": True})
        assert logger.getEffectiveLevel() == logging.DEBUG
        assert logging.getLogger("horovod.runner").isEnabledFor(logging.DEBUG)
        fmt = next(h.formatter._fmt for h in logger.handlers if getattr(h, "_horovod", False))
        assert "asctime" not in fmt
    finally:
        logger.setLevel(before[0])
        logger.handlers[:] = before[1]
        logger.propagate = before[2]


@pytest.mark.unit
def test_settings_that_cannot_apply_warn_once(capsys):
    from horovod.runner.tunables import warn_inert
    assert warn_inert({"num_nccl_streams": 2, "mpi_threads_disable": True}) == ["--mpi-threads-disable",
                                                                              "--num-nccl-streams"]
    err = capsys.readouterr().err
    assert err.count("--num-nccl-streams is ignored") == 1 and err.count("--mpi-threads-disable is ignored") == 1


@pytest.mark.unit
def test_thread_affinity_parsing(caplog):
    assert parse_affinity("0,1,4-5") == [{0}, {1}, {4, 5}]
    assert cores_for("2,3", 1, 2) == {3}
    with caplog.at_level(logging.ERROR, logger="horovod"):
        assert cores_for("0", 0, 2) is None
    assert "Expected 2 core ids but got 1" in caplog.text
    with pytest.raises(ValueError, match="not a core id"):
        parse_affinity("0,x")


def _exit(rank, code, at):
    return WorkerExit(rank, "h", code, at)


@pytest.mark.unit
def test_diagnosis_prefers_the_rank_that_raised_over_earlier_consequences():
    # rank 0 exited first (HorovodInternalError), rank 1 raised KeyError earlier but was still shutting down.
    result = JobResult((_exit(0, 1, 10.0), _exit(1, -15, 11.0)), first_failure=_exit(0, 1, 10.0))
    records = [FailureRecord(0, 9.5, "HorovodInternalError", "shut down", consequence=True, waiting_for="allreduce.w"),
               FailureRecord(1, 9.0, "KeyError", "'x'", "Traceback...\nKeyError: 'x'\n"), finished_record(0, 9.6)]
    verdict = diagnose(result, records)
    assert (verdict.rank, verdict.kind) == (1, "raised")
    text = summary(result, records)
    assert text.index("KeyError: 'x'") < text.index("Horovod detected")
    assert "Process name: 1" in text and "Root cause: rank 1 on h raised KeyError: 'x'." in text
    assert "rank 0 failed as a consequence (waiting for allreduce.w)" in text


@pytest.mark.unit
def test_a_deadlock_report_names_every_rank_once_and_agrees_with_the_first_exit():
    # Both ranks raise the same deadlock error (each naming its own stacks' file); rank 1 raised first, rank 0 exited
    # first. The report: one traceback, Horovod's block and the root cause naming the same rank, no rank repeated.
    message = "Deadlock: for 31 s ... (rank 0 waits for allreduce.a; rank 1 waits for allreduce.b)"
    records = [FailureRecord(r, 9.0 + (1 - r) * 0.1, "TensorMismatchError",
                             f"{message}\nThread stacks of this process (pid {r}): /tmp/s{r}.txt",
                             f"Traceback...\nTensorMismatchError: {message}\nThread stacks ...: /tmp/s{r}.txt\n")
               for r in (0, 1)]
    result = JobResult((_exit(0, 1, 9.5), _exit(1, 1, 9.6)), first_failure=_exit(0, 1, 9.5))
    text = summary(result, records)
    assert [line for line in text.splitlines() if line.startswith("Root cause")] == \
        ["Root cause, rank 0 (ranks 0 and 1 raised alike):",
         f"Root cause: ranks 0 and 1 all raised TensorMismatchError: {message}."], text
    assert "Process name: 0\n" in text and "The first process to do so was" in text and "failed too" not in text
    assert text.count("Thread stacks") == 1 and len(text.splitlines()) == 10, text


@pytest.mark.unit
def test_when_two_ranks_raise_the_earliest_raise_is_the_root_cause():
    # rank 1 raised first (9.0) but lingered; rank 0 raised its own error later (9.4) and exited first, rank 2 failed
    # as a consequence. Neither the first exit nor the latest raise is the cause: the earliest raise is.
    result = JobResult((_exit(0, 1, 9.5), _exit(2, 1, 9.6), _exit(1, 1, 12.0)), first_failure=_exit(0, 1, 9.5))
    records = [FailureRecord(2, 9.2, "HorovodInternalError", "rank 1 failed", consequence=True),
               FailureRecord(0, 9.4, "ValueError", "bad batch", "Traceback...\nValueError: bad batch\n"),
               FailureRecord(1, 9.0, "KeyError", "'x'", "Traceback...\nKeyError: 'x'\n")]
    verdict = diagnose(result, records)
    assert (verdict.rank, verdict.kind) == (1, "raised")
    text = summary(result, records)
    assert [line for line in text.splitlines() if line.startswith("Root cause")] == \
        ["Root cause, rank 1:", "Root cause: rank 1 on h raised KeyError: 'x'."], text
    assert "rank 0 failed too: ValueError: bad batch" in text and "rank 2 failed as a consequence" in text


@pytest.mark.unit
def test_diagnosis_of_a_rank_that_finished_while_others_waited():
    result = JobResult((_exit(0, 1, 10.0), _exit(1, 0, 4.0)), first_failure=_exit(0, 1, 10.0))
    records = [FailureRecord(0, 9.9, "HorovodInternalError", "shut down", consequence=True,
                             waiting_for="allreduce.grad")]
    verdict = diagnose(result, records)
    assert (verdict.rank, verdict.kind) == (1, "finished")
    assert verdict.headline() == "rank 1 on h finished (exited with code 0) while rank 0 waited for allreduce.grad"
    # the launcher stopped rank 1 after rank 0's failure, but rank 1 had recorded that it finished
    stopped = JobResult((_exit(0, 1, 10.0), _exit(1, -15, 10.5)), first_failure=_exit(0, 1, 10.0))
    verdict = diagnose(stopped, records + [finished_record(1, 9.8)])
    assert (verdict.rank, verdict.kind) == (1, "finished") and "shut down normally" in verdict.headline()
    # a rank killed by a signal, with no record, before the consequences: that one
    killed = JobResult((_exit(0, 1, 10.0), _exit(1, -9, 9.0)), first_failure=_exit(1, -9, 9.0))
    assert diagnose(killed, records).kind == "died" and diagnose(killed, records).rank == 1
    assert diagnose(JobResult((_exit(0, 0, 1.0),)), []) is None


@pytest.mark.unit
def test_diagnosis_of_a_lost_host_names_it_not_the_survivor_that_exited_first():
    import errno
    from horovod.common.failure_records import describe_exception
    from horovod.transport.tcp import TcpTransport
    # The survivors' errors, worded by the transport itself.
    errors = []
    for rank in (0, 1):
        transport = TcpTransport(rank, 4, b"k", timeout=30.0, liveness=10.0)
        transport.set_layout(["a", "a", "b", "b"], [2, 2, 2, 2])
        errors.append(transport.fail(2, OSError(errno.ETIMEDOUT, "Connection timed out")))
    records = [describe_exception(rank, error, when=10.4 + rank / 10) for rank, error in enumerate(errors)]
    assert records[0].lost_peer() == (2, "b", "its connection showed no sign of life for 10 s "
                                              "(HOROVOD_LIVENESS_TIMEOUT); its host is down or unreachable")
    # Host b's workers could tell nobody: the launcher ended them last, when it reaped.
    result = JobResult((_exit(0, 1, 10.5), _exit(1, 1, 10.6), _exit(2, -9, 12.6), _exit(3, -9, 12.6)),
                       first_failure=_exit(0, 1, 10.5))
    verdict = diagnose(result, records)
    assert (verdict.rank, verdict.kind) == (2, "lost")
    assert verdict.headline() == ("rank 2 on h was lost, as rank 0 reported first: its connection showed no sign of "
                                  "life for 10 s (HOROVOD_LIVENESS_TIMEOUT); its host is down or unreachable")
    text = summary(result, records)
    # Horovod's block names the lost rank too, saying it is the cause rather than the first to exit: no line of the
    # summary names the survivor that exited first as the failure.
    assert "Root cause, rank" not in text and "The process that caused it was:\nProcess name: 2\n" in text
    assert "rank 0 failed as a consequence" in text and "rank 1 failed as a consequence" in text
    # A lost rank that reported a failure itself is no lost host: the first failure stays the verdict.
    own = FailureRecord(2, 10.0, "HorovodInternalError", "rank 0 was lost", consequence=True)
    assert diagnose(result, records + [own]).kind == "failed"


RAISE_LATE = textwrap.dedent("""
    import atexit, os, time
    import numpy as np
    import horovod.numpy as hvd
    if os.environ["HOROVOD_RANK"] == "1":
        atexit.register(time.sleep, 4)  # registered first, runs last: rank 1 lingers after its engine stopped
    hvd.init()
    if hvd.rank() == 1:
        {}["missing"]
    hvd.allreduce(np.ones(3), name="grad_w")
""")

FINISH_EARLY = textwrap.dedent("""
    import numpy as np
    import horovod.numpy as hvd
    hvd.init()
    if hvd.rank() == 0:
        hvd.allreduce(np.ones(3), name="grad_w")
""")


@pytest.mark.cli
def test_summary_names_the_rank_that_raised_even_when_a_survivor_exits_first(tmp_path):
    (tmp_path / "job.py").write_text(RAISE_LATE)
    result = run_horovodrun(["-np", "2", PY, "job.py"], timeout=60, cwd=str(tmp_path))
    assert result.returncode == 1
    err = result.stderr
    assert "Process 0 exit with status code 1." in err  # the survivor did exit first
    summary_text = err[err.index("Root cause, rank 1:"):]
    assert summary_text.index("KeyError: 'missing'") < summary_text.index("Horovod detected")
    assert "Process name: 1\n" in summary_text and "Root cause: rank 1 on localhost raised KeyError" in summary_text
    assert "rank 0 failed as a consequence (waiting for allreduce.grad_w)" in summary_text


TWO_RAISE = textwrap.dedent("""
    import atexit, os, time
    import horovod.numpy as hvd
    if os.environ["HOROVOD_RANK"] == "1":
        atexit.register(time.sleep, 3)  # registered first, runs last: rank 1 exits well after rank 0
    hvd.init()
    if hvd.rank() == 1:
        atexit.register(open, "raised.1", "w")  # runs first at exit: after the hook has recorded the KeyError
        {}["first"]
    deadline = time.monotonic() + 30
    while not os.path.exists("raised.1") and time.monotonic() < deadline:
        time.sleep(0.01)
    raise ValueError("second")
""")


@pytest.mark.cli
def test_when_two_ranks_raise_horovodrun_blames_the_earliest_not_the_first_to_exit(tmp_path):
    (tmp_path / "job.py").write_text(TWO_RAISE)
    result = run_horovodrun(["-np", "2", PY, "job.py"], timeout=60, cwd=str(tmp_path))
    assert result.returncode == 1
    err = result.stderr
    assert "Process 0 exit with status code 1." in err, err[-3000:]  # rank 0, the later raise, exited first
    assert [line for line in err.splitlines() if line.startswith("Root cause")] == \
        ["Root cause, rank 1:", "Root cause: rank 1 on localhost raised KeyError: 'first'."], err[-3000:]
    assert "rank 0 failed too: ValueError: second" in err, err[-3000:]


@pytest.mark.cli
def test_a_rank_that_exits_0_while_others_wait_is_reported_as_such(tmp_path):
    (tmp_path / "job.py").write_text(FINISH_EARLY)
    result = run_horovodrun(["-np", "2", PY, "job.py"], timeout=60, cwd=str(tmp_path))
    assert result.returncode == 1
    # rank 1 either exited 0 or, still shutting down, was stopped by the launcher after rank 0 failed
    assert re.search(r"Root cause: rank 1 on localhost finished \((exited with code 0|shut down normally)\) while "
                     r"rank 0 waited for allreduce\.grad_w\.", result.stderr), result.stderr


def _raise_late(rank_to_fail):
    import atexit
    import os
    import time
    import numpy as np
    import horovod.numpy as hvd
    if os.environ["HOROVOD_RANK"] == str(rank_to_fail):
        atexit.register(time.sleep, 4)  # the failing rank lingers: the survivor exits first
    hvd.init()
    if hvd.rank() == rank_to_fail:
        raise KeyError("missing")
    hvd.allreduce(np.ones(3), name="grad_w")


def _finish_early():
    import numpy as np
    import horovod.numpy as hvd
    hvd.init()
    if hvd.rank() == 0:
        hvd.allreduce(np.ones(3), name="grad_w")
    return hvd.rank()


@pytest.mark.ranks
def test_run_reraises_the_root_cause_not_the_consequence():
    with pytest.raises(KeyError, match="missing") as info:
        horovod.run(_raise_late, args=(1,), np=2)
    assert info.value.__cause__.rank == 1


@pytest.mark.ranks
def test_run_says_when_a_rank_finished_while_another_waited():
    from horovod.common.exceptions import HorovodInternalError
    with pytest.raises(HorovodInternalError) as info:
        horovod.run(_finish_early, np=2)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert re.search(r"rank 1 on localhost finished \((exited with code 0|shut down normally)\) while rank 0 "
                     r"waited for allreduce\.grad_w", notes), notes


ENV_AND_AFFINITY = textwrap.dedent("""
    import os
    import horovod.numpy as hvd
    hvd.init()
    e = os.environ
    tasks = sorted({c for t in os.listdir('/proc/self/task') for c in os.sched_getaffinity(int(t))})
    print(e['RANK'], e['LOCAL_RANK'], e['WORLD_SIZE'], e['LOCAL_WORLD_SIZE'], tasks)
    hvd.start_timeline(os.path.join(os.environ['OUT'], f"timeline.{hvd.rank()}.json"))
    hvd.allreduce(hvd.rank() * 1.0 + __import__('numpy').zeros(2), name='x')
    hvd.stop_timeline()
    hvd.shutdown()
""")


@pytest.mark.cli
def test_torch_variables_thread_affinity_and_timeline_on_every_rank(tmp_path):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two cores")
    first, second = sorted(os.sched_getaffinity(0))[:2]
    (tmp_path / "job.py").write_text(ENV_AND_AFFINITY)
    result = run_horovodrun(["-np", "2", "--thread-affinity", f"{first},{second}", PY, "job.py"], timeout=60,
                            cwd=str(tmp_path), env={"OUT": str(tmp_path), "HOROVOD_TIMELINE": "DYNAMIC"})
    assert result.returncode == 0, result.stderr
    lines = sorted(line for line in result.stdout.splitlines())
    assert lines == [f"[0]<stdout>:0 0 2 2 [{first}]", f"[1]<stdout>:1 1 2 2 [{second}]"], result.stdout
    assert (tmp_path / "timeline.0.json").read_text().startswith("[")
    assert not (tmp_path / "timeline.1.json").exists()  # only rank 0 writes


@pytest.mark.cli
def test_verbose_prints_hosts_slots_interface_and_commands(tmp_path):
    result = run_horovodrun(["-np", "2", "--verbose", PY, "-c", "pass"], timeout=60, cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for line in ("Filtering local host names.", "All hosts are local, finding the interfaces with address 127.0.0.1",
                 "Hosts and slots used: localhost:2", "Local interface found lo: workers on localhost reach the "
                 "rendezvous at 127.0.0.1:", f"Rank 1 on localhost (local rank 1/2, cross rank 0/1): {PY} -c pass"):
        assert line in out, out


@pytest.mark.cli
def test_python_m_launch_and_run_commandline(tmp_path):
    env = {**os.environ, "PYTHONPATH": ROOT}
    proc = subprocess.run([PY, "-m", "horovod.runner.launch", "-np", "2", PY, "-c",
                           "import os; print(os.environ['HOROVOD_RANK'])"], capture_output=True, text=True,
                          timeout=60, env=env, cwd=str(tmp_path))
    assert proc.returncode == 0 and sorted(proc.stdout.split()) == ["[0]<stdout>:0", "[1]<stdout>:1"], proc.stderr
    code = "import sys; from horovod.runner.launch import run_commandline; sys.argv[1:] = ['-v']; run_commandline()"
    proc = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0 and proc.stdout.strip() == horovod.__version__


JOB = textwrap.dedent("""
    import sys
    import numpy as np
    import horovod.numpy as hvd
    comm = None
    if len(sys.argv) > 1:   # init(comm=...): ranks 0-1 form one job, the others jobs of their own
        from mpi4py import MPI
        world = MPI.COMM_WORLD
        comm = world.Split(0 if world.rank < 2 else 1 + world.rank, world.rank)
    hvd.init(comm=comm)
    r, s = hvd.rank(), hvd.size()
    total = hvd.allreduce(np.arange(4, dtype=np.float64) + r, op=hvd.Sum)
    assert np.array_equal(total, np.arange(4) * s + sum(range(s))), total
    if comm is None and s > 1 and "OMPI_COMM_WORLD_SIZE" in __import__("os").environ:
        from mpi4py import MPI
        ps = hvd.ProcessSet(MPI.COMM_WORLD.Split(1 if MPI.COMM_WORLD.rank >= 1 else 0, MPI.COMM_WORLD.rank))
        assert ps.ranks in ([0], list(range(1, s))), ps.ranks
    sys.stdout.write(f"OK {r} {s} {hvd.local_rank()} {hvd.local_size()}\\n")
    sys.stdout.flush()
    hvd.shutdown()
""")


def _clean_env():
    return {**{k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "OMPI_", "PMI_", "SLURM_"))},
            "PYTHONPATH": ROOT}


def _mpirun_or_skip():
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("no mpirun (Debian: openmpi-bin)")
    pytest.importorskip("mpi4py")
    return [mpirun, "--allow-run-as-root", "--oversubscribe", "-x", "PYTHONPATH"]


@pytest.mark.cli
def test_plain_mpirun_with_mpi4py_needs_no_variables(tmp_path):
    (tmp_path / "job.py").write_text(JOB)
    proc = subprocess.run([*_mpirun_or_skip(), "-np", "3", PY, "job.py"], capture_output=True, text=True,
                          timeout=120, env=_clean_env(), cwd=str(tmp_path), start_new_session=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(line for line in proc.stdout.splitlines() if line.startswith("OK")) == \
        [f"OK {r} 3 {r} 3" for r in range(3)], proc.stdout


@pytest.mark.cli
def test_init_with_an_mpi4py_communicator(tmp_path):
    (tmp_path / "job.py").write_text(JOB)
    proc = subprocess.run([*_mpirun_or_skip(), "-np", "3", PY, "job.py", "split"], capture_output=True, text=True,
                          timeout=120, env=_clean_env(), cwd=str(tmp_path), start_new_session=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(line for line in proc.stdout.splitlines() if line.startswith("OK")) == \
        ["OK 0 1 0 1", "OK 0 2 0 2", "OK 1 2 1 2"], proc.stdout


def _mpi_task(x):
    import numpy as np
    import horovod.numpy as hvd
    hvd.init()
    return hvd.rank(), hvd.size(), float(hvd.allreduce(np.ones(1) * x, op=hvd.Sum)[0])


@pytest.mark.ranks
def test_run_with_use_mpi():
    _mpirun_or_skip()
    assert horovod.run(_mpi_task, args=(2,), np=2, use_mpi=True, mpi_args="--oversubscribe") == \
        [(0, 2, 4.0), (1, 2, 4.0)]


@pytest.mark.cli
def test_torchrun_forms_one_job_of_world_size_ranks(tmp_path):
    torchrun = os.path.join(os.path.dirname(PY), "torchrun")
    if not os.path.exists(torchrun):
        pytest.skip("torchrun is not installed")
    (tmp_path / "job.py").write_text(JOB)
    proc = subprocess.run([torchrun, "--nproc-per-node", "2", "job.py"], capture_output=True, text=True,
                          timeout=180, env=_clean_env(), cwd=str(tmp_path), start_new_session=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(line for line in proc.stdout.splitlines() if line.startswith("OK")) == \
        ["OK 0 2 0 2", "OK 1 2 1 2"], proc.stdout


@pytest.mark.unit
def test_docs_say_what_runs_on_cpu_and_gpu_how_to_view_a_timeline_and_link_nothing_outside():
    docs = {name: open(os.path.join(ROOT, "docs", name), encoding="utf-8").read()
            for name in os.listdir(os.path.join(ROOT, "docs")) if name.endswith(".md")}
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    migrating = docs["migrating.md"]
    assert "chrome://tracing" in migrating and "Perfetto" in migrating
    assert "CPU" in readme and "NCCL" in readme and "docs/gpu.md" in readme and "docs/gpu.md" in migrating
    assert ".cuda()" in docs["gpu.md"] and "torch.cuda.set_device(hvd.local_rank())" in docs["gpu.md"]
    for name, text in {**docs, "README.md": readme}.items():
        assert "http://" not in text and "https://" not in text, name
