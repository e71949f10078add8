"""Rules that had copies now have one definition each, which every caller uses (issue 47, item 4; tier unit): the
deprecated ``average=`` argument, Adasum's rank count, and the spacing of batching cycles."""

import pathlib
import warnings

import numpy as np
import pytest

import horovod
from horovod.algorithms import adasum
from horovod.common.util import check_adasum_ranks, get_average_backwards_compatibility_fun
from horovod.core.negotiation.base import BATCH_SPACING_SECONDS, spacing_for
from horovod.runtime.collectives import Average, Sum, resolve_op
from horovod.runtime.mpi_ops_names import handle_average_backwards_compatibility

pytestmark = pytest.mark.unit

PACKAGE = pathlib.Path(horovod.__file__).resolve().parent


def _modules_saying(text: str):
    return sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if text in p.read_text())


def test_the_average_deprecation_is_one_rule_with_one_text():
    assert _modules_saying("has been replaced with `op`") == ["common/util.py"]
    for rule in (resolve_op, handle_average_backwards_compatibility,
                 get_average_backwards_compatibility_fun(type("Ops", (), {"Average": Average, "Sum": Sum}))):
        with pytest.raises(ValueError, match="supersedes average"):
            rule(Sum, True)
        for average, expected in ((True, Average), (False, Sum)):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                assert rule(None, average) == expected
            assert [str(w.message) for w in caught] == [
                "Parameter `average` has been replaced with `op` and will be removed in v0.21.0"]
            assert caught[0].category is DeprecationWarning
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert rule(None, None) == Average and rule(Sum, None) == Sum


def test_adasums_rank_count_is_one_rule_with_one_exception():
    assert _modules_saying("needs a power-of-two number of ranks") == ["common/util.py"]
    for n in (1, 2, 4, 64):
        check_adasum_ranks(n)
    for n in (0, 3, 6):
        with pytest.raises(NotImplementedError, match=f"power-of-two number of ranks, not {n}"):
            check_adasum_ranks(n)
    with pytest.raises(NotImplementedError, match="power-of-two"):
        adasum.adasum_reduce([np.ones(2)] * 3, [0, 2])
    for path in ("runtime/collectives.py", "algorithms/adasum.py"):
        assert "check_adasum_ranks(" in (PACKAGE / path).read_text(), path


def test_the_batch_spacing_is_one_rule_that_the_engine_and_the_simulation_ask():
    assert spacing_for(0.001, explicit=False) == BATCH_SPACING_SECONDS
    assert spacing_for(0.05, explicit=False) == 0.05
    assert spacing_for(0.001, explicit=True) == 0.001 and spacing_for(0.0, explicit=True) == 0.0
    assert _modules_saying("BATCH_SPACING_SECONDS)") == ["core/negotiation/base.py"]
    for path in ("core/engine.py", "tools/simulate/rank.py"):
        assert "spacing_for(" in (PACKAGE / path).read_text(), path
