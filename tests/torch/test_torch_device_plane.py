"""The device plane, proven on this machine by the same code: Gloo stands in for NCCL (``HOROVOD_DEVICE_PLANE=gloo``)
and torch's CPU tensors take the very path a GPU tensor takes (a DeviceTensor through negotiation, fusion into the
plane's buffer, the communicator's call, unfusion, completion).

Every op check of ``test_torch_ops.py`` runs again through the plane at 2 and 3 ranks, and the plane's own counters
show that it carried the bytes (not the CPU ring under another name). Then what only the plane has: the response
cache and fusion on it, process sets, a CPU/device mismatch named on every rank, a rank that dies mid-collective
(the survivors raise within the liveness bound), an elastic reset that makes new communicators, and the host-staged
path. What needs a GPU (CUDA streams, pinned memory, NCCL itself) is in ``bench/gpu_check.py``.
"""

import os
import re
import sys

import numpy as np
import pytest
import torch

from horovod.testing import spawn_ranks

import test_torch_ops as ops

PLANE = {"HOROVOD_DEVICE_PLANE": "gloo"}
WORLDS = (2, 3)


@pytest.fixture(scope="module", params=WORLDS, ids=lambda w: f"{w}ranks")
def results(request):
    return spawn_ranks(ops._run_all, request.param, timeout=120, args=(request.param,), env=PLANE)


@pytest.mark.ranks
@pytest.mark.parametrize("check", list(ops.CHECKS))
def test_torch_op_on_the_device_plane(results, check):
    failures = [f"rank {rank}:\n{r[check]}" for rank, r in enumerate(results) if r[check] is not None]
    assert not failures, "\n".join(failures)


@pytest.mark.ranks
def test_the_plane_carried_every_collective(results):
    for rank, r in enumerate(results):
        stats = r["_plane_stats"]
        assert stats is not None, f"rank {rank} had no device plane"
        for op in ("ALLREDUCE", "ALLGATHER", "BROADCAST", "ALLTOALL", "REDUCESCATTER"):
            assert stats.get(op, 0) > 0 and stats.get(op + "_bytes", 0) > 0, (rank, op, stats)


# -- what only the plane has ------------------------------------------------------------------------------------------

def _plane_only(world):
    """Fusion, the response cache, process sets, a CPU/device mismatch and the host-staged path, on one job."""
    import horovod.torch as hvd
    from horovod.common.device import DeviceTensor
    from horovod.common.exceptions import TensorMismatchError
    from horovod.runtime import basics
    from horovod.runtime import collectives as core
    from horovod.torch._tensors import TORCH_OPS
    torch.set_num_threads(1)
    hvd.init(process_sets=[hvd.ProcessSet([0, world - 1])])
    n, me = hvd.size(), hvd.rank()
    plane = basics.context().engine.device_plane
    seen = {}
    # A group of five float32 tensors is fused into one buffer: one call of the communicator, every step; the
    # steps after the first come from the response cache.
    shapes = [(3,), (2, 2), (5,), (1,), (4, 1)]
    before = plane.stats["ALLREDUCE"]
    for step in range(4):
        tensors = [torch.full(s, float(me + step + i)) for i, s in enumerate(shapes)]
        out = hvd.grouped_allreduce(tensors, name="fused", op=hvd.Sum)
        for i, s in enumerate(shapes):
            want = sum(float(r + step + i) for r in range(n))
            assert torch.equal(out[i], torch.full(s, want)), (step, i, out[i])
    seen["fused_calls"] = plane.stats["ALLREDUCE"] - before
    state = basics.engine().sets[0]
    bit = state.cache.bit("grouped_allreduce.fused_1of5")
    seen["cached_device"] = state.cache.response(bit).device if bit is not None else None
    # A process set of the first and last rank gets a communicator of its own.
    pair = hvd.ProcessSet([0, world - 1])
    pair.process_set_id = 1
    if me in (0, world - 1):
        got = hvd.allreduce(torch.tensor([float(me)]), name="pair", op=hvd.Sum, process_set=pair)
        seen["pair"] = got.item()
    hvd.barrier()
    seen["communicators"] = sorted(plane._groups)
    # Rank 0 hands over a numpy array (the CPU plane), the others a torch tensor (the device plane): every rank
    # fails, naming each rank's device.
    try:
        if me == 0:
            core.allreduce(np.ones(2, dtype=np.float32), name="mixed")
        else:
            hvd.allreduce(torch.ones(2), name="mixed")
        seen["mixed"] = "no error"
    except TensorMismatchError as exc:
        seen["mixed"] = str(exc)
    # A tensor of a device kind the plane does not carry is staged through host memory to the CPU plane.
    before = dict(plane.stats)
    staged = DeviceTensor(torch.full((3,), float(me)), "cuda:0", "float32", (3,), None, TORCH_OPS)
    got = core.allreduce(staged, name="staged", op=hvd.Sum)
    seen["staged"] = (type(got).__name__, got.device, got.data.tolist(), dict(plane.stats) == before)
    hvd.shutdown()
    return seen


@pytest.fixture(scope="module", params=WORLDS, ids=lambda w: f"{w}ranks")
def plane_only(request):
    return request.param, spawn_ranks(_plane_only, request.param, timeout=90, args=(request.param,), env=PLANE)


@pytest.mark.ranks
def test_a_group_is_fused_on_the_plane_and_cached(plane_only):
    world, seen = plane_only
    for rank, s in enumerate(seen):
        assert s["fused_calls"] == 4, (rank, s)       # four steps, one communicator call each
        assert s["cached_device"] == "cpu+gloo", (rank, s)


@pytest.mark.ranks
def test_a_process_set_gets_its_own_communicator(plane_only):
    world, seen = plane_only
    for rank in (0, world - 1):
        assert seen[rank]["pair"] == float(world - 1)
        assert seen[rank]["communicators"] == [0, 1], seen[rank]
    for rank in range(1, world - 1):
        assert seen[rank]["communicators"] == [0], seen[rank]      # not a member: never made it


@pytest.mark.ranks
def test_ranks_on_different_devices_fail_by_name_on_every_rank(plane_only):
    world, seen = plane_only
    for s in seen:
        text = s["mixed"]
        assert "CPU/GPU device selection" in text and "'allreduce.mixed'" in text, text
        assert "rank 0: cpu" in text and "rank 1: cpu+gloo:0" in text, text


@pytest.mark.ranks
def test_a_device_the_plane_does_not_carry_is_staged_through_the_host(plane_only):
    world, seen = plane_only
    total = float(sum(range(world)))
    for s in seen:
        assert s["staged"] == ("DeviceTensor", "cuda:0", [total] * 3, True), s["staged"]


# -- a rank that dies mid-collective ---------------------------------------------------------------------------------

DEATH_ON_THE_PLANE = r"""
import os, sys, time
import torch
import horovod.torch as hvd
from horovod.common.exceptions import HorovodInternalError
from horovod.runtime import basics
hvd.init()
hvd.allreduce(torch.ones(4), name="warmup")     # every communicator is made
plane = basics.context().engine.device_plane
if hvd.rank() == 2:
    execute = plane.execute
    def dies_inside(response, *args, **kwargs):
        if response.names[0].startswith("allreduce.doomed"):
            os._exit(3)       # negotiated, inside the plane, before its part of the collective
        return execute(response, *args, **kwargs)
    plane.execute = dies_inside
start = time.monotonic()
try:
    for i in range(50):
        hvd.allreduce(torch.ones(1 << 16), name=f"doomed{i}")
    print("NO ERROR")
except HorovodInternalError as exc:
    print(f"ERROR after {time.monotonic() - start:.2f}s: {exc}")
"""


@pytest.mark.ranks
def test_a_rank_dying_inside_the_plane_fails_the_survivors_fast(tmp_path):
    from horovod.testing.raw_ranks import run_raw_ranks
    script = tmp_path / "dies.py"
    script.write_text(DEATH_ON_THE_PLANE)
    codes, outputs = run_raw_ranks(script, 3, lambda rank: dict(PLANE), timeout=60)
    assert codes[2] == 3, outputs[2]
    for rank in (0, 1):
        assert codes[rank] == 0, outputs[rank]
        found = [line for line in outputs[rank].splitlines() if line.startswith("ERROR after")]
        assert found, outputs[rank]
        seconds = float(found[0].split()[2].rstrip("s:"))
        assert seconds < 3.0 and "rank 2" in found[0], found[0]   # 0.1-0.3 s measured; the liveness bound is 10 s


# -- an elastic reset makes new communicators for the new world -------------------------------------------------------

@pytest.mark.cli
def test_elastic_training_through_a_killed_worker_remakes_the_communicator():
    from horovod.testing.fixtures import run_horovodrun
    example = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "pytorch_elastic_digits.py")
    result = run_horovodrun(["-np", "3", "--min-np", "1", "-H", "127.0.0.1:1,127.0.0.2:1,127.0.0.3:1",
                             sys.executable, example, "--epochs", "2", "--crash-host", "127.0.0.3"], timeout=120,
                            env={**PLANE, "HOROVOD_LOG_LEVEL": "debug"})
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-5000:]
    assert "round 2: 2 worker(s)" in log
    assert log.count("gloo communicator for process set 0 (ranks (0, 1, 2))") == 3, log[-5000:]
    assert log.count("gloo communicator for process set 0 (ranks (0, 1))") == 2, log[-5000:]
    finals = re.findall(r"final test accuracy: ([\d.]+)% on rank (\d) of (\d); parameter checksum (\S+)", log)
    assert sorted(f[1:3] for f in finals) == [("0", "2"), ("1", "2")], log[-3000:]
    assert len({f[3] for f in finals}) == 1, "the survivors' parameters differ"


# -- the device check and the build queries on a machine without a GPU -------------------------------------------------

@pytest.mark.unit
def test_the_device_check_says_there_is_no_gpu_and_runs_nothing():
    import subprocess
    script = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "gpu_check.py")
    proc = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 77, proc.stdout + proc.stderr
    assert "no GPU here" in proc.stdout and "nothing was run" in proc.stdout


@pytest.mark.unit
def test_build_queries_answer_for_the_installed_torch():
    import horovod.torch as hvd
    from horovod.common import util
    cuda = torch.version.cuda is not None
    assert hvd.cuda_built() is cuda and util.gpu_available("torch") is cuda
    assert (hvd.nccl_built() > 0) == (cuda and torch.distributed.is_nccl_available())


# -- a Horovod GPU script on a CPU-only torch ------------------------------------------------------------------------

CUDA_SCRIPT = r"""
import torch
import horovod.torch as hvd
hvd.init()
torch.cuda.set_device(hvd.local_rank())
model = torch.nn.Linear(4, 2).cuda()
"""


@pytest.mark.cli
def test_a_cuda_script_on_a_cpu_torch_fails_only_where_torch_does(tmp_path):
    from horovod.testing.fixtures import run_horovodrun
    script = tmp_path / "cuda_script.py"
    script.write_text(CUDA_SCRIPT)
    result = run_horovodrun(["-np", "2", sys.executable, str(script)], timeout=60)
    log = result.stdout + result.stderr
    if torch.cuda.is_available():
        assert result.returncode == 0, log[-3000:]
        return
    assert result.returncode != 0
    frames = [line for line in log.splitlines() if line.startswith("[0]<stderr>:") and 'File "' in line]
    assert frames and f"{os.sep}torch{os.sep}" in frames[-1] and "horovod" not in frames[-1], log[-3000:]
    assert "HorovodInternalError" not in log, log[-3000:]
