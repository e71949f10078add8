"""horovodrun: flags and usage errors (tier unit, through main()) and real launches (tier cli)."""

import os
import re
import sys

import pytest

from horovod.runner.check_build import check_build_text
from horovod.runner.cli import main
from horovod.version import __version__


@pytest.mark.unit
def test_version(capsys):
    assert main(["-v"]) == 0
    assert capsys.readouterr().out.strip() == __version__


@pytest.mark.unit
def test_check_build(capsys):
    assert main(["-cb"]) == 0
    out = capsys.readouterr().out
    assert f"Horovod v{__version__}:" in out
    assert "[X] Gloo (TCP)" in out and "[ ] MPI" in out and "[ ] NCCL" in out and "[X] Shared memory" in out
    assert "[ ] MXNet" in out


@pytest.mark.unit
@pytest.mark.parametrize("present, marked", [
    ({"jax"}, set()),                                    # the framework alone is not enough
    ({"horovod.jax"}, set()),                            # nor this package's module alone
    ({"jax", "horovod.jax"}, {"JAX"}),
    ({"ray", "horovod.ray", "pyspark"}, {"Ray"}),
    ({"pyspark", "horovod.spark", "torch", "horovod.torch"}, {"Spark", "PyTorch"}),
])
def test_check_build_lists_only_what_is_really_available(present, marked):
    text = check_build_text("1.0", found=lambda module: module in present)
    rows = {line.split("] ", 1)[1]: line.strip().startswith("[X]") for line in text.splitlines() if "] " in line}
    for name in ("TensorFlow", "PyTorch", "MXNet", "JAX", "Ray", "Spark"):
        assert rows[name] == (name in marked), (name, text)


@pytest.mark.unit
@pytest.mark.parametrize("argv, message", [
    (["-np", "2", "--min-np", "3", "--max-np", "2", "python", "x.py"], "--max-np"),
    (["-np", "2", "--min-np", "1", "--blacklist-cooldown-range", "0", "5", "python", "x.py"], "cooldown"),
    (["-np", "2", "--mpi-args=--oversubscribe", "python", "x.py"], "--mpi-args needs --mpi"),
    (["-np", "2", "--jsrun", "python", "x.py"], "jsrun"),
    (["-np", "2", "python", "x.py", "-H", "a:1"], None),  # flags after the command belong to the command
    (["-np", "2"], "no command"),
    (["python", "x.py"], "-np/--num-proc"),
    (["-np", "4", "-H", "localhost:2", "python", "x.py"], "more processes"),
    (["-np", "2", "-H", "localhost", "python", "x.py"], "hostname:slots"),
])
def test_usage_errors_exit_2(argv, message, capsys, monkeypatch):
    if message is None:  # sanity: parses and would launch; do not actually launch
        from horovod.runner.cli import make_parser
        assert make_parser().parse_args(argv).command == ["python", "x.py", "-H", "a:1"]
        return
    assert main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.unit
def test_hosts_and_hostfile_are_exclusive(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["-np", "1", "-H", "localhost:1", "--hostfile", "f", "python", "x.py"])
    assert exc.value.code == 2
    assert "not allowed with" in capsys.readouterr().err


PRINT_RANK = ["python", "-c", "import os; print(os.environ['HOROVOD_RANK'])"]


@pytest.mark.cli
def test_three_prefixed_lines(horovodrun):
    proc = horovodrun(["-np", "3", *PRINT_RANK], timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == ["[0]<stdout>:0", "[1]<stdout>:1", "[2]<stdout>:2"]


@pytest.mark.cli
def test_console_script_and_hostfile(tmp_path, horovodrun):
    script = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    if not os.path.exists(script):
        pytest.skip("package not installed with pip install -e . (no horovodrun console script)")
    import subprocess
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=2\n")
    proc = subprocess.run([script, "-np", "2", "--hostfile", str(hostfile), *PRINT_RANK], capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == ["[0]<stdout>:0", "[1]<stdout>:1"]


@pytest.mark.cli
def test_worker_environment(horovodrun):
    code = ("import os; e = os.environ; print(*[e[k] for k in ('HOROVOD_RANK', 'HOROVOD_SIZE', "
            "'HOROVOD_LOCAL_RANK', 'HOROVOD_LOCAL_SIZE', 'HOROVOD_CROSS_RANK', 'HOROVOD_CROSS_SIZE', "
            "'HOROVOD_HOSTNAME', 'HOROVOD_CONTROLLER', 'HOROVOD_FUSION_THRESHOLD', 'PYTHONUNBUFFERED')], "
            "len(e['HOROVOD_SECRET_KEY']), e['HOROVOD_GLOO_RENDEZVOUS_ADDR'], "
            "int(e['HOROVOD_GLOO_RENDEZVOUS_PORT']) > 0, "
            "e['HOROVOD_SECRET_KEY'] in open('/proc/self/cmdline').read())")
    proc = horovodrun(["-np", "2", "--fusion-threshold-mb", "2", "python", "-c", code], timeout=30)
    assert proc.returncode == 0, proc.stderr
    lines = sorted(proc.stdout.splitlines())
    assert lines == [f"[{r}]<stdout>:{r} 2 {r} 2 0 1 localhost gloo 2097152 1 64 127.0.0.1 True False"
                     for r in (0, 1)]


@pytest.mark.cli
def test_stderr_prefix_timestamp_and_output_files(tmp_path, horovodrun):
    code = "import os, sys; r = os.environ['HOROVOD_RANK']; print('out', r); print('err', r, file=sys.stderr)"
    outdir = tmp_path / "logs"
    proc = horovodrun(["-np", "2", "--output-filename", str(outdir), "--prefix-output-with-timestamp",
                       "python", "-c", code], timeout=30)
    assert proc.returncode == 0, proc.stderr
    stamp = r"\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}"
    for r in (0, 1):
        assert re.search(rf"^{stamp}\[{r}\]<stdout>:out {r}$", proc.stdout, re.M), proc.stdout
        assert re.search(rf"^{stamp}\[{r}\]<stderr>:err {r}$", proc.stderr, re.M), proc.stderr
        assert (outdir / f"rank.{r}" / "stdout").read_text() == f"out {r}\n"
        assert (outdir / f"rank.{r}" / "stderr").read_text() == f"err {r}\n"


@pytest.mark.cli
def test_lines_never_interleave(horovodrun):
    code = ("import os, sys; r = os.environ['HOROVOD_RANK']\n"
            "for i in range(300):\n"
            "    sys.stdout.write(r * 3000 + '\\n')\n")
    proc = horovodrun(["-np", "3", "python", "-c", code], timeout=30)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 900
    for line in lines:
        assert re.fullmatch(r"\[(\d)\]<stdout>:(\d)\2{2999}", line) and line[1] == line[-1]


@pytest.mark.cli
def test_missing_command_exits_127(horovodrun):
    proc = horovodrun(["-np", "2", "no-such-command-for-horovod-tests"], timeout=30)
    assert proc.returncode == 127
    assert "cannot start" in proc.stderr
