"""Pytest fixtures and markers for the three test tiers.

* ``unit``  — pure logic, no processes (negotiation, fusion plans, slot assignment, flag mapping).
* ``ranks`` — a function on N real processes through :func:`~horovod.testing.spawn_ranks` (fixture ``spawn``).
* ``cli``   — the real ``horovodrun`` in a subprocess (fixture ``horovodrun``).

World sizes: a multi-rank test whose checks hold at any size takes the argument ``world`` (or a fixture that does),
run at each of :func:`world_sizes`: 2 and 3 ranks by default, any others with ``--world-sizes 5,8`` or
``HVD_WORLD_SIZES=5,8`` (``make soak``). A test that keeps its own sizes in ``make test`` but follows the override
lists ``world_sizes(default=...)``; a test written for one size says why.

Enable with ``pytest_plugins = ["horovod.testing.fixtures"]`` in a ``conftest.py``.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time
from typing import Callable, Iterable, List, Mapping, Optional, Sequence, Tuple

import pytest

from horovod.common import config
from horovod.common.config import environ_get, environ_set
from horovod.runner.launch import package_pythonpath
from horovod.testing.spawn import spawn_ranks

TIERS = {
    "unit": "pure logic, no processes",
    "ranks": "functions on N real processes via spawn_ranks",
    "cli": "the real horovodrun command line in a subprocess",
}
# Across the tiers, how `make test` schedules a test: most run four at a time (``-m "not serial and not timed"``);
# tests that bound a time while the machine stays nearly idle (a user's sleep, a stall or start timeout running out)
# then run five at a time beside each other only (``-m timed``); tests that bound a time under load, or load the
# machine themselves with dozens of ranks or hold a machine-wide resource (a Ray cluster, a second local user), run
# last, alone (``-m serial``).
SCHEDULES = {
    "timed": "bounds a time but leaves the CPU idle; `make test` runs it beside other timed tests only, five at once "
             "(timed(seconds=N): a wait of N s, started first)",
    "serial": "bounds a time under load or loads the whole machine; `make test` runs it last, alone",
}

WORLD_SIZES_ENV = "HVD_WORLD_SIZES"
DEFAULT_WORLD_SIZES = (2, 3)


def world_sizes(default: Sequence[int] = DEFAULT_WORLD_SIZES) -> Tuple[int, ...]:
    """The world sizes of the size-independent multi-rank tests: ``HVD_WORLD_SIZES`` (``--world-sizes`` sets it), a
    comma-separated list such as ``5,8``, where set; ``default`` otherwise. Read at collection."""
    text = (environ_get(WORLD_SIZES_ENV) or "").strip()
    if not text:
        return tuple(default)
    try:
        sizes = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise pytest.UsageError(f"{WORLD_SIZES_ENV}={text!r}: give world sizes as positive integers, e.g. 5,8")
    return sizes


def pytest_addoption(parser):
    """pytest hook: the ``--world-sizes`` option."""
    parser.getgroup("horovod").addoption(
        "--world-sizes", default=None, metavar="N,M",
        help=f"run the size-independent multi-rank tests at these world sizes (sets {WORLD_SIZES_ENV}; "
             f"default {','.join(map(str, DEFAULT_WORLD_SIZES))})")


def pytest_generate_tests(metafunc):
    """pytest hook: a test that takes ``world`` runs once per world size."""
    # One parameter of module scope, so that a module's job spawned for a size serves every test at that size.
    explicit = any("world" in marker.args[0] for marker in metafunc.definition.iter_markers("parametrize")
                   if marker.args and isinstance(marker.args[0], str))
    if "world" in metafunc.fixturenames and not explicit:
        metafunc.parametrize("world", world_sizes(), ids=lambda n: f"{n}ranks", scope="module")


def pytest_configure(config):
    """pytest hook: ``--world-sizes`` into the one variable that names them, and this project's markers."""
    option = config.getoption("world_sizes", None)
    if option:     # before the test modules are collected; xdist workers get the option too
        environ_set(WORLD_SIZES_ENV, option)
        world_sizes()
    for name, doc in TIERS.items():
        config.addinivalue_line("markers", f"{name}: {doc}")
    for name, doc in SCHEDULES.items():
        config.addinivalue_line("markers", f"{name}: {doc}")


def pytest_ignore_collect(collection_path, config):
    """pytest hook: under ``-m unit``, a test module that marks no test unit is not even imported."""
    # `pytest -m unit` would deselect every test of a module that marks none unit, after importing it (Ray, Spark
    # and the frameworks at module level: about 1.5 s of the unit tier); a tier marker is written out in its module.
    if config.getoption("markexpr", "") == "unit" and collection_path.suffix == ".py" \
            and collection_path.name.startswith("test_"):
        return "mark.unit" not in collection_path.read_text(encoding="utf-8", errors="replace") or None
    return None


@pytest.hookimpl(tryfirst=True)     # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    """pytest hook: every test in one tier and at most one schedule; the longest waits first, and the tests that
    share a spawned job on one xdist worker."""
    # Every test says which tier it is in, so `pytest -m unit` really is the suite's process-free part.
    untiered = [item.nodeid for item in items if not any(item.get_closest_marker(tier) for tier in TIERS)]
    if untiered:
        raise pytest.UsageError("tests without a tier marker (pytest.mark.unit, .ranks or .cli): "
                                + ", ".join(untiered[:10]))
    # A test in two schedules would run twice in `make test`.
    both = [item.nodeid for item in items if all(item.get_closest_marker(name) for name in SCHEDULES)]
    if both:
        raise pytest.UsageError("tests marked both timed and serial: " + ", ".join(both[:10]))
    # The timed phase lasts at least as long as its longest wait: the few waits of most of a minute start first, one
    # per worker, and everything shorter fills in around them (a stable sort: every xdist worker orders alike). Only
    # under xdist's loadgroup: in one process the sort would only set up the moved tests' module fixtures twice.
    if getattr(config.option, "loadgroup", False):
        items.sort(key=lambda item: -_declared_seconds(item))
    for item in items:
        group = _shared_fixture_group(item)
        if group and not _declared_seconds(item):     # a long wait starts on a worker of its own
            item.add_marker(pytest.mark.xdist_group(group))


def _shared_fixture_group(item) -> Optional[str]:
    """The xdist group of a test that uses a module- or session-wide fixture (a job spawned once for a module's
    checks, a Spark cluster), so that `make test` (--dist loadgroup) builds it on one worker instead of on every
    worker that draws one of its tests: the module and the fixture's parameter, or a wider fixture's name."""
    info = getattr(item, "_fixtureinfo", None)
    params = getattr(getattr(item, "callspec", None), "params", {})
    for scope in ("session", "package", "module"):
        for name in sorted(info.name2fixturedefs if info else ()):
            definition = info.name2fixturedefs[name][-1]
            if definition.scope == scope and definition.baseid:     # the suite's own, not pytest's tmp_path_factory
                where = item.nodeid.split("::")[0] if scope == "module" else name
                # the job of one world size (a fixture on the `world` parameter) goes to a worker of its own
                param = params.get(name, params.get("world") if "world" in definition.argnames else None)
                # xdist reads a group after the last "@" only if no "]" follows it: "module:param", not "module[param]"
                return f"{where}:{param}" if param is not None else where
    return None


def _declared_seconds(item) -> float:
    marker = item.get_closest_marker("timed")
    return float(marker.kwargs.get("seconds", 0)) if marker else 0.0


def skip_module_without(package: str) -> None:
    """Skip the calling test module when ``package`` is not installed, without importing it.

    For modules that run the framework only in their workers: ``pytest.importorskip("tensorflow")`` costs every
    pytest process that collects the module three CPU-seconds of TensorFlow import.
    """
    import importlib.util
    if importlib.util.find_spec(package) is None:
        pytest.skip(f"{package} is not installed", allow_module_level=True)


def process_alive(pid: int) -> bool:
    """Whether ``pid`` is a live (not zombie) process."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            # The state follows the parenthesised command name, which may itself contain spaces.
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not os.path.exists("/proc") or os.path.exists(f"/proc/{pid}")


def live_processes(pids: Iterable[int]) -> List[int]:
    """The pids of ``pids`` that are still alive; tests assert it is empty after a job."""
    return [pid for pid in pids if process_alive(pid)]


def wait_for(predicate: Callable[[], object], timeout: float, what: str) -> None:
    """Return once ``predicate()`` is true; fail the test (naming ``what``) if it is not within ``timeout`` seconds.

    For a condition outside the test's process (a file a rank writes, a kernel's socket state): it is looked at
    every 20 ms, never slept on blindly.
    """
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.02)


def run_horovodrun(args: Sequence[str], timeout: float = 30.0, env: Optional[Mapping[str, str]] = None,
                   cwd: Optional[str] = None) -> subprocess.CompletedProcess:
    """Run ``python -m horovod.runner ARGS`` to completion and capture its output.

    The launcher runs in its own process group, killed with SIGKILL if it overruns ``timeout``.

    Raises:
        subprocess.TimeoutExpired: the launcher did not finish in time (it has been killed).
    """
    full_env = {**config.environ_snapshot(), **package_pythonpath(), **dict(env or {})}
    proc = subprocess.Popen([sys.executable, "-m", "horovod.runner", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=full_env, cwd=cwd, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.communicate()
        raise
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.fixture
def spawn() -> Callable:
    """``spawn(fn, world_size, timeout=60, args=(), env=None)``: :func:`spawn_ranks`."""
    return functools.partial(spawn_ranks)


@pytest.fixture
def horovodrun() -> Callable[..., subprocess.CompletedProcess]:
    """``horovodrun(["-np", "2", "python", "x.py"], timeout=30)``: run the real launcher, see :func:`run_horovodrun`."""
    return run_horovodrun


__all__ = ["TIERS", "world_sizes", "process_alive", "live_processes", "run_horovodrun", "spawn", "horovodrun", "wait_for"]


def start_horovodrun(args: Sequence[str], cwd: str, env: Optional[Mapping[str, str]] = None) -> subprocess.Popen:
    """``horovodrun args`` from this checkout in a session of its own, output captured, not waited for (see
    :func:`end_horovodrun`)."""
    full = {**config.environ_snapshot(), **package_pythonpath(), **(env or {})}
    return subprocess.Popen([sys.executable, "-m", "horovod.runner", *args], cwd=cwd, env=full,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def end_horovodrun(proc: subprocess.Popen, timeout: float):
    """``(stdout, stderr)`` once ``proc`` ends within ``timeout`` seconds; past it, its whole session is killed
    and the test fails. Its session is killed whatever happens."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"horovodrun ran over {timeout} s:\n{out[-2000:]}\n{err[-4000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
