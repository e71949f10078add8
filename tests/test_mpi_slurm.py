"""Workers started by others: mpirun's and Slurm's variables (tier unit), srun simulated by setting its variables and
Open MPI's real mpirun, directly and through ``horovodrun --mpi`` (tier cli)."""

import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

from horovod.common.exceptions import HorovodConfigError
from horovod.runtime.launch_env import detect, placement
from horovod.runner.hosts import HostInfo
from horovod.runner.backends.mpirun import mpirun_command
from horovod.runner.launch import job_env
from horovod.runner.rendezvous import RendezvousInfo

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MPIRUN = shutil.which("mpirun")

JOB = textwrap.dedent("""
    import sys
    import numpy as np
    import horovod.numpy as hvd
    hvd.init()
    r, s = hvd.rank(), hvd.size()
    total = hvd.allreduce(np.arange(4, dtype=np.float64) + r, op=hvd.Sum)
    assert np.array_equal(total, np.arange(4) * s + sum(range(s))), total
    # One write: mpirun tags each chunk it forwards, and print() writes the newline separately.
    sys.stdout.write(f"OK {r} {s} {hvd.local_rank()} {hvd.local_size()} {hvd.cross_rank()} {hvd.cross_size()}\\n")
    sys.stdout.flush()
    hvd.shutdown()
""")


@pytest.mark.unit
@pytest.mark.parametrize("env, expected", [
    ({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "1"},
     ("mpirun (Open MPI)", 3, 8, None)),
    ({"PMI_RANK": "1", "PMI_SIZE": "2"}, ("mpirun (PMI)", 1, 2, None)),
    ({"SLURM_PROCID": "5", "SLURM_NTASKS": "6", "SLURM_STEP_ID": "0", "SLURMD_NODENAME": "gpu7"},
     ("srun (Slurm)", 5, 6, "gpu7")),
    ({"SLURM_PROCID": "1", "SLURM_NTASKS": "9", "SLURM_STEP_NUM_TASKS": "4", "SLURM_STEP_ID": "2",
      "SLURM_NODEID": "1"}, ("srun (Slurm)", 1, 4, "slurm-node-1")),
    # mpirun inside a Slurm allocation is mpirun.
    ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "SLURM_PROCID": "0", "SLURM_NTASKS": "1",
      "SLURM_STEP_ID": "0"}, ("mpirun (Open MPI)", 0, 2, None)),
])
def test_detect(env, expected):
    slot = detect(env)
    assert (slot.starter, slot.rank, slot.size, slot.node) == expected


@pytest.mark.unit
@pytest.mark.parametrize("env", [
    {},
    {"PATH": "/bin", "HOSTNAME": "x"},
    {"SLURM_PROCID": "0", "SLURM_NTASKS": "4"},  # the sbatch script itself: not a task step
    {"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_STEP_ID": "4294967294"},  # batch step
    {"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_STEP_ID": "batch"},
])
def test_detect_nothing(env):
    assert detect(env) is None


@pytest.mark.unit
@pytest.mark.parametrize("env, message", [
    ({"OMPI_COMM_WORLD_RANK": "x", "OMPI_COMM_WORLD_SIZE": "2"}, "OMPI_COMM_WORLD_RANK='x'"),
    ({"PMI_RANK": "2", "PMI_SIZE": "2"}, "rank 2 outside 0..1"),
    ({"SLURM_PROCID": "0", "SLURM_STEP_ID": "0"}, "SLURM_NTASKS"),
])
def test_detect_errors(env, message):
    with pytest.raises(HorovodConfigError, match=message):
        detect(env)


@pytest.mark.unit
def test_placement_block_cyclic_and_uneven():
    block = ["a", "a", "b", "b"]
    assert [placement(block, r) for r in range(4)] == [(0, 2, 0, 2), (1, 2, 0, 2), (0, 2, 1, 2), (1, 2, 1, 2)]
    cyclic = ["a", "b", "a", "b"]
    assert [placement(cyclic, r) for r in range(4)] == [(0, 2, 0, 2), (0, 2, 1, 2), (1, 2, 0, 2), (1, 2, 1, 2)]
    uneven = ["a", "a", "a", "b"]
    assert [placement(uneven, r) for r in range(4)] == [(0, 3, 0, 2), (1, 3, 0, 1), (2, 3, 0, 1), (0, 1, 1, 2)]


@pytest.mark.unit
def test_mpirun_command_names_variables_but_never_the_secret():
    rendezvous = RendezvousInfo("10.0.0.1", 4000, b"\xab" * 32)
    env = job_env({"PATH": "/bin", "HOROVOD_RANK": "7", "HOME": "/root"}, rendezvous, {"HOROVOD_CYCLE_TIME": "2"})
    assert "HOROVOD_RANK" not in env and env["HOROVOD_SECRET_KEY"] == "ab" * 32
    argv = mpirun_command("/usr/bin/mpirun", 4, [HostInfo("h1", 2), HostInfo("h2", 2)], ["python", "t.py"], env,
                          ssh_port=2222, mpi_args="--oversubscribe", as_root=True)
    assert "ab" * 32 not in " ".join(argv)
    assert argv[:8] == ["/usr/bin/mpirun", "--tag-output", "-np", "4", "-H", "h1:2,h2:2", "-bind-to", "none"]
    for name in ("HOROVOD_SECRET_KEY", "HOROVOD_GLOO_RENDEZVOUS_ADDR", "HOROVOD_CYCLE_TIME", "PATH"):
        assert argv[argv.index(name) - 1] == "-x"
    assert "HOME" not in argv and "--allow-run-as-root" in argv
    assert argv[argv.index("plm_rsh_args") + 1] == "-p 2222"
    assert argv[-3:] == ["--oversubscribe", "python", "t.py"]


def _free_port() -> int:
    """A free port below the kernel's ephemeral range (32768 up on Linux): between this probe and rank 0's bind,
    no other process's automatic bind can take it. mpirun's own daemons listen on ephemeral ports, and one that
    landed on a probed ephemeral port made rank 0's bind fail (seen in CI)."""
    rng = random.Random(os.getpid())
    for _ in range(200):
        port = rng.randrange(20000, 32000)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000-32000")


def _clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HOROVOD_", "OMPI_", "PMI_", "SLURM", "PMIX_"))}
    env["PYTHONPATH"] = ROOT
    env.update(extra)
    return env


def _run_all(procs, timeout):
    try:
        return [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.communicate()


@pytest.mark.ranks
def test_srun_variables_place_workers_and_rank_0_serves_the_rendezvous(tmp_path):
    (tmp_path / "job.py").write_text(JOB)
    port = _free_port()
    nodes = ["n0", "n1", "n0", "n1"]  # srun --distribution=cyclic over two nodes
    procs = []
    for rank, node in enumerate(nodes):
        env = _clean_env(SLURM_PROCID=str(rank), SLURM_NTASKS="4", SLURM_STEP_ID="0", SLURM_JOB_ID="77",
                         SLURMD_NODENAME=node, SLURM_NODEID=node[1], SLURM_LOCALID=str(rank // 2),
                         HOROVOD_RENDEZVOUS_ADDR="127.0.0.1", HOROVOD_RENDEZVOUS_PORT=str(port),
                         HOROVOD_SECRET_KEY="5e" * 32, HOROVOD_START_TIMEOUT="30")
        procs.append(subprocess.Popen([sys.executable, "job.py"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, start_new_session=True))
    results = _run_all(procs, 90)
    assert all(p.returncode == 0 for p in procs), [err for _, err in results]
    lines = [out.strip() for out, _ in results]
    assert lines == ["OK 0 4 0 2 0 2", "OK 1 4 0 2 1 2", "OK 2 4 1 2 0 2", "OK 3 4 1 2 1 2"]
    assert not any("HOROVOD_SECRET_KEY is not set" in err for _, err in results)


@pytest.mark.cli
@pytest.mark.skipif(MPIRUN is None, reason="mpirun is not installed (Debian: openmpi-bin; .ci/run installs it)")
def test_mpirun_without_horovodrun_and_without_secret(tmp_path):
    (tmp_path / "job.py").write_text(JOB)
    port = _free_port()
    argv = [MPIRUN, "-np", "2", "-H", "localhost:2", "-bind-to", "none", "-x", "HOROVOD_RENDEZVOUS_ADDR",
            "-x", "HOROVOD_RENDEZVOUS_PORT", "-x", "PYTHONPATH", sys.executable, "job.py"]
    if os.geteuid() == 0:
        argv.insert(1, "--allow-run-as-root")
    proc = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_clean_env(HOROVOD_RENDEZVOUS_ADDR="127.0.0.1", HOROVOD_RENDEZVOUS_PORT=str(port)),
                            start_new_session=True)
    [(out, err)] = _run_all([proc], 90)
    assert proc.returncode == 0, err
    assert sorted(re.findall(r"OK [0-9 ]+", out)) == ["OK 0 2 0 2 0 1", "OK 1 2 1 2 0 1"], out + err
    assert err.count("HOROVOD_SECRET_KEY is not set") == 1, err  # rank 0 warns once


@pytest.mark.cli
@pytest.mark.skipif(MPIRUN is None, reason="mpirun is not installed (Debian: openmpi-bin; .ci/run installs it)")
def test_horovodrun_mpi(tmp_path, horovodrun):
    (tmp_path / "job.py").write_text(JOB)
    result = horovodrun(["--mpi", "-np", "2", sys.executable, "job.py"], timeout=90, cwd=str(tmp_path),
                        env={"PYTHONPATH": ROOT})
    assert result.returncode == 0, result.stderr
    assert sorted(re.findall(r"\[1,[01]\]<stdout>:OK [0-9 ]+", result.stdout)) == [
        "[1,0]<stdout>:OK 0 2 0 2 0 1", "[1,1]<stdout>:OK 1 2 1 2 0 1"], result.stdout + result.stderr
    assert "HOROVOD_SECRET_KEY is not set" not in result.stderr


@pytest.mark.cli
@pytest.mark.skipif(MPIRUN is None, reason="mpirun is not installed (Debian: openmpi-bin; .ci/run installs it)")
def test_horovodrun_mpi_failure_exits_non_zero(tmp_path, horovodrun):
    result = horovodrun(["--mpi", "-np", "2", sys.executable, "-c", "import sys; sys.exit(3)"], timeout=60,
                        cwd=str(tmp_path))
    assert result.returncode != 0

