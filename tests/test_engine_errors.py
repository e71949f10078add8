"""Errors instead of hangs: mismatches, duplicate names, stalls, dead peers, use outside init; and the timeline.

Every check holds at any world size: the core ones (argument ``world``) run at 2 and 3 ranks in ``make test``, the
others at the size they list, and all at ``--world-sizes 5,8`` in ``make soak`` (horovod.testing.fixtures).
"""

import json
import os
import subprocess
import sys
import time

import pytest

from horovod.testing import spawn_ranks
from horovod.testing.fixtures import world_sizes
from horovod.testing.raw_ranks import run_raw_ranks


def _mismatches():
    import numpy as np
    import horovod.numpy as hvd
    from horovod.common.exceptions import TensorMismatchError
    hvd.init()
    me = hvd.rank()
    errors = {}
    cases = {
        "shape": lambda: hvd.allreduce(np.ones(3 + me), name="shape"),
        "dtype": lambda: hvd.allreduce(np.ones(3, dtype=np.float32 if me else np.float64), name="dtype"),
        "op": lambda: hvd.allreduce(np.ones(3), op=hvd.Sum if me else hvd.Max, name="op"),
        "root": lambda: hvd.broadcast(np.ones(3), root_rank=me, name="root"),
        "prescale": lambda: hvd.allreduce(np.ones(3), prescale_factor=1.0 + me, name="prescale"),
    }
    for case, call in cases.items():
        try:
            call()
            errors[case] = None
        except TensorMismatchError as exc:
            errors[case] = str(exc)
    # A mismatch is not fatal: the job goes on, and the same names work again once the ranks agree (the response
    # cache must not remember the failed request).
    after = hvd.allreduce(np.ones(2), op=hvd.Sum, name="after").tolist()
    for _ in range(2):
        again = [hvd.allreduce(np.ones(3), op=hvd.Sum, name=case).tolist() for case in ("shape", "dtype", "op")]
    # One bad tensor in a group fails the whole group on every rank instead of leaving its partners waiting.
    group_errors = []
    try:
        hvd.grouped_allreduce([np.ones(2), np.ones(2 + me)], name="grp")
    except TensorMismatchError as exc:
        group_errors.append(str(exc))
    handles = hvd.grouped_allreduce_async([np.ones(2), np.ones(2 + me)], name="grp2").handles
    for h in handles:
        try:
            h.result(timeout=30)
        except TensorMismatchError as exc:
            group_errors.append(str(exc))
    # Rank 0's "dup" stays pending until the others submit theirs, after the barrier: its second is refused. (Each
    # rank submitting twice at once raced: the first could complete before a descheduled rank's second came.)
    duplicate = None
    if me == 0:
        handle = hvd.allreduce_async(np.ones(2), name="dup")
        try:
            hvd.allreduce_async(np.ones(2), name="dup")
        except ValueError as exc:
            duplicate = str(exc)
    hvd.barrier()
    if me == 0:
        handle.result()
    else:
        hvd.allreduce(np.ones(2), name="dup")
    hvd.shutdown()
    return errors, after, duplicate, again, group_errors


def _init_then_mismatches():
    """One job per world size: the calls outside init first (before any init), then the mismatches."""
    return _outside_init(), _mismatches()


@pytest.fixture(scope="module")
def job(world):
    return spawn_ranks(_init_then_mismatches, world, timeout=60 + 15 * world)


@pytest.mark.ranks
def test_mismatches_fail_on_every_rank_and_job_goes_on(job, world):
    if world < 2:
        pytest.skip("one rank: nothing to mismatch with")
    for rank, (_, (errors, after, duplicate, again, group_errors)) in enumerate(job):
        for case, text in errors.items():
            assert text is not None, f"rank {rank}: no error for mismatched {case}"
            assert "rank 0" in text and "rank 1" in text and f"'{'broadcast' if case == 'root' else 'allreduce'}.{case}'" in text
        assert "shape" in errors["shape"] and "(3,)" in errors["shape"] and "(4,)" in errors["shape"]
        assert "float32" in errors["dtype"] and "float64" in errors["dtype"]
        assert "root rank" in errors["root"]
        assert after == [float(world)] * 2
        assert again == [[float(world)] * 3] * 3
        assert (duplicate is not None and "Duplicate tensor name" in duplicate) == (rank == 0), (rank, duplicate)
        assert len(group_errors) == 3 and any("another tensor of its group failed" in e for e in group_errors)


def _stall(marker):
    import logging
    import numpy as np
    import horovod.numpy as hvd
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    logging.getLogger("horovod").addHandler(Keep())
    hvd.init()
    error = None
    if hvd.rank() == 0:
        try:
            hvd.allreduce(np.ones(1), name="lonely")
        except Exception as exc:  # the stall shutdown error
            error = f"{type(exc).__name__}: {exc}"
        open(marker, "w").close()
    else:
        # The others must stay silent (any collective they submitted would stall too) until rank 0 saw its error.
        deadline = time.monotonic() + 30
        while not os.path.exists(marker):
            assert time.monotonic() < deadline, "rank 0 never reported the stalled tensor"
            time.sleep(0.01)
    hvd.shutdown()
    return error, records


@pytest.mark.timed
@pytest.mark.ranks
@pytest.mark.parametrize("negotiation", ["peer", "star"])
@pytest.mark.parametrize("world", [n for n in world_sizes() if n > 1])     # one rank cannot stall
def test_stall_warning_names_tensor_and_missing_rank_then_fails_it(tmp_path, negotiation, world):
    env = {"HOROVOD_STALL_CHECK_TIME_SECONDS": "1", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "2",
           "HOROVOD_NEGOTIATION": negotiation}
    (error, records), *_ = spawn_ranks(_stall, world, timeout=60, env=env, args=(str(tmp_path / "marker"),))
    missing = str(list(range(1, world)))
    assert error is not None and error.startswith("HorovodInternalError")
    assert "allreduce.lonely" in error and missing in error
    assert any("allreduce.lonely" in r and f"missing ranks: {missing}" in r for r in records), records


def _outside_init():
    import numpy as np
    import horovod.numpy as hvd
    seen = []
    for call in (hvd.rank, hvd.size, lambda: hvd.allreduce(np.ones(1))):
        try:
            call()
        except ValueError as exc:
            seen.append(str(exc))
    hvd.init()
    hvd.shutdown()
    try:
        hvd.allreduce(np.ones(1))
    except ValueError as exc:
        seen.append(str(exc))
    hvd.init()
    value = hvd.allreduce(np.ones(1), op=hvd.Sum).tolist()
    hvd.shutdown()
    return seen, value


@pytest.mark.ranks
def test_calls_outside_init_raise_horovods_error_and_reinit_works(job, world):
    for (seen, value), _ in job:
        assert len(seen) == 4 and all("Horovod has not been initialized; use hvd.init()." in s for s in seen)
        assert value == [float(world)]


DEATH_SCRIPT = r"""
import os, sys, time
import numpy as np
import horovod.numpy as hvd
from horovod.common.exceptions import HorovodInternalError
hvd.init()
hvd.allreduce(np.ones(4), name="warmup")
here = os.path.dirname(os.path.abspath(__file__))
if hvd.rank() == 1:
    # Die only once the others are past the warmup (it may complete here first): the error must come from the
    # training loop below, not from the warmup outside it.
    deadline = time.monotonic() + 30
    others = [r for r in range(hvd.size()) if r != 1]
    while not all(os.path.exists(os.path.join(here, f"warm.{r}")) for r in others) and time.monotonic() < deadline:
        time.sleep(0.01)
    os._exit(3)
open(os.path.join(here, f"warm.{hvd.rank()}"), "w").close()
start = time.monotonic()
try:
    for i in range(1000):
        hvd.allreduce(np.ones(4), name=f"step{i}")
    print("NO ERROR")
except HorovodInternalError as exc:
    print(f"ERROR after {time.monotonic() - start:.2f}s: {exc}")
"""


_run_raw_ranks = run_raw_ranks


@pytest.mark.ranks
@pytest.mark.parametrize("size", world_sizes(default=(2,)))     # a start-up check: 2 ranks in make test
def test_ranks_with_different_algorithm_settings_refuse_to_start(tmp_path, size):
    script = tmp_path / "init.py"
    script.write_text("import horovod.numpy as hvd\nhvd.init()\nprint('STARTED')\nhvd.shutdown()\n")
    codes, outputs = _run_raw_ranks(script, size, lambda rank: {"HOROVOD_SHM_MIN_BYTES": str(1024 * (rank + 1))})
    listing = ", ".join(f"rank {r}: {1024 * (r + 1)}" for r in range(size))
    for code, output in zip(codes, outputs):
        assert code != 0 and "STARTED" not in output
        assert f"HOROVOD_SHM_MIN_BYTES differs between ranks ({listing})" in output


@pytest.mark.ranks
@pytest.mark.parametrize("transport_env", [{"HOROVOD_SHM_DISABLE": "1"}, {"HOROVOD_SHM_MIN_BYTES": "0"}],
                         ids=["tcp", "shm"])
@pytest.mark.serial
# At least three ranks: rank 1 dies between survivors on either side; 3 in make test (a serial test: alone).
@pytest.mark.parametrize("size", [n for n in world_sizes(default=(3,)) if n >= 3])
def test_dead_peer_becomes_horovod_internal_error_fast(tmp_path, transport_env, size):
    script = tmp_path / "death.py"
    script.write_text(DEATH_SCRIPT)
    codes, outputs = _run_raw_ranks(script, size, lambda rank: {"HOROVOD_GLOO_TIMEOUT_SECONDS": "30",
                                                                **transport_env})
    assert codes[1] == 3
    for rank in [r for r in range(size) if r != 1]:
        assert "ERROR after" in outputs[rank], outputs[rank]
        seconds = float(outputs[rank].split("ERROR after ")[1].split("s:")[0])
        assert seconds < 2, outputs[rank]     # at most 0.1 s measured (run alone); the liveness bound is 10 s


def _timeline(path):
    import numpy as np
    import horovod.numpy as hvd
    hvd.init()
    for step in range(3):
        handles = [hvd.allreduce_async(np.ones(2048, np.float32), name=f"w{i}") for i in range(3)]
        [h.result() for h in handles]
    hvd.allreduce(np.ones(4, np.float32), name="small")     # its data travels with the negotiation
    hvd.broadcast(np.ones(3), root_rank=0, name="b")
    if hvd.rank() == 0:
        # valid JSON while the job runs: wait (bounded) for the writer's flush, which happens within 100 ms
        deadline = time.monotonic() + 5
        while True:
            try:
                events = json.load(open(path))
                if any(e.get("name") == "BROADCAST" for e in events):
                    break
            except ValueError:
                pass
            assert time.monotonic() < deadline, "timeline not flushed within 5 s"
            time.sleep(0.02)
    hvd.shutdown()


@pytest.mark.ranks
@pytest.mark.parametrize("size", world_sizes(default=(2,)))     # rank 0 writes it whatever the size
def test_timeline_is_chrome_trace_json(tmp_path, size):
    path = str(tmp_path / "timeline.json")
    spawn_ranks(_timeline, size, timeout=60, args=(path,),
                env={"HOROVOD_TIMELINE": path, "HOROVOD_TIMELINE_MARK_CYCLES": "1"})
    events = json.load(open(path))
    names = {e.get("name") for e in events}
    assert {"NEGOTIATE_ALLREDUCE", "ALLREDUCE", "MEMCPY_IN_FUSION_BUFFER", "BROADCAST",
            "NEGOTIATED_DATA_ALLREDUCE", "CYCLE_START", "0", "1"} <= names
    # the data plane's algorithm for 8 KiB over the job's ranks: the exchange, or recursive doubling at 8
    assert names & {"EXCHANGE_ALLREDUCE", "RECURSIVE_DOUBLING_ALLREDUCE", "SHM_ALLREDUCE"}, sorted(names)
    tensors = {e["args"]["name"] for e in events if e.get("name") == "process_name" and e["pid"] > 0}
    assert {"allreduce.w0", "allreduce.w1", "allreduce.w2", "broadcast.b"} <= tensors
    begins = sum(1 for e in events if e.get("ph") == "B")
    ends = sum(1 for e in events if e.get("ph") == "E")
    assert begins == ends


def _after_peer_shutdown():
    import numpy as np
    import horovod.numpy as hvd
    from horovod.common.exceptions import HorovodInternalError
    hvd.init()
    hvd.allreduce(np.ones(1), name="before")
    if hvd.rank() == 1:
        hvd.shutdown()
        return "shut down"
    start = time.monotonic()
    try:
        # Rank 1's shutdown stops the job; a later collective must fail, not wait forever.
        hvd.allreduce(np.ones(1), name="after")
        hvd.allreduce(np.ones(1), name="after2")
        return "no error"
    except HorovodInternalError as exc:
        return f"error after {time.monotonic() - start:.1f}s: {exc}"
    finally:
        hvd.shutdown()


@pytest.mark.serial
@pytest.mark.ranks
@pytest.mark.parametrize("size", [n for n in world_sizes(default=(2,)) if n > 1])     # serial: 2 in make test
def test_collectives_after_another_rank_shut_down_fail_instead_of_hanging(size):
    results = spawn_ranks(_after_peer_shutdown, size, timeout=60)
    assert results[1] == "shut down"
    for rank, result in enumerate(results):
        if rank != 1:
            assert result.startswith("error after") and "shut down" in result, (rank, result)


def _busy_partner():
    import time as _time
    import numpy as np
    import horovod.numpy as hvd
    hvd.init()
    if hvd.rank() == 1:
        _time.sleep(2.5)     # the user's own computation, longer than HOROVOD_GLOO_TIMEOUT_SECONDS
    value = hvd.allreduce(np.ones(1), op=hvd.Sum, name="late").tolist()
    hvd.shutdown()
    return value


@pytest.mark.timed
@pytest.mark.ranks
@pytest.mark.parametrize("negotiation", ["peer", "star"])
@pytest.mark.parametrize("size", [n for n in world_sizes(default=(2,)) if n > 1])     # 2.5 s idle: 2 in make test
def test_a_rank_busy_in_its_own_code_is_not_taken_for_dead(negotiation, size):
    # The others wait 2.5 s for rank 1's tensor with a 1 s peer timeout: rank 1's engine still answers, no error.
    results = spawn_ranks(_busy_partner, size, timeout=60,
                          env={"HOROVOD_GLOO_TIMEOUT_SECONDS": "1", "HOROVOD_NEGOTIATION": negotiation})
    assert results == [[float(size)]] * size


DEATH_IN_BARRIER_SCRIPT = r"""
import os, time
import numpy as np
import horovod.numpy as hvd
from horovod.common.exceptions import HorovodInternalError
from horovod.transport import shm
hvd.init()
hvd.allreduce(np.ones(1 << 16), name="warmup")     # through shared memory: segments mapped, barriers counted
if hvd.rank() == 1:
    entered = shm.ShmSegments.barrier
    def dies_between_barriers(self):
        entered(self)
        os._exit(3)     # after the first barrier of the next allreduce: the others wait in its second one
    shm.ShmSegments.barrier = dies_between_barriers
start = time.monotonic()
try:
    hvd.allreduce(np.ones(1 << 16), name="doomed")
    print("NO ERROR")
except HorovodInternalError as exc:
    print(f"ERROR after {time.monotonic() - start:.2f}s: {exc}")
"""


@pytest.mark.ranks
@pytest.mark.parametrize("size", [n for n in world_sizes() if n > 1])
def test_a_peer_dying_inside_a_shared_memory_collective_fails_the_others_fast(tmp_path, size):
    # Three ranks on two cores sleep in the barrier (no spinning); two spin first, then sleep.
    script = tmp_path / "death_in_barrier.py"
    script.write_text(DEATH_IN_BARRIER_SCRIPT)
    codes, outputs = _run_raw_ranks(script, size, lambda rank: {"HOROVOD_GLOO_TIMEOUT_SECONDS": "30"})
    assert codes[1] == 3
    for rank in [r for r in range(size) if r != 1]:
        assert "ERROR after" in outputs[rank], outputs[rank]
        seconds = float(outputs[rank].split("ERROR after ")[1].split("s:")[0])
        assert seconds < 3, outputs[rank]     # at most 0.1 s measured, beside two busy processes too
        assert "rank 1" in outputs[rank], outputs[rank]
