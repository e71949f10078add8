"""Bad input at the API never corrupts a job (issue 19, item 5), at every world size of horovod.testing.fixtures
(2 and 3 ranks; ``--world-sizes 5,8`` in ``make soak``), one job per size (tier ranks).

Each case either works correctly or raises a clear error on every rank, and the job goes on: after every case the
ranks run a checked allreduce. A child forked after ``init`` is ``tests/test_liveness.py``'s.
"""

import traceback

import pytest

from horovod.testing import spawn_ranks

pytestmark = pytest.mark.ranks

ODD_NAMES = ["", "x" * 10_000, "nul\0inside", "new\nline", "non-ascii-é-漢字-🙂", "path/with/../separators",
             "back\\slash", " "]


def _goes_on(hvd, np, tag):
    """The job still works: a checked allreduce."""
    got = hvd.allreduce(np.arange(3, dtype=np.float64) + hvd.rank(), op=hvd.Sum, name=f"goes-on.{tag}")
    expected = np.arange(3) * hvd.size() + sum(range(hvd.size()))
    return bool(np.array_equal(got, expected))


def _odd_names():
    import numpy as np
    import horovod.numpy as hvd
    hvd.init()
    outcome = []
    for index, name in enumerate(ODD_NAMES):
        try:
            value = hvd.allreduce(np.full(2, float(hvd.rank() + 1)), op=hvd.Sum, name=name).tolist()
        except (ValueError, TypeError) as exc:
            value = f"error: {exc}"
        outcome.append((value, _goes_on(hvd, np, index)))
    hvd.shutdown()
    return outcome


def _every_case():
    """Each case's function in turn on one job (each inits and shuts down): its value or its traceback."""
    outcomes = {}
    for case in (_odd_names, _odd_values, _mismatches, _before_and_after):
        try:
            outcomes[case.__name__] = (case(), None)
        except Exception:  # the case's test reports it
            import horovod.numpy as hvd
            outcomes[case.__name__] = (None, traceback.format_exc())
            if hvd.is_initialized():
                hvd.shutdown()
    return outcomes


@pytest.fixture(scope="module")
def job(world):
    return spawn_ranks(_every_case, world, timeout=90 + 30 * world)


def _part(results, case):
    failures = [f"rank {rank}:\n{r[case.__name__][1]}" for rank, r in enumerate(results)
                if r[case.__name__][1] is not None]
    assert not failures, "\n".join(failures)
    return [r[case.__name__][0] for r in results]


def test_odd_tensor_names_work_or_fail_clearly_on_every_rank(job, world):
    results = _part(job, _odd_names)
    assert all(result == results[0] for result in results), results
    total = float(sum(range(1, world + 1)))
    for name, (value, goes_on) in zip(ODD_NAMES, results[0]):
        assert value == [total, total] or (isinstance(value, str) and "name" in value), (name[:20], value)
        assert goes_on, name[:20]


def _odd_values():
    import numpy as np
    import horovod.numpy as hvd
    hvd.init()
    r = hvd.rank()
    out = {}
    special = np.array([np.nan, np.inf, -np.inf, 1.0, -0.0], dtype=np.float64)
    out["nan_inf"] = hvd.allreduce(special * (r + 1), op=hvd.Sum, name="special").tolist()
    out["nan_inf_max"] = hvd.allreduce(special, op=hvd.Max, name="special-max").tolist()
    out["inf_minus_inf"] = hvd.allreduce(np.array([np.inf if r == 0 else -np.inf]), op=hvd.Sum,
                                         name="inf-minus-inf").tolist()
    base = np.arange(20, dtype=np.float32).reshape(4, 5) + r
    out["non_contiguous"] = hvd.allreduce(base[:, ::2], op=hvd.Sum, name="strided").tolist()
    out["transposed"] = hvd.allreduce(base.T, op=hvd.Sum, name="transposed").tolist()
    frozen = np.full(4, float(r + 1))
    frozen.setflags(write=False)
    out["read_only"] = hvd.allreduce(frozen, op=hvd.Sum, name="read-only").tolist()
    out["read_only_unchanged"] = frozen.tolist()
    try:
        hvd.allreduce_(frozen, op=hvd.Sum, name="read-only-in-place")
        out["in_place_read_only"] = "no error"
    except (ValueError, TypeError) as exc:
        out["in_place_read_only"] = f"error: {exc}"
    out["nan_prescale"] = str(hvd.allreduce(np.ones(2), op=hvd.Sum, prescale_factor=float("nan"),
                                            name="nan-prescale").tolist())
    out["goes_on"] = _goes_on(hvd, np, "values")
    hvd.shutdown()
    return out


def test_nan_inf_non_contiguous_and_read_only_arrays_give_correct_results(job, world):
    import numpy as np
    results = _part(job, _odd_values)
    r0 = results[0]
    own = "read_only_unchanged"         # each rank's own input
    shared = [str({k: v for k, v in r.items() if k != own}) for r in results]
    assert shared == [shared[0]] * world
    special = np.array([np.nan, np.inf, -np.inf, 1.0, -0.0])
    # (Started from -0.0, the additive identity that keeps a sum of negative zeros negative, as IEEE adds them.)
    assert str(r0["nan_inf"]) == str(sum((special * (r + 1) for r in range(world)), np.full(5, -0.0)).tolist())
    assert str(r0["nan_inf_max"]) == str(special.tolist())
    assert str(r0["inf_minus_inf"]) == ("[inf]" if world == 1 else "[nan]")
    base = np.arange(20, dtype=np.float32).reshape(4, 5)
    assert r0["non_contiguous"] == (world * base[:, ::2] + sum(range(world))).tolist()
    assert r0["transposed"] == (world * base.T + sum(range(world))).tolist()
    assert r0["read_only"] == [float(sum(range(1, world + 1)))] * 4
    assert [r[own] for r in results] == [[r + 1.0] * 4 for r in range(world)]
    assert r0["in_place_read_only"].startswith("error:") and "read-only" in r0["in_place_read_only"].lower() \
        or r0["in_place_read_only"] == "no error", r0["in_place_read_only"]
    assert r0["nan_prescale"] == "[nan, nan]", "a NaN prescale on every rank is not a mismatch"
    assert r0["goes_on"]


def _mismatches():
    import numpy as np
    import horovod.numpy as hvd
    from horovod.common.exceptions import HorovodError
    hvd.init()
    r = hvd.rank()
    out = {}
    cases = {
        "dtype": lambda: hvd.allreduce(np.ones(3, dtype=np.float32 if r == 0 else np.float64), name="dtype"),
        "shape": lambda: hvd.allreduce(np.ones(3 + r), name="shape"),
        "op": lambda: hvd.allreduce(np.ones(3), op=hvd.Sum if r == 0 else hvd.Max, name="op"),
        "root": lambda: hvd.broadcast(np.ones(3), root_rank=r, name="root"),
        "prescale": lambda: hvd.allreduce(np.ones(3), prescale_factor=1.0 + r, name="prescale"),
        "bad_root": lambda: hvd.broadcast(np.ones(3), root_rank=hvd.size(), name="bad-root"),
        "bad_dtype": lambda: hvd.allreduce(np.array(["a", "b"]), name="strings"),
        "object_dtype": lambda: hvd.allreduce(np.array([{}, 1], dtype=object), name="objects"),
    }
    for case, call in cases.items():
        try:
            call()
            out[case] = "no error"
        except (ValueError, TypeError, HorovodError) as exc:
            out[case] = f"{type(exc).__name__}: {exc}"
        out[case + ".goes_on"] = _goes_on(hvd, np, case)
    hvd.shutdown()
    return out


def test_dtype_shape_and_argument_mismatches_raise_clearly_on_every_rank_and_the_job_goes_on(job, world):
    if world < 2:
        pytest.skip("one rank: nothing to mismatch with")
    results = _part(job, _mismatches)
    for case in ("dtype", "shape", "op", "root", "prescale"):
        for result in results:
            assert "Mismatched" in result[case] and f".{case}'" in result[case], (case, result[case])
    for case in ("bad_root", "bad_dtype", "object_dtype"):
        for result in results:
            assert result[case] != "no error", (case, result[case])
    for result in results:
        assert all(value for key, value in result.items() if key.endswith(".goes_on")), result


def _before_and_after():
    import numpy as np
    import horovod.numpy as hvd
    from horovod.common.exceptions import HorovodInternalError
    out = {}
    for when in ("before", "after"):
        if when == "after":
            hvd.init()
            out["works"] = hvd.allreduce(np.ones(2), op=hvd.Sum).tolist()
            hvd.shutdown()
        for op, call in (("allreduce", lambda: hvd.allreduce(np.ones(2))), ("rank", hvd.rank),
                         ("broadcast", lambda: hvd.broadcast(np.ones(2), 0)), ("barrier", hvd.barrier)):
            try:
                call()
                out[f"{when}.{op}"] = "no error"
            except (ValueError, HorovodInternalError) as exc:
                out[f"{when}.{op}"] = str(exc)
    hvd.init()      # and init again after shutdown works
    out["again"] = hvd.allreduce(np.ones(2), op=hvd.Sum).tolist()
    hvd.shutdown()
    return out


def test_ops_before_init_and_after_shutdown_raise_a_clear_error(job, world):
    for result in _part(job, _before_and_after):
        assert result["works"] == [float(world)] * 2 and result["again"] == [float(world)] * 2
        for key, value in result.items():
            if key.startswith(("before.", "after.")):
                assert "not been initialized" in value or "shut down" in value, (key, value)
