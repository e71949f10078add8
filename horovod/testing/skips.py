"""The skip report of ``make test`` (pytest option ``--strict-skips``): every skipped test with its reason, and a
failed run when a test skipped for a reason that this machine does not explain.

A skip is expected only when an entry of :data:`EXPECTED` matches its reason *and* that entry's one condition holds
on this machine, checked when the run ends (not root, no mpirun on PATH, ...). Nothing that ``make test`` installs
is among them: a missing extra (JAX, Ray, pyspark, TensorFlow, scikit-learn, mpi4py), Spark's Java, or, as root
with apt-get, sshd, ssh, ip or mpirun (``scripts/system-deps.sh``) means the suite ran hollow, and the run fails
naming the skips.

Registered by ``tests/conftest.py``; each of the Makefile's pytest phases passes ``--strict-skips``. Under
pytest-xdist the controller judges: the workers' skip reports, of tests and of whole modules, reach it through
``pytest_runtest_logreport`` and ``pytest_collectreport``.
"""

from __future__ import annotations

import dataclasses
import os
import re
import resource
import shutil
from typing import Callable, Dict, List, Optional, Tuple

import pytest

__all__ = ["EXPECTED", "Expected", "expected_by", "skip_reason"]


@dataclasses.dataclass(frozen=True)
class Expected:
    """A skip this suite may take: ``reason`` (a regular expression searched in the skip's reason) names the skip,
    ``holds`` says whether its ``condition`` is true on this machine (given the reason's match, for its figures)."""

    condition: str
    reason: str
    holds: Callable[[re.Match], bool]


def _missing(tool: str) -> Callable[[re.Match], bool]:
    return lambda match: shutil.which(tool) is None


def _uninstallable(tool: str) -> bool:
    """``tool`` is missing and scripts/system-deps.sh cannot install it here (it installs only as root, with apt)."""
    missing = not os.access(tool, os.X_OK) if "/" in tool else shutil.which(tool) is None
    return missing and (os.geteuid() != 0 or shutil.which("apt-get") is None)


def _netns_refused(match: re.Match) -> bool:
    from horovod.testing import netns     # (only when such a skip happened: the probe makes a namespace)
    return os.geteuid() == 0 and (netns.unavailable_reason() or "").startswith(("cannot create a network namespace",
                                                                                "ip netns add failed"))


def _netns_tool_missing(match: re.Match) -> bool:
    return _uninstallable(match.group(1))


def _open_files_below(match: re.Match) -> bool:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return hard != resource.RLIM_INFINITY and hard < int(match.group(1))


def _shm_not_writable(match: re.Match) -> bool:
    return not (os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK))


# The whole list: one condition each. A reason matched by none of them, or matched by one whose condition is false
# here, fails `make test`.
EXPECTED: Tuple[Expected, ...] = (
    Expected("not root: os.geteuid() != 0 (network namespace hosts, a second local user)",
             r"\bneeds? root\b", lambda match: os.geteuid() != 0),
    Expected("root, but `ip netns add` fails here (a container without CAP_NET_ADMIN)",
             r"^namespace test hosts unavailable: (cannot create a network namespace|ip netns add failed)",
             _netns_refused),
    Expected("a tool the namespace hosts need (ip, ssh, ssh-keygen, sshd) is missing and scripts/system-deps.sh "
             "cannot install it here (no apt-get)",
             r"^namespace test hosts unavailable: (ip|ssh|ssh-keygen|/\S*/sshd) is not installed",
             _netns_tool_missing),
    Expected("no mpirun on PATH, and scripts/system-deps.sh cannot install it here (not root, or no apt-get)",
             r"^(mpirun is not installed|no mpirun)\b", lambda match: _uninstallable("mpirun")),
    Expected("no prlimit on PATH: shutil.which('prlimit') is None",
             r"^prlimit \(util-linux\) is not installed$", _missing("prlimit")),
    Expected("no useradd on PATH: shutil.which('useradd') is None",
             r"^useradd/userdel not installed", _missing("useradd")),
    Expected("no /usr/bin/python3 nor /usr/local/bin/python3 for a second user to run",
             r"^no system python3 the second user may run",
             lambda match: not any(os.access(p, os.X_OK) for p in ("/usr/bin/python3", "/usr/local/bin/python3"))),
    Expected("the open-file hard limit is below what the test needs: getrlimit(RLIMIT_NOFILE)[1] < N",
             r"^needs (\d+) open files \(hard limit \d+\)$", _open_files_below),
    Expected("fewer than two cores to run on: len(os.sched_getaffinity(0)) < 2",
             r"^needs two cores$", lambda match: len(os.sched_getaffinity(0)) < 2),
    Expected("no writable /dev/shm", r"^no writable /dev/shm$", _shm_not_writable),
)


def skip_reason(report) -> str:
    """The reason a skipped test or collector gave, as ``pytest -rs`` prints it."""
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return reason[len("Skipped: "):] if reason.startswith("Skipped: ") else reason


def expected_by(reason: str) -> Tuple[Optional[Expected], Optional[Expected]]:
    """``(entry, None)``: the entry of :data:`EXPECTED` whose reason matches and whose condition holds here;
    ``(None, entry)``: an entry matches but its condition is false here; ``(None, None)``: no entry declares it."""
    declared = None
    for entry in EXPECTED:
        match = re.search(entry.reason, reason)
        if match is None:
            continue
        if entry.holds(match):
            return entry, None
        declared = declared or entry
    return None, declared


def pytest_addoption(parser):
    """pytest hook: the ``--strict-skips`` option."""
    parser.getgroup("horovod").addoption(
        "--strict-skips", action="store_true", default=False,
        help="list every skip with its reason and fail the run when a test skipped for a reason not expected on "
             "this machine (horovod/testing/skips.py: EXPECTED)")


def pytest_configure(config):
    """pytest hook: start collecting skips when ``--strict-skips`` is on."""
    # Judged where every report arrives: the controller under xdist (its workers have `workerinput`), else the one
    # pytest process.
    if config.getoption("strict_skips", False) and not hasattr(config, "workerinput"):
        config.pluginmanager.register(SkipLedger(), "horovod-skip-ledger")


class SkipLedger:
    """Collects the run's skips, fails the session for an unexpected one and prints them all at the end."""

    def __init__(self):
        self.skips: Dict[Tuple[str, str], str] = {}     # (node id, reason) -> where the skip was raised
        self.verdicts: List[Tuple[str, List[str], Optional[Expected], Optional[Expected]]] = []

    def _note(self, report) -> None:
        reason = skip_reason(report)
        where = report.longrepr[:2] if isinstance(report.longrepr, tuple) else ("", "")
        self.skips.setdefault((report.nodeid, reason), f"{where[0]}:{where[1]}")

    def pytest_runtest_logreport(self, report):
        """pytest hook: note a test's skip (on the controller, xdist workers' reports too)."""
        if report.skipped and not hasattr(report, "wasxfail"):
            self._note(report)

    def pytest_collectreport(self, report):
        """pytest hook: note a module skipped while collecting."""
        if report.skipped:
            self._note(report)

    def pytest_sessionfinish(self, session):
        """pytest hook: fail the run when a skip was not declared expected on this machine."""
        by_reason: Dict[str, List[str]] = {}
        for nodeid, reason in self.skips:
            by_reason.setdefault(reason, []).append(nodeid)
        self.verdicts = [(reason, sorted(nodes), *expected_by(reason)) for reason, nodes in sorted(by_reason.items())]
        if any(entry is None for _, _, entry, _ in self.verdicts) and \
                session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter):
        """pytest hook: the skip report, grouped by reason, expected or not."""
        if not self.verdicts:
            return
        write = terminalreporter.write_line
        terminalreporter.section(f"skips: {len(self.skips)}, each with its reason", sep="=")
        unexpected = 0
        for reason, nodes, entry, declared in self.verdicts:
            if entry is not None:
                write(f"expected, {entry.condition}: {len(nodes)} skipped: {reason}")
                shown = nodes[:3]
            else:
                unexpected += len(nodes)
                why = f"declared for '{declared.condition}', which is false here" if declared else "not declared"
                write(f"UNEXPECTED ({why}): {len(nodes)} skipped: {reason}", red=True)
                shown = nodes
            for nodeid in shown:
                write(f"    {nodeid}")
            if len(nodes) > len(shown):
                write(f"    ... and {len(nodes) - len(shown)} more")
        if unexpected:
            write(f"{unexpected} skip(s) not expected on this machine: the run fails (--strict-skips; the expected "
                  f"ones are horovod/testing/skips.py's EXPECTED)", red=True, bold=True)
