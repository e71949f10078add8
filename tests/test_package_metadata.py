"""The installed package declares what Horovod 0.28.1 installs (issue 30 item 6; tier unit): code and tests written
for Horovod import psutil, cloudpickle, yaml and packaging without declaring them."""

import importlib
import importlib.metadata

import pytest
from packaging.requirements import Requirement

HOROVODS_REQUIREMENTS = {"cloudpickle": "cloudpickle", "psutil": "psutil", "pyyaml": "yaml", "packaging": "packaging"}


@pytest.mark.unit
def test_horovods_dependencies_are_declared_and_installed():
    requires = [Requirement(text) for text in importlib.metadata.requires("horovod-py") or []]
    unconditional = {r.name.lower().replace("_", "-") for r in requires if r.marker is None}
    missing = sorted(set(HOROVODS_REQUIREMENTS) - unconditional)
    assert not missing, f"not declared as dependencies of horovod-py: {missing} (declared: {sorted(unconditional)})"
    for module in HOROVODS_REQUIREMENTS.values():
        importlib.import_module(module)


@pytest.mark.unit
def test_install_hints_work_from_a_checkout_or_a_wheel(monkeypatch):
    from horovod import __version__
    from horovod.common.extras import install_hint
    hint = install_hint("spark")  # the packages from the installed metadata, then the extra from either source
    assert hint.startswith("pip install 'pyspark>=3.4' 'pyarrow>=14' 'pandas>=2' ")
    assert "pip install -e '.[spark]'" in hint and f"horovod_py-{__version__}-py3-none-any.whl[spark]" in hint
    assert "horovod-py[" not in hint  # no package index serves horovod-py
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)
    monkeypatch.setattr(importlib.metadata, "requires", not_installed)  # running from a checkout on PYTHONPATH
    assert install_hint("spark").startswith("install horovod-py's 'spark' extra: pip install -e '.[spark]'")
