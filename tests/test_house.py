"""The package keeps the shape docs/architecture.md describes: checked on the source, no processes."""
from pathlib import Path

import pytest

from horovod.tools import floors, house

pytestmark = pytest.mark.unit

ROOT = Path(house.__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def modules():
    return house.load_package(ROOT)


def test_no_import_circles(modules):
    assert house.import_cycles(modules) == []


def test_layers_import_only_downwards(modules):
    assert house.layer_violations(modules) == []


def test_modules_are_small(modules):
    assert house.long_modules(modules) == []


def test_functions_are_small(modules):
    assert house.long_functions(modules) == []


def test_only_config_reads_the_environment(modules):
    assert house.environ_readers(modules) == []


def test_public_api_is_documented(modules):
    documented, total, missing = house.documentation(modules)
    assert documented / total >= house.MIN_DOCUMENTED, missing


def test_checker_finds_a_circle(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "common").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "common" / "__init__.py").write_text("")
    (pkg / "common" / "a.py").write_text("def f():\n    from pkg.common import b\n")
    (pkg / "common" / "b.py").write_text("from pkg.common.a import f\nfrom pkg.core import engine\n")
    (pkg / "core").mkdir()
    (pkg / "core" / "__init__.py").write_text("")
    (pkg / "core" / "engine.py").write_text("")
    mods = house.load_package(pkg)
    assert house.import_cycles(mods) == [["pkg.common.a", "pkg.common.b"]]
    assert ("pkg.common.b", "pkg.core.engine") in house.layer_violations(mods)


def _package(tmp_path, files):
    """A package ``pkg`` of the given {relative path: source} under ``tmp_path``, every folder a package."""
    pkg = tmp_path / "pkg"
    for rel, text in {"__init__.py": "", **files}.items():
        path = pkg / rel
        for folder in [path.parent, *path.parent.parents]:
            if folder == tmp_path:
                break
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "__init__.py").touch()
        path.write_text(text)
    return house.load_package(pkg)


def test_checker_covers_every_floor(tmp_path):
    mods = _package(tmp_path, {
        "runtime/context.py": "from pkg.transport import mesh\n",        # front door skipping the engine
        "transport/mesh.py": "",
        "runner/launch.py": "from pkg.runtime import context\n",          # a launcher loading the worker's side
        "runner/run_task.py": "def main():\n    from pkg.runtime import context\n",   # allowed: the worker runs it
        "spark/task.py": "from pkg.torch import optimizer\n",
        "torch/optimizer.py": "from pkg.runner import launch\n",          # a binding importing a launcher
        "spark/torch/remote.py": "from pkg.torch import optimizer\n",     # an estimator: every rank runs it
        "testing/spawn.py": "from pkg.runner import launch\nfrom pkg.transport import mesh\n",
        "newpackage/thing.py": "from pkg.runtime import context\n",      # a package with no floor
    })
    bad = house.layer_violations(mods)
    assert ("pkg.runtime.context", "pkg.transport.mesh") in bad
    assert ("pkg.runner.launch", "pkg.runtime.context") in bad
    assert ("pkg.spark.task", "pkg.torch.optimizer") in bad
    assert ("pkg.torch.optimizer", "pkg.runner.launch") in bad
    assert ("pkg.newpackage.thing", "pkg.runtime.context") in bad
    assert not [pair for pair in bad if pair[0] in ("pkg.runner.run_task", "pkg.spark.torch.remote",
                                                    "pkg.testing.spawn")]


def test_named_exceptions_are_horovods_paths_only(modules):
    """Every exception still applies (a stale one would hide a future violation) and is one of Horovod's paths."""
    for (importer, imported), reason in floors.EXCEPTIONS.items():
        assert reason.startswith("Horovod's public path")
        assert importer in modules and any(t == imported or t.startswith(imported + ".")
                                           for t in modules[importer].imports), (importer, imported)


def test_every_package_has_a_floor(modules):
    assert not [name for name in modules if floors.floor_of(name) is None]


def test_a_package_without_a_floor_is_reported(tmp_path):
    mods = _package(tmp_path, {"newpackage/thing.py": "from pkg.common import util\n", "common/util.py": ""})
    assert ("pkg.newpackage.thing", "pkg.common.util") in house.layer_violations(mods)


def test_horovods_public_paths_are_imported_by_nothing_here(modules):
    """The re-exporting files serve code written for Horovod; the package itself imports the real modules."""
    paths = {importer for importer, _ in floors.EXCEPTIONS} | {"horovod.elastic.worker", "horovod.elastic.protocol"}
    assert not [(m.name, t) for m in modules.values() for t in m.imports if t in paths]
