"""The package keeps the shape docs/architecture.md describes (issue 13): checked on the source, no processes."""
from pathlib import Path

import pytest

from horovod.tools import house

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
