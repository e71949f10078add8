"""Output that cannot be written never kills a job (issue 19): ``horovodrun ... | head -n 3``, a closed stdout."""

import io
import os
import subprocess
import sys
import textwrap

import pytest

from horovod.runner.output import OutputSink


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
