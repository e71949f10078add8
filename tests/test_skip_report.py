"""`make test` cannot pass hollow (issue 47, item 6): with ``--strict-skips`` (horovod/testing/skips.py) pytest lists
every skip with its reason and fails the run when a test skipped for a reason that this machine does not explain.

Tier unit: pytest runs in this process (pytester) on small test files. Tier cli: pytest's own command line with
pytest-xdist, whose workers' skips the controller must judge.
"""

import os
import resource
import stat

import pytest

from horovod.testing import skips

pytest_plugins = ["pytester"]

SKIPPING = """
import pytest

def test_runs():
    pass

def test_without_an_extra():
    pytest.skip("jax is not installed")

def test_without_mpirun():
    pytest.skip("no mpirun (Debian: openmpi-bin)")

@pytest.mark.xfail(reason="an expected failure is no skip")
def test_xfail():
    assert False
"""

MODULE_SKIP = """
import pytest
pytest.importorskip("horovod_no_such_extra")

def test_never_collected():
    pass
"""


def _path_with(tmp_path, mpirun: bool) -> str:
    """A PATH of one folder, holding an executable ``mpirun`` or not."""
    folder = tmp_path / ("with" if mpirun else "without")
    folder.mkdir()
    if mpirun:
        (folder / "mpirun").write_text("#!/bin/sh\n")
        (folder / "mpirun").chmod(stat.S_IRWXU)
    return str(folder)


@pytest.mark.unit
def test_an_undeclared_skip_fails_the_run_and_every_skip_is_listed(pytester, tmp_path, monkeypatch):
    pytester.makepyfile(test_skipping=SKIPPING, test_module_skip=MODULE_SKIP)
    monkeypatch.setenv("PATH", _path_with(tmp_path, mpirun=False))
    result = pytester.runpytest_inprocess("-p", "horovod.testing.skips", "--strict-skips")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    out = result.stdout.str()
    assert "skips: 3, each with its reason" in out
    assert "UNEXPECTED (not declared): 1 skipped: jax is not installed" in out
    assert "UNEXPECTED (not declared): 1 skipped: could not import 'horovod_no_such_extra'" in out
    assert "test_module_skip.py" in out
    assert "expected, no mpirun on PATH" in out and "test_skipping.py::test_without_mpirun" in out
    assert "2 skip(s) not expected on this machine" in out
    result.assert_outcomes(passed=1, skipped=3, xfailed=1)
    # Without the option pytest behaves as ever: skips do not fail a run.
    assert pytester.runpytest_inprocess("-p", "horovod.testing.skips").ret == pytest.ExitCode.OK


@pytest.mark.unit
def test_a_declared_skip_passes_only_while_its_condition_holds(pytester, tmp_path, monkeypatch):
    pytester.makepyfile(test_skipping=SKIPPING)
    args = ("-p", "horovod.testing.skips", "--strict-skips", "-k", "runs or mpirun")
    monkeypatch.setenv("PATH", _path_with(tmp_path, mpirun=False))
    result = pytester.runpytest_inprocess(*args)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    result.stdout.fnmatch_lines(["expected, no mpirun on PATH*: 1 skipped: no mpirun (Debian: openmpi-bin)"])
    # The same skip where mpirun is on PATH: the run fails and says why.
    monkeypatch.setenv("PATH", _path_with(tmp_path, mpirun=True))
    result = pytester.runpytest_inprocess(*args)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["UNEXPECTED (declared for 'no mpirun on PATH*', which is false here): 1 skipped: "
                                 "no mpirun (Debian: openmpi-bin)"])


@pytest.mark.unit
def test_a_failing_run_with_an_unexpected_skip_stays_failed_and_lists_it(pytester):
    pytester.makepyfile(test_fails="import pytest\ndef test_f():\n    assert False\n"
                                   "def test_s():\n    pytest.skip('jax is not installed')\n")
    result = pytester.runpytest_inprocess("-p", "horovod.testing.skips", "--strict-skips")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert "UNEXPECTED (not declared): 1 skipped: jax is not installed" in result.stdout.str()


@pytest.mark.unit
@pytest.mark.parametrize("reason", [
    # What the suite's skips say when `make test` did not install what it installs: never expected.
    "jax is not installed", "tensorflow is not installed", "could not import 'ray': No module named 'ray'",
    "could not import 'jax': No module named 'jax'", "the spark extra (pyspark) is not installed",
    "no Java: run `make sysdeps` (scripts/system-deps.sh installs a JRE)", "torchrun is not installed",
    "could not import 'mpi4py': No module named 'mpi4py'", "could not import 'greenlet': No module named 'greenlet'",
    "the test extra's `build` is not installed (pip install build)", "no make",
    "package not installed with pip install -e . (no horovodrun console script)",
    "no chaos trial ran in this process", "got empty parameter set ['x'], function test_x at t.py:3",
    "useradd hvdx0 failed: useradd: cannot lock /etc/passwd", "",
])
def test_nothing_that_make_test_installs_is_an_expected_skip(reason):
    assert skips.expected_by(reason) == (None, None)


@pytest.mark.unit
def test_each_entry_is_judged_by_its_own_condition():
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    entry, declared = skips.expected_by(f"needs {10 ** 15} open files (hard limit {hard})")
    assert entry is not None and "open-file hard limit" in entry.condition and declared is None
    entry, declared = skips.expected_by("needs 300 open files (hard limit 100000)")
    assert (entry is None) == (hard >= 300) and (declared is not None) == (hard >= 300)
    entry, declared = skips.expected_by("namespace test hosts unavailable: network namespace hosts need root "
                                        "(CAP_NET_ADMIN); CI runs as root")
    assert (entry or declared).condition.startswith("not root") and (entry is not None) == (os.geteuid() != 0)
    entry, declared = skips.expected_by("needs two cores")
    assert (entry is not None) == (len(os.sched_getaffinity(0)) < 2)


@pytest.mark.cli
def test_under_xdist_the_controller_judges_every_workers_skips(pytester, tmp_path, monkeypatch):
    """pytest's command line with two xdist workers: a test's skip and a whole module's reach the controller."""
    pytester.makepyfile(test_skipping=SKIPPING, test_module_skip=MODULE_SKIP)
    monkeypatch.setenv("PATH", _path_with(tmp_path, mpirun=False))
    result = pytester.runpytest_subprocess("-p", "horovod.testing.skips", "--strict-skips", "-p", "xdist", "-n", "2",
                                           timeout=120)
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    out = result.stdout.str()
    assert "UNEXPECTED (not declared): 1 skipped: jax is not installed" in out
    assert "UNEXPECTED (not declared): 1 skipped: could not import 'horovod_no_such_extra'" in out
    assert "2 skip(s) not expected on this machine" in out
