"""A full ``/dev/shm`` is a named error, never a SIGBUS (issue 48, item 2).

Segments were sized with ``ftruncate`` alone, so a tmpfs that another user had filled was found out only when a
rank first touched a page: the job died with "rank N ended with signal SIGBUS" and no word of why. They are reserved
up front now (``posix_fallocate``). The test gives the job a private, small ``/dev/shm`` (a 4 MiB tmpfs in a mount
namespace of its own, ``unshare -m``: root only, skipped otherwise) where the first segments fit and the grown ones
do not; the job must end with the error that names ``/dev/shm``, the bytes and ``HOROVOD_SHM_DISABLE``, and the
same job with ``HOROVOD_SHM_DISABLE=1`` must pass (the reference).
"""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

pytestmark = [pytest.mark.ranks]

GROWS = textwrap.dedent("""
    import numpy as np
    import horovod.numpy as hvd
    hvd.init()
    small = hvd.allreduce(np.full(8192, hvd.rank() + 1.0), op=hvd.Sum)                     # 1 MiB segments
    big = hvd.allreduce(np.full(1 << 21, hvd.rank() + 1.0, dtype=np.float32), op=hvd.Sum)  # 4 MiB each: too big
    assert float(small[0]) == 3.0 and float(big[0]) == 3.0, (small[0], big[0])
    print("DONE", hvd.rank(), flush=True)
    hvd.shutdown()
""")


def _in_small_shm(script, env):
    unshare = shutil.which("unshare")
    command = (f"mount -t tmpfs -o size=4m,mode=1777 tmpfs /dev/shm && exec {sys.executable} -m horovod.runner "
               f"-np 2 {sys.executable} {script}")
    return subprocess.run([unshare, "--mount", "--propagation", "private", "sh", "-c", command],
                          capture_output=True, text=True, timeout=120, env=env)


def test_a_full_dev_shm_is_a_named_error_not_a_sigbus(tmp_path):
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare: the job gets a small /dev/shm of its own in a mount namespace")
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                            "mount -t tmpfs -o size=1m tmpfs /dev/shm"], capture_output=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a private tmpfs here: {probe.stderr.decode().strip()}")
    script = tmp_path / "grows.py"
    script.write_text(GROWS)
    env = {**os.environ, "HOROVOD_SHM_MIN_BYTES": "0",
           "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    env.pop("HOROVOD_SHM_DISABLE", None)
    full = _in_small_shm(script, env)
    said = full.stdout + full.stderr
    assert full.returncode != 0, said[-3000:]
    assert "SIGBUS" not in said, said[-3000:]
    assert "/dev/shm is full: cannot reserve the 4198400 bytes" in said and "HOROVOD_SHM_DISABLE=1" in said, \
        said[-3000:]
    disabled = _in_small_shm(script, {**env, "HOROVOD_SHM_DISABLE": "1"})
    assert disabled.returncode == 0 and disabled.stdout.count("DONE") == 2, (disabled.stdout + disabled.stderr)[-3000:]
