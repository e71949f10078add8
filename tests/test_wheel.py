"""The package as users get it (tier cli): ``python -m build`` makes a wheel and an sdist of a copy of this checkout;
the wheel installs into a fresh virtual environment, whose ``horovodrun -np 2`` runs an example with the wheel's
``horovod``, and whose install hints name commands that work without a package index serving horovod-py.

The fresh environment gets the wheel with ``--no-deps``; its dependencies (numpy, cloudpickle...) are lent from this
interpreter's site-packages by a ``.pth`` line, which adds the folder without running its ``.pth`` files, so the
checkout's editable install stays out of it. No download; about 15 s."""

import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.cli, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
DEPENDENCIES = ["numpy", "cloudpickle", "psutil", "yaml", "packaging"]
_NOT_SOURCE = shutil.ignore_patterns(".git", ".venv", "__pycache__", "*.egg-info", "build", "dist", ".pytest_cache",
                                     "checkpoints", "bench", "docs")


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    """The wheel and the sdist built from a copy of the checkout, and what ``python -m build`` printed."""
    pytest.importorskip("build", reason="the test extra's `build` is not installed (pip install build)")
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"
    shutil.copytree(ROOT, source, ignore=_NOT_SOURCE)
    proc = subprocess.run([sys.executable, "-m", "build", "--outdir", str(tmp / "dist"), str(source)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    wheels, sdists = list((tmp / "dist").glob("*.whl")), list((tmp / "dist").glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, list((tmp / "dist").iterdir())
    return wheels[0], sdists[0], proc.stdout + proc.stderr, source


@pytest.fixture(scope="module")
def fresh_env(dist, tmp_path_factory):
    """A new virtual environment holding the wheel (and this interpreter's copies of its dependencies)."""
    wheel = dist[0]
    env = tmp_path_factory.mktemp("env") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, timeout=120)
    python = env / "bin" / "python"
    proc = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
                           "--no-index", str(wheel)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    lent = {str(Path(__import__(name).__file__).resolve().parents[1]) for name in DEPENDENCIES}
    (Path(purelib) / "_lent_dependencies.pth").write_text("\n".join(sorted(lent)) + "\n")
    return env


def _clean_env(env: Path) -> dict:
    variables = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("HOROVOD_")}
    variables["PATH"] = f"{env / 'bin'}{os.pathsep}{variables.get('PATH', '')}"
    return variables


def test_build_makes_a_wheel_and_an_sdist_of_the_whole_package(dist):
    wheel, sdist, output, source = dist
    package = {p.relative_to(source).as_posix() for p in (source / "horovod").rglob("*.py")}
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = next(archive.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert package <= names, sorted(package - names)[:10]
    assert "horovodrun = horovod.runner.cli:main" in entry_points
    with tarfile.open(sdist) as archive:
        top = {n.split("/", 1)[1] for n in archive.getnames() if "/" in n}
    assert {"pyproject.toml", "README.md", "horovod/__init__.py", "horovod/runner/cli.py"} <= top
    assert "deprecated" not in output.lower(), output[-3000:]  # the build says nothing twice, nothing stale


def test_the_wheel_installs_into_a_fresh_environment_and_horovodrun_runs_an_example(fresh_env, tmp_path):
    where = subprocess.run([str(fresh_env / "bin" / "python"), "-c", "import horovod; print(horovod.__file__)"],
                           capture_output=True, text=True, cwd=tmp_path, env=_clean_env(fresh_env), timeout=60)
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).resolve().is_relative_to(fresh_env.resolve()), where.stdout
    shutil.copy(ROOT / "examples" / "numpy_allreduce.py", tmp_path)
    proc = subprocess.run([str(fresh_env / "bin" / "horovodrun"), "-np", "2", "python", "numpy_allreduce.py"],
                          capture_output=True, text=True, cwd=tmp_path, env=_clean_env(fresh_env), timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    for rank in range(2):
        assert f"[{rank}]<stdout>:rank {rank} of 2: sum=[1.0, 1.0, 1.0, 1.0]" in proc.stdout, proc.stdout


def test_an_install_hint_from_the_wheel_names_commands_that_work_there(fresh_env, tmp_path):
    code = "import sys; sys.modules['ray'] = None\nimport horovod.ray"
    proc = subprocess.run([str(fresh_env / "bin" / "python"), "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, env=_clean_env(fresh_env), timeout=60)
    assert proc.returncode != 0
    assert "pip install 'ray[train]>=2.9'" in proc.stderr, proc.stderr[-2000:]  # from the wheel's metadata
    assert "-py3-none-any.whl[ray]" in proc.stderr and "pip install -e '.[ray]'" in proc.stderr
    assert "pip install 'horovod-py[ray]'" not in proc.stderr  # no index serves that name
