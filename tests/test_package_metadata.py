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
