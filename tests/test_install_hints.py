"""Every binding names what to install when its framework is missing (the frameworks hidden from a fresh
interpreter by an import blocker, as a bare environment would lack them)."""

import subprocess
import sys

import pytest

from horovod.runner.launch import package_pythonpath

_BLOCK = """
import importlib.abc, sys
class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}")
        return None
sys.meta_path.insert(0, Blocker())
"""


@pytest.mark.unit
@pytest.mark.parametrize("module, blocked, extra", [
    ("horovod.torch", ("torch",), "torch"),
    ("horovod.tensorflow", ("tensorflow",), "tensorflow"),
    ("horovod.tensorflow.keras", ("tensorflow", "keras"), "tensorflow"),
    ("horovod.keras", ("tensorflow", "keras"), "tensorflow"),
    ("horovod.tensorflow.keras", ("keras",), "tensorflow"),
])
def test_a_binding_without_its_framework_names_the_extra(module, blocked, extra):
    import os
    env = {**os.environ, **package_pythonpath()}
    proc = subprocess.run([sys.executable, "-c", _BLOCK.format(blocked=blocked) + f"import {module}"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode != 0, proc.stdout
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: horovod.") and f"pip install -e '.[{extra}]'" in last, proc.stderr[-2000:]
    if extra == "torch":
        assert "CPU-only wheel" in last and "docs/gpu.md" in last
