"""Importing horovod.ray without Ray (tier unit): kept apart from the Ray cluster the other Ray tests start."""

import subprocess
import sys

import pytest


@pytest.mark.unit
def test_import_without_ray_names_the_extra():
    code = "import sys; sys.modules['ray'] = None\nimport horovod.ray"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "ImportError" in proc.stderr and "pip install 'ray[train]>=2.9'" in proc.stderr
    assert "pip install -e '.[ray]'" in proc.stderr

