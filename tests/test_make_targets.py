"""The Makefile's environments (tier unit, no install): ``make demo`` sets up only what the demo needs (torch pinned,
scikit-learn for the digits), ``make test`` everything the suite tests. Read from ``make -n`` in a fresh copy of the
Makefile and pyproject.toml, with each ``-e ".[extras]"`` expanded from pyproject's extras."""

import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
FRAMEWORKS = {"tensorflow", "tensorflow-cpu", "keras", "jax", "jaxlib", "optax", "ray", "pyspark", "pyarrow"}


def planned_installs(target: str, tmp_path: Path) -> list:
    """The requirement names each ``pip install`` of ``make -n target`` asks for, from a fresh clone's files."""
    if shutil.which("make") is None:
        pytest.skip("no make")
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    (tmp_path / "examples").mkdir()
    shutil.copy(ROOT / "examples" / "pytorch_digits.py", tmp_path / "examples")
    dry = subprocess.run(["make", "-n", target], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    installs = []
    for line in dry.stdout.splitlines():
        if "pip install" not in line:
            continue
        names = set()
        for word in shlex.split(line.split("pip install", 1)[1]):
            wanted = re.fullmatch(r"\.\[(.*)\]", word)
            if wanted:
                names |= {Requirement(r).name.lower() for e in wanted.group(1).split(",") for r in extras[e]}
            elif not word.startswith("-") and word != ".":
                names.add(Requirement(word).name.lower())
        installs.append((line, names))
    return installs


def test_make_demo_installs_torch_and_scikit_learn_only(tmp_path):
    installs = planned_installs("demo", tmp_path)
    assert installs, "make demo plans no pip install"
    everything = set().union(*(names for _, names in installs))
    assert not everything & FRAMEWORKS, f"make demo installs {sorted(everything & FRAMEWORKS)}: {installs}"
    assert {"torch", "scikit-learn"} <= everything
    assert all("torch==2.13.0" in line for line, names in installs if "torch" in names)  # never an unpinned torch


def test_make_test_installs_every_extra_the_suite_tests(tmp_path):
    installs = planned_installs("test", tmp_path)
    everything = set().union(*(names for _, names in installs))
    assert {"torch", "scikit-learn", "pytest", "tensorflow-cpu", "jax", "ray", "pyspark"} <= everything
    assert all("torch==2.13.0" in line for line, names in installs if "torch" in names)


def test_every_pytest_phase_of_make_test_fails_on_an_unexpected_skip(tmp_path):
    """Each of `make test`'s pytest commands lists its skips and fails on one this machine does not explain
    (horovod/testing/skips.py), so that a suite whose extras failed to import cannot pass hollow."""
    if shutil.which("make") is None:
        pytest.skip("no make")
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    dry = subprocess.run(["make", "-n", "test"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    phases = [line for line in dry.stdout.splitlines() if " -m pytest " in line]
    assert len(phases) == 3, dry.stdout
    assert all("--strict-skips" in shlex.split(line) for line in phases), phases
