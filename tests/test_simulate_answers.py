"""The simulation checks answers and catches planted bugs (issue 46, items 3, 4 and 6): every collective carries
small real data and every rank's result is compared byte for byte with the reduction of what the ranks submitted;
workloads differ per rank; and each mutant of the real protocol code (horovod.tools.simulate.mutants) is caught by
a sweep of seeds, the seed printed."""

import time
import warnings
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("greenlet")

from horovod.common.types import OpType, Request  # noqa: E402
from horovod.tools.simulate import answers  # noqa: E402
from horovod.tools.simulate.job import InvariantViolation, scenario  # noqa: E402
from horovod.tools.simulate.mutants import MUTANTS, planted  # noqa: E402
from horovod.tools.simulate.varied import FEATURES, Varied  # noqa: E402

class PlantedBugCaught(UserWarning):
    """Which seed caught a planted bug (shown in the warnings summary, so that make test's output names it)."""


# Star (3, 5, 8 ranks) and tree (17, 24, 32: relays fold on the way up); peer is 2 ranks (tests/test_simulate.py).
MUTANT_SIZES = (3, 8, 24, 32, 5, 17)
MUTANT_SEEDS = 60


@pytest.mark.unit
@pytest.mark.parametrize("size", [2, 5, 24])
def test_every_collective_kind_on_every_rank_gets_the_reduction_of_what_the_ranks_submitted(size):
    # Peer (2), star (5) and tree (24): allreduces that ride the negotiation and ones too large to, of three reduce
    # ops, allgathers of per-rank first dimensions, a broadcast, alltoalls, reducescatters, in a second process set too.
    workload = Varied(1, size, features=set(FEATURES) - {"join"})
    job = scenario(size, 1, workload=workload, horizon=1.0)
    members = len(workload.set_members)
    # Each step: 6 allreduces, 3 grouped, 5 kinds, on every rank; 1 + 5 more in the set; step s adds s new names.
    per_rank = 3 * (6 + 3 + 5) + (0 + 1 + 2)
    assert job.answers.results == size * per_rank + members * 3 * 6
    # The mismatched name failed on every rank with the coordinator's error, and the job went on.
    assert job.mismatches == size and all(r.finished and r.error is None for r in job.ranks)


@pytest.mark.unit
@pytest.mark.parametrize("size", [2, 5, 24])
def test_a_rank_that_joins_a_step_early_contributes_zeros_and_every_rank_joins(size):
    # Four steps: two with every rank's data, one where the joiner has joined (the others' allreduces fold its
    # zeros, an average divides by every member), and one where the others join.
    workload = Varied(4, size, steps=4, features=("join", "reduce_ops", "order"))
    job = scenario(size, 4, workload=workload, horizon=1.0)
    assert job.answers.results == 6 * (2 * size + size - 1)
    assert all(r.finished and r.error is None and not r.executor.joined for r in job.ranks)


@pytest.mark.unit
def test_a_wrong_byte_in_one_ranks_result_fails_the_seed_and_names_the_byte(monkeypatch):
    real = answers.DataPlane._combine

    def corrupt(self, set_id, k, held, members):
        rank, response, parts = held[-1][:3]     # (then when it was ready)
        if response.op == OpType.ALLGATHER:     # the last member's data corrupted on its way
            parts[0] = SimpleNamespace(request=parts[0].request, array=parts[0].array + 1, handle=parts[0].handle)
        return real(self, set_id, k, held, members)
    monkeypatch.setattr(answers.DataPlane, "_combine", corrupt)
    with pytest.raises(InvariantViolation, match=r"^seed 9: rank \d+: the result of 'all.gather' .*is wrong: byte"):
        scenario(8, 9, workload=Varied(9, 8, features=("kinds",)))


@pytest.mark.unit
def test_the_reference_reduces_scatters_and_exchanges_as_horovod_defines_them():
    members = [3, 5, 9]
    a = [np.arange(6, dtype=np.float32).reshape(3, 2) + i for i in range(3)]
    scatter = [Request("s", OpType.REDUCESCATTER, "float32", (3, 2))] * 3
    assert answers.reference(scatter, a, members)(0).tolist() == [[3.0, 6.0]]
    assert answers.reference(scatter, a, members)(2).tolist() == [[15.0, 18.0]]
    bcast = [Request("b", OpType.BROADCAST, "float32", (3, 2), root_rank=5)] * 3
    assert np.array_equal(answers.reference(bcast, a, members)(0), a[1])
    splits = [(1, 1, 1), (0, 2, 1), (3, 0, 0)]
    alltoall = [Request("t", OpType.ALLTOALL, "float32", (3, 2), splits=s) for s in splits]
    rows, received = answers.reference(alltoall, a, members)(1)
    assert received.tolist() == [1, 2, 0] and rows.tolist() == [[2.0, 3.0], [1.0, 2.0], [3.0, 4.0]]


@pytest.mark.ranks
@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_each_bug_planted_in_the_protocol_code_is_caught_by_the_seed_sweep_with_its_seed(mutant, capsys):
    began = time.process_time()
    caught = None
    with planted(mutant):
        for seed in range(MUTANT_SEEDS):
            size = MUTANT_SIZES[seed % len(MUTANT_SIZES)]
            try:
                scenario(size, seed, workload=Varied(seed, size), horizon=1.0)
            except InvariantViolation as exc:
                caught = (seed, size, str(exc))
                break
    assert caught is not None, f"{mutant!r}: no seed of {MUTANT_SEEDS} caught it"
    seed, size, what = caught
    assert what.startswith(f"seed {seed}: ")
    line = f"planted {mutant!r}: caught by seed {seed} at {size} ranks in {time.process_time() - began:.1f} CPU-s: " \
        f"{what[:240]}"
    # Printed where pytest runs in one process; under make test's workers (xdist relays no output of a passing
    # test) the warnings summary carries it.
    with capsys.disabled():
        print("\n" + line)
    warnings.warn(PlantedBugCaught(line))
