"""Every collective on 1-4 real ranks against numpy references (spawned ranks and the real horovodrun).

The checks hold at any world size: ``--world-sizes 5,8`` (``make soak``) runs them there (horovod.testing.fixtures).
"""

import os
import sys

import pytest

from horovod.testing import spawn_ranks
from horovod.testing.fixtures import run_horovodrun, world_sizes

HERE = os.path.dirname(os.path.abspath(__file__))
SMALL_FUSION = {"HOROVOD_FUSION_THRESHOLD": "65536"}
# The TCP runs negotiate through rank 0 (as jobs of 5-16 ranks, or crowded ones, do), the shared-memory runs peer to
# peer (as jobs of up to 4 ranks with a core each do), the default-transport runs up and down the tree (as jobs above
# 16 ranks do), so that every protocol meets every op, dtype, process set and error case at every size.
TRANSPORTS = {"tcp": {"HOROVOD_SHM_DISABLE": "1", "HOROVOD_NEGOTIATION": "star"},
              "shm": {"HOROVOD_SHM_MIN_BYTES": "0", "HOROVOD_NEGOTIATION": "peer"},
              "tree": {"HOROVOD_NEGOTIATION": "tree"}}


def _all_checks():
    sys.path.insert(0, HERE)
    import collective_checks
    import horovod.numpy as hvd
    hvd.init()
    n = hvd.size()
    subset = hvd.ProcessSet(list(range(0, n, 2)))
    odd = hvd.ProcessSet(list(range(1, n, 2))) if n > 1 else None
    hvd.shutdown()     # and init again: re-initialisation must work
    hvd.init(process_sets=[s for s in (subset, odd) if s is not None])
    try:
        return collective_checks.run_all(hvd, subset, odd)
    finally:
        hvd.shutdown()


@pytest.mark.ranks
@pytest.mark.parametrize("transport", sorted(TRANSPORTS))
@pytest.mark.parametrize("world_size", world_sizes(default=(1, 2, 3, 4)))
def test_every_op_dtype_shape_matches_numpy(world_size, transport):
    results = spawn_ranks(_all_checks, world_size, timeout=120, env={**SMALL_FUSION, **TRANSPORTS[transport]})
    for rank, (count, failures) in enumerate(results):
        assert count > 300, f"rank {rank} ran only {count} checks"
        assert failures == [], f"rank {rank}: {failures[:10]}"


# `make test` runs the defaults at 8 ranks (the star); `make soak` at 32 (HVD_LARGE_WORLD_SIZES=32: the tree and its
# start-up records, 32 ranks on 2 cores: about 50 s). `make test` still covers every op down the tree at 1-4 ranks
# (transport "tree" above) and the default choice of the tree at 32 and 64 ranks (tests/test_scale.py).
LARGE_WORLD_SIZES = tuple(int(n) for n in os.environ.get("HVD_LARGE_WORLD_SIZES", "8").split(","))


@pytest.mark.ranks
@pytest.mark.slow
@pytest.mark.parametrize("world_size", LARGE_WORLD_SIZES)
def test_every_op_at_larger_world_sizes_with_default_settings(world_size):
    # Defaults: the star at 8 ranks, the tree (and start-up records down it) at 32; 32 ranks share 2 cores here.
    results = spawn_ranks(_all_checks, world_size, timeout=600, env=SMALL_FUSION)
    for rank, (count, failures) in enumerate(results):
        assert count > 300, f"rank {rank} ran only {count} checks"
        assert failures == [], f"rank {rank}: {failures[:10]}"


@pytest.mark.cli
@pytest.mark.parametrize("world_size", world_sizes(default=(3,)))     # the spawned runs above cover 1-4
def test_under_horovodrun(world_size):
    proc = run_horovodrun(["-np", str(world_size), "--fusion-threshold-mb", "0", sys.executable,
                           os.path.join(HERE, "collective_checks.py")], timeout=120 + 30 * world_size)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for rank in range(world_size):
        assert f"[{rank}]<stdout>:rank {rank}: " in proc.stdout and "0 failures" in proc.stdout


def _dynamic_sets():
    import numpy as np
    import horovod.numpy as hvd
    hvd.init(process_sets="dynamic")
    try:
        n = hvd.size()
        first = hvd.add_process_set([0])
        rest = hvd.add_process_set(list(range(1, n)))
        from horovod.runtime import basics
        ids = basics._get_process_set_ids_and_ranks()
        got = None
        if rest.included():
            got = hvd.allreduce(np.array([1.0]), op=hvd.Sum, process_set=rest, name="rest").tolist()
        try:
            hvd.add_process_set([0])
            duplicate = "no error"
        except ValueError as exc:
            duplicate = str(exc)
        removed = hvd.remove_process_set(first)
        after = basics._get_process_set_ids_and_ranks()
        return ids, got, "duplicate" in duplicate, removed, after, first.process_set_id, rest.rank()
    finally:
        hvd.shutdown()


@pytest.mark.cli
def test_two_hosts_hierarchical_allreduce_under_horovodrun():
    """localhost and 127.0.0.1 are two host identities: shared memory within each, TCP between their leaders.
    Four ranks, two a host: the smallest layout with a local and a cross-host level of two each (the checks are
    the size-independent ones above)."""
    proc = run_horovodrun(["-np", "4", "-H", "localhost:2,127.0.0.1:2", "--hierarchical-allreduce",
                           sys.executable, os.path.join(HERE, "collective_checks.py")],
                          timeout=120, env={"HOROVOD_SHM_MIN_BYTES": "0"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count(" 0 failures") == 4


def _multi_chunk_allreduces():
    import numpy as np
    import horovod.numpy as hvd
    from horovod.algorithms import shm_collectives
    shm_collectives.CHUNK_BYTES = 64 << 10    # several chunks, both segment halves, and a partial last chunk
    shm_collectives.BLOCK_BYTES = 6 << 10     # and several blocks per reduced slice, the last one partial
    hvd.init()
    try:
        me, n = hvd.rank(), hvd.size()
        count = 5 * (16 << 10) + 7
        results = {}
        for dtype, op in (("float32", hvd.Average), ("float64", hvd.Sum), ("int32", hvd.Average),
                          ("float32", hvd.Max)):
            x = (np.arange(count) % 97 * (me + 1)).astype(dtype)
            results[dtype, int(op)] = hvd.allreduce(x, op=op, name=f"mc.{dtype}.{int(op)}",
                                                    postscale_factor=1.0 if op != hvd.Sum else 0.5)
        return results
    finally:
        hvd.shutdown()


def _mixed_back_to_back():
    import random
    import time as clock
    import numpy as np
    import horovod.numpy as hvd
    from horovod.algorithms import shm_collectives
    shm_collectives.CHUNK_BYTES = 32 << 10     # many chunks: halves alternate within and across collectives
    hvd.init()
    try:
        me, n = hvd.rank(), hvd.size()
        jitter = random.Random(me)
        failures = []
        for i in range(40):
            count = 20_000 + 3_000 * (i % 5)
            x = np.full(count, me + 1.0 + i, np.float32)
            if jitter.random() < 0.3:
                clock.sleep(jitter.random() * 0.003)   # perturb timing: a rank lagging inside the sequence
            kind = i % 4
            if kind == 0:
                got = hvd.allreduce(x, op=hvd.Sum, name=f"ar{i}")
                want = np.full(count, sum(r + 1.0 + i for r in range(n)), np.float32)
            elif kind == 1:
                got = hvd.broadcast(x, root_rank=i % n, name=f"bc{i}")
                want = np.full(count, (i % n) + 1.0 + i, np.float32)
            elif kind == 2:
                got = hvd.allgather(x, name=f"ag{i}")
                want = np.concatenate([np.full(count, r + 1.0 + i, np.float32) for r in range(n)])
            else:
                got, _ = hvd.alltoall(np.concatenate([x] * n), name=f"a2a{i}")
                want = np.concatenate([np.full(count, r + 1.0 + i, np.float32) for r in range(n)])
            if not np.array_equal(got, want):
                failures.append(f"op {i} (kind {kind}) differs")
        return failures
    finally:
        hvd.shutdown()


def _shared_job():
    """The checks below on one job per world size, each part's outcome (or traceback) reported by its own test."""
    import traceback
    outcomes = {}
    for part in (_dynamic_sets, _multi_chunk_allreduces, _mixed_back_to_back):
        try:
            outcomes[part.__name__] = (part(), None)
        except Exception:  # the part's test reports it
            outcomes[part.__name__] = (None, traceback.format_exc())
    return outcomes


@pytest.fixture(scope="module")
def shared_job(world):
    # Shared memory for every size (HOROVOD_SHM_MIN_BYTES=0): the chunked allreduces are large anyway.
    return spawn_ranks(_shared_job, world, timeout=60 + 30 * world, env={"HOROVOD_SHM_MIN_BYTES": "0"})


def _part(results, name):
    failures = [f"rank {rank}:\n{r[name][1]}" for rank, r in enumerate(results) if r[name][1] is not None]
    assert not failures, "\n".join(failures)
    return [r[name][0] for r in results]


@pytest.mark.ranks
def test_dynamic_process_sets_numbered_in_registration_order(shared_job, world):
    if world < 2:
        pytest.skip("one rank: no second process set to register")
    everyone, rest_ranks = list(range(world)), list(range(1, world))
    for rank, (ids, got, duplicate, removed, after, first_id, rest_rank) in enumerate(_part(shared_job,
                                                                                            "_dynamic_sets")):
        assert ids == {0: everyone, 1: [0], 2: rest_ranks}
        assert got == (None if rank == 0 else [float(world - 1)])
        assert duplicate and removed and first_id is None
        assert after == {0: everyone, 2: rest_ranks}
        assert rest_rank == (None if rank == 0 else rank - 1)


@pytest.mark.ranks
def test_shared_memory_allreduce_over_several_chunks_with_fused_scaling(shared_job, world):
    import numpy as np
    n, results = world, _part(shared_job, "_multi_chunk_allreduces")
    count = 5 * (16 << 10) + 7
    base = np.arange(count) % 97
    contributions = [base * (r + 1) for r in range(n)]
    average, total = 0, 1     # Horovod's values of hvd.Average and hvd.Sum
    want = {("float32", average): np.sum(contributions, axis=0) / n,
            ("float64", total): np.sum(contributions, axis=0) * 0.5,
            ("int32", average): np.trunc(np.sum(contributions, axis=0) / n),
            ("float32", 4): np.max(contributions, axis=0)}
    for rank, got in enumerate(results):
        for key, value in want.items():
            np.testing.assert_allclose(got[key], value, rtol=1e-6, err_msg=f"rank {rank} {key}")
        assert all(np.array_equal(got[k], results[0][k]) for k in want), f"rank {rank} differs from rank 0"


@pytest.mark.ranks
def test_shared_memory_collectives_back_to_back_without_closing_barriers(shared_job):
    for rank, failures in enumerate(_part(shared_job, "_mixed_back_to_back")):
        assert failures == [], f"rank {rank}: {failures}"
